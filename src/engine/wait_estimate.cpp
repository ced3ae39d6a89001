#include "engine/wait_estimate.h"

#include <algorithm>

namespace mnemo {

void WaitEstimator::Pass(double now, int admitted, bool left_waiting) {
  if (backlog_ && last_pass_ >= 0) {
    window_time_ += now - last_pass_;
    window_admits_ += admitted;
    // A window closes on the first admission once it spans kWindow. With turns that each hold the
    // batch or the memory for longer than a window, admissions come in lumps; windows closed on the
    // clock alone alternated between 0 and a lump's rate, and the blend halved the rate at each
    // empty one (two admissions every 0.6 s, 3.3 turns a second, read as 1.3: a forecast of 6.2 s
    // for a 2.4 s wait, and 429s from a server answering within a second). A stall closes no
    // window: the sojourn of the turn at the head speaks for it, and the admission that ends it
    // measures how slow the drain was.
    if (window_time_ >= kWindow && window_admits_ > 0) {
      const double sample = window_admits_ / window_time_;
      const double was = rate_.load(std::memory_order_relaxed);
      // A stale rate is not blended: it no longer describes the engine.
      const bool fresh = was >= 0 && now - rate_at_.load(std::memory_order_relaxed) <= kStale + window_time_;
      rate_.store(fresh ? 0.5 * was + 0.5 * sample : sample, std::memory_order_relaxed);
      rate_at_.store(now, std::memory_order_relaxed);
      window_time_ = 0;
      window_admits_ = 0;
    }
  }
  last_pass_ = now;
  backlog_ = left_waiting;
}

void WaitEstimator::Publish(int waiting, int free_slots, double oldest_queued_at) {
  waiting_.store(waiting, std::memory_order_relaxed);
  free_slots_.store(std::max(free_slots, 0), std::memory_order_relaxed);
  oldest_.store(oldest_queued_at, std::memory_order_relaxed);
}

int WaitEstimator::Ahead(int arriving) const {
  const int free = free_slots_.load(std::memory_order_relaxed);
  return waiting_.load(std::memory_order_relaxed) + std::max(0, arriving - free);
}

double WaitEstimator::Estimate(double now, int arriving) const {
  const int ahead = Ahead(arriving);
  if (ahead == 0 && arriving < free_slots_.load(std::memory_order_relaxed)) return 0;
  const double at = rate_at_.load(std::memory_order_relaxed);
  const double rate = at >= 0 && now - at <= kStale ? rate_.load(std::memory_order_relaxed) : -1;
  double forecast = 0;  // unmeasured or stale: the sojourn alone speaks
  if (rate > 0) forecast = (ahead + 1) / rate;
  const double oldest = oldest_.load(std::memory_order_relaxed);
  const double sojourn = oldest >= 0 ? std::max(0.0, now - oldest) : 0;
  return std::max(forecast, sojourn);
}

}  // namespace mnemo
