// Function tools: parsing, checks, rendering, grammar, reply extraction (see tools.h).
#include "server/tools.h"

#include <algorithm>
#include <set>
#include <utility>

#include "grammar/grammar.h"
#include "grammar/json_schema.h"
#include "server/http_util.h"
#include "store/store.h"

namespace mnemo {

using http::Json;
using grammar::OrderedJson;

namespace {

ApiError Bad(const std::string& message, const std::string& param, const std::string& code = "invalid_value") {
  return http::BadRequest(message, param, code);
}

bool ValidName(const std::string& n) {
  if (n.empty() || n.size() > 64) return false;
  for (char c : n) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-') return false;
  }
  return true;
}

// A schema's rule for the SchemaCompiler; checks it compiles alone first (errors name the tool).
std::optional<ApiError> CheckSchema(const OrderedJson& schema, const std::string& param) {
  auto g = grammar::SchemaToGrammar(schema);
  if (!g.ok()) return Bad("Invalid or unsupported JSON Schema in '" + param + "': " + g.error().message, param, "invalid_function_parameters");
  return std::nullopt;
}

// One tool definition; `p` its param path. Chat nests the function in `function`.
std::optional<ApiError> ParseTool(const OrderedJson& t, const std::string& p, bool responses, ToolRequest* out) {
  if (!t.is_object()) return Bad("'" + p + "' must be an object", p, "invalid_type");
  auto type = t.find("type");
  if (type == t.end() || !type->is_string()) return Bad("Missing required parameter: '" + p + ".type'.", p + ".type", "missing_required_parameter");
  if (*type != "function") {
    return Bad("Tools of type '" + type->get<std::string>() + "' are not supported (only 'function')", p + ".type", "unsupported_value");
  }
  const OrderedJson* fn = &t;
  std::string fp = p;
  if (!responses) {
    for (auto it = t.begin(); it != t.end(); ++it) {
      if (it.key() != "type" && it.key() != "function") return Bad("Unrecognized request argument supplied: " + p + "." + it.key(), p + "." + it.key(), "unknown_parameter");
    }
    auto f = t.find("function");
    if (f == t.end()) return Bad("Missing required parameter: '" + p + ".function'.", p + ".function", "missing_required_parameter");
    if (!f->is_object()) return Bad("'" + p + ".function' must be an object", p + ".function", "invalid_type");
    fn = &*f;
    fp = p + ".function";
  }
  for (auto it = fn->begin(); it != fn->end(); ++it) {
    const std::string& k = it.key();
    if (k != "name" && k != "description" && k != "parameters" && k != "strict" && !(responses && k == "type")) {
      return Bad("Unrecognized request argument supplied: " + fp + "." + k, fp + "." + k, "unknown_parameter");
    }
  }
  auto name = fn->find("name");
  if (name == fn->end() || !name->is_string()) return Bad("Missing required parameter: '" + fp + ".name'.", fp + ".name", "missing_required_parameter");
  const std::string n = name->get<std::string>();
  if (!ValidName(n)) return Bad("'" + fp + ".name' must be 1 to 64 letters, digits, '_' or '-'; got '" + n.substr(0, 80) + "'", fp + ".name");
  if (out->Has(n)) return Bad("Duplicate tool name '" + n + "'", fp + ".name");
  auto desc = fn->find("description");
  if (desc != fn->end() && !desc->is_null() && !desc->is_string()) return Bad("'" + fp + ".description' must be a string", fp + ".description", "invalid_type");
  auto strict = fn->find("strict");
  if (strict != fn->end() && !strict->is_null() && !strict->is_boolean()) return Bad("'" + fp + ".strict' must be a boolean", fp + ".strict", "invalid_type");
  OrderedJson params = OrderedJson{{"type", "object"}, {"properties", OrderedJson::object()}};
  auto ps = fn->find("parameters");
  if (ps != fn->end() && !ps->is_null()) {
    if (!ps->is_object()) return Bad("'" + fp + ".parameters' must be a JSON Schema object", fp + ".parameters", "invalid_type");
    if (!ps->empty()) params = *ps;
    if (auto e = CheckSchema(params, fp + ".parameters")) return e;
  }
  out->tools.push_back({n, params});
  OrderedJson f = {{"name", n}};
  if (desc != fn->end() && desc->is_string()) f["description"] = *desc;
  f["parameters"] = params;
  out->chat_tools.push_back(OrderedJson{{"type", "function"}, {"function", f}});
  return std::nullopt;
}

}  // namespace

bool ToolRequest::Has(const std::string& name) const {
  for (const Tool& t : tools) {
    if (t.name == name) return true;
  }
  return false;
}

bool ToolRequest::Callable(const std::string& name) const {
  if (!Has(name)) return false;
  if (choice == ToolChoice::kNamed) return name == named;
  return allowed.empty() || std::find(allowed.begin(), allowed.end(), name) != allowed.end();
}

namespace {

// tool_choice {type: "allowed_tools", ...}: chat nests {mode, tools} in `allowed_tools`, each tool
// {type: "function", function: {name}}; Responses has them at the top, each {type: "function", name}.
std::optional<ApiError> ParseAllowedTools(const Json& c, bool responses, ToolRequest* out) {
  const Json* holder = &c;
  std::string hp = "tool_choice";
  if (!responses) {
    if (!c.contains("allowed_tools") || !c["allowed_tools"].is_object()) {
      return Bad("Missing required parameter: 'tool_choice.allowed_tools'.", "tool_choice.allowed_tools", "missing_required_parameter");
    }
    holder = &c["allowed_tools"];
    hp = "tool_choice.allowed_tools";
  }
  const Json& h = *holder;
  if (!h.contains("mode") || !h["mode"].is_string()) {
    return Bad("Missing required parameter: '" + hp + ".mode'.", hp + ".mode", "missing_required_parameter");
  }
  const std::string mode = h["mode"].get<std::string>();
  if (mode != "auto" && mode != "required") {
    return Bad("'" + hp + ".mode' must be 'auto' or 'required'; got '" + mode.substr(0, 80) + "'", hp + ".mode");
  }
  if (!h.contains("tools") || !h["tools"].is_array() || h["tools"].empty()) {
    return Bad("'" + hp + ".tools' must be a non-empty array of tools", hp + ".tools", "invalid_type");
  }
  for (size_t i = 0; i < h["tools"].size(); ++i) {
    const Json& t = h["tools"][i];
    const std::string tp = hp + ".tools[" + std::to_string(i) + "]";
    if (!t.is_object() || !t.contains("type") || t["type"] != "function") {
      return Bad("'" + tp + ".type' must be 'function' (only function tools are supported)", tp + ".type", "unsupported_value");
    }
    const Json* fn = &t;
    std::string np = tp + ".name";
    if (!responses || t.contains("function")) {
      if (!t.contains("function") || !t["function"].is_object()) return Bad("Missing required parameter: '" + tp + ".function'.", tp + ".function", "missing_required_parameter");
      fn = &t["function"];
      np = tp + ".function.name";
    }
    if (!fn->contains("name") || !(*fn)["name"].is_string()) return Bad("Missing required parameter: '" + np + "'.", np, "missing_required_parameter");
    const std::string name = (*fn)["name"].get<std::string>();
    if (!out->Has(name)) return Bad("tool_choice allows function '" + name.substr(0, 80) + "', which is not in 'tools'", np);
    out->allowed.push_back(name);
  }
  out->choice = mode == "required" ? ToolChoice::kRequired : ToolChoice::kAuto;
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> ParseTools(const Json& body, const std::string& raw_body, bool responses, ToolRequest* out) {
  if (!http::Absent(body, "parallel_tool_calls")) out->parallel = body["parallel_tool_calls"].get<bool>();
  if (!http::Absent(body, "tools") && !body["tools"].empty()) {
    // The body again with member order kept: schema properties are generated in their order.
    const OrderedJson ordered = OrderedJson::parse(raw_body, nullptr, false);
    if (!ordered.is_object() || !ordered["tools"].is_array()) return Bad("'tools' must be an array", "tools", "invalid_type");
    const OrderedJson& tools = ordered["tools"];
    if (tools.size() > 128) return Bad("'tools' may hold at most 128 tools", "tools");
    for (size_t i = 0; i < tools.size(); ++i) {
      if (auto e = ParseTool(tools[i], "tools[" + std::to_string(i) + "]", responses, out)) return e;
    }
  }
  if (http::Absent(body, "tool_choice")) return std::nullopt;
  const Json& c = body["tool_choice"];
  if (c.is_string()) {
    const std::string s = c.get<std::string>();
    if (s == "none") out->choice = ToolChoice::kNone;
    else if (s == "auto") out->choice = ToolChoice::kAuto;
    else if (s == "required") out->choice = ToolChoice::kRequired;
    else return Bad("'tool_choice' must be 'none', 'auto', 'required' or a function; got '" + s.substr(0, 80) + "'", "tool_choice");
  } else if (c.contains("type") && c["type"] == "allowed_tools") {
    if (auto e = ParseAllowedTools(c, responses, out)) return e;
  } else {
    if (!c.contains("type") || c["type"] != "function") {
      return Bad("'tool_choice.type' must be 'function' or 'allowed_tools'", "tool_choice.type",
                 c.contains("type") ? "unsupported_value" : "missing_required_parameter");
    }
    const Json* holder = &c;
    std::string hp = "tool_choice";
    if (!responses || c.contains("function")) {
      if (!c.contains("function") || !c["function"].is_object()) return Bad("Missing required parameter: 'tool_choice.function'.", "tool_choice.function", "missing_required_parameter");
      holder = &c["function"];
      hp = "tool_choice.function";
    }
    if (!holder->contains("name") || !(*holder)["name"].is_string()) return Bad("Missing required parameter: '" + hp + ".name'.", hp + ".name", "missing_required_parameter");
    out->named = (*holder)["name"].get<std::string>();
    out->choice = ToolChoice::kNamed;
    if (!out->Has(out->named)) return Bad("tool_choice names function '" + out->named.substr(0, 80) + "', which is not in 'tools'", hp + ".name");
  }
  if (out->choice == ToolChoice::kRequired && out->tools.empty()) {
    return Bad("tool_choice 'required' needs at least one tool in 'tools'", "tool_choice");
  }
  return std::nullopt;
}

std::optional<ApiError> CheckToolHistory(std::vector<ChatMessage>* messages, const std::string& param) {
  for (size_t i = 0; i < messages->size(); ++i) {
    ChatMessage& m = (*messages)[i];
    if (m.role != "tool") continue;
    const std::string p = param + "[" + std::to_string(i) + "]";
    bool found = false;
    for (size_t j = i; j-- > 0 && !found;) {
      for (const ChatToolCall& c : (*messages)[j].tool_calls) {
        if (c.id != m.tool_call_id) continue;
        found = true;
        if (m.name.empty()) m.name = c.name;
        break;
      }
    }
    if (!found) {
      return Bad("Invalid parameter: messages with role 'tool' must be a response to a preceeding message with "
                 "'tool_calls'; no earlier call has id '" + m.tool_call_id.substr(0, 80) + "'",
                 p + (param == "messages" ? ".tool_call_id" : ".call_id"));
    }
  }
  return std::nullopt;
}

Result<std::string> ToolCallGrammar(ToolFormat f, const ToolRequest& tools) {
  grammar::SchemaCompiler c;
  std::string calls;
  int k = 0;
  for (const ToolRequest::Tool& t : tools.tools) {
    if (!tools.Callable(t.name)) continue;
    const std::string args = "args-" + std::to_string(k);
    MNEMO_TRY(c.Add(args, t.parameters));
    const std::string text = ToolCallText(f, t.name, "\x01");
    const size_t cut = text.find('\x01');
    const std::string rule = "call-" + std::to_string(k++);
    calls += rule + " ::= " + grammar::Literal(text.substr(0, cut)) + " " + args + " " + grammar::Literal(text.substr(cut + 1)) + "\n";
  }
  if (k == 0) return Error{"no tool to call"};
  std::string any = "call ::=";
  for (int i = 0; i < k; ++i) any += (i ? " | call-" : " call-") + std::to_string(i);
  const ToolCallFrame fr = ToolCallFraming(f);
  const bool many = tools.parallel && f != ToolFormat::kLlama3;
  std::string root = "root ::= " + grammar::Literal(fr.open) + " call " +
                     (many ? "( " + grammar::Literal(fr.sep) + " call ){0,3} " : "") + grammar::Literal(fr.close) + "\n";
  // Arguments without whitespace: what the client gets back is what the history renders, exactly.
  std::string schema = c.Text();
  std::string out;
  size_t at = 0;
  while (at < schema.size()) {
    size_t nl = schema.find('\n', at);
    if (nl == std::string::npos) nl = schema.size();
    const std::string line = schema.substr(at, nl - at);
    out += line.rfind("ws ::= ", 0) == 0 ? "ws ::= \"\"" : line;
    out += "\n";
    at = nl + 1;
  }
  return root + any + "\n" + calls + out;
}

void PrepareToolMessages(const ServedModel& model, std::vector<ChatMessage>* messages) {
  const ChatTemplate& t = model.chat_template();
  bool has_tool_messages = false;
  for (const ChatMessage& m : *messages) has_tool_messages = has_tool_messages || m.role == "tool" || !m.tool_calls.empty();
  if (!has_tool_messages) return;
  if (!TemplateRendersTools(t)) {
    *messages = GenericToolMessages(*messages, t.family() == "fallback" ? "tool" : "user");
  } else if (DetectToolFormat(t) == ToolFormat::kMistral) {
    MistralToolIds(messages);
  }
}

std::string PrefixRules(const std::string& text, const std::string& prefix) {
  auto name_char = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-'; };
  std::string out;
  out.reserve(text.size() + text.size() / 8);
  size_t i = 0;
  // Copies text[i] up to and including the unescaped `close`.
  auto quoted = [&](char close) {
    out += text[i++];
    while (i < text.size() && text[i] != close) {
      if (text[i] == '\\' && i + 1 < text.size()) out += text[i++];
      out += text[i++];
    }
    if (i < text.size()) out += text[i++];
  };
  while (i < text.size()) {
    const char c = text[i];
    if (c == '"') {
      quoted('"');
    } else if (c == '[') {
      quoted(']');
    } else if (c == '{') {  // a repetition's bounds
      quoted('}');
    } else if (c == '#') {
      while (i < text.size() && text[i] != '\n') out += text[i++];
    } else if (name_char(c)) {
      out += prefix;
      while (i < text.size() && name_char(text[i])) out += text[i++];
    } else {
      out += text[i++];
    }
  }
  return out;
}

std::optional<ApiError> ApplyTools(ServedModel& model, const ToolRequest& tools, TurnSpec* spec,
                                   std::optional<std::string>* instructions, const std::string& format_text) {
  const ChatTemplate& t = model.chat_template();
  const bool native = TemplateRendersTools(t);
  const ToolFormat f = DetectToolFormat(t);
  PrepareToolMessages(model, &spec->messages);
  if (native) {
    if (!tools.tools.empty()) {
      auto extra = std::make_shared<jinja::Dict>();
      extra->Set("tools", jinja::Value::FromJson(tools.chat_tools));
      spec->template_extra = std::move(extra);
    }
  } else {
    if (!tools.tools.empty()) {
      const std::string block = GenericToolsPrompt(tools.chat_tools.dump());
      if (instructions) {
        *instructions = *instructions ? **instructions + "\n\n" + block : block;
      } else if (!spec->messages.empty() && spec->messages[0].role == "system") {
        spec->messages[0].content += "\n\n" + block;
      } else {
        spec->messages.insert(spec->messages.begin(), ChatMessage{"system", block});
        if (!spec->pinned.empty()) spec->pinned.insert(spec->pinned.begin(), false);
        if (spec->hint.reply_message >= 0) spec->hint.reply_message++;
      }
    }
  }
  const bool forced = tools.choice == ToolChoice::kRequired || tools.choice == ToolChoice::kNamed;
  // Under auto, stop strings apply to the text but not from a call's opener on: a stop such as
  // LangChain's "\n" would cut the call, which then parses as nothing.
  if (tools.choice == ToolChoice::kAuto && tools.parse()) spec->request.call_start = CallOpeners(f);
  if (tools.choice == ToolChoice::kAuto && !tools.tools.empty() && !format_text.empty()) {
    // Calls or the format's JSON: OpenAI's agents answer in the format after their calls; a
    // format grammar alone would never let a call out.
    auto calls = ToolCallGrammar(f, tools);
    if (!calls.ok()) return Bad("Cannot build the tool-call grammar: " + calls.error().message, "tools", "invalid_function_parameters");
    const std::string text = "root ::= format-root | calls-root\n" + PrefixRules(format_text, "format-") + "\n" +
                             PrefixRules(*calls, "calls-");
    auto a = model.Grammar(text);
    if (!a.ok()) return Bad("Cannot compile the tool-call grammar: " + a.error().message, "tools", "invalid_function_parameters");
    spec->request.grammar = std::move(*a);
    return std::nullopt;
  }
  if (!forced) return std::nullopt;
  if (spec->request.grammar && format_text.empty()) {
    return Bad("tool_choice 'required' or a named function cannot be combined with a grammar", "tool_choice");
  }
  // The grammar ends the reply; a stop string matching inside the call syntax (LangChain agents'
  // "\n", a "}") could only cut the call, which then parses as nothing.
  spec->request.stop.clear();
  auto text = ToolCallGrammar(f, tools);
  if (!text.ok()) return Bad("Cannot build the tool-call grammar: " + text.error().message, "tools", "invalid_function_parameters");
  auto a = model.Grammar(*text);
  if (!a.ok()) return Bad("Cannot compile the tool-call grammar: " + a.error().message, "tools", "invalid_function_parameters");
  spec->request.grammar = std::move(*a);
  return std::nullopt;
}

ToolReply ToolReplyFromText(ToolFormat f, const ToolRequest& tools, std::string_view raw) {
  ToolReply out{std::string(raw), {}};
  if (!tools.parse()) return out;
  ParsedToolCalls p = ParseToolCalls(f, raw);
  for (ChatToolCall& c : p.calls) {
    if (!tools.Callable(c.name)) continue;  // a call of no offered (or allowed) tool stays text
    if (!tools.parallel && !out.calls.empty()) break;
    c.id = NewId("call_");
    out.calls.push_back(std::move(c));
  }
  if (!out.calls.empty()) {
    out.content = p.content;
    // The parse trims the text around the calls; the reply's leading whitespace stays with text
    // (ToolHold streams it before it can know a call follows): streamed and whole replies agree,
    // and a client sending either back continues the session.
    const size_t lead = raw.find_first_not_of(" \n\t\r");
    if (!out.content.empty() && lead != std::string_view::npos && lead > 0 &&
        raw.substr(lead, out.content.size()) == out.content) {
      out.content.insert(0, raw.substr(0, lead));
    }
  } else if (p.calls.empty() && p.content.size() != raw.size()) {
    out.content = p.content;  // cut-off markup dropped
  }  // else every call named a tool not offered (or not allowed): the reply stays text, calls included
  // Under required / a named tool the grammar made the whole reply call syntax: nothing in it is
  // content, not even a call cut off by max_tokens.
  if (tools.choice == ToolChoice::kRequired || tools.choice == ToolChoice::kNamed) out.content.clear();
  return out;
}

ToolReply ExtractToolCalls(const ServedModel& model, const ToolRequest& tools, const TurnResult& r) {
  if (!tools.parse()) return ToolReply{r.text, {}};
  // The text with control tokens written out (<|python_tag|>, [TOOL_CALLS]); the final
  // end-of-generation token left out.
  const Tokenizer& tok = model.tokenizer();
  std::string raw = r.text;
  bool control = false;
  for (int32_t id : r.tokens) control = control || (tok.IsControl(id) && !tok.IsEog(id));
  if (control) {
    std::vector<int32_t> ids = r.tokens;
    while (!ids.empty() && tok.IsEog(ids.back())) ids.pop_back();
    raw = tok.Decode(ids, /*skip_special=*/false);
  }
  return ToolReplyFromText(DetectToolFormat(model.chat_template()), tools, raw);
}

CallStart CallOpeners(ToolFormat f) {
  CallStart o;
  o.control_token = true;  // <|python_tag|>, [TOOL_CALLS] where the vocab marks them as control
  switch (f) {
    case ToolFormat::kHermes:
    case ToolFormat::kGeneric: o.anywhere = {"<tool_call>"}; break;
    case ToolFormat::kLlama3:
      o.at_start = {"{"};
      o.anywhere = {"<|python_tag|>"};  // a tokenizer that does not mark it as control
      break;
    case ToolFormat::kMistral:
      o.at_start = {"["};
      o.anywhere = {"[TOOL_CALLS]"};
      break;
  }
  return o;
}

ToolHold::ToolHold(const ServedModel& model, const ToolRequest& tools) : tok_(&model.tokenizer()), tools_(&tools) {
  if (!tools.parse()) return;
  active_ = true;
  format_ = DetectToolFormat(model.chat_template());
  if (tools.choice != ToolChoice::kAuto) {
    holding_ = true;
    return;
  }
  CallStart o = CallOpeners(format_);
  start_openers_ = std::move(o.at_start);
  openers_ = std::move(o.anywhere);
}

std::string ToolHold::Feed(int32_t token, const std::string& text) {
  if (!active_) {
    released_ += text;
    return text;
  }
  const bool control = tok_->IsControl(token) && !tok_->IsEog(token);  // a marker the text does not show
  if (holding_) {
    held_ += control ? tok_->TokenToPiece(token, /*special=*/true) : text;
    return "";
  }
  auto is_space = [](char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; };
  auto release = [&](size_t n) {
    std::string out = pending_.substr(0, n);
    pending_.erase(0, n);
    released_ += out;
    return out;
  };
  // The text before a call goes out without the whitespace it ends with, as the whole reply's
  // parse trims it: what a client streamed and sends back is then what a non-streamed reply said,
  // and the history renders as generated (with "Let me check.\n" the session forked at the reply).
  auto release_before_call = [&](size_t n) {
    while (n > 0 && is_space(pending_[n - 1])) --n;
    return release(n);
  };
  if (control) {  // <|python_tag|>, [TOOL_CALLS]: a call follows
    std::string out = release_before_call(pending_.size());
    holding_ = true;
    held_ = pending_ + tok_->TokenToPiece(token, /*special=*/true);
    pending_.clear();
    return out;
  }
  pending_ += text;
  if (released_.find_first_not_of(" \n\t\r") == std::string::npos) {
    // Nothing but whitespace so far: a start opener may still come.
    size_t b = 0;
    while (b < pending_.size() && is_space(pending_[b])) ++b;
    const std::string_view s = std::string_view(pending_).substr(b);
    if (s.empty()) return "";
    for (const std::string& o : start_openers_) {
      if (s.size() >= o.size() ? s.compare(0, o.size(), o) == 0 : o.compare(0, s.size(), s) == 0) {
        if (s.size() >= o.size()) {
          holding_ = true;
          held_ = pending_;
          pending_.clear();
        }
        return "";
      }
    }
  }
  // An opener anywhere: the text before it goes out, the rest is held.
  for (const std::string& o : openers_) {
    const size_t at = pending_.find(o);
    if (at == std::string::npos) continue;
    std::string out = release_before_call(at);
    holding_ = true;
    held_ = std::move(pending_);
    pending_.clear();
    return out;
  }
  // Keep back the longest tail that may begin an opener, and the whitespace before it (a call may
  // follow that).
  size_t keep = 0;
  for (const std::string& o : openers_) {
    for (size_t k = std::min(o.size() - 1, pending_.size()); k > keep; --k) {
      if (pending_.compare(pending_.size() - k, k, o, 0, k) == 0) {
        keep = k;
        break;
      }
    }
  }
  while (keep < pending_.size() && is_space(pending_[pending_.size() - 1 - keep])) ++keep;
  return release(pending_.size() - keep);
}

ToolReply ToolHold::End() {
  if (!active_) return ToolReply{std::exchange(pending_, {}), {}};
  ToolReply out = ToolReplyFromText(format_, *tools_, pending_ + held_);
  pending_.clear();
  held_.clear();
  return out;
}

CallStream::CallStream(ToolFormat f) {
  const std::string t = ToolCallText(f, "N", "\x01");
  const size_t at = t.find("\"N\"");
  name_prefix_ = t.substr(0, at);
  mid_ = t.substr(at + 3, t.find('\x01') - at - 3);
}

std::vector<Json> CallStream::Feed(const std::string& text) {
  text_ += text;
  std::vector<Json> out;
  // Bytes [from, to) of the arguments, up to the last whole UTF-8 character.
  auto send = [&](size_t to) {
    while (to > sent_ && to < text_.size() && (static_cast<unsigned char>(text_[to]) & 0xC0) == 0x80) --to;
    if (to > sent_) {
      begun_.back().arguments += text_.substr(sent_, to - sent_);
      out.push_back({{"index", calls_}, {"function", {{"arguments", text_.substr(sent_, to - sent_)}}}});
      sent_ = to;
    }
  };
  for (;;) {
    if (!in_args_) {
      const size_t i = text_.find(name_prefix_, pos_);
      if (i == std::string::npos) return out;
      const size_t ns = i + name_prefix_.size();
      const size_t ne = JsonValueEnd(text_, ns);
      if (ne == std::string::npos || ne + mid_.size() > text_.size()) return out;
      auto name = Json::parse(text_.substr(ns, ne - ns), nullptr, false);
      if (!name.is_string() || text_.compare(ne, mid_.size(), mid_) != 0) return out;  // not the grammar's shape
      begun_.push_back(ChatToolCall{NewId("call_"), name.get<std::string>(), ""});
      out.push_back({{"index", calls_}, {"id", begun_.back().id}, {"type", "function"},
                     {"function", {{"name", begun_.back().name}, {"arguments", ""}}}});
      in_args_ = true;
      args_start_ = sent_ = ne + mid_.size();
    }
    if (args_start_ >= text_.size()) return out;
    const char c = text_[args_start_];
    size_t end = JsonValueEnd(text_, args_start_);
    // A scalar's end is known only once a byte follows it.
    if (c != '{' && c != '[' && c != '"' && end == text_.size()) end = std::string::npos;
    if (end == std::string::npos) {
      send(text_.size());
      return out;
    }
    send(end);
    in_args_ = false;
    pos_ = end;
    calls_++;
  }
}

Json ToolCallsJson(const std::vector<ChatToolCall>& calls) {
  Json a = Json::array();
  for (const ChatToolCall& c : calls) {
    a.push_back({{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
  }
  return a;
}

std::vector<std::string> Utf8Pieces(const std::string& text, size_t n) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at < text.size()) {
    size_t end = std::min(text.size(), at + n);
    while (end < text.size() && end > at + 1 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
    out.push_back(text.substr(at, end - at));
    at = end;
  }
  return out;
}

}  // namespace mnemo
