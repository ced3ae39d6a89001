#include "store/pg_listen.h"

#include <poll.h>

#include <algorithm>
#include <chrono>

#include "base/log.h"
#include "store/pg_conn.h"

namespace mnemo::pg {

Listener::Listener(std::string url, int connect_timeout_s, std::string channel,
                   std::function<void(const std::string&)> fn, std::function<void(bool)> on_listen)
    : url_(std::move(url)),
      channel_(std::move(channel)),
      connect_timeout_s_(connect_timeout_s),
      fn_(std::move(fn)),
      on_listen_(std::move(on_listen)) {
  thread_ = std::thread([this] { Run(); });
}

Listener::~Listener() {
  stop_ = true;
  thread_.join();
}

void Listener::Run() {
  using std::chrono::milliseconds;
  static constexpr int kPollMs = 100;  // how soon a stop is seen
  milliseconds backoff(100);
  // Sleeps `d` in poll-sized steps; false when stopped meanwhile.
  auto sleep = [this](milliseconds d) {
    for (auto left = d; left.count() > 0 && !stop_; left -= milliseconds(kPollMs)) {
      std::this_thread::sleep_for(std::min(left, milliseconds(kPollMs)));
    }
    return !stop_;
  };
  bool lost = false;  // logged once per outage, at warn; the recovery at info
  bool listened = false;  // LISTEN succeeded once: a later one follows a lost connection
  while (!stop_) {
    auto conn = Conn::Open(url_, connect_timeout_s_, "SET client_min_messages = warning");
    Status st = conn.ok() ? (*conn)->Run(("LISTEN " + channel_).c_str()) : Status(conn.error());
    if (!st.ok()) {
      if (!lost) spdlog::warn("store notifications ({}): cannot listen ({}), retrying", channel_, st.error().message);
      lost = true;
      if (!sleep(backoff)) break;
      backoff = std::min(backoff * 2, milliseconds(5000));
      continue;
    }
    if (lost) spdlog::info("store notifications ({}): listening again", channel_);
    lost = false;
    backoff = milliseconds(100);
    if (on_listen_) on_listen_(listened);  // before listening() says so: tests wait for that
    listened = true;
    listening_ = true;
    Conn& c = **conn;
    while (!stop_) {
      pollfd p{c.socket(), POLLIN, 0};
      const int n = poll(&p, 1, kPollMs);
      if (n == 0) continue;
      if (n < 0 && errno == EINTR) continue;
      auto got = c.TakeNotifications();
      if (got.ok()) {
        for (const Conn::Notification& note : *got) {
          if (note.channel == channel_) fn_(note.payload);
        }
      }
      if (!got.ok() || (p.revents & (POLLERR | POLLHUP | POLLNVAL)) || c.broken()) {
        spdlog::warn("store notifications ({}): connection lost ({}), reconnecting", channel_,
                     got.ok() ? "hang-up" : got.error().message);
        lost = true;
        break;
      }
    }
    listening_ = false;
  }
}

}  // namespace mnemo::pg
