// How long a turn submitted now would wait in the engine's queue before it is admitted to the batch,
// from what the engine measured: the basis of load shedding (the server's 429 before any work).
//
// The estimator. A newcomer joins the back of a first-come-first-served queue, so it is admitted
// right after the `waiting` turns ahead of it; when the batch is full (or memory is short) that
// happens at the rate at which the engine has been admitting turns from a backlog (a slot frees
// when a running turn ends, room when blocks free). So:
//
//   forecast = (ahead + 1) / drain_rate       (Little's law, with the measured service rate)
//   estimate = max(forecast, sojourn of the oldest waiting turn)
//
// where `ahead` counts the turns waiting plus those still arriving (let in by a server's admission
// check, not yet queued: Engine::ReserveAdmission) beyond the batch's free places.
//
// drain_rate counts admissions per second of backlog only: the time between two admission passes
// counts when the earlier pass left turns waiting (an idle engine, admitting each turn as it comes,
// measures the arrival rate, not the capacity). It is averaged over windows of at least kWindow
// seconds (one forward step on a big model can take longer than a whole short turn on a small one)
// that end on an admission (admissions come in lumps when each turn holds its place for longer
// than a window, so a window cut by the clock alone reads 0 or a lump),
// blended by an exponential moving average (half the weight on the newest window) so that a change
// of workload (long turns after short ones) is followed within a second or two. The sojourn term
// (CoDel's signal) covers what the forecast misses: no measurement yet, or a batch stalled for
// memory where nothing drains; the newcomer waits at least as long as the turns ahead still must.
// A rate last measured more than kStale seconds ago (no backlog since) is not used: it describes the
// engine as it was (a stall, a CPU taken by something else, a memory-bound spell), and a rate near 0
// kept from such a spell refused every turn that arrived while another waited, long after the
// engine had recovered. Until a fresh window closes, the sojourn alone speaks.
// With nothing ahead and a free batch place left for the newcomer the estimate is 0.
//
// Thread-safety: Pass and Publish on the engine thread only; the readers from any thread (each a
// relaxed atomic load: the parts may come from two different steps, good enough for an estimate).
#pragma once

#include <atomic>

namespace mnemo {

class WaitEstimator {
 public:
  // Shortest stretch of backlog one drain-rate sample spans (seconds); it ends on an admission.
  static constexpr double kWindow = 0.25;
  // Age past which a drain rate no longer counts (seconds since the window that measured it).
  static constexpr double kStale = 2.0;

  // One admission pass at `now` (engine clock, seconds) admitted `admitted` turns; `left_waiting`:
  // turns were still waiting after it.
  void Pass(double now, int admitted, bool left_waiting);
  // The queue as it stands: turns waiting, free places in the batch (0: full), and when the turn
  // that has waited longest entered the queue (< 0: none waits).
  void Publish(int waiting, int free_slots, double oldest_queued_at);

  // Turns a newcomer would queue behind: the waiting ones, and of `arriving` turns let in but not
  // yet queued, those the batch's free places do not take.
  int Ahead(int arriving) const;
  // Seconds a turn submitted at `now` would wait for admission, with `arriving` others on their way.
  double Estimate(double now, int arriving = 0) const;
  // Turns admitted per second of backlog (< 0: not measured yet), whatever its age.
  double drain_rate() const { return rate_.load(std::memory_order_relaxed); }
  int waiting() const { return waiting_.load(std::memory_order_relaxed); }
  int free_slots() const { return free_slots_.load(std::memory_order_relaxed); }

 private:
  // Engine thread only.
  double last_pass_ = -1;     // when the previous pass ran
  bool backlog_ = false;      // the previous pass left turns waiting
  double window_time_ = 0;    // backlog seconds in the current window
  int window_admits_ = 0;     // admissions in them
  // Published.
  std::atomic<double> rate_{-1};
  std::atomic<double> rate_at_{-1};  // when rate_ was last updated (engine clock)
  std::atomic<int> waiting_{0};
  std::atomic<int> free_slots_{1};
  std::atomic<double> oldest_{-1};
};

}  // namespace mnemo
