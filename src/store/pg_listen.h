// LISTEN on one channel, on a connection of its own, from a background thread (issue 14: replicas
// hear of each other's commits). Internal to the store.
//
// The connection is opened by the thread; when it drops (a server restart, the network) the
// thread logs it and reconnects with backoff (0.1 s doubling to 5 s). Notifications sent while it
// was disconnected are lost: a listener is a hint, never the truth (the per-turn probe is); it
// says when it listens (again), so that its user can treat what it heard before as incomplete.
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <thread>

namespace mnemo::pg {

class Listener {
 public:
  // Calls fn(payload) on the listener's thread for every notification on `channel` (a plain
  // identifier), in the order the server delivers them (commit order); and on_listen(again) each
  // time LISTEN succeeds, before the notifications that follow (again: after a lost connection).
  Listener(std::string url, int connect_timeout_s, std::string channel, std::function<void(const std::string&)> fn,
           std::function<void(bool again)> on_listen = nullptr);
  ~Listener();  // stops the thread (at most one poll interval, 100 ms) and closes the connection
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  // Whether the thread is listening now (connected, LISTEN done): tests wait for it.
  bool listening() const { return listening_.load(); }

 private:
  void Run();

  const std::string url_, channel_;
  const int connect_timeout_s_;
  const std::function<void(const std::string&)> fn_;
  const std::function<void(bool)> on_listen_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> listening_{false};
  std::thread thread_;
};

}  // namespace mnemo::pg
