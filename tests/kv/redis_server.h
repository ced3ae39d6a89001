// A real Redis 7 server for tests. Under ctest, the fixture tests/kv/redis_test_server.sh started
// one for the whole run and wrote its URL to MNEMO_REDIS_URL_FILE: Shared() returns that one. A
// test binary run by hand, or a test that must kill its server (Private()), starts its own:
// redis-server on 127.0.0.1 at a free port, no persistence, its directory a temporary one, killed
// when the object goes (and with the test process: PR_SET_PDEATHSIG).
// Without redis-server ($MNEMO_REDIS_SERVER, else on PATH) they return null with the reason, and
// tests GTEST_SKIP with it.
#pragma once

#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kv/redis_client.h"

namespace mnemo::testing_util {

class RedisServer {
 public:
  // The run's shared server (the fixture's, else one of this process's own).
  static RedisServer* Shared(std::string* why) {
    static std::string reason;
    static std::unique_ptr<RedisServer> server = Find(&reason);
    if (!server && why) *why = reason;
    return server.get();
  }
  // A server of the caller's own (which it may kill).
  static std::unique_ptr<RedisServer> Private(std::string* why) { return Start(why); }

  ~RedisServer() {
    Kill();
    std::error_code ec;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
  }

  const std::string& url() const { return url_; }
  // Runs one command; its reply as text, or "ERR: ..." on failure.
  std::string Run(const std::vector<std::string>& args) const { return RunAt(url_, args); }
  // The same on the server (and database) at url.
  static std::string RunAt(const std::string& at, const std::vector<std::string>& args) {
    auto url = ParseRedisUrl(at);
    if (!url.ok()) return "ERR: " + url.error().message;
    auto c = RedisConnection::Connect(*url, 2, 2);
    if (!c.ok()) return "ERR: " + c.error().message;
    auto r = (*c)->Command(args);
    return r.ok() ? *r : "ERR: " + r.error().message;
  }
  // Starts a killed server of our own again on the same port (empty: nothing is saved). False
  // when it does not answer within 5 s.
  bool Restart() {
    Kill();
    return Launch(port_);
  }
  // Kills the server now (SIGKILL), as a crash would. Only for servers of our own.
  void Kill() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      int status = 0;
      waitpid(pid_, &status, 0);
      pid_ = -1;
    }
  }

 private:
  RedisServer() = default;

  static bool Answers(const std::string& url) {
    auto u = ParseRedisUrl(url);
    if (!u.ok()) return false;
    auto c = RedisConnection::Connect(*u, 0.5, 0.5);
    return c.ok() && (*c)->Ping().ok();
  }

  static std::unique_ptr<RedisServer> Find(std::string* why) {
    const char* file = std::getenv("MNEMO_REDIS_URL_FILE");
#ifdef MNEMO_REDIS_URL_FILE
    if (!file) file = MNEMO_REDIS_URL_FILE;
#endif
    if (file) {
      std::ifstream f(file);
      std::string url;
      if (f && std::getline(f, url) && !url.empty() && Answers(url)) {
        std::unique_ptr<RedisServer> s(new RedisServer());
        s->url_ = url;
        return s;
      }
    }
    return Start(why);
  }

  static std::unique_ptr<RedisServer> Start(std::string* why) {
    const char* env = std::getenv("MNEMO_REDIS_SERVER");
    std::string bin = env && *env ? env : "";
    if (bin.empty()) {
      for (const char* d : {"/usr/bin", "/usr/local/bin", "/usr/sbin"}) {
        if (access((std::string(d) + "/redis-server").c_str(), X_OK) == 0) {
          bin = std::string(d) + "/redis-server";
          break;
        }
      }
    }
    if (bin.empty() || access(bin.c_str(), X_OK) != 0) {
      *why = "redis-server not found (install redis-server or set MNEMO_REDIS_SERVER)";
      return nullptr;
    }
    std::unique_ptr<RedisServer> s(new RedisServer());
    std::string tmpl = (std::filesystem::temp_directory_path() / "mnemo_redis_XXXXXX").string();
    if (!mkdtemp(tmpl.data())) {
      *why = "cannot create a temporary directory";
      return nullptr;
    }
    s->dir_ = tmpl;
    s->bin_ = bin;
    for (int attempt = 0; attempt < 5; attempt++) {
      const int port = 20000 + static_cast<int>((static_cast<unsigned>(getpid()) * 7919u + attempt * 104729u +
                                                 static_cast<unsigned>(std::chrono::steady_clock::now().time_since_epoch().count())) %
                                                30000u);
      if (s->Launch(port)) return s;
    }
    *why = "redis-server did not start (see " + s->dir_ + "/log)";
    s->dir_.clear();
    return nullptr;
  }

  // Starts the server on `port` and waits (up to 5 s) until it answers; false when it exits (the
  // port was taken) or never answers.
  bool Launch(int port) {
    const std::vector<std::string> args = {bin_, "--port", std::to_string(port), "--bind", "127.0.0.1", "--save", "",
                                           "--appendonly", "no", "--dir", dir_, "--logfile", dir_ + "/log",
                                           "--maxmemory", "256mb", "--maxmemory-policy", "allkeys-lru"};
    pid_ = fork();
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      std::vector<char*> argv;
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    port_ = port;
    url_ = "redis://127.0.0.1:" + std::to_string(port);
    for (int i = 0; i < 100; i++) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return false;
      }
      if (Answers(url_)) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    Kill();
    return false;
  }

  std::string bin_;
  std::string url_;
  std::string dir_;
  int port_ = -1;
  pid_t pid_ = -1;
};

}  // namespace mnemo::testing_util
