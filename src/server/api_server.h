// The OpenAI-compatible HTTP server: routes, API-key auth, OpenAI-shaped errors, body limits, and
// the handlers of every endpoint (chat_api.cpp, responses_api.cpp, api_server.cpp).
//
// Threads: cpp-httplib runs one handler thread per connection from a pool of http_threads; a
// streaming response keeps its thread until the turn ends.
#pragma once

#include <httplib.h>

#include <atomic>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/status.h"
#include "server/metrics.h"
#include "server/service.h"

namespace mnemo {

struct ServerConfig {
  std::string host = "127.0.0.1";      // bind address
  int port = 8080;                     // 0 = any free port (see ApiServer::port)
  std::vector<std::string> api_keys;   // accepted bearer keys; empty = no auth
  size_t max_body_bytes = 8u << 20;    // larger bodies get 413
  int http_threads = 128;              // connections served at once
  // Origins whose browser pages may call the API (CORS): each gets Access-Control-Allow-Origin and
  // its preflights are answered; "*" allows any. Empty = no CORS headers (browsers then refuse).
  std::vector<std::string> cors_origins;
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
  // Blocks until Stop (from another thread or a signal handler's flag).
  void Wait();
  int port() const { return port_; }

 private:
  using Req = httplib::Request;
  using Res = httplib::Response;
  // The request's owner (hash of its API key), or an error when auth fails.
  std::variant<std::string, ApiError> Authenticate(const Req& req) const;
  // Wraps a handler with auth, error shaping and metrics. turn: the route starts a turn, so it is
  // refused before any work (no parsing, rendering or session) when the engine is shedding load
  // (429) or the server drains (503), both with Retry-After.
  httplib::Server::Handler Wrap(const std::string& route, bool auth,
                                std::function<void(const Req&, Res&, const std::string& owner)> fn,
                                bool turn = false);
  // Why a turn would be refused now (draining, queue full, wait past the bound), or nullopt.
  std::optional<ApiError> Shed();
  // Seconds a refused client should wait before it retries (Retry-After): the time the queue,
  // draining at its measured rate with nothing new, takes to come back within the bound; 1 to 30.
  int RetryAfterSeconds() const;
  // A stream commits to status 200 with its first byte, so it first waits for the engine to admit
  // its turn: a turn ended before that (it waited past the bound, shutdown) is discarded and its
  // error returned, to be sent with its real status.
  std::optional<ApiError> AwaitAdmission(const StartedTurn& t, const std::string& owner);
  // The queue and the server's state (/health, /ready).
  http_json_t StatusJson() const;

  void ChatCompletions(const Req& req, Res& res, const std::string& owner);
  void Completions(const Req& req, Res& res, const std::string& owner);
  void CreateResponse(const Req& req, Res& res, const std::string& owner);
  void GetResponse(const Req& req, Res& res, const std::string& owner);
  void DeleteResponse(const Req& req, Res& res, const std::string& owner);
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
  httplib::Server http_;
  std::thread thread_;
  std::atomic<bool> listen_ended_{false};  // the listener thread's listen call returned
  std::atomic<bool> draining_{false};      // Stop was called: new turns get 503
  int port_ = 0;
};

// The owner id of an API key: hex of its SHA-256 (keys themselves are never stored).
std::string KeyOwner(const std::string& key);

}  // namespace mnemo
