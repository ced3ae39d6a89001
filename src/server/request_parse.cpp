// Request bodies to calls (request_parse.h): the parse half of the chat, completions and responses
// handlers (chat_api.cpp, responses_api.cpp).
#include "server/request_parse.h"

#include <algorithm>
#include <cctype>

#include "server/http_util.h"
#include "server/openai_fields.h"
#include "server/output_format.h"

namespace mnemo {

using http::Json;

namespace {

// Flattens an OpenAI message content (string or array of text parts) to text.
std::optional<std::string> ContentText(const Json& content) {
  if (content.is_string()) return content.get<std::string>();
  if (content.is_null()) return std::string();
  if (!content.is_array()) return std::nullopt;
  std::string text;
  for (const auto& part : content) {
    if (!part.is_object()) return std::nullopt;
    auto t = part.find("text");
    if (t == part.end() || !t->is_string()) return std::nullopt;
    text += t->get<std::string>();
  }
  return text;
}

std::variant<std::vector<ChatMessage>, ApiError> ParseMessages(const Json& body, std::vector<bool>* pinned) {
  auto it = body.find("messages");
  if (it == body.end()) return http::BadRequest("Missing required parameter: 'messages'.", "messages", "missing_required_parameter");
  if (!it->is_array() || it->empty()) return http::BadRequest("'messages' must be a non-empty array", "messages", "invalid_type");
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < it->size(); i++) {
    const Json& m = (*it)[i];
    const std::string p = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return http::BadRequest(p + " must be an object", p, "invalid_type");
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) return http::BadRequest(p + ".role must be a string", p + ".role", "invalid_type");
    std::string r = role->get<std::string>();
    if (r == "developer") r = "system";
    if (r != "system" && r != "user" && r != "assistant" && r != "tool") {
      return http::BadRequest(p + ".role must be one of system, developer, user, assistant, tool; got '" + r + "'", p + ".role", "invalid_value");
    }
    auto content = m.find("content");
    std::optional<std::string> text = content == m.end() ? std::optional<std::string>(std::string()) : ContentText(*content);
    if (!text) return http::BadRequest(p + ".content must be a string or an array of text parts", p + ".content", "invalid_type");
    ChatMessage msg{r, *text};
    if (r == "tool") {
      auto id = m.find("tool_call_id");
      if (id == m.end() || !id->is_string()) {
        return http::BadRequest("Missing required parameter: '" + p + ".tool_call_id'.", p + ".tool_call_id", "missing_required_parameter");
      }
      msg.tool_call_id = id->get<std::string>();
    }
    auto calls = m.find("tool_calls");
    if (calls != m.end() && !calls->is_null()) {
      if (r != "assistant" || !calls->is_array()) {
        return http::BadRequest(p + ".tool_calls must be an array on an assistant message", p + ".tool_calls", "invalid_type");
      }
      for (size_t k = 0; k < calls->size(); k++) {
        const Json& c = (*calls)[k];
        const std::string cp = p + ".tool_calls[" + std::to_string(k) + "]";
        const bool ok = c.is_object() && c.contains("id") && c["id"].is_string() && c.contains("function") &&
                        c["function"].is_object() && c["function"].contains("name") && c["function"]["name"].is_string() &&
                        (!c["function"].contains("arguments") || c["function"]["arguments"].is_string());
        if (!ok) {
          return http::BadRequest(cp + " must be {\"id\", \"type\": \"function\", \"function\": {\"name\", \"arguments\": string}}", cp, "invalid_type");
        }
        msg.tool_calls.push_back(ChatToolCall{c["id"].get<std::string>(), c["function"]["name"].get<std::string>(),
                                              c["function"].value("arguments", std::string("{}"))});
      }
    }
    out.push_back(std::move(msg));
    if (!http::Absent(m, "pinned") && !m["pinned"].is_boolean()) {
      return http::BadRequest(p + ".pinned must be a boolean", p + ".pinned", "invalid_type");
    }
    pinned->push_back(http::BoolOr(m, "pinned", false));
  }
  return out;
}

std::optional<std::string> PartsText(const Json& content) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) return std::nullopt;
  std::string text;
  for (const auto& part : content) {
    if (!part.is_object() || !part.contains("text") || !part["text"].is_string()) return std::nullopt;
    text += part["text"].get<std::string>();
  }
  return text;
}

// Ids appear in URL paths (/v1/conversations/{id}/items/{item}), which take these only.
std::optional<ApiError> CopyId(const Json& it, const std::string& p, Json* item) {
  if (http::Absent(it, "id")) return std::nullopt;
  const std::string& id = it["id"].get_ref<const std::string&>();
  const bool ok = !id.empty() && id.size() <= 64 && std::all_of(id.begin(), id.end(), [](char ch) {
    return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '-';
  });
  if (!ok) return http::BadRequest(p + ".id must be 1 to 64 letters, digits, '_' or '-'", p + ".id", "invalid_value");
  (*item)["id"] = id;
  return std::nullopt;
}

// A function_call {call_id, name, arguments} or function_call_output {call_id, output} input item,
// normalized (status and other output-only members dropped).
std::variant<Json, ApiError> ToolItem(const Json& it, const std::string& type, const std::string& p) {
  auto str = [&](const char* k) -> std::optional<ApiError> {
    if (http::Absent(it, k)) return http::BadRequest("Missing required parameter: '" + p + "." + k + "'.", p + "." + k, "missing_required_parameter");
    if (!it[k].is_string()) return http::BadRequest(p + "." + k + " must be a string", p + "." + k, "invalid_type");
    return std::nullopt;
  };
  Json item = {{"type", type}};
  if (auto e = str("call_id")) return *e;
  item["call_id"] = it["call_id"];
  if (type == "function_call") {
    for (const char* k : {"name", "arguments"}) {
      if (auto e = str(k)) return *e;
      item[k] = it[k];
    }
  } else {
    if (http::Absent(it, "output")) return http::BadRequest("Missing required parameter: '" + p + ".output'.", p + ".output", "missing_required_parameter");
    auto text = PartsText(it["output"]);
    if (!text) return http::BadRequest(p + ".output must be a string or an array of text parts", p + ".output", "invalid_type");
    item["output"] = *text;
  }
  if (auto e = CopyId(it, p, &item)) return *e;
  return item;
}

}  // namespace

std::variant<Json, ApiError> InputItems(const Json& input, const std::string& param, const ItemResolver& resolve) {
  Json items = Json::array();
  if (input.is_string()) {
    items.push_back({{"type", "message"}, {"role", "user"},
                     {"content", Json::array({{{"type", "input_text"}, {"text", input.get<std::string>()}}})}});
  } else if (input.is_array()) {
    for (size_t i = 0; i < input.size(); i++) {
      const Json& it = input[i];
      const std::string p = param + "[" + std::to_string(i) + "]";
      if (!it.is_object()) return http::BadRequest(p + " must be an object", p, "invalid_type");
      for (const char* k : {"type", "role", "id"}) {
        if (!http::Absent(it, k) && !it[k].is_string()) {
          return http::BadRequest(p + "." + k + " must be a string", p + "." + k, "invalid_type");
        }
      }
      const std::string type = http::Absent(it, "type") ? "message" : it["type"].get<std::string>();
      if (type == "item_reference" && resolve) {
        if (http::Absent(it, "id")) return http::BadRequest(p + ".id must be a string", p + ".id", "invalid_type");
        auto got = resolve(it["id"].get<std::string>(), p + ".id");
        if (auto* e = std::get_if<ApiError>(&got)) return *e;
        items.push_back(std::move(std::get<Json>(got)));
        continue;
      }
      if (type == "function_call" || type == "function_call_output") {
        auto item = ToolItem(it, type, p);
        if (auto* e = std::get_if<ApiError>(&item)) return *e;
        items.push_back(std::move(std::get<Json>(item)));
        continue;
      }
      if (type != "message") return http::BadRequest(p + ": items of type '" + type + "' are not supported", p + ".type", "unsupported_value");
      if (http::Absent(it, "role")) return http::BadRequest(p + ".role must be a string", p + ".role", "invalid_type");
      const std::string role = it["role"].get<std::string>();
      if (role != "user" && role != "assistant" && role != "system" && role != "developer") {
        return http::BadRequest(p + ".role '" + role + "' is not supported", p + ".role", "invalid_value");
      }
      auto text = http::Absent(it, "content") ? std::optional<std::string>("") : PartsText(it["content"]);
      if (!text) return http::BadRequest(p + ".content must be a string or an array of text parts", p + ".content", "invalid_type");
      const char* part_type = role == "assistant" ? "output_text" : "input_text";
      Json item = {{"type", "message"}, {"role", role},
                   {"content", Json::array({{{"type", part_type}, {"text", *text}}})}};
      if (auto e = CopyId(it, p, &item)) return *e;
      if (!http::Absent(it, "pinned")) {
        if (!it["pinned"].is_boolean()) return http::BadRequest(p + ".pinned must be a boolean", p + ".pinned", "invalid_type");
        item["pinned"] = it["pinned"];
      }
      items.push_back(std::move(item));
    }
  } else {
    return http::BadRequest("'" + param + "' must be a string or an array of items", param, "invalid_type");
  }
  for (auto& it : items) {
    if (!it.contains("id")) it["id"] = NewId(it["type"] == "function_call" ? "fc_" : it["type"] == "function_call_output" ? "fco_" : "msg_");
  }
  return items;
}

void AppendMessages(const Json& items, std::vector<ChatMessage>* out, std::vector<bool>* pinned) {
  for (const auto& it : items) {
    if (!it.is_object()) continue;
    const Json type = http::ValueOr(it, "type", "message");
    if (type == "function_call" && it.value("call_id", Json()).is_string() && it.value("name", Json()).is_string()) {
      // Calls join the assistant message right before them (one reply: its text, then its calls).
      const ChatToolCall call{it["call_id"].get<std::string>(), it["name"].get<std::string>(),
                              it.value("arguments", Json("{}")).is_string() ? it["arguments"].get<std::string>() : "{}"};
      if (out->empty() || out->back().role != "assistant") {
        out->push_back(ChatMessage{"assistant", ""});
        pinned->push_back(false);
      }
      out->back().tool_calls.push_back(call);
      continue;
    }
    if (type == "function_call_output" && it.value("call_id", Json()).is_string()) {
      ChatMessage m{"tool", it.value("output", Json("")).is_string() ? it["output"].get<std::string>() : ""};
      m.tool_call_id = it["call_id"].get<std::string>();
      out->push_back(std::move(m));
      pinned->push_back(false);
      continue;
    }
    if (type != "message") continue;
    const Json role_j = http::ValueOr(it, "role", "user");
    std::string role = role_j.is_string() ? role_j.get<std::string>() : "user";
    if (role == "developer") role = "system";
    auto text = http::Absent(it, "content") ? std::optional<std::string>("") : PartsText(it["content"]);
    out->push_back(ChatMessage{role, text.value_or("")});
    pinned->push_back(http::BoolOr(it, "pinned", false));
  }
}


std::optional<ApiError> CheckMetadata(const Json& m) {
  if (!m.is_object()) return http::BadRequest("'metadata' must be an object of strings", "metadata", "invalid_type");
  if (m.size() > 16) return http::BadRequest("'metadata' may hold at most 16 keys", "metadata", "invalid_value");
  for (auto it = m.begin(); it != m.end(); ++it) {
    if (!it.value().is_string() || it.key().size() > 64 || it.value().get<std::string>().size() > 512) {
      return http::BadRequest("'metadata' values must be strings (keys <= 64, values <= 512 characters)", "metadata", "invalid_value");
    }
  }
  return std::nullopt;
}

ApiResult<ChatCall> ParseChatCompletion(ServedModel& model, const std::string& raw_body, const std::string& owner) {
  auto parsed = http::ParseBody(raw_body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  const Json& body = std::get<Json>(parsed);
  using namespace http;  // FieldType bits
  if (auto e = CheckFields(body, {{"model", kString}, {"messages", kArray}, {"max_tokens", kInteger},
                                  {"max_completion_tokens", kInteger}, {"temperature", kNumber}, {"top_p", kNumber},
                                  {"n", kInteger}, {"stream", kBool}, {"stream_options", kObject},
                                  {"stop", kString | kArray}, {"presence_penalty", kNumber},
                                  {"frequency_penalty", kNumber}, {"seed", kInteger}, {"user", kString},
                                  {"top_k", kInteger}, {"min_p", kNumber}, {"repetition_penalty", kNumber},
                                  {"ignore_eos", kBool}, {"min_tokens", kInteger}, {"metadata", kObject},
                                  {"store", kBool}, {"logprobs", kBool}, {"parallel_tool_calls", kBool},
                                  {"service_tier", kString}, {"context_budget", kNumber}, {"context_mode", kString},
                                  {"context_preset", kString}, {"context_relevance", kString},
                                  {"context_keep_last", kInteger}, {"include", kArray}, {"logit_bias", kObject},
                                  {"top_logprobs", kInteger}, {"tools", kArray}, {"tool_choice", kString | kObject},
                                  {"functions", kArray}, {"function_call", kString | kObject},
                                  {"prompt_cache_key", kString}, {"prompt_cache_retention", kString},
                                  {"prompt_cache_options", kObject}, {"moderation", kObject},
                                  {"safety_identifier", kString},
                                  {"reasoning_effort", kString}, {"verbosity", kString}, {"modalities", kArray},
                                  {"prediction", kObject}, {"audio", kObject}, {"web_search_options", kObject},
                                  {"response_format", kObject}, {"grammar", kString}})) {
    return *e;
  }
  TurnSpec spec;
  auto msgs = ParseMessages(body, &spec.pinned);
  if (auto* e = std::get_if<ApiError>(&msgs)) return *e;
  if (auto e = http::ParseContext(body, &spec.context)) return *e;
  spec.owner = owner;
  spec.messages = std::move(std::get<0>(msgs));
  if (auto e = http::ParseGeneration(body, {"max_completion_tokens", "max_tokens"}, &spec.request)) return *e;
  if (auto e = ParseKnownFields(body, Endpoint::kChat, model.tokenizer().n_vocab(), &spec.request)) return *e;
  std::string format_text;
  if (auto e = ParseOutputFormat(model, body, raw_body, OutputApi::kChat, &spec.request, nullptr, &format_text)) return *e;
  auto tools = std::make_shared<ToolRequest>();
  if (auto e = ParseTools(body, raw_body, /*responses=*/false, tools.get())) return *e;
  if (auto e = CheckToolHistory(&spec.messages, "messages")) return *e;
  if (auto e = ApplyTools(model, *tools, &spec, nullptr, format_text)) return *e;
  const bool stream = BoolOr(body, "stream", false);
  bool include_usage = false;
  if (!Absent(body, "stream_options")) {
    const Json& so = body["stream_options"];
    if (auto e = CheckFields(so, {{"include_usage", kBool}, {"include_obfuscation", kBool}})) {
      e->param = "stream_options." + e->param;
      return *e;
    }
    include_usage = BoolOr(so, "include_usage", false);
  }
  int n = 1;
  if (auto e = ParseChoices(body, &n)) return *e;
  return ChatCall{std::move(spec), std::move(tools), stream, include_usage, n};
}

ApiResult<CompletionCall> ParseCompletion(ServedModel& model, const std::string& raw_body, const std::string& owner) {
  auto parsed = http::ParseBody(raw_body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  const Json& body = std::get<Json>(parsed);
  using namespace http;  // FieldType bits
  if (auto e = CheckFields(body, {{"model", kString}, {"prompt", kString | kArray}, {"max_tokens", kInteger},
                                  {"temperature", kNumber}, {"top_p", kNumber}, {"n", kInteger}, {"stream", kBool},
                                  {"stream_options", kObject}, {"stop", kString | kArray},
                                  {"presence_penalty", kNumber}, {"frequency_penalty", kNumber}, {"seed", kInteger},
                                  {"user", kString}, {"top_k", kInteger}, {"min_p", kNumber},
                                  {"repetition_penalty", kNumber}, {"ignore_eos", kBool}, {"min_tokens", kInteger},
                                  {"echo", kBool}, {"logprobs", kInteger}, {"best_of", kInteger},
                                  {"suffix", kString}, {"logit_bias", kObject}, {"grammar", kString}})) {
    return *e;
  }
  auto p = body.find("prompt");
  if (p == body.end() || p->is_null()) return http::BadRequest("Missing required parameter: 'prompt'.", "prompt", "missing_required_parameter");
  // OpenAI's prompt is a string, an array of strings, an array of token ids or an array of those.
  // An array of strings is that many prompts (LangChain's OpenAI LLM sends every prompt in one,
  // its generate([a, b]) several); token ids are refused, never half-answered.
  std::vector<std::string> prompts;
  if (p->is_array()) {
    if (p->empty()) return BadRequest("'prompt' must be a string or a non-empty array of strings", "prompt", "invalid_type");
    if ((*p)[0].is_number_integer() || (*p)[0].is_array()) {
      return BadRequest("Prompts as token ids are not supported: send the prompt's text", "prompt", "unsupported_value");
    }
    if (p->size() > static_cast<size_t>(kMaxPrompts)) {
      return BadRequest("'prompt' holds " + std::to_string(p->size()) + " prompts; at most " +
                        std::to_string(kMaxPrompts) + " are allowed", "prompt", "invalid_value");
    }
    for (size_t i = 0; i < p->size(); i++) {
      if (!(*p)[i].is_string()) {
        return BadRequest("'prompt' must be a string or an array of strings", "prompt[" + std::to_string(i) + "]", "invalid_type");
      }
      prompts.push_back((*p)[i].get<std::string>());
    }
  } else {
    prompts.push_back(p->get<std::string>());
  }
  TurnSpec spec;
  spec.owner = owner;
  spec.prompt = prompts[0];
  spec.request.max_tokens = 16;  // OpenAI's default for completions
  if (auto e = http::ParseGeneration(body, {"max_tokens"}, &spec.request)) return *e;
  if (auto e = ParseKnownFields(body, Endpoint::kCompletions, model.tokenizer().n_vocab(), &spec.request)) return *e;
  if (auto e = ParseOutputFormat(model, body, raw_body, OutputApi::kCompletions, &spec.request)) return *e;
  if (Absent(body, "max_tokens")) spec.request.max_tokens = 16;
  CompletionCall call;
  call.stream = BoolOr(body, "stream", false);
  if (auto e = ParseChoices(body, &call.n)) return *e;
  if (auto e = ParseBestOf(body, call.n, call.stream, &call.best_of)) return *e;
  // The legacy echo, suffix and logprobs over the prompt: what cannot be done is refused, never
  // ignored.
  call.echo = BoolOr(body, "echo", false);
  if (call.echo && spec.request.logprobs >= 0) {
    return BadRequest("'logprobs' with 'echo' asks for the prompt tokens' logprobs, which mnemo does not compute; "
                      "drop one of them", "logprobs", "unsupported_parameter");
  }
  if (!Absent(body, "suffix") && !body["suffix"].get_ref<const std::string&>().empty()) {
    return BadRequest("suffix is not supported by this model", "suffix", "unsupported_parameter");
  }
  if (prompts.size() > 1 && call.stream) {
    return BadRequest("'stream' with several prompts is not supported: send one request per prompt", "stream",
                      "unsupported_value");
  }
  if (prompts.size() * static_cast<size_t>(call.best_of) > static_cast<size_t>(kMaxPromptChoices)) {
    return BadRequest("'prompt' holds " + std::to_string(prompts.size()) + " prompts of " + std::to_string(call.best_of) +
                      " choices each; at most " + std::to_string(kMaxPromptChoices) + " choices are run per request",
                      "prompt", "invalid_value");
  }
  call.spec = std::move(spec);
  call.prompts = std::move(prompts);
  return call;
}

ApiResult<ResponseCall> ParseResponseRequest(ServedModel& model, const std::string& raw_body, const std::string& owner,
                                             const ItemResolver& resolve) {
  auto parsed = http::ParseBody(raw_body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  ResponseCall call;
  call.body = std::move(std::get<Json>(parsed));
  const Json& body = call.body;
  using namespace http;  // FieldType bits
  if (auto e = CheckFields(body, {{"model", kString}, {"input", kString | kArray}, {"instructions", kString},
                                  {"previous_response_id", kString}, {"conversation", kString | kObject},
                                  {"store", kBool}, {"max_output_tokens", kInteger}, {"temperature", kNumber},
                                  {"top_p", kNumber}, {"truncation", kString}, {"stream", kBool},
                                  {"metadata", kObject}, {"user", kString}, {"seed", kInteger}, {"top_k", kInteger},
                                  {"min_p", kNumber}, {"stop", kString | kArray}, {"presence_penalty", kNumber},
                                  {"frequency_penalty", kNumber}, {"repetition_penalty", kNumber},
                                  {"ignore_eos", kBool}, {"min_tokens", kInteger}, {"parallel_tool_calls", kBool},
                                  {"tool_choice", kString | kObject}, {"tools", kArray}, {"text", kObject},
                                  {"reasoning", kObject}, {"service_tier", kString}, {"context_budget", kNumber},
                                  {"context_mode", kString}, {"context_preset", kString},
                                  {"context_relevance", kString}, {"context_keep_last", kInteger},
                                  {"include", kArray}, {"prompt_cache_key", kString},
                                  {"prompt_cache_retention", kString}, {"context_management", kArray},
                                  {"prompt_cache_options", kObject}, {"moderation", kObject},
                                  {"safety_identifier", kString}, {"background", kBool}, {"stream_options", kObject}, {"top_logprobs", kInteger},
                                  {"max_tool_calls", kInteger}, {"prompt", kObject}, {"grammar", kString}})) {
    return *e;
  }
  if (!Absent(body, "stream_options")) {
    if (auto e = CheckFields(body["stream_options"], {{"include_obfuscation", kBool}})) {
      e->param = "stream_options." + e->param;
      return *e;
    }
  }
  if (Absent(body, "input")) {
    return BadRequest("Missing required parameter: 'input'.", "input", "missing_required_parameter");
  }
  auto items_v = InputItems(body["input"], "input", resolve);
  if (auto* e = std::get_if<ApiError>(&items_v)) return *e;
  call.input_items = std::move(std::get<Json>(items_v));
  call.store = BoolOr(body, "store", true);
  call.truncation = Absent(body, "truncation") ? "disabled" : body["truncation"].get<std::string>();
  if (call.truncation != "disabled" && call.truncation != "auto") {
    return BadRequest("'truncation' must be 'auto' or 'disabled'", "truncation", "invalid_value");
  }
  if (!Absent(body, "metadata")) {
    if (auto e = CheckMetadata(body["metadata"])) return *e;
  }
  TurnSpec& spec = call.spec;
  spec.owner = owner;
  if (auto e = http::ParseGeneration(body, {"max_output_tokens"}, &spec.request)) return *e;
  if (auto e = ParseKnownFields(body, Endpoint::kResponses, model.tokenizer().n_vocab(), &spec.request)) return *e;
  std::string format_text;
  if (auto e = ParseOutputFormat(model, body, raw_body, OutputApi::kResponses, &spec.request, nullptr, &format_text)) return *e;
  if (auto e = http::ParseContext(body, &spec.context)) return *e;
  std::optional<std::string>& instructions = call.instructions;
  if (body.contains("instructions") && body["instructions"].is_string()) instructions = body["instructions"].get<std::string>();
  call.tools = std::make_shared<ToolRequest>();
  if (auto e = ParseTools(body, raw_body, /*responses=*/true, call.tools.get())) return *e;
  // Template variables, the generic tools block (in the instructions) and the grammar; the
  // messages are prepared by the handler (PrepareToolMessages) once the history is known.
  if (auto e = ApplyTools(model, *call.tools, &spec, &instructions, format_text)) return *e;

  // Where the history comes from: a previous response's chain, or a conversation's items.
  std::optional<std::string>& prev_id = call.previous_response_id;
  std::optional<std::string>& conv_id = call.conversation_id;
  if (!Absent(body, "previous_response_id")) prev_id = body["previous_response_id"].get<std::string>();
  if (!Absent(body, "conversation")) {
    const Json& c = body["conversation"];
    if (c.is_string()) conv_id = c.get<std::string>();
    else if (c.is_object() && c.contains("id") && c["id"].is_string()) conv_id = c["id"].get<std::string>();
    else return http::BadRequest("'conversation' must be an id or {\"id\": ...}", "conversation", "invalid_type");
  }
  if (prev_id && conv_id) {
    return http::BadRequest("'previous_response_id' and 'conversation' cannot be used together", "conversation", "invalid_value");
  }
  // Nothing to answer (the renderer's refusal named `messages`, a member Responses does not have).
  if (!prev_id && !conv_id && call.input_items.empty() && Absent(body, "instructions")) {
    return http::BadRequest("'input' must not be empty", "input", "invalid_value");
  }
  spec.chain = !conv_id;  // a previous_response_id chain (or its first turn)
  spec.instructions = instructions;
  call.stream = BoolOr(body, "stream", false);
  return call;
}

}  // namespace mnemo
