// The OpenAI-compatible HTTP server: routes, API-key auth, OpenAI-shaped errors, body limits, and
// the handlers of every endpoint (chat_api.cpp, responses_api.cpp, api_server.cpp).
//
// Threads: an event-driven HTTP server (http_server.h): I/O threads own the sockets, a bounded
// pool of http_threads workers runs the handlers. A turn's answer (streamed or whole) holds no
// thread while the engine works: the turn's events wake a worker (DriveTurn), which formats them
// and queues them on the connection.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/status.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/request_dedup.h"
#include "server/service.h"

namespace mnemo {

struct CompletionCall;

struct ServerConfig {
  std::string host = "127.0.0.1";      // bind address
  int port = 8080;                     // 0 = any free port (see ApiServer::port)
  std::vector<std::string> api_keys;   // accepted bearer keys; empty = no auth
  size_t max_body_bytes = 8u << 20;    // larger bodies get 413 (a declared length at once)
  int http_threads = 16;               // workers running handlers (no connection or stream holds one)
  int max_connections = 16384;         // open connections in total; past it 503 and close
  int max_connections_per_address = 1024;  // open connections from one client address
  double header_timeout_s = 10;        // total time for a request's line and headers
  double body_timeout_s = 60;          // total time for its body
  double idle_timeout_s = 60;          // a kept-alive connection's wait for its next request
  // Origins whose browser pages may call the API (CORS): each gets Access-Control-Allow-Origin and
  // its preflights are answered; "*" allows any. Empty = no CORS headers (browsers then refuse).
  std::vector<std::string> cors_origins;
  // HTTPS: PEM certificate chain and private key (both or neither; empty = plain HTTP).
  std::string tls_cert_file;
  std::string tls_key_file;
  // With api_keys: /metrics needs a key too (the status page then asks for one). /health, /ready
  // and the page's static files stay open (load balancers probe them; they carry no data).
  bool private_metrics = false;
  // X-Mnemo-Request-Id (request_dedup.h): how long a turn's recorded answer is replayed to retries.
  double request_id_ttl_s = 86400;
  // This replica's name (--replica-id): the X-Mnemo-Replica header of every response, /health,
  // /ready, /metrics (mnemo_replica_info) and the status page. Empty: hostname:port, once bound.
  std::string replica_id;
};

class ApiServer {
 public:
  using http_json_t = nlohmann::json;
  ApiServer(const ServerConfig& config, Service& service, Metrics& metrics);
  ~ApiServer();
  // Binds and starts serving on a background thread.
  Status Start();
  // Stops accepting and waits for the listener to end; requests still arriving on open
  // connections meanwhile (draining) are answered 503 with Retry-After.
  void Stop();
  // Starts a drain before Stop: /ready answers 503 (a front's health checks take the replica out
  // of rotation) while requests, turns included, are still served. Any thread.
  void BeginDrain() { unready_ = true; }
  // Blocks until Stop (from another thread or a signal handler's flag).
  void Wait();
  int port() const { return port_; }
  // This replica's name: ServerConfig::replica_id, else hostname:port once Start has bound ("" before).
  // Any thread.
  std::string replica_id() const;

 private:
  using Req = http::Request;
  using Res = http::Response;
  // The request's owner (hash of its API key), or an error when auth fails.
  std::variant<std::string, ApiError> Authenticate(const Req& req) const;
  // Wraps a handler with auth, error shaping and metrics. turn: the route starts a turn, so it is
  // refused before any work (no parsing, rendering or session) when the engine is shedding load
  // (429) or the server drains (503), both with Retry-After.
  http::Handler Wrap(const std::string& route, bool auth,
                                std::function<void(const Req&, Res&, const std::string& owner)> fn,
                                bool turn = false);
  // Why a turn would be refused now (draining, queue full, wait past the bound), or nullopt with
  // the turn's place at the door in *ticket (Engine::ReserveAdmission).
  std::optional<ApiError> Shed(AdmissionTicket* ticket);
  // Seconds a refused client should wait before it retries (Retry-After): the time the queue,
  // draining at its measured rate with nothing new, takes to come back within the bound; 1 to 30.
  int RetryAfterSeconds() const;
  // A stream commits to status 200 with its first byte, so its head waits for the engine to admit
  // its turn. kLater: not decided yet (call again on the turn's next news); kFailed: the turn ended
  // before admission (it waited past the bound, shutdown), was discarded, and its error was sent
  // with its real status; kOpen: the event-stream head was sent, *alive says whether the client
  // still reads.
  enum class StreamOpen { kLater, kFailed, kOpen };
  StreamOpen OpenStream(const StartedTurn& t, const std::string& owner, http::Reply& reply, bool* alive);
  // Runs step on the worker pool whenever the turn has news (an event, its admission), one call at
  // a time, until step returns true. Nothing waits on the turn meanwhile.
  void DriveTurn(const std::shared_ptr<TurnHandle>& handle, std::function<bool()> step);
  // What the choices of one chat or completions request share: the answer is complete when the
  // last one ends. Members are read and written under mu once the choices run.
  struct ChoicesRun {
    std::mutex mu;
    int left = 0;                      // choices still running
    http_json_t choices;               // [choices] each choice's object once ended (not streamed, or a request id's)
    std::optional<ApiError> error;     // the first failure (not streamed: the answer)
    std::optional<TurnResult> prompt;  // the prompt's turn, with more than one choice (usage counts it once)
    int64_t completion_tokens = 0;     // generated by all choices
    TurnResult last;                   // a choice's result (usage for one choice)
    bool head = false;                 // streamed: the head went out
    std::atomic<bool> alive{true};     // streamed: the client still reads
    // Chat-style usage: the prompt once, the tokens every choice generated.
    http_json_t Usage() const;
  };
  // Runs a request's `count` choices, handing each choice's turn to drive(i, turn) once `run` is set
  // up for them. count 1: `t` is the choice. More: `t` is the prompt's turn (AsPrefill,
  // StartedTurn::prefill), run to its end and committed; then its session is forked
  // (Service::StartChoices, on the worker pool: it waits on the engine) and every choice starts with
  // `request`. A failure before the choices start is answered on `reply` (nothing was sent before);
  // the client going away cancels whatever runs. Streamed with more than one choice, the
  // event-stream head goes out before the choices start (the prompt's turn decided the status).
  using ChoiceDriver = std::function<void(int i, StartedTurn turn)>;
  void RunChoices(StartedTurn t, const TurnRequest& request, int count, const std::string& owner,
                  std::shared_ptr<http::Reply> reply, std::shared_ptr<ChoicesRun> run, bool stream, ChoiceDriver drive);
  // A streamed choice's step before it writes: the event-stream head waits for a lone choice's
  // admission (OpenStream). nullopt: go on writing; otherwise the value the step returns.
  std::optional<bool> OpenChoiceStream(ChoicesRun& run, const StartedTurn& t, const std::string& owner,
                                       http::Reply& reply);
  // Writes s to a streamed answer while the client reads; a client gone cancels turn t. Returns
  // whether the client still reads.
  static bool WriteChoice(ChoicesRun& run, http::Reply& reply, TurnHandle& t, const std::string& s);
  // After the last streamed choice's final chunk: `usage_chunk` (unless null), [DONE], the end.
  static void EndStream(ChoicesRun& run, http::Reply& reply, TurnHandle& t, const http_json_t& usage_chunk);
  // X-Mnemo-Request-Id on a turn's request (request_dedup.h). nullopt: answered here (the stored
  // answer of an earlier attempt, with X-Mnemo-Deduplicated: true, or an error); else the ticket
  // whose Record goes with the turn's commit (null when the request carries no id).
  using Ticket = std::shared_ptr<RequestDedup::Ticket>;
  std::optional<Ticket> BeginRequest(const Req& req, Res& res, const std::string& owner, std::string_view route);
  // After a turn's commit carrying ticket's record failed: the answer another attempt of the same
  // request committed first (another replica won the race), when there is one.
  std::optional<http::Response> ReplayCommitted(const Ticket& ticket);
  // A choice's turn committed, under run.mu: the request's last choice, when nothing failed, carries
  // ticket's record of `answer` (*recorded says so) and releases the ticket. Returns this turn's
  // failure (the turn's error, else the commit's), which also becomes run.error when that is unset.
  std::optional<ApiError> CommitChoice(ChoicesRun& run, const Ticket& ticket, const StartedTurn& t,
                                       const TurnResult& r, const std::string& owner,
                                       const std::function<http_json_t()>& answer, bool* recorded);
  static http::Response Replay(const StoredRequest& r);
  // The queue and the server's state (/health, /ready).
  http_json_t StatusJson() const;

  void ChatCompletions(const Req& req, Res& res, const std::string& owner);
  void Completions(const Req& req, Res& res, const std::string& owner);
  // One prompt's completions (call.spec), answered on reply; session_key: X-Session-Id.
  void RunCompletion(CompletionCall call, Ticket ticket, const std::string& owner, const std::string& session_key,
                     std::shared_ptr<http::Reply> reply);
  void CreateResponse(const Req& req, Res& res, const std::string& owner);
  void CountResponseTokens(const Req& req, Res& res, const std::string& owner);
  // Both: count_only renders the prompt and answers its token count, starting no turn.
  void RunResponse(const Req& req, Res& res, const std::string& owner, bool count_only);
  void GetResponse(const Req& req, Res& res, const std::string& owner);
  void DeleteResponse(const Req& req, Res& res, const std::string& owner);
  void CancelResponse(const Req& req, Res& res, const std::string& owner);
  void ListInputItems(const Req& req, Res& res, const std::string& owner);
  void Conversations(const Req& req, Res& res, const std::string& owner);
  void Tokenize(const Req& req, Res& res, const std::string& owner);
  void Detokenize(const Req& req, Res& res, const std::string& owner);
  void ListSessions(const Req& req, Res& res, const std::string& owner);
  // The Access-Control-Allow-Origin value for a request's Origin header ("" = none).
  std::string CorsOrigin(const Req& req) const;

  ServerConfig config_;
  Service& service_;
  Metrics& metrics_;
  std::vector<std::string> key_hashes_;  // owners of the configured keys
  std::unique_ptr<http::Server> http_;
  std::unique_ptr<RequestDedup> dedup_;
  std::atomic<bool> draining_{false};      // Stop was called: new turns get 503
  std::atomic<bool> unready_{false};       // BeginDrain was called: /ready answers 503
  int port_ = 0;
  mutable std::mutex replica_mu_;
  std::string replica_id_;  // guarded by replica_mu_: Start sets it while the I/O threads may answer
};

// The owner id of an API key: hex of its SHA-256 (keys themselves are never stored).
std::string KeyOwner(const std::string& key);

}  // namespace mnemo
