// An event-driven HTTP/1.1 server (Boost.Asio + Beast's request parser): a few I/O threads serve
// every connection; handlers run on a bounded worker pool; an answer that waits on something else
// (a turn of the engine) is deferred and completed later from any thread, without holding one.
//
// What a connection costs: while idle, reading, or streaming, a socket, a parser and its buffers
// (a few KB), no thread. Limits, all total rather than per read (a client that sends one header byte
// a second is cut at the header deadline, not kept alive by its trickle):
//   idle_s     a kept-alive connection waits this long for the first byte of its next request;
//   header_s   from that byte, the request line and headers must be complete within this;
//   body_s     the body must have arrived within this after the headers;
//   write_s    each write of the answer must drain within this (a client that stops reading).
// A Content-Length over max_body_bytes is answered 413 as soon as the headers are read, without
// reading the body. Connections past max_connections (in total) or max_per_address (one client
// address) are answered 503 and closed at once.
//
// Threads: io_threads run every socket operation; workers run handlers. Reply may be used from any
// thread. Handlers must not block for long (a bounded pool): waits on the engine are deferred.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <regex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "base/status.h"

namespace mnemo::http {

struct ServerLimits {
  int io_threads = 1;                // threads running the sockets (one is plenty below ~50k requests/s)
  int workers = 16;                  // threads running handlers (JSON parsing, store queries, turn starts)
  int quick_workers = 2;             // threads of each of the kQuick and kEvents lanes
  int max_connections = 16384;       // open connections in total (the fd limit is raised to fit)
  int max_per_address = 1024;        // open connections from one client address
  double idle_s = 60;                // keep-alive: wait for the next request's first byte
  double header_s = 10;              // total time for the request line and headers
  double body_s = 60;                // total time for the body after the headers
  double write_s = 30;               // each write of an answer (a stalled reader is dropped)
  size_t max_header_bytes = 64 << 10;  // request line and headers; 431 past it
  size_t max_body_bytes = 8u << 20;  // 413 past it (before the body is read when it is declared)
  size_t max_queued_bytes = 8u << 20;  // a stream's unsent bytes; past it the reader is too slow and dropped
};

using Headers = std::vector<std::pair<std::string, std::string>>;

// Case-insensitive header lookup ("" when absent).
std::string HeaderValue(const Headers& h, std::string_view name);

struct Request {
  std::string method;                // "GET", "POST", ...
  std::string path;                  // decoded, without the query
  std::string query;                 // raw, after '?'
  Headers headers;
  std::string body;
  std::vector<std::string> matches;  // the route's regex groups ([0] = the whole path)
  std::string remote;                // the client's address

  std::string get_header_value(std::string_view name) const { return HeaderValue(headers, name); }
  bool has_header(std::string_view name) const;
  // Query parameters, percent-decoded.
  bool has_param(std::string_view name) const;
  std::string get_param_value(std::string_view name) const;
};

class Reply;

struct Response {
  int status = 200;
  Headers headers;
  std::string body;
  // Called once with the final response just before it is sent (for a stream: its head), on
  // whatever thread sends it; the layer that wraps a handler uses it for metrics and logs.
  std::function<void(Response&)> before_send;

  // Replaces any header of that name.
  void set_header(std::string_view name, std::string value);
  void erase_header(std::string_view name);
  std::string get_header_value(std::string_view name) const { return HeaderValue(headers, name); }
  bool has_header(std::string_view name) const;
  void set_content(std::string content, std::string content_type);

  // The handler answers later: this response's headers and before_send move into the Reply, whose
  // Send or Begin/Write/End complete it from any thread. Call at most once.
  std::shared_ptr<Reply> Defer();
  bool deferred() const { return deferred_ != nullptr; }

 private:
  friend class Server;
  friend class Connection;
  std::shared_ptr<Reply> deferred_;
  std::function<std::shared_ptr<Reply>(Response&)> make_reply_;  // set by the server before the handler runs
};

// A deferred answer. Thread-safe. Completing it (Send, End) lets the connection read its next
// request; dropping the last reference without completing closes the connection.
class Reply {
 public:
  virtual ~Reply() = default;
  // The whole answer at once. Its headers are merged over those set before Defer.
  virtual void Send(Response res) = 0;
  // A streamed answer (chunked): head now, then Write any number of times, then End. Write returns
  // false once the client is gone or too slow (more than max_queued_bytes unsent); the data is dropped.
  virtual bool Begin(Response head) = 0;
  virtual bool Write(std::string data) = 0;
  virtual void End() = 0;
  // fn runs once when the connection closes before the answer was completed (the client went
  // away, or a write failed): at once if that already happened. Runs on an I/O thread: keep it short.
  virtual void OnClose(std::function<void()> fn) = 0;
};

using Handler = std::function<void(const Request&, Response&)>;

class Server {
 public:
  explicit Server(const ServerLimits& limits);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Which threads run a handler or a task: kWork, the worker pool (handlers that may wait on the
  // engine: a turn's start waits for the engine's next step); kQuick, a pair of threads for answers
  // that never wait on a turn (health, readiness, metrics), so that a burst of turn starts cannot
  // hold them up; kEvents, a pair for turns' events (formatting, the commit at a turn's end).
  enum class Lane { kWork, kQuick, kEvents };
  // Routes: a regex over the whole decoded path, tried in the order added.
  void Route(std::string method, const std::string& pattern, Handler h, Lane lane = Lane::kWork);
  // Runs on the I/O thread before routing: may rewrite the request (ids) or answer it alone
  // (returns true: the response is sent as is, e.g. a CORS preflight).
  std::function<bool(Request&, Response&)> pre_routing;
  // Applied to every response before it is sent, the server's own errors included.
  std::function<void(const Request&, Response&)> post_routing;
  // Shapes the server's own errors (404, 413, 400, 431, 503) into res.body.
  std::function<void(const Request&, Response&)> error_page;

  // Serves HTTPS instead of HTTP (before Listen): PEM files, the certificate chain (leaf first) and
  // its private key; TLS 1.2 or 1.3. The handshake counts against header_s. Errors: kInvalidArgument
  // (unreadable file, bad PEM, a key that does not match the certificate).
  Status UseTls(const std::string& cert_chain_file, const std::string& private_key_file);
  // Binds (port 0: any free port) and starts the I/O threads and workers.
  Status Listen(const std::string& host, int port);
  int port() const { return port_; }
  // Stops accepting, waits until every request in flight has been answered (streams ended), closes
  // every connection and ends the threads. Idempotent.
  void Stop();
  // Blocks until Stop has ended the threads.
  void Wait();

  // Open connections now (for tests and metrics).
  int connections() const;
  // Runs fn on a lane's threads (bounded threads, unbounded queue).
  void Post(std::function<void()> fn, Lane lane = Lane::kWork);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

}  // namespace mnemo::http
