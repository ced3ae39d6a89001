// POST /v1/chat/completions and POST /v1/completions.
#include <atomic>
#include <chrono>
#include <mutex>

#include "base/log.h"
#include "server/api_server.h"
#include "server/http_util.h"
#include "server/logprobs_json.h"
#include "server/prompts_reply.h"
#include "server/request_parse.h"
#include "server/tools.h"

namespace mnemo {

using http::Json;

void ApiServer::ChatCompletions(const Req& req, Res& res, const std::string& owner) {
  auto begun = BeginRequest(req, res, owner, "/v1/chat/completions");
  if (!begun) return;  // answered: a retry of a request that ran, or a refused request id
  const Ticket ticket = std::move(*begun);
  auto parsed = ParseChatCompletion(service_, req.body, owner);
  if (auto* e = std::get_if<ApiError>(&parsed)) return http::SendError(res, *e);
  ChatCall& call = std::get<ChatCall>(parsed);
  TurnSpec& spec = call.spec;
  const std::shared_ptr<ToolRequest> tools = call.tools;
  const bool stream = call.stream;
  const bool include_usage = call.include_usage;
  const int n = call.n;
  spec.hint.key = req.get_header_value("X-Session-Id");
  const bool logprobs = spec.request.logprobs >= 0;
  const TurnRequest choice_request = spec.request;
  if (n > 1) AsPrefill(&spec.request);
  auto started = service_.Start(std::move(spec));
  if (auto* e = std::get_if<ApiError>(&started)) return http::SendError(res, *e);
  StartedTurn t = std::get<StartedTurn>(started);
  t.prefill = n > 1;
  if (t.context.applied) metrics_.ContextSelection(t.context.dropped_tokens);
  if (t.windowed) metrics_.WindowedTurn();
  const std::string id = NewId("chatcmpl-");
  const int64_t created = http::UnixSeconds();
  const std::string model = service_.config().model_name;
  const std::string fingerprint = service_.config().system_fingerprint;
  const Tokenizer* tok = &service_.tokenizer();
  const ContextReport context = t.context;
  res.set_header("X-Session-Id", req.get_header_value("X-Session-Id"));
  auto reply = res.Defer();

  // lp: the logprobs of the tokens this chunk's text came from (taken; null without logprobs).
  auto chunk = [=](int index, Json delta, Json finish, std::vector<PositionLogprobs>* lp = nullptr) {
    Json lj = nullptr;
    if (logprobs && lp) {
      lj = http::ChatLogprobs(*tok, *lp);
      lp->clear();
    }
    return Json{{"id", id},
                {"object", "chat.completion.chunk"},
                {"created", created},
                {"model", model},
                {"system_fingerprint", fingerprint},
                {"choices", Json::array({{{"index", index}, {"delta", std::move(delta)}, {"logprobs", std::move(lj)},
                                          {"finish_reason", std::move(finish)}}})}};
  };
  // One choice while it runs.
  struct Choice {
    StartedTurn turn;
    std::vector<PositionLogprobs> lp;  // logprobs of tokens whose text has not gone out yet
    std::vector<PositionLogprobs> all_lp;  // streamed with a request id: every token's (the recorded answer)
    std::optional<ToolHold> hold;      // tool calls under auto (ToolHold), across the steps of one stream
    std::optional<CallStream> calls;   // required / a named tool: the reply is calls, streamed as they come
    std::chrono::steady_clock::time_point last;
    bool role_sent = false;
  };
  auto run = std::make_shared<ChoicesRun>();
  const bool forced = tools->choice == ToolChoice::kRequired || tools->choice == ToolChoice::kNamed;
  // Drives choice i to its end, then (the last one) completes the answer.
  auto drive = [=, this](int i, StartedTurn turn) {
    auto c = std::make_shared<Choice>();
    c->turn = std::move(turn);
    c->hold.emplace(service_, *tools);
    c->calls.emplace(DetectToolFormat(service_.chat_template()));
    c->last = std::chrono::steady_clock::now();
    const std::shared_ptr<TurnHandle> handle = c->turn.handle;
    DriveTurn(handle, [=, this]() -> bool {
      const StartedTurn& t = c->turn;
      auto write = [&](const std::string& s) { return WriteChoice(*run, *reply, *t.handle, s); };
      if (stream) {
        if (auto done = OpenChoiceStream(*run, t, owner, *reply)) return *done;
      }
      // The role goes in the first chunk, as OpenAI sends it: with `content: ""` before text, with
      // `content: null` before calls (an empty string there made the AI SDK open and close an
      // empty text part before each call). Under auto with tools it waits for the first delta,
      // which may be content or a call.
      if (stream && !c->role_sent && (forced || !tools->parse())) {
        c->role_sent = true;
        write(http::SseData(chunk(i, {{"role", "assistant"}, {"content", forced ? Json(nullptr) : Json("")}}, nullptr)));
      }
      auto with_role = [&c](Json delta) {
        if (!c->role_sent) {
          c->role_sent = true;
          delta["role"] = "assistant";
          if (!delta.contains("content")) delta["content"] = nullptr;
        }
        return delta;
      };
      TurnEvent ev;
      while (t.handle->TryNext(&ev)) {
        if (ev.kind == TurnEvent::kText) {
          if (ev.logprobs && stream && ticket) c->all_lp.push_back(*ev.logprobs);
          if (ev.logprobs) c->lp.push_back(std::move(*ev.logprobs));
          if (!stream) continue;
          auto now = std::chrono::steady_clock::now();
          metrics_.InterToken(std::chrono::duration<double>(now - c->last).count());
          c->last = now;
          if (forced) {  // calls in the grammar's shape: streamed as they are generated
            for (Json& d : c->calls->Feed(ev.text)) write(http::SseData(chunk(i, {{"tool_calls", Json::array({std::move(d)})}}, nullptr)));
            continue;
          }
          // Text goes out as content until a call opener; the rest is held and sent as calls at the end.
          const std::string out = c->hold->Feed(ev.token, ev.text);
          if (!out.empty()) write(http::SseData(chunk(i, with_role({{"content", out}}), nullptr, &c->lp)));
          continue;
        }
        const TurnResult& r = ev.result;
        metrics_.Turn(r, t.choice);
        // Held across the commit: the last choice's commit records the whole answer (a request id's).
        std::lock_guard<std::mutex> lock(run->mu);
        run->left--;
        run->completion_tokens += static_cast<int64_t>(r.tokens.size());
        run->last = r;
        // The choice as the whole answer gives it (a stream's too, when its answer is recorded).
        if ((!stream || ticket) && r.finish_reason != FinishReason::kError) {
          const ToolReply tool = ExtractToolCalls(service_, *tools, r);
          Json message = {{"role", "assistant"}, {"content", tool.content}};
          std::string finish = FinishReasonName(r.finish_reason);
          if (!tool.calls.empty()) {
            if (tool.content.empty()) message["content"] = nullptr;
            message["tool_calls"] = ToolCallsJson(tool.calls);
            finish = "tool_calls";
          }
          const std::vector<PositionLogprobs>& lp = stream ? c->all_lp : c->lp;
          run->choices[i] = {{"index", i}, {"message", std::move(message)},
                             {"logprobs", logprobs ? http::ChatLogprobs(*tok, lp) : Json(nullptr)},
                             {"finish_reason", finish}};
        }
        auto whole = [&] {
          Json j = {{"id", id}, {"object", "chat.completion"}, {"created", created}, {"model", model},
                    {"system_fingerprint", fingerprint}, {"choices", run->choices}, {"usage", run->Usage()}};
          if (context.applied) j["mnemo_context"] = http::ContextJson(context);
          return j;
        };
        bool recorded = false;
        // Durable before the final event.
        const std::optional<ApiError> failed = CommitChoice(*run, ticket, t, r, owner, whole, &recorded);
        if (!stream) {
          if (run->left > 0) return true;
          if (recorded && failed) {  // another attempt of the request committed first: its answer
            if (auto prev = ReplayCommitted(ticket)) {
              reply->Send(std::move(*prev));
              return true;
            }
          }
          if (run->error) {
            reply->Send(http::ErrorResponse(*run->error));
            return true;
          }
          reply->Send(http::JsonResponse(whole()));
          return true;
        }
        if (failed) {
          write(http::SseData(Json{{"error", {{"message", failed->message}, {"type", failed->type}, {"code", failed->code}}}}));
        } else {
          std::string finish = FinishReasonName(r.finish_reason);
          if (forced) {
            if (c->calls->calls() > 0) finish = "tool_calls";
          } else {
            // The content held back and the calls from the first opener on.
            const ToolReply tool = c->hold->End();
            if (!tool.calls.empty()) finish = "tool_calls";
            if (!tool.content.empty()) write(http::SseData(chunk(i, with_role({{"content", tool.content}}), nullptr, &c->lp)));
            // As OpenAI streams a call: index, id, type and name with empty arguments, then the
            // arguments in pieces.
            for (size_t k = 0; k < tool.calls.size(); k++) {
              const ChatToolCall& call = tool.calls[k];
              write(http::SseData(chunk(i, with_role({{"tool_calls", Json::array({{{"index", k}, {"id", call.id}, {"type", "function"},
                                                                                    {"function", {{"name", call.name}, {"arguments", ""}}}}})}}),
                                        nullptr)));
              for (const std::string& piece : Utf8Pieces(call.arguments, 16)) {
                write(http::SseData(chunk(i, {{"tool_calls", Json::array({{{"index", k}, {"function", {{"arguments", piece}}}}})}}, nullptr)));
              }
            }
          }
          // An empty reply: the role chunk still comes first.
          if (!c->role_sent) write(http::SseData(chunk(i, with_role({{"content", ""}}), nullptr)));
          // Tokens whose text never went out as content (held back, or calls) report here.
          Json last = chunk(i, Json::object(), finish, c->lp.empty() ? nullptr : &c->lp);
          if (context.applied) last["mnemo_context"] = http::ContextJson(context);
          write(http::SseData(last));
        }
        if (run->left > 0) return true;
        EndStream(*run, *reply, *t.handle,
                  include_usage ? Json{{"id", id}, {"object", "chat.completion.chunk"}, {"created", created},
                                       {"model", model}, {"system_fingerprint", fingerprint},
                                       {"choices", Json::array()}, {"usage", run->Usage()}}
                                : Json());
        return true;
      }
      return false;
    });
  };
  RunChoices(std::move(t), choice_request, n, owner, reply, run, stream, drive);
}

void ApiServer::Completions(const Req& req, Res& res, const std::string& owner) {
  auto begun = BeginRequest(req, res, owner, "/v1/completions");
  if (!begun) return;  // answered: a retry of a request that ran, or a refused request id
  const Ticket ticket = std::move(*begun);
  auto parsed = ParseCompletion(service_, req.body, owner);
  if (auto* e = std::get_if<ApiError>(&parsed)) return http::SendError(res, *e);
  CompletionCall& call = std::get<CompletionCall>(parsed);
  if (call.prompts.size() <= 1) {
    return RunCompletion(std::move(call), std::move(ticket), owner, req.get_header_value("X-Session-Id"), res.Defer());
  }
  // Several prompts: each its own request (its own session; X-Session-Id names one session, so it
  // is not used), into one answer. The request id's ticket is held until that answer goes out
  // (a retry meanwhile waits) and records nothing: a retry after it runs the prompts again.
  auto merged = PromptsReply::Create(res.Defer(), call.prompts.size(), call.n);
  merged->Hold(std::move(ticket));
  const std::vector<std::string> prompts = std::move(call.prompts);
  for (size_t i = 0; i < prompts.size(); i++) {
    CompletionCall one = call;
    one.spec.prompt = prompts[i];
    one.spec.lock.reset();
    RunCompletion(std::move(one), Ticket(), owner, "", merged->Part(i));
  }
}

void ApiServer::RunCompletion(CompletionCall call, Ticket ticket, const std::string& owner,
                              const std::string& session_key, std::shared_ptr<http::Reply> reply) {
  TurnSpec& spec = call.spec;
  const bool stream = call.stream;
  const int n = call.n;
  const int best_of = call.best_of;  // candidates run: n, or more to choose the n best from
  const std::string echo = call.echo ? *spec.prompt : std::string();
  spec.hint.key = session_key;
  const bool logprobs = spec.request.logprobs >= 0;
  TurnRequest choice_request = spec.request;
  // Ranking needs each token's logprob (the chosen one's: reported only when asked).
  if (best_of > n && !logprobs) choice_request.logprobs = 0;
  if (best_of > 1) AsPrefill(&spec.request);
  auto started = service_.Start(std::move(spec));
  if (auto* e = std::get_if<ApiError>(&started)) return reply->Send(http::ErrorResponse(*e));
  StartedTurn t = std::get<StartedTurn>(started);
  t.prefill = best_of > 1;
  const std::string id = NewId("cmpl-");
  const int64_t created = http::UnixSeconds();
  const std::string model = service_.config().model_name;
  const std::string fingerprint = service_.config().system_fingerprint;
  const Tokenizer* tok = &service_.tokenizer();
  // Choice `index`'s object; lp: the logprobs of the tokens the text came from (taken), their
  // text_offset from *offset on.
  auto choice = [=](int index, const std::string& text, Json finish, std::vector<PositionLogprobs>* lp,
                    size_t* offset) {
    Json lj = nullptr;
    if (logprobs && lp) {
      lj = http::CompletionLogprobs(*tok, *lp, *offset);
      *offset += http::PiecesBytes(*tok, *lp);
      lp->clear();
    }
    return Json{{"index", index}, {"text", text}, {"logprobs", std::move(lj)}, {"finish_reason", std::move(finish)}};
  };
  auto object = [=](Json choices) {
    return Json{{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", model},
                {"system_fingerprint", fingerprint}, {"choices", std::move(choices)}};
  };
  struct Choice {
    StartedTurn turn;
    std::vector<PositionLogprobs> lp;  // tokens whose text has not gone out
    std::vector<PositionLogprobs> all_lp;  // streamed with a request id: every token's (the recorded answer)
    size_t offset = 0;                 // text_offset of the next token
    bool echoed = false;               // streamed: the prompt went out
    double logprob = 0;                // cumulative logprob of the tokens reported (with best_of > n)
  };
  // best_of > n: each candidate's cumulative logprob and session, under run->mu.
  struct Candidates {
    std::vector<double> logprob;
    std::vector<int64_t> session;
  };
  auto candidates = std::make_shared<Candidates>();
  candidates->logprob.assign(best_of, 0.0);
  candidates->session.assign(best_of, -1);
  auto run = std::make_shared<ChoicesRun>();
  auto drive = [=, this](int i, StartedTurn turn) {
    auto c = std::make_shared<Choice>();
    c->turn = std::move(turn);
    const std::shared_ptr<TurnHandle> handle = c->turn.handle;
    DriveTurn(handle, [=, this]() -> bool {
      const StartedTurn& t = c->turn;
      auto write = [&](const std::string& s) { return WriteChoice(*run, *reply, *t.handle, s); };
      if (stream) {
        if (auto done = OpenChoiceStream(*run, t, owner, *reply)) return *done;
        if (!echo.empty() && !c->echoed) {
          c->echoed = true;
          write(http::SseData(object(Json::array({choice(i, echo, nullptr, nullptr, nullptr)}))));
        }
      }
      TurnEvent ev;
      while (t.handle->TryNext(&ev)) {
        if (ev.kind == TurnEvent::kText) {
          if (ev.logprobs) {
            c->logprob += ev.logprobs->chosen.logprob;
            if (logprobs && stream && ticket) c->all_lp.push_back(*ev.logprobs);
            if (logprobs) c->lp.push_back(std::move(*ev.logprobs));
          }
          if (stream && !ev.text.empty()) {
            write(http::SseData(object(Json::array({choice(i, ev.text, nullptr, &c->lp, &c->offset)}))));
          }
          continue;
        }
        const TurnResult& r = ev.result;
        metrics_.Turn(r, t.choice);
        // Held across the commit: the last choice's commit records the whole answer (a request id's).
        std::lock_guard<std::mutex> lock(run->mu);
        run->left--;
        run->completion_tokens += static_cast<int64_t>(r.tokens.size());
        run->last = r;
        // A candidate that ended chose its end-of-generation (or stop) token: that counts too.
        candidates->logprob[i] = c->logprob + r.end_logprob.value_or(0.0f);
        candidates->session[i] = t.session;
        if (!stream) {
          run->choices[i] = choice(i, echo + r.text, FinishReasonName(r.finish_reason), &c->lp, &c->offset);
        } else if (ticket) {  // the recorded answer of a stream: the choice as the whole answer gives it
          size_t from = 0;
          run->choices[i] = choice(i, echo + r.text, FinishReasonName(r.finish_reason), &c->all_lp, &from);
        }
        // The whole answer: with best_of > n, the n most likely candidates, in that order.
        auto whole = [&] {
          Json chosen = run->choices;
          if (best_of > n) {
            const std::vector<int> rank = RankCandidates(candidates->logprob);
            chosen = Json::array();
            for (int k = 0; k < n; k++) {
              chosen.push_back(run->choices[rank[k]]);
              chosen.back()["index"] = k;
            }
          }
          Json j = object(std::move(chosen));
          j["usage"] = run->Usage();
          return j;
        };
        bool recorded = false;
        CommitChoice(*run, ticket, t, r, owner, whole, &recorded);
        if (!stream) {
          if (run->left > 0) return true;
          if (recorded && run->error) {  // another attempt of the request committed first: its answer
            if (auto prev = ReplayCommitted(ticket)) {
              reply->Send(std::move(*prev));
              return true;
            }
          }
          if (run->error) {
            reply->Send(http::ErrorResponse(*run->error));
            return true;
          }
          if (best_of == n) {
            reply->Send(http::JsonResponse(whole()));
            return true;
          }
          // The candidates not chosen: their sessions are deleted (on the worker pool: that waits
          // on the engine) before the answer goes out.
          const std::vector<int> rank = RankCandidates(candidates->logprob);
          Json j = whole();
          std::vector<int64_t> dropped;
          for (int k = n; k < best_of; k++) dropped.push_back(candidates->session[rank[k]]);
          http_->Post([this, reply, owner, dropped, j = std::move(j)] {
            for (int64_t s : dropped) {
              if (Status st = service_.DeleteSession(s, owner); !st.ok()) {
                spdlog::debug("best_of: session {} not deleted: {}", s, st.error().message);
              }
            }
            reply->Send(http::JsonResponse(j));
          });
          return true;
        }
        Json last = object(Json::array({choice(i, "", FinishReasonName(r.finish_reason), c->lp.empty() ? nullptr : &c->lp,
                                               &c->offset)}));
        if (run->left == 0) last["usage"] = run->Usage();
        write(http::SseData(last));
        if (run->left > 0) return true;
        EndStream(*run, *reply, *t.handle, Json());
        return true;
      }
      return false;
    });
  };
  RunChoices(std::move(t), choice_request, best_of, owner, reply, run, stream, drive);
}

}  // namespace mnemo
