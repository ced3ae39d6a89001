#include "server/http_server.h"

#include <malloc.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <array>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <map>
#include <optional>
#include <unordered_set>

#include "base/log.h"

namespace mnemo::http {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {

bool IEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); i++) {
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  }
  return true;
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// %XX decoding; plus_space: '+' is a space (query strings).
std::string Decode(std::string_view s, bool plus_space) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); i++) {
    if (s[i] == '%' && i + 2 < s.size() && HexDigit(s[i + 1]) >= 0 && HexDigit(s[i + 2]) >= 0) {
      out += static_cast<char>(HexDigit(s[i + 1]) * 16 + HexDigit(s[i + 2]));
      i += 2;
    } else if (plus_space && s[i] == '+') {
      out += ' ';
    } else {
      out += s[i];
    }
  }
  return out;
}

// A malformed request (as opposed to a timeout, a reset or the client closing).
bool IsParseError(const boost::system::error_code& ec) {
  return &ec.category() == &bhttp::make_error_code(bhttp::error::bad_method).category() &&
         ec != bhttp::error::end_of_stream && ec != bhttp::error::partial_message;
}

std::chrono::steady_clock::duration Seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

// The status line and headers of a response, ending with the blank line.
std::string Head(const Response& res, bool keep_alive, bool chunked, bool head_only) {
  std::string out = "HTTP/1.1 " + std::to_string(res.status) + " ";
  const auto reason = bhttp::obsolete_reason(static_cast<bhttp::status>(res.status));
  out.append(reason.data(), reason.size());
  out += "\r\n";
  for (const auto& [k, v] : res.headers) {
    if (IEquals(k, "Content-Length") || IEquals(k, "Connection") || IEquals(k, "Transfer-Encoding")) continue;
    out += k + ": " + v + "\r\n";
  }
  if (chunked) {
    out += "Transfer-Encoding: chunked\r\n";
  } else {
    out += "Content-Length: " + std::to_string(res.body.size()) + "\r\n";
  }
  out += keep_alive ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
  if (!chunked && !head_only) out += res.body;
  return out;
}

// A fixed pool of worker threads over an unbounded FIFO of tasks.
class WorkerPool {
 public:
  explicit WorkerPool(int n) {
    for (int i = 0; i < std::max(1, n); i++) threads_.emplace_back([this] { Run(); });
  }
  ~WorkerPool() { Shutdown(); }
  // Runs what is queued, then ends the threads; later Posts are dropped.
  void Shutdown() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
    threads_.clear();
  }
  void Post(std::function<void()> fn) {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (stop_) return;
      tasks_.push_back(std::move(fn));
    }
    cv_.notify_one();
  }

 private:
  void Run() {
    for (;;) {
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&] { return stop_ || !tasks_.empty(); });
        if (tasks_.empty()) return;  // stop_, and the queue drained
        fn = std::move(tasks_.front());
        tasks_.pop_front();
      }
      fn();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace

std::string HeaderValue(const Headers& h, std::string_view name) {
  for (const auto& [k, v] : h) {
    if (IEquals(k, name)) return v;
  }
  return "";
}

bool Request::has_header(std::string_view name) const {
  for (const auto& kv : headers) {
    if (IEquals(kv.first, name)) return true;
  }
  return false;
}

bool Request::has_param(std::string_view name) const {
  size_t pos = 0;
  while (pos <= query.size()) {
    size_t amp = query.find('&', pos);
    if (amp == std::string::npos) amp = query.size();
    std::string_view kv(query.data() + pos, amp - pos);
    const std::string key = Decode(kv.substr(0, kv.find('=')), true);
    if (!kv.empty() && key == name) return true;
    pos = amp + 1;
  }
  return false;
}

std::string Request::get_param_value(std::string_view name) const {
  size_t pos = 0;
  while (pos <= query.size()) {
    size_t amp = query.find('&', pos);
    if (amp == std::string::npos) amp = query.size();
    std::string_view kv(query.data() + pos, amp - pos);
    const size_t eq = kv.find('=');
    if (!kv.empty() && Decode(kv.substr(0, eq), true) == name) {
      return eq == std::string_view::npos ? std::string() : Decode(kv.substr(eq + 1), true);
    }
    pos = amp + 1;
  }
  return "";
}

void Response::set_header(std::string_view name, std::string value) {
  erase_header(name);
  headers.emplace_back(std::string(name), std::move(value));
}

void Response::erase_header(std::string_view name) {
  std::erase_if(headers, [&](const auto& kv) { return IEquals(kv.first, name); });
}

bool Response::has_header(std::string_view name) const {
  for (const auto& kv : headers) {
    if (IEquals(kv.first, name)) return true;
  }
  return false;
}

void Response::set_content(std::string content, std::string content_type) {
  body = std::move(content);
  set_header("Content-Type", std::move(content_type));
}

std::shared_ptr<Reply> Response::Defer() {
  if (!deferred_ && make_reply_) deferred_ = make_reply_(*this);
  return deferred_;
}

class Connection;

struct Server::Impl {
  ServerLimits limits;
  net::io_context ioc;
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work;
  std::optional<tcp::acceptor> acceptor;
  std::optional<net::ssl::context> tls;  // set by UseTls: every connection is TLS
  std::vector<std::thread> io_threads;
  std::unique_ptr<WorkerPool> workers;
  std::unique_ptr<WorkerPool> quick;
  std::unique_ptr<WorkerPool> events;
  struct RouteEntry {
    std::string method;
    std::regex pattern;
    Handler handler;
    Server::Lane lane;
  };
  std::vector<RouteEntry> routes;
  Server* owner = nullptr;

  std::mutex conn_mu;  // guards conns and per_address
  std::unordered_set<Connection*> conns;
  std::map<std::string, int> per_address;
  std::atomic<int> inflight{0};  // requests dispatched and not yet answered
  std::atomic<bool> stopping{false};
  bool stopped = false;
  std::mutex stop_mu;

  void Accept();
};

// One connection: every member is touched only on its strand (the socket's executor), except the
// atomics that Reply reads from other threads.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(Server::Impl* srv, tcp::socket socket, std::string address)
      : srv_(srv), stream_(std::move(socket)), address_(std::move(address)) {
    if (srv_->tls) tls_.emplace(stream_, *srv_->tls);
    std::lock_guard<std::mutex> l(srv_->conn_mu);
    srv_->conns.insert(this);
    srv_->per_address[address_]++;
  }
  ~Connection() {
    std::lock_guard<std::mutex> l(srv_->conn_mu);
    srv_->conns.erase(this);
    if (--srv_->per_address[address_] == 0) srv_->per_address.erase(address_);
  }

  void Start() {
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] {
      if (!self->tls_) return self->ReadNext();
      // The handshake counts against the header deadline: a client that opens a connection and
      // sends nothing (or trickles its hello) holds it no longer than one that trickles a head.
      self->stream_.expires_after(Seconds(self->srv_->limits.header_s));
      self->tls_->async_handshake(net::ssl::stream_base::server, [self](beast::error_code ec) {
        if (ec) {
          spdlog::debug("http: TLS handshake from {} failed: {}", self->address_, ec.message());
          return self->Close();
        }
        self->ReadNext();
      });
    });
  }
  // From any thread.
  void PostClose() {
    net::post(stream_.get_executor(), [self = shared_from_this()] { self->Close(); });
  }

  // The Reply of the request being answered; defined below.
  class ReplyImpl;

  std::atomic<size_t> queued_{0};  // bytes enqueued and not yet written
  std::atomic<bool> closed_{false};

 private:
  friend class ReplyImpl;

  void ReadNext() {
    if (closed_) return;
    if (buffer_.size() > 0) return ReadHeader();
    // Idle: wait for the first byte of the next request, at most idle_s.
    stream_.expires_after(Seconds(srv_->limits.idle_s));
    WithStream([&](auto& s) {
      s.async_read_some(buffer_.prepare(4096), [self = shared_from_this()](beast::error_code ec, size_t n) {
        if (ec) return self->Close();
        self->buffer_.commit(n);
        self->ReadHeader();
      });
    });
  }

  void ReadHeader() {
    parser_.emplace();
    parser_->header_limit(static_cast<std::uint32_t>(srv_->limits.max_header_bytes));
    parser_->body_limit(srv_->limits.max_body_bytes);
    // One deadline for the whole head, however it trickles in.
    stream_.expires_after(Seconds(srv_->limits.header_s));
    WithStream([&](auto& s) {
      bhttp::async_read_header(s, buffer_, *parser_, [self = shared_from_this()](beast::error_code ec, size_t) {
        self->OnHeader(ec);
      });
    });
  }

  void OnHeader(beast::error_code ec) {
    if (ec == bhttp::error::body_limit) return Refuse(413);  // declared too large: the body is never read
    if (ec == bhttp::error::header_limit) return Refuse(431);
    if (ec) {
      // Timeouts and resets close quietly; a malformed head gets a 400 first.
      return IsParseError(ec) ? Refuse(400) : Close();
    }
    if (parser_->is_done()) return Dispatch();
    auto read_body = [self = shared_from_this()] {
      self->stream_.expires_after(Seconds(self->srv_->limits.body_s));
      self->WithStream([&](auto& s) {
        bhttp::async_read(s, self->buffer_, *self->parser_, [self](beast::error_code ec, size_t) {
          if (ec == bhttp::error::body_limit) return self->Refuse(413);
          if (ec) return IsParseError(ec) ? self->Refuse(400) : self->Close();
          self->Dispatch();
        });
      });
    };
    if (IEquals(std::string(parser_->get()[bhttp::field::expect]), "100-continue")) {
      auto msg = std::make_shared<std::string>("HTTP/1.1 100 Continue\r\n\r\n");
      stream_.expires_after(Seconds(srv_->limits.write_s));
      WithStream([&](auto& s) {
        net::async_write(s, net::buffer(*msg), [self = shared_from_this(), msg, read_body](beast::error_code ec, size_t) {
          if (ec) return self->Close();
          read_body();
        });
      });
      return;
    }
    read_body();
  }

  // The request's head as a Request (for the server's own errors, before or without a body).
  std::shared_ptr<Request> HeadRequest() {
    auto req = std::make_shared<Request>();
    if (!parser_) return req;
    const auto& msg = parser_->get();
    req->method = std::string(msg.method_string());
    const std::string_view target(msg.target().data(), msg.target().size());
    const size_t q = target.find('?');
    req->path = Decode(target.substr(0, q), false);
    if (q != std::string_view::npos) req->query = std::string(target.substr(q + 1));
    for (const auto& f : msg) req->headers.emplace_back(std::string(f.name_string()), std::string(f.value()));
    req->remote = address_;
    return req;
  }

  // Answers with the server's own error and closes (the rest of the request is not read).
  void Refuse(int status) {
    auto req = HeadRequest();
    Response res;
    res.status = status;
    if (srv_->owner->error_page) srv_->owner->error_page(*req, res);
    req_ = req;
    keep_alive_ = false;
    srv_->inflight++;
    SendNow(std::move(res));
  }

  void Dispatch() {
    auto req = HeadRequest();
    keep_alive_ = parser_->get().keep_alive();
    req->body = std::move(parser_->get().body());
    parser_.reset();
    req_ = req;
    srv_->inflight++;
    Response res;
    if (srv_->owner->pre_routing && srv_->owner->pre_routing(*req, res)) return SendNow(std::move(res));
    const Handler* handler = nullptr;
    Server::Lane lane = Server::Lane::kWork;
    for (const auto& r : srv_->routes) {
      const bool method_ok = r.method == req->method || (req->method == "HEAD" && r.method == "GET");
      std::smatch m;
      if (!method_ok || !std::regex_match(req->path, m, r.pattern)) continue;
      for (const auto& g : m) req->matches.push_back(g.str());
      handler = &r.handler;
      lane = r.lane;
      break;
    }
    if (!handler) {
      res.status = 404;
      if (srv_->owner->error_page) srv_->owner->error_page(*req, res);
      return SendNow(std::move(res));
    }
    // The handler runs on a worker: parsing and store queries never stall the sockets.
    srv_->owner->Post([self = shared_from_this(), req, handler] {
      Response res;
      std::weak_ptr<Connection> weak = self;
      Server::Impl* srv = self->srv_;
      res.make_reply_ = [srv, weak, req](Response& r) -> std::shared_ptr<Reply> { return MakeReply(srv, weak, req, r); };
      try {
        (*handler)(*req, res);
      } catch (...) {
        spdlog::error("{} {}: an exception escaped the handler", req->method, req->path);
        res = Response();
        res.status = 500;
        if (self->srv_->owner->error_page) self->srv_->owner->error_page(*req, res);
      }
      const bool large = req->body.size() >= (1u << 20);
      std::string().swap(req->body);  // handlers copy what they keep: a long stream holds no body
      // glibc keeps what a large request freed (its body, its parsed JSON, a rejected prompt's
      // tokens) in the arenas of the threads that touched it, and after a freed mmap its threshold
      // rises so that the next large buffers come from those arenas too: 7 MB prompts, rejected,
      // left RSS near 1 GB (issue 13). Handing the free pages back costs a walk of the arenas
      // (about a millisecond), only after bodies of 1 MB or more.
      if (large) malloc_trim(0);
      if (res.deferred()) return;      // the Reply answers
      net::post(self->stream_.get_executor(), [self, res = std::move(res)]() mutable { self->SendNow(std::move(res)); });
    }, lane);
  }

  static std::shared_ptr<Reply> MakeReply(Server::Impl* srv, std::weak_ptr<Connection> conn,
                                          std::shared_ptr<Request> req, Response& res);

  // Finishes a response (hooks) and serializes it into the write queue. On the strand.
  void Finish(Response& res) {
    if (res.before_send) {
      auto fn = std::move(res.before_send);
      fn(res);
    }
    if (srv_->owner->post_routing && req_) srv_->owner->post_routing(*req_, res);
  }

  // counted: the request leaves the in-flight count here (a deferred Reply counts it out itself).
  void SendNow(Response res, bool counted = true) {
    if (counted) srv_->inflight--;
    if (closed_) return;
    Finish(res);
    const bool head_only = req_ && req_->method == "HEAD";
    Enqueue(Head(res, keep_alive_, false, head_only));
    AfterAnswer();
  }

  // The answer is complete once the queue drains: read the next request, or close.
  void AfterAnswer() {
    answered_ = true;
    req_.reset();
    Flush();
  }

  void Enqueue(std::string data) {
    queued_ += data.size();
    out_.push_back(std::move(data));
    Flush();
  }

  void Flush() {
    if (writing_ || closed_) return;
    if (out_.empty()) {
      if (answered_) {
        answered_ = false;
        if (keep_alive_) return ReadNext();
        return Linger();
      }
      return;
    }
    writing_ = true;
    stream_.expires_after(Seconds(srv_->limits.write_s));
    // out_.front() stays alive and unmoved (a deque keeps its elements) until this completes.
    WithStream([&](auto& s) {
      net::async_write(s, net::buffer(out_.front()), [self = shared_from_this()](beast::error_code ec, size_t) {
        self->writing_ = false;
        if (self->closed_) {
          self->out_.clear();
          self->queued_ = 0;
          return;
        }
        self->queued_ -= self->out_.front().size();
        self->out_.pop_front();
        if (ec) return self->Close();
        self->Flush();
      });
    });
  }

  // Closing after an answer: stop sending, then read and drop what the client still sends for a
  // short while (bounded in time and bytes), so that the kernel does not reset the connection
  // under a response the client has not read yet (a 413 sent while the body still streams in).
  void Linger() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    stream_.expires_after(std::chrono::seconds(2));
    linger_left_ = 16 << 20;
    LingerRead();
  }
  void LingerRead() {
    auto scratch = std::make_shared<std::array<char, 16384>>();
    stream_.async_read_some(net::buffer(*scratch), [self = shared_from_this(), scratch](beast::error_code ec, size_t n) {
      if (ec || n >= self->linger_left_) return self->Close();
      self->linger_left_ -= n;
      self->LingerRead();
    });
  }

  // While a deferred answer is pending nothing is read; this notices the client closing meanwhile
  // (a queued streaming turn is cancelled before its first byte).
  void WatchClose() {
    stream_.socket().async_wait(tcp::socket::wait_read, [self = shared_from_this()](beast::error_code ec) {
      if (self->closed_ || !self->waiting_reply_) return;
      if (ec) return self->Close();
      char c;
      const ssize_t n = ::recv(self->stream_.socket().native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return self->Close();
      if (n < 0) return self->WatchClose();
      // Bytes of a pipelined request: they are read after this answer.
    });
  }

  void Close() {
    if (closed_) return;
    closed_ = true;
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.socket().close(ignored);
    if (!writing_) out_.clear();  // else the write in flight still reads its buffer: cleared when it ends
    if (on_close_) {
      auto fn = std::move(on_close_);
      on_close_ = nullptr;
      fn();
    }
  }

  // Runs f with the stream that carries HTTP: the TLS layer when the server has one, else the TCP
  // stream. Deadlines (expires_after) are always the TCP stream's: TLS reads and writes go through it.
  template <class F>
  void WithStream(F&& f) {
    if (tls_) {
      f(*tls_);
    } else {
      f(stream_);
    }
  }

  Server::Impl* srv_;
  beast::tcp_stream stream_;
  std::optional<net::ssl::stream<beast::tcp_stream&>> tls_;  // over stream_, when the server has TLS
  std::string address_;
  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  std::shared_ptr<Request> req_;  // the request being answered
  bool keep_alive_ = true;
  std::deque<std::string> out_;   // serialized bytes waiting for the socket
  bool writing_ = false;
  bool answered_ = false;         // the whole answer is in out_
  bool waiting_reply_ = false;    // a deferred answer is pending
  size_t linger_left_ = 0;
  std::function<void()> on_close_;  // the pending Reply's OnClose
};

class Connection::ReplyImpl : public Reply, public std::enable_shared_from_this<ReplyImpl> {
 public:
  ReplyImpl(Server::Impl* srv, std::weak_ptr<Connection> conn, std::shared_ptr<Request> req)
      : srv_(srv), conn_(std::move(conn)), req_(std::move(req)) {}
  ~ReplyImpl() override {
    if (!done_.exchange(true)) {  // dropped unanswered (a bug): the client must not wait forever
      srv_->inflight--;
      if (auto c = conn_.lock()) {
        net::post(c->stream_.get_executor(), [c] {
          c->waiting_reply_ = false;
          c->Close();
        });
      }
    }
  }

  // Takes what the handler set on its Response before Defer.
  void Adopt(Response& res) {
    saved_ = std::move(res.headers);
    res.headers.clear();
    before_send_ = std::move(res.before_send);
    res.before_send = nullptr;
  }

  void Send(Response res) override {
    if (done_.exchange(true)) return;
    Merge(res);
    auto c = conn_.lock();
    if (!c) {
      srv_->inflight--;
      return;
    }
    net::post(c->stream_.get_executor(), [this_srv = srv_, c, res = std::move(res)]() mutable {
      this_srv->inflight--;
      c->waiting_reply_ = false;
      c->on_close_ = nullptr;
      c->SendNow(std::move(res), /*counted=*/false);
    });
  }

  bool Begin(Response head) override {
    if (done_ || begun_.exchange(true)) return false;
    Merge(head);
    auto c = conn_.lock();
    if (!c || c->closed_) return false;
    net::post(c->stream_.get_executor(), [c, head = std::move(head)]() mutable {
      if (c->closed_) return;
      c->Finish(head);
      c->Enqueue(Head(head, c->keep_alive_, true, false));
    });
    return true;
  }

  bool Write(std::string data) override {
    if (done_ || data.empty()) return !done_;
    auto c = conn_.lock();
    if (!c || c->closed_) return false;
    if (c->queued_ + data.size() > c->srv_->limits.max_queued_bytes) {
      c->PostClose();  // the reader is far behind: drop it (its turn is cancelled by OnClose)
      return false;
    }
    char size[20];
    std::snprintf(size, sizeof size, "%zx\r\n", data.size());
    std::string chunk = size + data + "\r\n";
    net::post(c->stream_.get_executor(), [c, chunk = std::move(chunk)]() mutable {
      if (!c->closed_) c->Enqueue(std::move(chunk));
    });
    return true;
  }

  void End() override {
    if (done_.exchange(true)) return;
    auto c = conn_.lock();
    if (!c) {
      srv_->inflight--;
      return;
    }
    net::post(c->stream_.get_executor(), [c] {
      c->srv_->inflight--;
      c->waiting_reply_ = false;
      c->on_close_ = nullptr;
      if (c->closed_) return;
      c->Enqueue("0\r\n\r\n");
      c->AfterAnswer();
    });
  }

  void OnClose(std::function<void()> fn) override {
    auto c = conn_.lock();
    if (!c) return fn();
    net::dispatch(c->stream_.get_executor(), [c, fn = std::move(fn)]() mutable {
      if (c->closed_) return fn();
      c->on_close_ = std::move(fn);
    });
  }

 private:
  void Merge(Response& res) {
    for (const auto& [k, v] : saved_) {
      if (!res.has_header(k)) res.headers.emplace_back(k, v);
    }
    if (before_send_ && !res.before_send) res.before_send = std::move(before_send_);
  }

  Server::Impl* srv_;
  std::weak_ptr<Connection> conn_;
  std::shared_ptr<Request> req_;
  Headers saved_;
  std::function<void(Response&)> before_send_;
  std::atomic<bool> done_{false};
  std::atomic<bool> begun_{false};
};

std::shared_ptr<Reply> Connection::MakeReply(Server::Impl* srv, std::weak_ptr<Connection> conn,
                                             std::shared_ptr<Request> req, Response& res) {
  auto r = std::make_shared<ReplyImpl>(srv, conn, std::move(req));
  r->Adopt(res);
  if (auto c = conn.lock()) {
    net::post(c->stream_.get_executor(), [c] {
      c->waiting_reply_ = true;
      if (!c->closed_) c->WatchClose();
    });
  }
  return r;
}

void Server::Impl::Accept() {
  acceptor->async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
    if (stopping) return;
    if (ec) {
      if (ec == net::error::operation_aborted) return;
      // Out of descriptors (EMFILE) and the like: pause instead of spinning on the error.
      spdlog::warn("http: accept failed: {}", ec.message());
      auto t = std::make_shared<net::steady_timer>(ioc, std::chrono::milliseconds(100));
      t->async_wait([this, t](beast::error_code) { Accept(); });
      return;
    }
    beast::error_code aec;
    const auto ep = socket.remote_endpoint(aec);
    std::string address = aec ? std::string("?") : ep.address().to_string();
    bool over = false;
    {
      std::lock_guard<std::mutex> l(conn_mu);
      auto it = per_address.find(address);
      over = static_cast<int>(conns.size()) >= limits.max_connections ||
             (it != per_address.end() && it->second >= limits.max_per_address);
    }
    if (over) {
      // Answered and closed at once: a refused connection costs one small write, no state.
      static const std::string kBody =
          R"({"error":{"message":"Too many open connections; retry later.","type":"server_error","param":null,"code":"too_many_connections"}})";
      static const std::string kBusy =
          "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
          "Connection: close\r\nContent-Length: " + std::to_string(kBody.size()) + "\r\n\r\n" + kBody;
      socket.non_blocking(true, aec);
      socket.write_some(net::buffer(kBusy), aec);
      socket.shutdown(tcp::socket::shutdown_send, aec);
      socket.close(aec);
    } else {
      socket.set_option(tcp::no_delay(true), aec);
      std::make_shared<Connection>(this, std::move(socket), std::move(address))->Start();
    }
    Accept();
  });
}

Server::Server(const ServerLimits& limits) : impl_(std::make_unique<Impl>()) {
  impl_->limits = limits;
  impl_->owner = this;
}

Server::~Server() { Stop(); }

Status Server::UseTls(const std::string& cert_chain_file, const std::string& private_key_file) {
  net::ssl::context ctx(net::ssl::context::tls_server);
  // TLS 1.2 and 1.3 only; no compression, no renegotiation by the client.
  ctx.set_options(net::ssl::context::default_workarounds | net::ssl::context::no_sslv2 |
                  net::ssl::context::no_sslv3 | net::ssl::context::no_tlsv1 | net::ssl::context::no_tlsv1_1 |
                  net::ssl::context::no_compression | SSL_OP_NO_RENEGOTIATION);
  beast::error_code ec;
  ctx.use_certificate_chain_file(cert_chain_file, ec);
  if (ec) return MakeError(StatusCode::kInvalidArgument, "TLS certificate %s: %s", cert_chain_file.c_str(), ec.message().c_str());
  ctx.use_private_key_file(private_key_file, net::ssl::context::pem, ec);
  if (ec) {  // unreadable, not PEM, or (OpenSSL checks it here) not the certificate's key
    return MakeError(StatusCode::kInvalidArgument, "TLS key %s: %s", private_key_file.c_str(), ec.message().c_str());
  }
  if (SSL_CTX_check_private_key(ctx.native_handle()) != 1) {
    return MakeError(StatusCode::kInvalidArgument, "TLS key %s does not match the certificate %s",
                     private_key_file.c_str(), cert_chain_file.c_str());
  }
  impl_->tls.emplace(std::move(ctx));
  return Status::Ok();
}

void Server::Route(std::string method, const std::string& pattern, Handler h, Lane lane) {
  impl_->routes.push_back({std::move(method), std::regex(pattern), std::move(h), lane});
}

Status Server::Listen(const std::string& host, int port) {
  // Idle connections are cheap here, descriptors are the limit: raise the soft limit to the hard one.
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  beast::error_code ec;
  const auto addr = net::ip::make_address(host == "localhost" ? "127.0.0.1" : host, ec);
  if (ec) return MakeError("cannot bind %s: not an IP address", host.c_str());
  tcp::endpoint ep(addr, static_cast<unsigned short>(port));
  impl_->acceptor.emplace(net::make_strand(impl_->ioc));
  auto& a = *impl_->acceptor;
  a.open(ep.protocol(), ec);
  if (!ec) a.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) a.bind(ep, ec);
  if (!ec) a.listen(net::socket_base::max_listen_connections, ec);
  if (ec) return MakeError("cannot bind %s:%d (%s)", host.c_str(), port, ec.message().c_str());
  port_ = a.local_endpoint().port();
  impl_->workers = std::make_unique<WorkerPool>(impl_->limits.workers);
  impl_->quick = std::make_unique<WorkerPool>(impl_->limits.quick_workers);
  impl_->events = std::make_unique<WorkerPool>(impl_->limits.quick_workers);
  impl_->work.emplace(impl_->ioc.get_executor());
  impl_->Accept();
  for (int i = 0; i < std::max(1, impl_->limits.io_threads); i++) {
    impl_->io_threads.emplace_back([this] { impl_->ioc.run(); });
  }
  return Status::Ok();
}

void Server::Stop() {
  std::lock_guard<std::mutex> l(impl_->stop_mu);
  if (impl_->stopped) return;
  impl_->stopped = true;
  impl_->stopping = true;
  if (impl_->acceptor) {
    net::post(impl_->acceptor->get_executor(), [this] {
      beast::error_code ec;
      impl_->acceptor->close(ec);
    });
  }
  // Requests in flight are answered first (turns run to their end), as the listener drains.
  while (impl_->inflight > 0 && !impl_->io_threads.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  std::vector<std::shared_ptr<Connection>> open;
  {
    std::lock_guard<std::mutex> cl(impl_->conn_mu);
    for (Connection* c : impl_->conns) {
      if (auto s = c->weak_from_this().lock()) open.push_back(std::move(s));
    }
  }
  for (auto& c : open) c->PostClose();
  open.clear();
  impl_->work.reset();
  // Lingering closes end within 2 s; then the I/O threads run out of work.
  for (auto& t : impl_->io_threads) t.join();
  impl_->io_threads.clear();
  if (impl_->workers) impl_->workers->Shutdown();  // kept: turns still ending may Post (dropped)
  if (impl_->quick) impl_->quick->Shutdown();
  if (impl_->events) impl_->events->Shutdown();
}

void Server::Wait() {
  while (!impl_->stopping) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::lock_guard<std::mutex> l(impl_->stop_mu);  // Stop holds it until the threads ended
}

int Server::connections() const {
  std::lock_guard<std::mutex> l(impl_->conn_mu);
  return static_cast<int>(impl_->conns.size());
}

void Server::Post(std::function<void()> fn, Lane lane) {
  WorkerPool* pool = lane == Lane::kQuick    ? impl_->quick.get()
                     : lane == Lane::kEvents ? impl_->events.get()
                                             : impl_->workers.get();
  if (pool) pool->Post(std::move(fn));
}

}  // namespace mnemo::http
