// Tool-call syntaxes per model family: detection, call text, parsing (see tool_calls.h).
#include "chat/tool_calls.h"

#include <initializer_list>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

namespace mnemo {
namespace {

bool IsSpace(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

size_t SkipSpace(std::string_view s, size_t i) {
  while (i < s.size() && IsSpace(s[i])) ++i;
  return i;
}

std::string Trim(std::string_view s) {
  size_t b = SkipSpace(s, 0), e = s.size();
  while (e > b && IsSpace(s[e - 1])) --e;
  return std::string(s.substr(b, e - b));
}

// One call from the JSON object text `obj`: {"name": ..., "arguments" | "parameters": ...}, the
// arguments kept verbatim (the bytes the model wrote, so that the history renders them back
// exactly). A string-valued arguments member holding JSON text (some models write that) is
// unwrapped. nullopt when `obj` is not such an object.
std::optional<ChatToolCall> CallFromObject(std::string_view obj) {
  size_t i = SkipSpace(obj, 0);
  if (i >= obj.size() || obj[i] != '{') return std::nullopt;
  i = SkipSpace(obj, i + 1);
  std::optional<std::string> name;
  std::optional<std::string> args;
  while (i < obj.size() && obj[i] != '}') {
    const size_t kend = JsonValueEnd(obj, i);
    if (obj[i] != '"' || kend == std::string_view::npos) return std::nullopt;
    auto key = nlohmann::json::parse(obj.substr(i, kend - i), nullptr, false);
    if (!key.is_string()) return std::nullopt;
    i = SkipSpace(obj, kend);
    if (i >= obj.size() || obj[i] != ':') return std::nullopt;
    i = SkipSpace(obj, i + 1);
    const size_t vend = JsonValueEnd(obj, i);
    if (vend == std::string_view::npos) return std::nullopt;
    const std::string_view raw = obj.substr(i, vend - i);
    auto value = nlohmann::json::parse(raw, nullptr, false);
    if (value.is_discarded()) return std::nullopt;
    const std::string k = key.get<std::string>();
    if (k == "name" && value.is_string()) name = value.get<std::string>();
    if (k == "arguments" || k == "parameters") {
      if (value.is_string()) {
        auto inner = nlohmann::json::parse(value.get<std::string>(), nullptr, false);
        args = inner.is_object() ? value.get<std::string>() : std::string(raw);
      } else {
        args = std::string(raw);
      }
    }
    i = SkipSpace(obj, vend);
    if (i < obj.size() && obj[i] == ',') i = SkipSpace(obj, i + 1);
  }
  if (i >= obj.size() || !name || name->empty()) return std::nullopt;
  return ChatToolCall{"", *name, args.value_or("{}")};
}

// `tail` without a trailing cut-off tag: the output ended inside one of `tags` (its last '<' starts
// a proper prefix of a tag), e.g. "</t" of "</tool_call>".
std::string_view DropPartialTag(std::string_view tail, std::initializer_list<std::string_view> tags) {
  const size_t lt = tail.rfind('<');
  if (lt == std::string_view::npos) return tail;
  const std::string_view rest = tail.substr(lt);
  for (std::string_view tag : tags) {
    if (rest.size() < tag.size() && tag.substr(0, rest.size()) == rest) return tail.substr(0, lt);
  }
  return tail;
}

// kHermes / kGeneric: <tool_call> {...} </tool_call>, repeated, anywhere in the text.
ParsedToolCalls ParseTagged(std::string_view text) {
  static constexpr std::string_view kOpen = "<tool_call>", kClose = "</tool_call>";
  ParsedToolCalls out;
  std::string content;
  size_t at = 0;
  bool cut = false;  // the output ended inside a call: that call is dropped
  while (at <= text.size()) {
    const size_t open = text.find(kOpen, at);
    if (open == std::string_view::npos) break;
    const size_t body = SkipSpace(text, open + kOpen.size());
    const size_t end = JsonValueEnd(text, body);
    if (end == std::string_view::npos) {
      content += text.substr(at, open - at);
      at = text.size();
      cut = true;
      break;
    }
    auto call = CallFromObject(text.substr(body, end - body));
    if (!call) break;
    content += text.substr(at, open - at);
    out.calls.push_back(std::move(*call));
    size_t next = SkipSpace(text, end);
    if (text.substr(next, kClose.size()) == kClose) next += kClose.size();
    at = next;
  }
  content += DropPartialTag(text.substr(std::min(at, text.size())), {kOpen, kClose});
  if (out.calls.empty() && !cut && content.size() == text.size()) return ParsedToolCalls{std::string(text), {}};
  out.content = out.calls.empty() ? content : Trim(content);
  return out;
}

// kLlama3: [<|python_tag|>] {...} [; {...}]*: the whole reply (after leading space), or after
// text from a <|python_tag|> on.
ParsedToolCalls ParseLlama3(std::string_view text) {
  static constexpr std::string_view kTag = "<|python_tag|>";
  size_t i = SkipSpace(text, 0);
  size_t from = 0;  // where the calls start: the content is the text before
  if (text.substr(i, kTag.size()) != kTag) {
    const size_t tag = text.find(kTag);
    if (tag != std::string_view::npos) from = i = tag;
  }
  if (text.substr(i, kTag.size()) == kTag) i = SkipSpace(text, i + kTag.size());
  ParsedToolCalls out;
  while (i < text.size() && text[i] == '{') {
    const size_t end = JsonValueEnd(text, i);
    if (end == std::string_view::npos) break;
    auto call = CallFromObject(text.substr(i, end - i));
    if (!call) break;
    out.calls.push_back(std::move(*call));
    i = SkipSpace(text, end);
    if (i < text.size() && text[i] == ';') i = SkipSpace(text, i + 1);
  }
  if (out.calls.empty()) return ParsedToolCalls{std::string(text), {}};
  out.content = Trim(std::string(text.substr(0, from)) + std::string(text.substr(std::min(i, text.size()))));
  return out;
}

// kMistral: [content] [TOOL_CALLS] [{...}, ...]; a bare leading array counts too.
ParsedToolCalls ParseMistral(std::string_view text) {
  static constexpr std::string_view kTag = "[TOOL_CALLS]";
  size_t tag = text.find(kTag);
  size_t i;
  if (tag != std::string_view::npos) {
    i = SkipSpace(text, tag + kTag.size());
  } else {
    tag = i = SkipSpace(text, 0);
  }
  if (i >= text.size() || text[i] != '[') return ParsedToolCalls{std::string(text), {}};
  const size_t end = JsonValueEnd(text, i);
  if (end == std::string_view::npos) return ParsedToolCalls{std::string(text), {}};
  ParsedToolCalls out;
  size_t j = SkipSpace(text, i + 1);
  while (j < end - 1) {
    const size_t e = JsonValueEnd(text, j);
    if (e == std::string_view::npos || e > end) return ParsedToolCalls{std::string(text), {}};
    auto call = CallFromObject(text.substr(j, e - j));
    if (!call) return ParsedToolCalls{std::string(text), {}};
    out.calls.push_back(std::move(*call));
    j = SkipSpace(text, e);
    if (j < end && text[j] == ',') j = SkipSpace(text, j + 1);
  }
  if (out.calls.empty()) return ParsedToolCalls{std::string(text), {}};
  out.content = Trim(std::string(text.substr(0, tag)) + std::string(text.substr(end)));
  return out;
}

}  // namespace

const char* ToolFormatName(ToolFormat f) {
  switch (f) {
    case ToolFormat::kHermes: return "hermes";
    case ToolFormat::kLlama3: return "llama3";
    case ToolFormat::kMistral: return "mistral";
    case ToolFormat::kGeneric: return "generic";
  }
  return "generic";
}

bool TemplateRendersTools(const ChatTemplate& t) {
  const std::string& s = t.source();
  return t.family() != "fallback" && s.find("tools") != std::string::npos && s.find("tool_call") != std::string::npos;
}

ToolFormat DetectToolFormat(const ChatTemplate& t) {
  const std::string& s = t.source();
  if (!TemplateRendersTools(t)) return ToolFormat::kGeneric;
  if (s.find("<tool_call>") != std::string::npos) return ToolFormat::kHermes;
  if (s.find("[TOOL_CALLS]") != std::string::npos) return ToolFormat::kMistral;
  if (t.family() == "llama3") return ToolFormat::kLlama3;
  return ToolFormat::kGeneric;
}

ToolCallFrame ToolCallFraming(ToolFormat f) {
  switch (f) {
    case ToolFormat::kHermes:
    case ToolFormat::kGeneric: return {"", "\n", ""};
    case ToolFormat::kLlama3: return {"", "; ", ""};
    case ToolFormat::kMistral: return {"[", ", ", "]"};
  }
  return {"", "\n", ""};
}

std::string ToolCallText(ToolFormat f, const std::string& name, const std::string& arguments) {
  const std::string quoted = nlohmann::json(name).dump();
  switch (f) {
    case ToolFormat::kHermes:
    case ToolFormat::kGeneric:
      return "<tool_call>\n{\"name\": " + quoted + ", \"arguments\": " + arguments + "}\n</tool_call>";
    case ToolFormat::kLlama3: return "{\"name\": " + quoted + ", \"parameters\": " + arguments + "}";
    case ToolFormat::kMistral: return "{\"name\": " + quoted + ", \"arguments\": " + arguments + "}";
  }
  return "";
}

ParsedToolCalls ParseToolCalls(ToolFormat f, std::string_view text) {
  switch (f) {
    case ToolFormat::kHermes:
    case ToolFormat::kGeneric: return ParseTagged(text);
    case ToolFormat::kLlama3: return ParseLlama3(text);
    case ToolFormat::kMistral: return ParseMistral(text);
  }
  return ParsedToolCalls{std::string(text), {}};
}

std::string GenericToolsPrompt(const std::string& tools_json) {
  std::string lines;
  auto tools = nlohmann::ordered_json::parse(tools_json, nullptr, false);
  if (tools.is_array()) {
    for (const auto& t : tools) lines += t.dump() + "\n";
  }
  return "You can call these functions (JSON Schema signatures, one per line):\n" + lines +
         "To call a function, reply with one line per call:\n"
         "<tool_call>\n{\"name\": <function name>, \"arguments\": <arguments object>}\n</tool_call>\n"
         "Function results come back as <tool_response> blocks.";
}

std::vector<ChatMessage> GenericToolMessages(const std::vector<ChatMessage>& messages, const std::string& tool_role) {
  std::vector<ChatMessage> out;
  out.reserve(messages.size());
  for (const ChatMessage& m : messages) {
    if (m.role == "tool") {
      out.push_back(ChatMessage{tool_role, "<tool_response>\n" + m.content + "\n</tool_response>"});
      continue;
    }
    ChatMessage c{m.role, m.content};
    for (size_t i = 0; i < m.tool_calls.size(); ++i) {
      if (!c.content.empty()) c.content += "\n";
      c.content += ToolCallText(ToolFormat::kGeneric, m.tool_calls[i].name, m.tool_calls[i].arguments);
    }
    out.push_back(std::move(c));
  }
  return out;
}

void MistralToolIds(std::vector<ChatMessage>* messages) {
  auto nine = [](const std::string& id) {
    uint64_t h = 1469598103934665603ull;  // FNV-1a: stable across runs and builds
    for (unsigned char c : id) h = (h ^ c) * 1099511628211ull;
    std::string s(9, '0');
    for (char& c : s) {
      c = "0123456789abcdefghijklmnopqrstuvwxyz"[h % 36];
      h /= 36;
    }
    return s;
  };
  for (ChatMessage& m : *messages) {
    for (ChatToolCall& c : m.tool_calls) c.id = nine(c.id);
    if (!m.tool_call_id.empty()) m.tool_call_id = nine(m.tool_call_id);
  }
}

size_t JsonValueEnd(std::string_view s, size_t pos) {
  constexpr size_t npos = std::string_view::npos;
  if (pos >= s.size()) return npos;
  auto string_end = [&](size_t i) -> size_t {  // i at the opening quote
    for (++i; i < s.size(); ++i) {
      if (s[i] == '\\') ++i;
      else if (s[i] == '"') return i + 1;
    }
    return npos;
  };
  const char c = s[pos];
  if (c == '"') return string_end(pos);
  if (c == '{' || c == '[') {
    int depth = 0;
    for (size_t i = pos; i < s.size(); ++i) {
      const char d = s[i];
      if (d == '"') {
        const size_t e = string_end(i);
        if (e == npos) return npos;
        i = e - 1;
      } else if (d == '{' || d == '[') {
        ++depth;
      } else if (d == '}' || d == ']') {
        if (--depth == 0) return i + 1;
      }
    }
    return npos;
  }
  size_t i = pos;
  while (i < s.size() && !IsSpace(s[i]) && s[i] != ',' && s[i] != '}' && s[i] != ']') ++i;
  return i == pos ? npos : i;
}

}  // namespace mnemo
