#include "server/api_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <sys/socket.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "base/log.h"
#include "server/http_util.h"
#include "web/assets.h"

namespace mnemo {

using http::Json;

std::string KeyOwner(const std::string& key) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_Digest(key.data(), key.size(), md, &n, EVP_sha256(), nullptr);
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < n; i++) {
    out += hex[md[i] >> 4];
    out += hex[md[i] & 15];
  }
  return out;
}

namespace {

void SetRetryAfter(httplib::Response& res, int seconds) {
  res.headers.erase("Retry-After");
  res.set_header("Retry-After", std::to_string(seconds));
}

// cpp-httplib 0.11 listens with a backlog of 5: a burst of clients then overflows the accept queue
// and gets connection resets. Calling listen() again on the bound socket raises the backlog
// (Linux allows it); the socket is found by its local port.
void WidenBacklog(int port) {
  for (int fd = 3; fd < 1024; fd++) {
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) continue;
    int local = 0;
    if (addr.ss_family == AF_INET) local = ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
    if (addr.ss_family == AF_INET6) local = ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
    int listening = 0;
    socklen_t ol = sizeof listening;
    if (local == port && getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &ol) == 0 && listening) {
      ::listen(fd, SOMAXCONN);
    }
  }
}

}  // namespace

ApiServer::ApiServer(const ServerConfig& config, Service& service, Metrics& metrics)
    : config_(config), service_(service), metrics_(metrics) {
  for (const auto& k : config_.api_keys) key_hashes_.push_back(KeyOwner(k));
  const int threads = config_.http_threads;
  http_.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http_.set_payload_max_length(config_.max_body_bytes);
  http_.set_read_timeout(30, 0);
  http_.set_write_timeout(30, 0);
  // Errors httplib produces itself (413, 404 of unknown routes, ...) get OpenAI's shape too.
  http_.set_error_handler([](const Req&, Res& res) {
    if (!res.body.empty()) return;
    ApiError e;
    e.status = res.status;
    e.type = res.status >= 500 ? "server_error" : "invalid_request_error";
    e.message = res.status == 413 ? "The request body is too large." : res.status == 404 ? "Unknown endpoint." : "HTTP error " + std::to_string(res.status);
    e.code = res.status == 413 ? "request_too_large" : res.status == 404 ? "unknown_url" : "";
    http::SendError(res, e);
  });
  // Handlers outside Wrap (the status page's assets) end here; Wrap catches its own.
  http_.set_exception_handler([](const Req& req, Res& res, std::exception_ptr ep) {
    http::SendError(res, http::InternalError(req.method + " " + req.path, ep));
  });

  // Range requests are for files: applied to an API answer they cut an error body short (and a
  // JSON body in the middle). Ignoring the header is allowed (RFC 9110 14.2). The request object is
  // httplib's own non-const local, handed to handlers as const.
  //
  // Request ids: a sane client X-Request-Id is kept, anything else replaced by a generated one in
  // the request itself, so that handlers, their log lines and the response all carry the same.
  http_.set_pre_routing_handler([this](const Req& req, Res& res) {
    Req& r = const_cast<Req&>(req);
    r.ranges.clear();
    if (!http::SaneRequestId(r.get_header_value("X-Request-Id"))) {
      r.headers.erase("X-Request-Id");
      r.headers.emplace("X-Request-Id", http::NewRequestId());
    }
    SetLogRequestId(r.get_header_value("X-Request-Id"));
    // A CORS preflight names the method and headers the page wants; it carries no credentials, so
    // it is answered before auth (browsers send the API key only on the real request).
    if (req.method == "OPTIONS" && req.has_header("Access-Control-Request-Method")) {
      const std::string origin = CorsOrigin(req);
      if (origin.empty()) {
        res.status = 403;
        return httplib::Server::HandlerResponse::Handled;
      }
      res.status = 204;
      res.set_header("Access-Control-Allow-Origin", origin);
      res.set_header("Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS");
      const std::string asked = req.get_header_value("Access-Control-Request-Headers");
      res.set_header("Access-Control-Allow-Headers", asked.empty() ? "Authorization, Content-Type" : asked);
      res.set_header("Access-Control-Max-Age", "600");
      if (origin != "*") res.set_header("Vary", "Origin");
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  // Every response carries the request id, those httplib makes before routing (413 by
  // Content-Length) too.
  http_.set_post_routing_handler([this](const Req& req, Res& res) {
    const std::string id = req.get_header_value("X-Request-Id");
    res.headers.erase("X-Request-Id");
    res.set_header("X-Request-Id", http::SaneRequestId(id) ? id : http::NewRequestId());
    const std::string origin = CorsOrigin(req);
    if (origin.empty()) return;
    res.set_header("Access-Control-Allow-Origin", origin);
    res.set_header("Access-Control-Expose-Headers", "X-Session-Id, X-Request-Id, Retry-After");
    if (origin != "*") res.set_header("Vary", "Origin");
  });
  // POST bodies are read here whatever their Content-Type: cpp-httplib's own reader refuses an
  // application/x-www-form-urlencoded body over 8 KB with a 413 (a compile-time limit of the
  // packaged library), and that is what `curl -d` sends. The --max-body-mb limit still applies.
  auto post = [this](const std::string& pattern, httplib::Server::Handler h) {
    http_.Post(pattern, [h](const Req& req, Res& res, const httplib::ContentReader& read) {
      Req with_body = req;  // headers and matches (whose iterators point into req.path, alive)
      if (req.is_multipart_form_data()) {  // read and dropped: bodies are JSON
        if (read([](const httplib::MultipartFormData&) { return true; }, [](const char*, size_t) { return true; })) {
          http::SendError(res, http::BadRequest("The request body must be JSON, not multipart form data.", "",
                                                "invalid_json"));
        }
        return;
      }
      if (!read([&](const char* data, size_t n) {
            with_body.body.append(data, n);
            return true;
          })) {
        return;  // res.status says why (413 over the limit, 400); the error handler shapes it
      }
      h(with_body, res);
    });
  };
  auto bind = [this](auto method) {
    return [this, method](const Req& q, Res& s, const std::string& o) { (this->*method)(q, s, o); };
  };
  post("/v1/chat/completions", Wrap("/v1/chat/completions", true, bind(&ApiServer::ChatCompletions), /*turn=*/true));
  post("/v1/completions", Wrap("/v1/completions", true, bind(&ApiServer::Completions), /*turn=*/true));
  post("/v1/responses", Wrap("/v1/responses", true, bind(&ApiServer::CreateResponse), /*turn=*/true));
  http_.Get(R"(/v1/responses/([A-Za-z0-9_\-]+))", Wrap("/v1/responses/{id}", true, bind(&ApiServer::GetResponse)));
  http_.Delete(R"(/v1/responses/([A-Za-z0-9_\-]+))", Wrap("/v1/responses/{id}", true, bind(&ApiServer::DeleteResponse)));
  http_.Get(R"(/v1/responses/([A-Za-z0-9_\-]+)/input_items)",
            Wrap("/v1/responses/{id}/input_items", true, bind(&ApiServer::ListInputItems)));
  auto conv = Wrap("/v1/conversations", true, bind(&ApiServer::Conversations));
  post("/v1/conversations", conv);
  http_.Get(R"(/v1/conversations/([A-Za-z0-9_\-]+)(/items)?(?:/([A-Za-z0-9_\-]+))?)", conv);
  post(R"(/v1/conversations/([A-Za-z0-9_\-]+)(/items)?)", conv);
  http_.Delete(R"(/v1/conversations/([A-Za-z0-9_\-]+)(/items)?(?:/([A-Za-z0-9_\-]+))?)", conv);
  post("/tokenize", Wrap("/tokenize", true, bind(&ApiServer::Tokenize)));
  post("/detokenize", Wrap("/detokenize", true, bind(&ApiServer::Detokenize)));
  http_.Get("/v1/sessions", Wrap("/v1/sessions", true, bind(&ApiServer::ListSessions)));
  auto model_object = [this] {
    return Json{{"id", service_.config().model_name}, {"object", "model"}, {"created", 0}, {"owned_by", "mnemo"},
                {"max_model_len", service_.engine().max_context()}};
  };
  http_.Get("/v1/models", Wrap("/v1/models", true, [model_object](const Req&, Res& res, const std::string&) {
    http::SendJson(res, {{"object", "list"}, {"data", Json::array({model_object()})}});
  }));
  // Model ids may contain '/' (e.g. "org/name.gguf"): everything after /v1/models/ is the id.
  http_.Get(R"(/v1/models/(.+))", Wrap("/v1/models/{id}", true, [this, model_object](const Req& req, Res& res,
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
    http_.Get(path, [this, path](const Req&, Res& res) {
      std::string type;
      std::string_view body = web::Asset(path, &type);
      res.set_content(body.data(), body.size(), type);
      metrics_.Request(path, res.status);
    });
  }
  // Liveness (always 200 while the process serves) and readiness (503 with Retry-After while
  // draining), both with the admission queue.
  http_.Get("/health", Wrap("/health", false, [this](const Req&, Res& res, const std::string&) {
    http::SendJson(res, StatusJson());
  }));
  http_.Get("/ready", Wrap("/ready", false, [this](const Req&, Res& res, const std::string&) {
    http::SendJson(res, StatusJson(), draining_ ? 503 : 200);
    if (draining_) res.set_header("Retry-After", "1");
  }));
  http_.Get("/metrics", Wrap("/metrics", false, [this](const Req&, Res& res, const std::string&) {
    res.set_content(metrics_.Render(service_.engine().Stats(), service_.engine().Queue()), "text/plain; version=0.0.4");
  }));
}

ApiServer::~ApiServer() { Stop(); }

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

httplib::Server::Handler ApiServer::Wrap(const std::string& route, bool auth,
                                         std::function<void(const Req&, Res&, const std::string&)> fn, bool turn) {
  return [this, route, auth, fn, turn](const Req& req, Res& res) {
    std::string owner;
    if (auth) {
      auto a = Authenticate(req);
      if (auto* e = std::get_if<ApiError>(&a)) {
        http::SendError(res, *e);
        metrics_.Request(route, res.status);
        return;
      }
      owner = std::get<std::string>(a);
    }
    if (turn) {
      if (auto e = Shed()) {
        http::SendError(res, *e);
        if (res.status == 429) SetRetryAfter(res, RetryAfterSeconds());
        metrics_.Request(route, res.status);
        return;
      }
    }
    const double cpu0 = ThreadCpuSeconds();
    try {
      fn(req, res, owner);
    } catch (...) {  // a bug, never bad input: the client sees no exception text, the log does
      http::SendError(res, http::InternalError(req.method + " " + req.path, std::current_exception()));
    }
    if (res.status == 429) {  // refused by the engine after all (queue full, the wait, a timeout)
      metrics_.Shed("engine");
      SetRetryAfter(res, RetryAfterSeconds());
    }
    metrics_.RequestCpu(route, ThreadCpuSeconds() - cpu0);
    metrics_.Request(route, res.status);
    // Every error is logged with the request id the client got (X-Request-Id): 5xx at error level
    // (their detail was logged where it happened, under the same id), refusals for load at debug
    // (an overload makes thousands), other client errors at info.
    const std::string& rid = LogRequestId();
    if (res.status >= 500) {
      spdlog::error("request {}: {} {} -> {}: {}", rid, req.method, req.path, res.status, res.body.substr(0, 300));
    } else if (res.status == 429) {
      spdlog::debug("request {}: {} {} -> {}", rid, req.method, req.path, res.status);
    } else if (res.status >= 400) {
      spdlog::info("request {}: {} {} -> {}: {}", rid, req.method, req.path, res.status, res.body.substr(0, 300));
    } else {
      spdlog::debug("request {}: {} {} -> {}", rid, req.method, req.path, res.status);
    }
  };
}

std::optional<ApiError> ApiServer::Shed() {
  if (draining_) {
    metrics_.Shed("draining");
    return ApiError{503, "server_error", "The server is shutting down; retry on another replica or later.", "",
                    "unavailable"};
  }
  Status st = service_.engine().CheckAdmission();
  if (st.ok()) return std::nullopt;
  metrics_.Shed("admission");
  return ToApiError(st.error(), "The server is overloaded: ");
}

int ApiServer::RetryAfterSeconds() const {
  const QueueState q = service_.engine().Queue();
  const double over = q.max_queue_s > 0 ? q.estimated_wait_s - q.max_queue_s : 0;
  return std::isfinite(over) ? std::clamp(static_cast<int>(std::ceil(over)), 1, 30) : 30;
}

std::optional<ApiError> ApiServer::AwaitAdmission(const StartedTurn& t, const std::string& owner) {
  if (t.handle->WaitAdmitted()) return std::nullopt;
  const TurnResult r = t.handle->Wait();
  metrics_.Turn(r);
  service_.Commit(t, r, std::nullopt, std::nullopt, owner);  // not completed: discarded
  if (r.finish_reason == FinishReason::kError) return ToApiError(r.error);
  return ApiError{503, "server_error", "The server is shutting down; retry on another replica or later.", "",
                  "unavailable"};
}

ApiServer::http_json_t ApiServer::StatusJson() const {
  const QueueState q = service_.engine().Queue();
  Json queue = {{"waiting", q.waiting},
                {"max_waiting", q.max_waiting},
                {"estimated_wait_ms", std::isfinite(q.estimated_wait_s) ? Json(std::lround(q.estimated_wait_s * 1000)) : Json(nullptr)},
                {"max_queue_ms", std::lround(q.max_queue_s * 1000)},
                {"drain_rate_per_s", q.drain_rate >= 0 ? Json(q.drain_rate) : Json(nullptr)}};
  return {{"status", draining_ ? "draining" : "ok"}, {"queue", queue}};
}

Status ApiServer::Start() {
  if (config_.port == 0) {
    port_ = http_.bind_to_any_port(config_.host);
    if (port_ <= 0) return MakeError("cannot bind %s", config_.host.c_str());
  } else if (http_.bind_to_port(config_.host, config_.port)) {
    port_ = config_.port;
  } else {
    return MakeError("cannot bind %s:%d (in use?)", config_.host.c_str(), config_.port);
  }
  WidenBacklog(port_);
  listen_ended_ = false;
  thread_ = std::thread([this] {
    http_.listen_after_bind();
    listen_ended_ = true;
  });
  // cpp-httplib's stop() closes the socket only once listening has begun; a Stop() before that (a
  // SIGTERM pending since start-up) did nothing, and the listener then blocked in accept() forever.
  // So Start() returns once the listener runs (or has already given up).
  while (!http_.is_running() && !listen_ended_) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return Status::Ok();
}

void ApiServer::Stop() {
  draining_ = true;
  http_.stop();
  if (thread_.joinable()) thread_.join();
}

void ApiServer::Wait() {
  if (thread_.joinable()) thread_.join();
}

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
