// POST /v1/chat/completions and POST /v1/completions.
#include <chrono>

#include "server/api_server.h"
#include "server/http_util.h"
#include "server/request_parse.h"
#include "server/tools.h"

namespace mnemo {

using http::Json;

namespace {

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
  auto parsed = ParseChatCompletion(service_, req.body, owner);
  if (auto* e = std::get_if<ApiError>(&parsed)) return http::SendError(res, *e);
  ChatCall& call = std::get<ChatCall>(parsed);
  TurnSpec& spec = call.spec;
  const std::shared_ptr<ToolRequest> tools = call.tools;
  const bool stream = call.stream;
  const bool include_usage = call.include_usage;
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
  auto parsed = ParseCompletion(service_, req.body, owner);
  if (auto* e = std::get_if<ApiError>(&parsed)) return http::SendError(res, *e);
  TurnSpec& spec = std::get<CompletionCall>(parsed).spec;
  const bool stream = std::get<CompletionCall>(parsed).stream;
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
