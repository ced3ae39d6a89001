// The HTTP server under hostile and heavy connection patterns, over real sockets (issue 13): idle
// connections, a header trickle (slowloris), a declared 1 TB body, the per-address cap, and many
// concurrent SSE streams, each against a `mnemo serve` child process.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "server_process.h"

namespace mnemo::testing {
namespace {

using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// A connected socket to 127.0.0.1:port (-1 on failure).
int Connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

bool SendAll(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

// Reads until `until` appears, the peer closes, or timeout_s passes. *closed: the peer closed.
std::string ReadUntil(int fd, const std::string& until, double timeout_s, bool* closed = nullptr) {
  std::string out;
  const auto t0 = Clock::now();
  if (closed) *closed = false;
  while (Since(t0) < timeout_s && (until.empty() || out.find(until) == std::string::npos)) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    char buf[16384];
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) {
      if (closed) *closed = true;
      break;
    }
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

// One request on a fresh connection: the raw response (head and body, up to close or timeout).
std::string Exchange(int port, const std::string& request, double timeout_s = 5) {
  const int fd = Connect(port);
  if (fd < 0) return "";
  SendAll(fd, request);
  std::string r = ReadUntil(fd, "", timeout_s);
  close(fd);
  return r;
}

std::string Get(const std::string& path) {
  return "GET " + path + " HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n";
}

int ThreadsOf(int pid) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task")) {
    (void)e;
    n++;
  }
  return n;
}

void RaiseFdLimit() {
  rlimit rl{};
  getrlimit(RLIMIT_NOFILE, &rl);
  rl.rlim_cur = rl.rlim_max;
  setrlimit(RLIMIT_NOFILE, &rl);
}

// 1,024 connections that send nothing (the 128 threads cpp-httplib had were all held by 128 idle
// connections), then the same half-way through a request line, leave the server answering a new
// client at once.
TEST(Connections, ThousandIdleConnectionsDoNotDelayARequest) {
  RaiseFdLimit();
  // The idle ones and the client share 127.0.0.1, whose default cap is 1,024 connections.
  ServerProcess server({"--max-connections-per-address", "2048"});
  ASSERT_GT(server.port(), 0) << server.log();
  std::vector<int> idle;
  for (int i = 0; i < 1024; i++) {
    const int fd = Connect(server.port());
    ASSERT_GE(fd, 0) << i;
    idle.push_back(fd);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // all accepted
  const auto t0 = Clock::now();
  const std::string r = Exchange(server.port(), Get("/health"), 10);
  const double took = Since(t0);
  EXPECT_EQ(r.rfind("HTTP/1.1 200", 0), 0u) << r.substr(0, 200);
  EXPECT_LT(took, 1.0) << "a request behind 1,024 idle connections took " << took << " s";
  // And with the idle ones half-way through a request line.
  for (int fd : idle) SendAll(fd, "GET /hea");
  const auto t1 = Clock::now();
  const std::string r2 = Exchange(server.port(), Get("/v1/models"), 10);
  EXPECT_EQ(r2.rfind("HTTP/1.1 200", 0), 0u) << r2.substr(0, 200);
  EXPECT_LT(Since(t1), 1.0);
  for (int fd : idle) close(fd);
}

// A client that sends its headers one byte at a time, each well within any per-read timeout, is
// cut when the whole head is late: at the header deadline, not never.
TEST(Connections, SlowlorisIsClosedAtTheHeaderDeadline) {
  ServerProcess server({"--header-timeout-s", "2"});
  ASSERT_GT(server.port(), 0) << server.log();
  const int fd = Connect(server.port());
  ASSERT_GE(fd, 0);
  const std::string head = "GET /health HTTP/1.1\r\nHost: t\r\nX-Slow: " + std::string(200, 'a');
  const auto t0 = Clock::now();
  bool closed = false;
  size_t sent = 0;
  while (Since(t0) < 8 && sent < head.size()) {
    if (send(fd, head.data() + sent, 1, MSG_NOSIGNAL) != 1) {
      closed = true;
      break;
    }
    sent++;
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 250) > 0) {  // readable: the server closed (EOF) or answered
      char c;
      if (recv(fd, &c, 1, 0) <= 0) {
        closed = true;
        break;
      }
    }
  }
  const double took = Since(t0);
  close(fd);
  EXPECT_TRUE(closed) << "a trickling client was still connected after " << took << " s";
  EXPECT_GE(took, 1.5);
  EXPECT_LT(took, 4.0) << "closed at " << took << " s with a 2 s header deadline";
  // The server still serves.
  EXPECT_EQ(Exchange(server.port(), Get("/health")).rfind("HTTP/1.1 200", 0), 0u);
}

// A declared body of 10^12 bytes is refused from its headers: 413 at once, in OpenAI's shape and
// with the request id, without waiting for (or reading) the body.
TEST(Connections, ATerabyteContentLengthIs413AtOnce) {
  ServerProcess server({});
  ASSERT_GT(server.port(), 0) << server.log();
  const int fd = Connect(server.port());
  ASSERT_GE(fd, 0);
  const auto t0 = Clock::now();
  SendAll(fd,
          "POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
          "X-Request-Id: huge-1\r\nContent-Length: 1000000000000\r\n\r\n{\"messages\":");
  const std::string r = ReadUntil(fd, "}}", 5);
  const double took = Since(t0);
  close(fd);
  EXPECT_EQ(r.rfind("HTTP/1.1 413", 0), 0u) << r.substr(0, 300);
  EXPECT_LT(took, 1.0) << "413 came after " << took << " s";
  EXPECT_NE(r.find("X-Request-Id: huge-1"), std::string::npos) << r.substr(0, 300);
  EXPECT_NE(r.find("request_too_large"), std::string::npos) << r.substr(0, 300);
}

// One address may hold at most --max-connections-per-address connections; the next is answered
// 503 at once (Retry-After) and closed, and a slot freed is usable again.
TEST(Connections, ThePerAddressCapRefusesTheNextConnection) {
  ServerProcess server({"--max-connections-per-address", "8"});
  ASSERT_GT(server.port(), 0) << server.log();
  std::vector<int> held;
  for (int i = 0; i < 8; i++) held.push_back(Connect(server.port()));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const auto t0 = Clock::now();
  const std::string r = Exchange(server.port(), Get("/health"), 5);
  EXPECT_EQ(r.rfind("HTTP/1.1 503", 0), 0u) << r.substr(0, 300);
  EXPECT_NE(r.find("Retry-After:"), std::string::npos);
  EXPECT_NE(r.find("too_many_connections"), std::string::npos);
  EXPECT_LT(Since(t0), 1.0);
  close(held.back());
  held.pop_back();
  std::string ok;
  for (int i = 0; i < 40 && ok.rfind("HTTP/1.1 200", 0) != 0; i++) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ok = Exchange(server.port(), Get("/health"), 5);
  }
  EXPECT_EQ(ok.rfind("HTTP/1.1 200", 0), 0u) << ok.substr(0, 300);
  for (int fd : held) close(fd);
}

// 64 SSE streams open at once: every one gets its head and first events while the server's thread
// count stays where it was idle (a stream holds a queue of bytes, not a thread). cpp-httplib
// needed a thread per stream, so it ran at least 64 more.
TEST(Connections, SixtyFourStreamsAddNoThreads) {
  RaiseFdLimit();
  constexpr int kStreams = 64;
  ServerProcess server({"--max-running", "64", "--max-waiting", "64", "--max-queue-ms", "60000"});
  ASSERT_GT(server.port(), 0) << server.log();
  EXPECT_EQ(Exchange(server.port(), Get("/health")).rfind("HTTP/1.1 200", 0), 0u);
  const int idle_threads = ThreadsOf(server.pid());
  std::vector<int> fds;
  for (int i = 0; i < kStreams; i++) {
    Json body = {{"messages", {{{"role", "user"}, {"content", "Story " + std::to_string(i)}}}},
                 {"max_tokens", 400}, {"ignore_eos", true}, {"stream", true}};
    const std::string b = body.dump();
    const int fd = Connect(server.port());
    ASSERT_GE(fd, 0);
    SendAll(fd, "POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: " +
                    std::to_string(b.size()) + "\r\n\r\n" + b);
    fds.push_back(fd);
  }
  int streaming = 0;
  for (int fd : fds) {
    const std::string r = ReadUntil(fd, "\"content\"", 60);
    if (r.rfind("HTTP/1.1 200", 0) == 0 && r.find("text/event-stream") != std::string::npos) streaming++;
  }
  const int busy_threads = ThreadsOf(server.pid());
  EXPECT_EQ(streaming, kStreams);
  EXPECT_LE(busy_threads, idle_threads + 2) << "idle " << idle_threads << ", streaming " << busy_threads;
  EXPECT_LT(busy_threads, kStreams);
  // Closing the clients cancels their turns: the server is idle again soon.
  for (int fd : fds) close(fd);
  bool idle = false;
  for (int i = 0; i < 100 && !idle; i++) {
    idle = Exchange(server.port(), Get("/metrics")).find("\nmnemo_running 0\n") != std::string::npos;
    if (!idle) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(idle);
  EXPECT_EQ(Exchange(server.port(), Get("/health")).rfind("HTTP/1.1 200", 0), 0u);
}

}  // namespace
}  // namespace mnemo::testing
