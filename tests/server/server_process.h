// Runs `mnemo serve` as a child process on 127.0.0.1 with a free port, for end-to-end tests.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace mnemo::testing {

class ServerProcess {
 public:
  // Starts the server on `model` (default: stories260K) with extra flags; waits (bounded) until it
  // prints its address (port() stays 0 if it never does), unless wait_for_address is false.
  explicit ServerProcess(std::vector<std::string> extra, std::string model = "", bool wait_for_address = true) {
    if (model.empty()) model = std::string(MNEMO_SHARED_DIR) + "/models/stories260K/stories260K.gguf";
    std::vector<std::string> args = {std::string(MNEMO_BINARY_DIR) + "/apps/mnemo", "serve", "--model", model, "--port", "0"};
    // Defaults that `extra` may override.
    const std::vector<std::pair<std::string, std::string>> defaults = {{"--max-context", "512"}, {"--kv-t0-mb", "16"}};
    for (const auto& [flag, value] : defaults) {
      if (std::find(extra.begin(), extra.end(), flag) == extra.end()) args.insert(args.end(), {flag, value});
    }
    args.insert(args.end(), extra.begin(), extra.end());
    int fds[2];
    if (pipe(fds) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(fds[1], STDERR_FILENO);
      close(fds[0]);
      close(fds[1]);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(fds[1]);
    err_ = fdopen(fds[0], "r");
    char line[1024];
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (wait_for_address && std::chrono::steady_clock::now() < deadline && fgets(line, sizeof line, err_)) {
      std::string l(line);
      log_ += l;
      auto p = l.find("://127.0.0.1:");  // http or https
      if (p != std::string::npos) {
        port_ = std::stoi(l.substr(p + 13));
        break;
      }
    }
    // Keep draining stderr so the child never blocks on a full pipe.
    drain_ = std::thread([this] {
      char buf[4096];
      while (fgets(buf, sizeof buf, err_)) {
        std::lock_guard<std::mutex> lock(mu_);
        log_ += buf;
      }
    });
  }
  ~ServerProcess() {
    Stop(SIGTERM);
    if (drain_.joinable()) drain_.join();
    if (err_) fclose(err_);
  }
  int port() const { return port_; }
  int pid() const { return pid_; }
  std::string log() const {
    std::lock_guard<std::mutex> lock(mu_);
    return log_;
  }
  // Sends sig and waits up to `seconds` for the process to exit; false (and the process killed)
  // when it did not.
  bool StopWithin(int sig, double seconds) {
    if (pid_ <= 0) return true;
    kill(pid_, sig);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    int status = 0;
    while (waitpid(pid_, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        Stop(SIGKILL);
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    pid_ = -1;
    return true;
  }
  // Sends sig and waits for the process (SIGKILL: a crash).
  void Stop(int sig) {
    if (pid_ <= 0) return;
    kill(pid_, sig);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
  FILE* err_ = nullptr;
  mutable std::mutex mu_;
  std::string log_;  // what the server wrote to stderr
  std::thread drain_;
};

}  // namespace mnemo::testing
