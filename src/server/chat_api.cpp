// POST /v1/chat/completions and POST /v1/completions.
#include <chrono>

#include "server/api_server.h"
#include "server/http_util.h"
#include "server/openai_fields.h"
#include "server/output_format.h"
#include "server/tools.h"

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

// The end of a non-streaming turn: commits it; returns the result.
std::variant<TurnResult, ApiError> RunToEnd(Service& service, Metrics& metrics, const StartedTurn& t, TurnResult r,
                                            const std::string& owner) {
  metrics.Turn(r);
  auto c = service.Commit(t, r, std::nullopt, std::nullopt, owner);  // a failed turn is discarded here
  if (r.finish_reason == FinishReason::kError) return ToApiError(r.error);
  if (auto* e = std::get_if<ApiError>(&c)) return *e;
  return r;
}

}  // namespace

void ApiServer::ChatCompletions(const Req& req, Res& res, const std::string& owner) {
  auto parsed = http::ParseBody(req.body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return http::SendError(res, *e);
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
                                  {"prompt_cache_key", kString}, {"safety_identifier", kString},
                                  {"reasoning_effort", kString}, {"verbosity", kString}, {"modalities", kArray},
                                  {"prediction", kObject}, {"audio", kObject}, {"web_search_options", kObject},
                                  {"response_format", kObject}, {"grammar", kString}})) {
    return SendError(res, *e);
  }
  if (BoolOr(body, "logprobs", false)) {
    return SendError(res, BadRequest("logprobs are not supported", "logprobs", "unsupported_parameter"));
  }
  TurnSpec spec;
  auto msgs = ParseMessages(body, &spec.pinned);
  if (auto* e = std::get_if<ApiError>(&msgs)) return http::SendError(res, *e);
  if (auto e = http::ParseContext(body, &spec.context)) return http::SendError(res, *e);
  spec.owner = owner;
  spec.messages = std::move(std::get<0>(msgs));
  if (auto e = http::ParseGeneration(body, {"max_completion_tokens", "max_tokens"}, &spec.request)) {
    return http::SendError(res, *e);
  }
  if (auto e = ParseKnownFields(body, Endpoint::kChat, service_.tokenizer().n_vocab(), &spec.request)) {
    return SendError(res, *e);
  }
  if (auto e = ParseOutputFormat(service_, body, req.body, OutputApi::kChat, &spec.request)) return SendError(res, *e);
  auto tools = std::make_shared<ToolRequest>();
  if (auto e = ParseTools(body, req.body, /*responses=*/false, tools.get())) return SendError(res, *e);
  if (auto e = CheckToolHistory(&spec.messages, "messages")) return SendError(res, *e);
  if (auto e = ApplyTools(service_, *tools, &spec)) return SendError(res, *e);
  const bool stream = BoolOr(body, "stream", false);
  bool include_usage = false;
  if (!Absent(body, "stream_options")) {
    const Json& so = body["stream_options"];
    if (auto e = CheckFields(so, {{"include_usage", kBool}, {"include_obfuscation", kBool}})) {
      e->param = "stream_options." + e->param;
      return SendError(res, *e);
    }
    include_usage = BoolOr(so, "include_usage", false);
  }
  spec.hint.key = req.get_header_value("X-Session-Id");
  auto started = service_.Start(std::move(spec));
  if (auto* e = std::get_if<ApiError>(&started)) return http::SendError(res, *e);
  StartedTurn t = std::get<StartedTurn>(started);
  if (t.context.applied) metrics_.ContextSelection(t.context.dropped_tokens);
  if (t.windowed) metrics_.WindowedTurn();
  const std::string id = NewId("chatcmpl-");
  const int64_t created = http::UnixSeconds();
  const std::string model = service_.config().model_name;
  res.set_header("X-Session-Id", req.get_header_value("X-Session-Id"));

  auto reply = res.Defer();
  if (!stream) {
    return DriveTurn(t.handle, [=, this]() -> bool {
      TurnEvent ev;
      while (t.handle->TryNext(&ev)) {
        if (ev.kind != TurnEvent::kDone) continue;
        auto r = RunToEnd(service_, metrics_, t, std::move(ev.result), owner);
        if (auto* e = std::get_if<ApiError>(&r)) {
          reply->Send(http::ErrorResponse(*e));
          return true;
        }
        const TurnResult& tr = std::get<TurnResult>(r);
        const ToolReply tool = ExtractToolCalls(service_, *tools, tr);
        Json message = {{"role", "assistant"}, {"content", tool.content}};
        std::string finish = FinishReasonName(tr.finish_reason);
        if (!tool.calls.empty()) {
          if (tool.content.empty()) message["content"] = nullptr;
          message["tool_calls"] = ToolCallsJson(tool.calls);
          finish = "tool_calls";
        }
        Json j = {{"id", id},
                  {"object", "chat.completion"},
                  {"created", created},
                  {"model", model},
                  {"choices", Json::array({{{"index", 0},
                                            {"message", std::move(message)},
                                            {"logprobs", nullptr},
                                            {"finish_reason", finish}}})},
                  {"usage", http::ChatUsage(tr)}};
        if (t.context.applied) j["mnemo_context"] = http::ContextJson(t.context);
        reply->Send(http::JsonResponse(j));
        return true;
      }
      return false;
    });
  }

  auto chunk = [=](Json delta, Json finish) {
    return Json{{"id", id},
                {"object", "chat.completion.chunk"},
                {"created", created},
                {"model", model},
                {"choices", Json::array({{{"index", 0}, {"delta", std::move(delta)}, {"logprobs", nullptr},
                                          {"finish_reason", std::move(finish)}}})}};
  };
  // A stream commits to status 200 with its head, so the head waits for the turn's admission.
  Service* service = &service_;
  Metrics* metrics = &metrics_;
  std::shared_ptr<TurnHandle> handle = t.handle;
  reply->OnClose([handle] { handle->Cancel(); });  // the client went away: stop generating
  struct StreamState {
    bool head = false;
    bool alive = true;
    std::chrono::steady_clock::time_point last;
    std::optional<ToolHold> hold;  // across the steps of one stream
    bool forced = false;           // required / a named tool: the reply is calls, streamed as they come
    std::optional<CallStream> calls;
  };
  auto state = std::make_shared<StreamState>();
  state->hold.emplace(*service, *tools);
  state->forced = tools->choice == ToolChoice::kRequired || tools->choice == ToolChoice::kNamed;
  state->calls.emplace(DetectToolFormat(service->chat_template()));
  DriveTurn(t.handle, [=, this]() -> bool {
    auto write = [&](const std::string& s) { return reply->Write(s); };
    bool& alive = state->alive;
    auto& last = state->last;
    if (!state->head) {
      const StreamOpen open = OpenStream(t, owner, *reply, &alive);
      if (open == StreamOpen::kLater) return false;
      if (open == StreamOpen::kFailed) return true;
      state->head = true;
      alive = alive && write(http::SseData(chunk({{"role", "assistant"}, {"content", ""}}, nullptr)));
      last = std::chrono::steady_clock::now();
    }
    TurnEvent ev;
    // Tool calls under auto: text goes out as content until a call opener, the rest is held and
    // sent as tool_calls deltas at the end (ToolHold).
    ToolHold& hold = *state->hold;
    // Under required / a named tool the reply is calls in the grammar's shape: streamed as they
    // are generated.
    const bool forced = state->forced;
    CallStream& calls = *state->calls;
    while (t.handle->TryNext(&ev)) {
      if (ev.kind == TurnEvent::kText) {
        auto now = std::chrono::steady_clock::now();
        metrics->InterToken(std::chrono::duration<double>(now - last).count());
        last = now;
        if (forced) {
          for (Json& d : calls.Feed(ev.text)) {
            if (alive) alive = write(http::SseData(chunk({{"tool_calls", Json::array({std::move(d)})}}, nullptr)));
          }
          if (!alive) t.handle->Cancel();
          continue;
        }
        const std::string out = hold.Feed(ev.token, ev.text);
        if (alive && !out.empty()) alive = write(http::SseData(chunk({{"content", out}}, nullptr)));
        if (!alive) t.handle->Cancel();  // the client went away: stop generating
        continue;
      }
      const TurnResult& r = ev.result;
      metrics->Turn(r);
      auto c = service->Commit(t, r, std::nullopt, std::nullopt, owner);  // durable before the final event
      if (!alive) {
        reply->End();
        return true;
      }
      if (auto* e = std::get_if<ApiError>(&c)) {
        write(http::SseData(Json{{"error", {{"message", e->message}, {"type", e->type}}}}));
      } else if (r.finish_reason == FinishReason::kError) {
        const ApiError e = ToApiError(r.error);
        write(http::SseData(Json{{"error", {{"message", e.message}, {"type", e.type}, {"code", e.code}}}}));
      } else {
        std::string finish = FinishReasonName(r.finish_reason);
        if (forced) {
          if (calls.calls() > 0) finish = "tool_calls";
        } else {
          // The content held back and the calls from the first opener on.
          const ToolReply tool = hold.End();
          if (!tool.calls.empty()) finish = "tool_calls";
          if (!tool.content.empty()) write(http::SseData(chunk({{"content", tool.content}}, nullptr)));
          // As OpenAI streams a call: index, id, type and name with empty arguments, then the
          // arguments in pieces.
          for (size_t k = 0; k < tool.calls.size(); k++) {
            const ChatToolCall& c = tool.calls[k];
            write(http::SseData(chunk({{"tool_calls", Json::array({{{"index", k}, {"id", c.id}, {"type", "function"},
                                                                     {"function", {{"name", c.name}, {"arguments", ""}}}}})}},
                                      nullptr)));
            for (const std::string& piece : Utf8Pieces(c.arguments, 16)) {
              write(http::SseData(chunk({{"tool_calls", Json::array({{{"index", k}, {"function", {{"arguments", piece}}}}})}}, nullptr)));
            }
          }
        }
        Json last = chunk(Json::object(), finish);
        if (t.context.applied) last["mnemo_context"] = http::ContextJson(t.context);
        write(http::SseData(last));
        if (include_usage) {
          Json u = {{"id", id}, {"object", "chat.completion.chunk"}, {"created", created}, {"model", model},
                    {"choices", Json::array()}, {"usage", http::ChatUsage(r)}};
          write(http::SseData(u));
        }
      }
      write("data: [DONE]\n\n");
      reply->End();
      return true;
    }
    return false;
  });
}

void ApiServer::Completions(const Req& req, Res& res, const std::string& owner) {
  auto parsed = http::ParseBody(req.body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return http::SendError(res, *e);
  const Json& body = std::get<Json>(parsed);
  using namespace http;  // FieldType bits
  if (auto e = CheckFields(body, {{"model", kString}, {"prompt", kString}, {"max_tokens", kInteger},
                                  {"temperature", kNumber}, {"top_p", kNumber}, {"n", kInteger}, {"stream", kBool},
                                  {"stream_options", kObject}, {"stop", kString | kArray},
                                  {"presence_penalty", kNumber}, {"frequency_penalty", kNumber}, {"seed", kInteger},
                                  {"user", kString}, {"top_k", kInteger}, {"min_p", kNumber},
                                  {"repetition_penalty", kNumber}, {"ignore_eos", kBool}, {"min_tokens", kInteger},
                                  {"echo", kBool}, {"logprobs", kInteger}, {"best_of", kInteger},
                                  {"suffix", kString}, {"logit_bias", kObject}, {"grammar", kString}})) {
    return SendError(res, *e);
  }
  auto p = body.find("prompt");
  if (p == body.end() || !p->is_string()) {
    return http::SendError(res, http::BadRequest("'prompt' must be a string", "prompt", "invalid_type"));
  }
  TurnSpec spec;
  spec.owner = owner;
  spec.prompt = p->get<std::string>();
  spec.request.max_tokens = 16;  // OpenAI's default for completions
  if (auto e = http::ParseGeneration(body, {"max_tokens"}, &spec.request)) return http::SendError(res, *e);
  if (auto e = ParseKnownFields(body, Endpoint::kCompletions, service_.tokenizer().n_vocab(), &spec.request)) {
    return SendError(res, *e);
  }
  if (auto e = ParseOutputFormat(service_, body, req.body, OutputApi::kCompletions, &spec.request)) return SendError(res, *e);
  if (Absent(body, "max_tokens")) spec.request.max_tokens = 16;
  const bool stream = BoolOr(body, "stream", false);
  spec.hint.key = req.get_header_value("X-Session-Id");
  auto started = service_.Start(std::move(spec));
  if (auto* e = std::get_if<ApiError>(&started)) return http::SendError(res, *e);
  StartedTurn t = std::get<StartedTurn>(started);
  const std::string id = NewId("cmpl-");
  const int64_t created = http::UnixSeconds();
  const std::string model = service_.config().model_name;
  auto object = [=](const std::string& text, Json finish) {
    return Json{{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", model},
                {"choices", Json::array({{{"index", 0}, {"text", text}, {"logprobs", nullptr}, {"finish_reason", finish}}})}};
  };
  auto reply = res.Defer();
  if (!stream) {
    return DriveTurn(t.handle, [=, this]() -> bool {
      TurnEvent ev;
      while (t.handle->TryNext(&ev)) {
        if (ev.kind != TurnEvent::kDone) continue;
        auto r = RunToEnd(service_, metrics_, t, std::move(ev.result), owner);
        if (auto* e = std::get_if<ApiError>(&r)) {
          reply->Send(http::ErrorResponse(*e));
          return true;
        }
        const TurnResult& tr = std::get<TurnResult>(r);
        Json j = object(tr.text, FinishReasonName(tr.finish_reason));
        j["usage"] = http::ChatUsage(tr);
        reply->Send(http::JsonResponse(j));
        return true;
      }
      return false;
    });
  }
  Service* service = &service_;
  Metrics* metrics = &metrics_;
  std::shared_ptr<TurnHandle> handle = t.handle;
  reply->OnClose([handle] { handle->Cancel(); });
  auto head = std::make_shared<bool>(false);
  auto alive = std::make_shared<bool>(true);
  DriveTurn(t.handle, [=, this]() -> bool {
    auto write = [&](const std::string& s) { return reply->Write(s); };
    if (!*head) {
      const StreamOpen open = OpenStream(t, owner, *reply, alive.get());
      if (open == StreamOpen::kLater) return false;
      if (open == StreamOpen::kFailed) return true;
      *head = true;
    }
    TurnEvent ev;
    while (t.handle->TryNext(&ev)) {
      if (ev.kind == TurnEvent::kText) {
        if (*alive && !ev.text.empty()) *alive = write(http::SseData(object(ev.text, nullptr)));
        if (!*alive) t.handle->Cancel();
        continue;
      }
      metrics->Turn(ev.result);
      auto c = service->Commit(t, ev.result, std::nullopt, std::nullopt, owner);
      if (*alive) {
        Json last = object("", FinishReasonName(ev.result.finish_reason));
        last["usage"] = http::ChatUsage(ev.result);
        write(http::SseData(last));
        write("data: [DONE]\n\n");
      }
      reply->End();
      return true;
    }
    return false;
  });
}

}  // namespace mnemo
