#include "server/api_server.h"

#include <strings.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "base/log.h"
#include "server/http_util.h"
#include "web/assets.h"

namespace mnemo {

using http::Json;

std::string KeyOwner(const std::string& key) { return http::Sha256Hex({key}); }

namespace {

void SetRetryAfter(http::Response& res, int seconds) { res.set_header("Retry-After", std::to_string(seconds)); }

}  // namespace

ApiServer::ApiServer(const ServerConfig& config, Service& service, Metrics& metrics)
    : config_(config), service_(service), metrics_(metrics),
      dedup_(std::make_unique<RequestDedup>(service.store(), config.request_id_ttl_s)) {
  for (const auto& k : config_.api_keys) key_hashes_.push_back(KeyOwner(k));
  service_.SetSyncObserver([this](const char* result, double s) { metrics_.SessionSync(result, s); });
  service_.SetLockObserver([this](const char* result, double s) { metrics_.TurnLock(result, s); });
  service_.SetNoticeObserver([this](const char* action, double s) { metrics_.SessionNotice(action, s); });
  service_.SetResyncObserver([this](size_t marked) { metrics_.ListenerResync(marked); });
  http::ServerLimits limits;
  limits.workers = config_.http_threads;
  limits.max_connections = config_.max_connections;
  limits.max_per_address = config_.max_connections_per_address;
  limits.header_s = config_.header_timeout_s;
  limits.body_s = config_.body_timeout_s;
  limits.idle_s = config_.idle_timeout_s;
  limits.max_body_bytes = config_.max_body_bytes;
  http_ = std::make_unique<http::Server>(limits);
  // Errors the HTTP layer produces itself (413, 404 of unknown routes, ...) get OpenAI's shape too.
  http_->error_page = [](const Req&, Res& res) {
    ApiError e;
    e.status = res.status;
    e.type = res.status >= 500 ? "server_error" : "invalid_request_error";
    switch (res.status) {
      case 413: e.message = "The request body is too large."; e.code = "request_too_large"; break;
      case 404: e.message = "Unknown endpoint."; e.code = "unknown_url"; break;
      case 431: e.message = "The request headers are too large."; e.code = "headers_too_large"; break;
      case 400: e.message = "The request is not valid HTTP."; e.code = "bad_request"; break;
      default: e.message = "HTTP error " + std::to_string(res.status); break;
    }
    http::SendError(res, e);
  };

  // Range headers are ignored (RFC 9110 14.2 allows it): they are for files, and applied to an API
  // answer would cut an error body short.
  //
  // Request ids: a sane client X-Request-Id is kept, anything else replaced by a generated one in
  // the request itself, so that handlers, their log lines and the response all carry the same.
  http_->pre_routing = [this](Req& r, Res& res) {
    if (!http::SaneRequestId(r.get_header_value("X-Request-Id"))) {
      std::erase_if(r.headers, [](const auto& kv) { return strcasecmp(kv.first.c_str(), "X-Request-Id") == 0; });
      r.headers.emplace_back("X-Request-Id", http::NewRequestId());
    }
    // A CORS preflight names the method and headers the page wants; it carries no credentials, so
    // it is answered before auth (browsers send the API key only on the real request).
    if (r.method == "OPTIONS" && r.has_header("Access-Control-Request-Method")) {
      const std::string origin = CorsOrigin(r);
      if (origin.empty()) {
        res.status = 403;
        return true;
      }
      res.status = 204;
      res.set_header("Access-Control-Allow-Origin", origin);
      res.set_header("Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS");
      const std::string asked = r.get_header_value("Access-Control-Request-Headers");
      res.set_header("Access-Control-Allow-Headers", asked.empty() ? "Authorization, Content-Type" : asked);
      res.set_header("Access-Control-Max-Age", "600");
      if (origin != "*") res.set_header("Vary", "Origin");
      return true;
    }
    return false;
  };
  // Every response carries the request id, those the HTTP layer makes before routing (413 by
  // Content-Length) too.
  http_->post_routing = [this](const Req& req, Res& res) {
    const std::string id = req.get_header_value("X-Request-Id");
    res.set_header("X-Request-Id", http::SaneRequestId(id) ? id : http::NewRequestId());
    // Which replica answered, for clients and operators behind a front (docs/deploy.md).
    const std::string replica = replica_id();
    if (!replica.empty()) res.set_header("X-Mnemo-Replica", replica);
    const std::string origin = CorsOrigin(req);
    if (origin.empty()) return;
    res.set_header("Access-Control-Allow-Origin", origin);
    res.set_header("Access-Control-Expose-Headers",
                   "X-Session-Id, X-Request-Id, Retry-After, X-Mnemo-Deduplicated, X-Mnemo-Replica");
    if (origin != "*") res.set_header("Vary", "Origin");
  };
  // POST bodies are taken whatever their Content-Type (`curl -d` sends form-urlencoded); the body
  // limit applies to all. Multipart bodies are refused: bodies are JSON.
  auto post = [this](const std::string& pattern, http::Handler h) {
    http_->Route("POST", pattern, [h](const Req& req, Res& res) {
      const std::string type = req.get_header_value("Content-Type");
      if (strncasecmp(type.c_str(), "multipart/form-data", 19) == 0) {
        return http::SendError(res, http::BadRequest("The request body must be JSON, not multipart form data.", "",
                                                     "invalid_json"));
      }
      h(req, res);
    });
  };
  auto get = [this](const std::string& pattern, http::Handler h) { http_->Route("GET", pattern, std::move(h)); };
  // Answers that never wait on a turn's start: their own threads, so a burst of turns cannot
  // delay a health check (the kQuick lane; /metrics waits at most one engine step).
  auto quick = [this](const std::string& pattern, http::Handler h) {
    http_->Route("GET", pattern, std::move(h), http::Server::Lane::kQuick);
  };
  auto del = [this](const std::string& pattern, http::Handler h) { http_->Route("DELETE", pattern, std::move(h)); };
  auto bind = [this](auto method) {
    return [this, method](const Req& q, Res& s, const std::string& o) { (this->*method)(q, s, o); };
  };
  post("/v1/chat/completions", Wrap("/v1/chat/completions", true, bind(&ApiServer::ChatCompletions), /*turn=*/true));
  post("/v1/completions", Wrap("/v1/completions", true, bind(&ApiServer::Completions), /*turn=*/true));
  post("/v1/responses", Wrap("/v1/responses", true, bind(&ApiServer::CreateResponse), /*turn=*/true));
  post("/v1/responses/input_tokens", Wrap("/v1/responses/input_tokens", true, bind(&ApiServer::CountResponseTokens)));
  get(R"(/v1/responses/([A-Za-z0-9_\-]+))", Wrap("/v1/responses/{id}", true, bind(&ApiServer::GetResponse)));
  del(R"(/v1/responses/([A-Za-z0-9_\-]+))", Wrap("/v1/responses/{id}", true, bind(&ApiServer::DeleteResponse)));
  post(R"(/v1/responses/([A-Za-z0-9_\-]+)/cancel)",
       Wrap("/v1/responses/{id}/cancel", true, bind(&ApiServer::CancelResponse)));
  get(R"(/v1/responses/([A-Za-z0-9_\-]+)/input_items)",
      Wrap("/v1/responses/{id}/input_items", true, bind(&ApiServer::ListInputItems)));
  auto conv = Wrap("/v1/conversations", true, bind(&ApiServer::Conversations));
  post("/v1/conversations", conv);
  get(R"(/v1/conversations/([A-Za-z0-9_\-]+)(/items)?(?:/([A-Za-z0-9_\-]+))?)", conv);
  post(R"(/v1/conversations/([A-Za-z0-9_\-]+)(/items)?)", conv);
  del(R"(/v1/conversations/([A-Za-z0-9_\-]+)(/items)?(?:/([A-Za-z0-9_\-]+))?)", conv);
  post("/tokenize", Wrap("/tokenize", true, bind(&ApiServer::Tokenize)));
  post("/detokenize", Wrap("/detokenize", true, bind(&ApiServer::Detokenize)));
  get("/v1/sessions", Wrap("/v1/sessions", true, bind(&ApiServer::ListSessions)));
  auto model_object = [this] {
    return Json{{"id", service_.config().model_name}, {"object", "model"}, {"created", 0}, {"owned_by", "mnemo"},
                {"max_model_len", service_.engine().max_context()}};
  };
  quick("/v1/models", Wrap("/v1/models", true, [model_object](const Req&, Res& res, const std::string&) {
    http::SendJson(res, {{"object", "list"}, {"data", Json::array({model_object()})}});
  }));
  // Model ids may contain '/' (e.g. "org/name.gguf"): everything after /v1/models/ is the id.
  quick(R"(/v1/models/(.+))", Wrap("/v1/models/{id}", true, [this, model_object](const Req& req, Res& res,
                                                                                  const std::string&) {
    const std::string id = req.matches[1];
    if (id != service_.config().model_name) {
      return http::SendError(res, ApiError{404, "invalid_request_error",
                                           "The model '" + id.substr(0, 256) + "' does not exist", "model",
                                           "model_not_found"});
    }
    http::SendJson(res, model_object());
  }));
  // The live status page and its assets (embedded; the page reads /metrics).
  for (const char* path : {"/", "/uPlot.iife.min.js", "/uPlot.min.css"}) {
    quick(path, [this, path](const Req&, Res& res) {
      std::string type;
      std::string_view body = web::Asset(path, &type);
      res.set_content(std::string(body), type);
      metrics_.Request(path, res.status);
    });
  }
  // Liveness (always 200 while the process serves) and readiness (503 with Retry-After while
  // draining: after BeginDrain or Stop), both with the admission queue.
  quick("/health", Wrap("/health", false, [this](const Req&, Res& res, const std::string&) {
    http::SendJson(res, StatusJson());
  }));
  quick("/ready", Wrap("/ready", false, [this](const Req&, Res& res, const std::string&) {
    const bool ready = !draining_ && !unready_;
    http::SendJson(res, StatusJson(), ready ? 200 : 503);
    if (!ready) res.set_header("Retry-After", "1");
  }));
  quick("/metrics", Wrap("/metrics", config_.private_metrics, [this](const Req&, Res& res, const std::string&) {
    res.set_content(metrics_.Render(service_.engine().Stats(), service_.engine().Queue()), "text/plain; version=0.0.4");
  }));
}

ApiServer::~ApiServer() {
  Stop();
  service_.SetNoticeObserver(nullptr);  // notices arrive on the store's thread until the service goes
  service_.SetResyncObserver(nullptr);
}

std::string ApiServer::CorsOrigin(const Req& req) const {
  if (config_.cors_origins.empty()) return "";
  const std::string origin = req.get_header_value("Origin");
  for (const auto& o : config_.cors_origins) {
    if (o == "*") return "*";
    if (!origin.empty() && o == origin) return origin;
  }
  return "";
}

std::variant<std::string, ApiError> ApiServer::Authenticate(const Req& req) const {
  if (key_hashes_.empty()) return std::string();
  std::string auth = req.get_header_value("Authorization");
  const std::string prefix = "Bearer ";
  if (auth.rfind(prefix, 0) != 0) {
    return ApiError{401, "invalid_request_error",
                    "You didn't provide an API key. Provide it in the Authorization header as 'Bearer KEY'.", "",
                    "missing_api_key"};
  }
  std::string owner = KeyOwner(auth.substr(prefix.size()));
  for (const auto& h : key_hashes_) {
    if (h == owner) return owner;
  }
  return ApiError{401, "invalid_request_error", "Incorrect API key provided.", "", "invalid_api_key"};
}

namespace {
// CPU time of the calling thread (CLOCK_THREAD_CPUTIME_ID), seconds.
double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}
}  // namespace

http::Handler ApiServer::Wrap(const std::string& route, bool auth,
                              std::function<void(const Req&, Res&, const std::string&)> fn, bool turn) {
  return [this, route, auth, fn, turn](const Req& req, Res& res) {
    SetLogRequestId(req.get_header_value("X-Request-Id"));
    // Metrics and the log line run when the answer leaves, which for a turn is after the handler
    // returned (its Reply completes it from the worker the turn's last event woke).
    res.before_send = [this, route, method = req.method, path = req.path,
                       rid = req.get_header_value("X-Request-Id")](Res& res) {
      if (res.status == 429) {  // refused by the engine after all (queue full, the wait, a timeout)
        metrics_.Shed("engine");
        SetRetryAfter(res, RetryAfterSeconds());
      }
      metrics_.Request(route, res.status);
      // Every error is logged with the request id the client got (X-Request-Id): 5xx at error level
      // (their detail was logged where it happened, under the same id), refusals for load at debug
      // (an overload makes thousands), other client errors at info.
      if (res.status >= 500) {
        spdlog::error("request {}: {} {} -> {}: {}", rid, method, path, res.status, res.body.substr(0, 300));
      } else if (res.status == 429) {
        spdlog::debug("request {}: {} {} -> {}", rid, method, path, res.status);
      } else if (res.status >= 400) {
        spdlog::info("request {}: {} {} -> {}: {}", rid, method, path, res.status, res.body.substr(0, 300));
      } else {
        spdlog::debug("request {}: {} {} -> {}", rid, method, path, res.status);
      }
    };
    std::string owner;
    AdmissionTicket ticket;  // a turn's place at the door, held until the handler handed it over
    if (auth) {
      auto a = Authenticate(req);
      if (auto* e = std::get_if<ApiError>(&a)) {
        res.before_send = [this, route](Res& res) { metrics_.Request(route, res.status); };
        return http::SendError(res, *e);
      }
      owner = std::get<std::string>(a);
    }
    if (turn) {
      if (auto e = Shed(&ticket)) {
        http::SendError(res, *e);
        if (res.status == 429) SetRetryAfter(res, RetryAfterSeconds());
        res.before_send = [this, route](Res& res) { metrics_.Request(route, res.status); };
        return;
      }
      // A turn the store could not keep is refused before its tokens are generated (a full disk).
      if (Store* store = service_.store()) {
        if (Status w = store->CheckWritable(); !w.ok()) {
          metrics_.Shed("storage");
          http::SendError(res, StoreError(w.error(), "refusing a turn: "));
          SetRetryAfter(res, 30);
          res.before_send = [this, route](Res& res) { metrics_.Request(route, res.status); };
          return;
        }
      }
    }
    const double cpu0 = ThreadCpuSeconds();
    try {
      fn(req, res, owner);
    } catch (...) {  // a bug, never bad input: the client sees no exception text, the log does
      if (!res.deferred()) http::SendError(res, http::InternalError(req.method + " " + req.path, std::current_exception()));
    }
    metrics_.RequestCpu(route, ThreadCpuSeconds() - cpu0);
  };
}

void ApiServer::DriveTurn(const std::shared_ptr<TurnHandle>& handle, std::function<bool()> step) {
  struct Driver {
    std::mutex mu;                    // one step at a time
    std::function<bool()> step;       // cleared once it returned true
    std::atomic<bool> scheduled{false};
    std::string request_id;
  };
  auto d = std::make_shared<Driver>();
  d->step = std::move(step);
  d->request_id = LogRequestId();
  http::Server* srv = http_.get();
  std::weak_ptr<TurnHandle> weak = handle;
  // Runs on the engine's thread: only schedules. A step already queued drains every event there is.
  // Steps run on the events lane: they format events and commit (the store); only a discarded new
  // session's delete waits on the engine.
  handle->SetNotify([d, srv, weak] {
    if (d->scheduled.exchange(true)) return;
    srv->Post([d, weak] {
      d->scheduled = false;
      std::lock_guard<std::mutex> lock(d->mu);
      if (!d->step) return;
      SetLogRequestId(d->request_id);
      bool finished = true;
      try {
        finished = d->step();
      } catch (...) {  // a bug: logged; the Reply, dropped unanswered, closes its connection
        http::InternalError("turn", std::current_exception());
      }
      if (!finished) return;
      d->step = nullptr;  // releases the turn and its Reply
      if (auto h = weak.lock()) h->SetNotify(nullptr);
    }, http::Server::Lane::kEvents);
  });
}

std::optional<ApiError> ApiServer::Shed(AdmissionTicket* ticket) {
  if (draining_) {
    metrics_.Shed("draining");
    return ApiError{503, "server_error", "The server is shutting down; retry on another replica or later.", "",
                    "unavailable"};
  }
  auto t = service_.engine().ReserveAdmission();
  if (t.ok()) {
    *ticket = std::move(*t);
    return std::nullopt;
  }
  metrics_.Shed("admission");
  return ToApiError(t.error(), "The server is overloaded: ");
}

int ApiServer::RetryAfterSeconds() const {
  const QueueState q = service_.engine().Queue();
  const double over = q.max_queue_s > 0 ? q.estimated_wait_s - q.max_queue_s : 0;
  return std::isfinite(over) ? std::clamp(static_cast<int>(std::ceil(over)), 1, 30) : 30;
}

ApiServer::StreamOpen ApiServer::OpenStream(const StartedTurn& t, const std::string& owner, http::Reply& reply,
                                            bool* alive) {
  const TurnHandle::Admission a = t.handle->AdmissionState();
  if (a == TurnHandle::Admission::kWaiting) return StreamOpen::kLater;
  if (a != TurnHandle::Admission::kAdmitted && !t.handle->WaitAdmitted()) {
    const TurnResult r = t.handle->Wait();
    metrics_.Turn(r);
    service_.Commit(t, r, std::nullopt, std::nullopt, owner);  // not completed: discarded
    reply.Send(http::ErrorResponse(
        r.finish_reason == FinishReason::kError
            ? ToApiError(r.error)
            : ApiError{503, "server_error", "The server is shutting down; retry on another replica or later.", "",
                       "unavailable"}));
    return StreamOpen::kFailed;
  }
  http::Response head;
  head.set_header("Content-Type", "text/event-stream");
  *alive = reply.Begin(std::move(head));
  return StreamOpen::kOpen;
}

ApiServer::http_json_t ApiServer::ChoicesRun::Usage() const {
  return prompt ? http::ChatUsage(*prompt, completion_tokens) : http::ChatUsage(last);
}

void ApiServer::RunChoices(StartedTurn t, const TurnRequest& request, int count, const std::string& owner,
                           std::shared_ptr<http::Reply> reply, std::shared_ptr<ChoicesRun> run, bool stream,
                           ChoiceDriver drive) {
  // The choices' turns: the client going away cancels them all; several open the stream now.
  auto begin = [this, reply, run, stream, drive](std::optional<TurnResult> prompt, std::vector<StartedTurn> turns) {
    run->left = static_cast<int>(turns.size());
    run->choices = Json::array();
    for (size_t i = 0; i < turns.size(); i++) run->choices.push_back(nullptr);
    run->prompt = std::move(prompt);
    run->head = stream && run->prompt;
    std::vector<std::shared_ptr<TurnHandle>> handles;
    for (const StartedTurn& c : turns) handles.push_back(c.handle);
    reply->OnClose([handles] {  // the client went away: stop generating
      for (const auto& h : handles) h->Cancel();
    });
    if (run->head) {
      http::Response head;
      head.set_header("Content-Type", "text/event-stream");
      run->alive = reply->Begin(std::move(head));
    }
    for (size_t i = 0; i < turns.size(); i++) drive(static_cast<int>(i), std::move(turns[i]));
  };
  if (count == 1) return begin(std::nullopt, {std::move(t)});
  std::shared_ptr<TurnHandle> handle = t.handle;
  reply->OnClose([handle] { handle->Cancel(); });  // the client went away: stop computing
  DriveTurn(handle, [=, this]() -> bool {
    TurnEvent ev;
    while (t.handle->TryNext(&ev)) {
      if (ev.kind != TurnEvent::kDone) continue;
      const TurnResult r = std::move(ev.result);
      metrics_.Turn(r);
      auto c = service_.Commit(t, r, std::nullopt, std::nullopt, owner);  // a failed turn is discarded here
      std::optional<ApiError> failed;
      if (auto* e = std::get_if<ApiError>(&c)) failed = *e;
      if (r.finish_reason == FinishReason::kError) failed = ToApiError(r.error);
      if (!failed && !Completed(r.finish_reason)) {  // cancelled: the client is gone, or shutdown
        failed = ApiError{503, "server_error", "The server is shutting down; retry on another replica or later.", "",
                          "unavailable"};
      }
      if (failed) {
        reply->Send(http::ErrorResponse(*failed));
        return true;
      }
      // Forking waits on the engine: on the worker pool, not the events lane.
      http_->Post([=, this] {
        auto choices = service_.StartChoices(t, request, count, owner);
        if (auto* e = std::get_if<ApiError>(&choices)) return reply->Send(http::ErrorResponse(*e));
        begin(r, std::move(std::get<std::vector<StartedTurn>>(choices)));
      });
      return true;
    }
    return false;
  });
}

std::optional<bool> ApiServer::OpenChoiceStream(ChoicesRun& run, const StartedTurn& t, const std::string& owner,
                                                http::Reply& reply) {
  if (run.head) return std::nullopt;
  bool alive = true;
  const StreamOpen open = OpenStream(t, owner, reply, &alive);
  if (open == StreamOpen::kLater) return false;
  if (open == StreamOpen::kFailed) return true;
  run.head = true;
  run.alive = alive;
  return std::nullopt;
}

bool ApiServer::WriteChoice(ChoicesRun& run, http::Reply& reply, TurnHandle& t, const std::string& s) {
  if (run.alive && !reply.Write(s)) run.alive = false;
  if (!run.alive) t.Cancel();  // the client went away: stop generating
  return run.alive.load();
}

void ApiServer::EndStream(ChoicesRun& run, http::Reply& reply, TurnHandle& t, const http_json_t& usage_chunk) {
  if (!usage_chunk.is_null() && run.alive) WriteChoice(run, reply, t, http::SseData(usage_chunk));
  WriteChoice(run, reply, t, "data: [DONE]\n\n");
  reply.End();
}

std::optional<ApiServer::Ticket> ApiServer::BeginRequest(const Req& req, Res& res, const std::string& owner,
                                                         std::string_view route) {
  std::optional<std::string> header;
  if (req.has_header("X-Mnemo-Request-Id")) header = req.get_header_value("X-Mnemo-Request-Id");
  RequestDedup::Outcome o = dedup_->Begin(header, owner, route, req.body);
  if (o.error) {
    http::SendError(res, *o.error);
    if (o.error->code == "request_in_progress") SetRetryAfter(res, 1);
    return std::nullopt;
  }
  if (o.replay) {
    metrics_.Deduplicated();
    Res r = Replay(*o.replay);
    res.status = r.status;
    res.body = std::move(r.body);
    for (auto& [name, value] : r.headers) res.set_header(name, std::move(value));
    return std::nullopt;
  }
  return std::move(o.ticket);
}

std::optional<ApiError> ApiServer::CommitChoice(ChoicesRun& run, const Ticket& ticket, const StartedTurn& t,
                                                const TurnResult& r, const std::string& owner,
                                                const std::function<http_json_t()>& answer, bool* recorded) {
  const bool last = run.left == 0;
  std::optional<StoredRequest> record;
  if (ticket && last && !run.error && r.finish_reason != FinishReason::kError) {
    record = ticket->Record(200, answer().dump());
  }
  *recorded = record.has_value();
  auto committed = service_.Commit(t, r, std::nullopt, std::nullopt, owner, std::move(record));
  if (ticket && last) ticket->Release();  // a retry from now on finds the record (or runs)
  std::optional<ApiError> failed;
  if (auto* e = std::get_if<ApiError>(&committed)) failed = *e;
  if (r.finish_reason == FinishReason::kError) failed = ToApiError(r.error);
  if (failed && !run.error) run.error = failed;
  return failed;
}

std::optional<http::Response> ApiServer::ReplayCommitted(const Ticket& ticket) {
  if (!ticket) return std::nullopt;
  auto stored = dedup_->Committed(*ticket);
  if (!stored) return std::nullopt;
  spdlog::info("request {}: another attempt of request id '{}' committed first; answering with its answer",
               LogRequestId(), ticket->base().request_id);
  metrics_.Deduplicated();
  return Replay(*stored);
}

http::Response ApiServer::Replay(const StoredRequest& r) {
  http::Response res;
  res.status = r.status;
  res.set_content(r.body, "application/json");
  res.set_header("X-Mnemo-Deduplicated", "true");
  return res;
}

ApiServer::http_json_t ApiServer::StatusJson() const {
  const QueueState q = service_.engine().Queue();
  Json queue = {{"waiting", q.waiting},
                {"max_waiting", q.max_waiting},
                {"estimated_wait_ms", std::isfinite(q.estimated_wait_s) ? Json(std::lround(q.estimated_wait_s * 1000)) : Json(nullptr)},
                {"max_queue_ms", std::lround(q.max_queue_s * 1000)},
                {"drain_rate_per_s", q.drain_rate >= 0 ? Json(q.drain_rate) : Json(nullptr)}};
  return {{"status", draining_ || unready_ ? "draining" : "ok"}, {"queue", queue}, {"replica", replica_id()}};
}

std::string ApiServer::replica_id() const {
  std::lock_guard<std::mutex> lock(replica_mu_);
  return replica_id_;
}

Status ApiServer::Start() {
  if (config_.private_metrics && config_.api_keys.empty()) {
    return MakeError(StatusCode::kInvalidArgument, "--private-metrics needs at least one --api-key");
  }
  if (config_.tls_cert_file.empty() != config_.tls_key_file.empty()) {
    return MakeError(StatusCode::kInvalidArgument, "TLS needs both a certificate and a key file");
  }
  // A header value and a Prometheus label: printable ASCII only.
  if (config_.replica_id.size() > 128 ||
      !std::all_of(config_.replica_id.begin(), config_.replica_id.end(), [](char c) { return c > ' ' && c < 127; })) {
    return MakeError(StatusCode::kInvalidArgument, "--replica-id must be at most 128 printable ASCII characters, no spaces");
  }
  if (!config_.tls_cert_file.empty()) {
    Status tls = http_->UseTls(config_.tls_cert_file, config_.tls_key_file);
    if (!tls.ok()) return tls;
  }
  std::string replica = config_.replica_id;
  if (!replica.empty()) {  // named before the first request can be answered
    std::lock_guard<std::mutex> lock(replica_mu_);
    replica_id_ = replica;
  }
  Status st = http_->Listen(config_.host, config_.port);
  if (!st.ok()) return st;
  port_ = http_->port();
  if (replica.empty()) {  // hostname:port, the port known only now (--port 0)
    char host[256] = {};
    if (gethostname(host, sizeof host - 1) != 0 || host[0] == '\0') std::snprintf(host, sizeof host, "localhost");
    replica = std::string(host) + ":" + std::to_string(port_);
    std::lock_guard<std::mutex> lock(replica_mu_);
    replica_id_ = replica;
  }
  metrics_.SetReplica(replica);
  return Status::Ok();
}

void ApiServer::Stop() {
  draining_ = true;
  http_->Stop();
}

void ApiServer::Wait() { http_->Wait(); }

void ApiServer::Tokenize(const Req& req, Res& res, const std::string&) {
  auto parsed = http::ParseBody(req.body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return http::SendError(res, *e);
  const Json& body = std::get<Json>(parsed);
  using namespace http;  // FieldType bits
  if (auto e = CheckFields(body, {{"content", kString}, {"prompt", kString}, {"messages", kArray},
                                  {"add_special", kBool}, {"model", kString}})) {
    return SendError(res, *e);
  }
  std::vector<int32_t> ids;
  if (!Absent(body, "messages")) {
    TurnSpec spec;
    const Json& msgs = body["messages"];
    for (size_t i = 0; i < msgs.size(); i++) {
      const Json& m = msgs[i];
      const std::string p = "messages[" + std::to_string(i) + "]";
      if (!m.is_object() || !m.contains("content") || !m["content"].is_string()) {
        return SendError(res, BadRequest(p + " needs a string 'content'", p + ".content", "invalid_type"));
      }
      if (!Absent(m, "role") && !m["role"].is_string()) {
        return SendError(res, BadRequest(p + ".role must be a string", p + ".role", "invalid_type"));
      }
      spec.messages.push_back(ChatMessage{Absent(m, "role") ? "user" : m["role"].get<std::string>(),
                                          m["content"].get<std::string>()});
    }
    auto r = service_.Render(spec);
    if (auto* e = std::get_if<ApiError>(&r)) return SendError(res, *e);
    ids = std::get<0>(r);
  } else {
    const char* key = !Absent(body, "content") ? "content" : "prompt";
    if (Absent(body, key)) return SendError(res, BadRequest("'content' must be a string", "content", "invalid_type"));
    ids = service_.tokenizer().Encode(body[key].get<std::string>(), BoolOr(body, "add_special", false));
  }
  http::SendJson(res, {{"tokens", ids}, {"count", ids.size()}, {"max_model_len", service_.engine().max_context()}});
}

void ApiServer::Detokenize(const Req& req, Res& res, const std::string&) {
  auto parsed = http::ParseBody(req.body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return http::SendError(res, *e);
  const Json& body = std::get<Json>(parsed);
  if (auto e = http::CheckFields(body, {{"tokens", http::kArray}, {"model", http::kString}})) return http::SendError(res, *e);
  if (http::Absent(body, "tokens")) {
    return http::SendError(res, http::BadRequest("'tokens' must be an array of token ids", "tokens", "invalid_type"));
  }
  std::vector<int32_t> ids;
  for (const auto& t : body["tokens"]) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= service_.tokenizer().n_vocab()) {
      return http::SendError(res, http::BadRequest("token ids must be integers in [0, " +
                                                       std::to_string(service_.tokenizer().n_vocab()) + ")",
                                                   "tokens", "invalid_value"));
    }
    ids.push_back(t.get<int32_t>());
  }
  http::SendJson(res, {{"prompt", service_.tokenizer().Decode(ids)}});
}

void ApiServer::ListSessions(const Req&, Res& res, const std::string& owner) {
  Json data = Json::array();
  const std::vector<Service::SessionView> views = service_.Sessions(owner);
  std::vector<int64_t> ids;
  for (const auto& v : views) ids.push_back(v.id);
  // One engine call for all of them: the engine thread is not held up once per session.
  const std::vector<SessionInfo> infos = service_.engine().ListSessions(ids);
  size_t j = 0;
  for (const auto& v : views) {  // both in id order; sessions the engine no longer has are skipped
    while (j < infos.size() && infos[j].id < v.id) j++;
    if (j == infos.size() || infos[j].id != v.id) continue;
    const SessionInfo& info = infos[j];
    data.push_back({{"id", v.id},
                    {"key", v.key.empty() ? Json(nullptr) : Json(v.key)},
                    {"tokens", info.n_tokens},
                    {"turns", info.n_turns},
                    {"kv_tokens", info.kv_tokens},
                    {"idle_seconds", info.idle_seconds},
                    {"busy", info.busy},
                    {"chunks", {{"t0", info.chunks_by_tier[0]}, {"t1", info.chunks_by_tier[1]},
                                {"t2", info.chunks_by_tier[2]}, {"dropped", info.chunks_by_tier[3]}}}});
  }
  http::SendJson(res, {{"object", "list"}, {"data", data}});
}

}  // namespace mnemo
