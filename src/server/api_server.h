// The OpenAI-compatible HTTP server: routes, API-key auth, OpenAI-shaped errors, body limits, and
// the handlers of every endpoint (chat_api.cpp, responses_api.cpp, api_server.cpp).
//
// Threads: cpp-httplib runs one handler thread per connection from a pool of http_threads; a
// streaming response keeps its thread until the turn ends.
#pragma once

#include <httplib.h>

#include <atomic>

#include <memory>
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
  ApiServer(const ServerConfig& config, Service& service, Metrics& metrics);
  ~ApiServer();
  // Binds and starts serving on a background thread.
  Status Start();
  // Stops accepting and waits for the listener to end.
  void Stop();
  // Blocks until Stop (from another thread or a signal handler's flag).
  void Wait();
  int port() const { return port_; }

 private:
  using Req = httplib::Request;
  using Res = httplib::Response;
  // The request's owner (hash of its API key), or an error when auth fails.
  std::variant<std::string, ApiError> Authenticate(const Req& req) const;
  // Wraps a handler with auth, error shaping and metrics.
  httplib::Server::Handler Wrap(const std::string& route, bool auth,
                                std::function<void(const Req&, Res&, const std::string& owner)> fn);

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
  int port_ = 0;
};

// The owner id of an API key: hex of its SHA-256 (keys themselves are never stored).
std::string KeyOwner(const std::string& key);

}  // namespace mnemo
