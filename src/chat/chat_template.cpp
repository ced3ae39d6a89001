// Chat template rendering: context construction, incremental decomposition, family detection.
#include "chat/chat_template.h"

#include <cstddef>
#include <ctime>
#include <nlohmann/json.hpp>
#include <utility>

namespace mnemo {
namespace {

// The documented plain template for models without one (see ChatTemplate::Fallback).
constexpr const char* kFallbackSource =
    "{% for message in messages %}{{ message['role'] | capitalize }}: {{ message['content'] | trim }}\n\n{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}";

// Stands in for the reply when locating it in the rendering: no letters (case filters), no
// whitespace (strip / trim), no Jinja or JSON syntax, not a prefix of any marker.
std::string Sentinel(const std::vector<ChatMessage>& history) {
  for (int k = 0;; ++k) {
    std::string s = "\xE2\x9F\xA6#" + std::to_string(7919 + k) + "#\xE2\x9F\xA7";  // "⟦#7919#⟧"
    bool used = false;
    for (const ChatMessage& m : history) used = used || m.content.find(s) != std::string::npos;
    if (!used) return s;
  }
}

size_t CountOccurrences(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t k = s.find(what); k != std::string::npos; k = s.find(what, k + what.size())) ++n;
  return n;
}

size_t FirstDifference(const std::string& a, const std::string& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  return i;
}

}  // namespace

std::string DetectChatFamily(const std::string& source) {
  auto has = [&](const char* s) { return source.find(s) != std::string::npos; };
  if (has("<|start_header_id|>")) return "llama3";
  if (has("<|im_start|>")) return "chatml";
  if (has("<start_of_turn>")) return "gemma";
  if (has("<|START_OF_TURN_TOKEN|>")) return "command-r";
  if (has("<|user|>") && has("<|end|>")) return "phi3";
  if (has("[INST]") && has("<<SYS>>")) return "llama2";
  if (has("[INST]")) return "mistral";
  return "unknown";
}

Result<ChatTemplate> ChatTemplate::Create(std::string source, std::string bos_token, std::string eos_token) {
  auto parsed = jinja::Template::Parse(source);
  if (!parsed.ok()) return Error{"chat template: " + parsed.error().message};
  ChatTemplate t;
  t.template_ = std::move(*parsed);
  t.bos_token_ = std::move(bos_token);
  t.eos_token_ = std::move(eos_token);
  t.family_ = DetectChatFamily(t.template_.source());
  // Whether renderings carry BOS: render a one-message conversation (errors here are not fatal:
  // some templates insist on a system message; they are reported when rendering for real).
  if (!t.bos_token_.empty()) {
    auto probe = t.Render({{"user", "Hi"}}, true);
    t.renders_bos_ = probe.ok() && probe->compare(0, t.bos_token_.size(), t.bos_token_) == 0;
  }
  return t;
}

ChatTemplate ChatTemplate::Fallback() {
  auto t = Create(kFallbackSource, "", "");
  MNEMO_CHECK_MSG(t.ok(), t.ok() ? "" : t.error().message);
  t->family_ = "fallback";
  return std::move(*t);
}

ChatTemplate& ChatTemplate::WithFixedTime(std::time_t t) {
  fixed_time_ = true;
  time_ = t;
  return *this;
}

jinja::Value ChatTemplate::Context(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                   const jinja::Dict* extra) const {
  jinja::List list;
  list.reserve(messages.size());
  for (const ChatMessage& m : messages) {
    jinja::Dict d;
    d.items.reserve(2);
    d.items.emplace_back("role", jinja::Value(m.role));
    d.items.emplace_back("content", jinja::Value(m.content));
    // As transformers passes them: tool_calls[i] = {id, type, function: {name, arguments}}, the
    // arguments parsed (templates write `arguments | tojson`); text that is not JSON stays text.
    if (!m.tool_calls.empty()) {
      jinja::List calls;
      for (const ChatToolCall& c : m.tool_calls) {
        auto args = nlohmann::ordered_json::parse(c.arguments, nullptr, false);
        jinja::Dict fn;
        fn.Set("name", jinja::Value(c.name));
        fn.Set("arguments", args.is_discarded() ? jinja::Value(c.arguments) : jinja::Value::FromJson(args));
        jinja::Dict call;
        call.Set("id", jinja::Value(c.id));
        call.Set("type", jinja::Value("function"));
        call.Set("function", jinja::Value(std::move(fn)));
        calls.push_back(jinja::Value(std::move(call)));
      }
      d.items.emplace_back("tool_calls", jinja::Value(std::move(calls)));
    }
    if (!m.tool_call_id.empty()) d.items.emplace_back("tool_call_id", jinja::Value(m.tool_call_id));
    if (!m.name.empty()) d.items.emplace_back("name", jinja::Value(m.name));
    list.push_back(jinja::Value(std::move(d)));
  }
  jinja::Dict ctx;
  if (extra != nullptr) ctx = *extra;
  ctx.Set("messages", jinja::Value(std::move(list)));
  ctx.Set("bos_token", jinja::Value(bos_token_));
  ctx.Set("eos_token", jinja::Value(eos_token_));
  ctx.Set("add_generation_prompt", jinja::Value(add_generation_prompt));
  const bool fixed = fixed_time_;
  const std::time_t when = time_;
  ctx.Set("strftime_now", jinja::Value::MakeFunction("strftime_now", [fixed, when](jinja::CallArgs& args) {
            std::string fmt = args.positional.empty() || !args.positional[0].is_string() ? "%Y-%m-%d"
                                                                                        : args.positional[0].str();
            const std::time_t now = fixed ? when : std::time(nullptr);
            std::tm tm{};
            if (fixed) gmtime_r(&now, &tm);
            else localtime_r(&now, &tm);
            char buf[256];
            const size_t n = fmt.size() < 128 ? std::strftime(buf, sizeof(buf), fmt.c_str(), &tm) : 0;
            return jinja::Value(std::string(buf, n));
          }));
  return jinja::Value(std::move(ctx));
}

Result<std::string> ChatTemplate::Render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                         const jinja::Dict* extra) const {
  auto r = template_.Render(Context(messages, add_generation_prompt, extra));
  if (!r.ok()) return Error{"chat template: " + r.error().message};
  return r;
}

Result<ChatAppend> ChatTemplate::RenderAppend(const std::vector<ChatMessage>& history, size_t n_old,
                                              bool add_generation_prompt, const jinja::Dict* extra) const {
  if (n_old > history.size()) {
    return MakeError("RenderAppend: n_old = %zu but the conversation has %zu messages", n_old, history.size());
  }
  auto full = Render(history, add_generation_prompt, extra);
  if (!full.ok()) return full.error();
  ChatAppend out;
  if (n_old == 0) {
    out.tail = std::move(*full);
    return out;
  }
  const std::vector<ChatMessage> old_messages(history.begin(), history.begin() + static_cast<std::ptrdiff_t>(n_old));
  auto old = Render(old_messages, /*add_generation_prompt=*/true, extra);
  if (!old.ok()) return old.error();
  if (full->compare(0, old->size(), *old) != 0) {
    return MakeError("chat template is not prefix-stable here: the rendering of the first %zu messages changes "
                     "when more messages follow (first difference at byte %zu)",
                     n_old, FirstDifference(*old, *full));
  }
  if (n_old == history.size() || history[n_old].role != "assistant") {
    out.tail = full->substr(old->size());
    return out;
  }
  // Locate the reply: render with a sentinel in its place; what surrounds it is template text.
  std::vector<ChatMessage> marked = history;
  const std::string sentinel = Sentinel(history);
  marked[n_old].content = sentinel;
  auto with_sentinel = Render(marked, add_generation_prompt, extra);
  if (!with_sentinel.ok()) return with_sentinel.error();
  const std::string& m = *with_sentinel;
  const size_t at = m.find(sentinel, old->size());
  if (m.compare(0, old->size(), *old) != 0 || at == std::string::npos || CountOccurrences(m, sentinel) != 1) {
    return MakeError("chat template does not render the assistant reply (message %zu) exactly once after the "
                     "previous prompt",
                     n_old);
  }
  out.reply_prefix = m.substr(old->size(), at - old->size());
  out.tail = m.substr(at + sentinel.size());
  const size_t head = old->size() + out.reply_prefix.size();
  if (full->size() < head + out.tail.size() || full->compare(0, head, m, 0, head) != 0 ||
      full->compare(full->size() - out.tail.size(), out.tail.size(), out.tail) != 0) {
    return MakeError("chat template renders the text around the assistant reply (message %zu) differently "
                     "depending on the reply",
                     n_old);
  }
  out.reply = full->substr(head, full->size() - head - out.tail.size());
  return out;
}

}  // namespace mnemo
