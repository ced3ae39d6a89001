// Prometheus metrics of the server: counters and histograms recorded by HTTP handler threads, plus
// gauges read from the engine when scraped. Thread-safe.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace mnemo {

// A cumulative histogram with fixed upper bounds (seconds).
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void Observe(double v);
  // Appends the Prometheus text of this histogram under `name`.
  void Render(const std::string& name, const std::string& help, std::string* out) const;

 private:
  std::vector<double> bounds_;
  mutable std::mutex mu_;
  std::vector<uint64_t> counts_;  // [bounds + 1] (last is +Inf)
  double sum_ = 0;
  uint64_t n_ = 0;
};

class Metrics {
 public:
  Metrics();
  // One HTTP request finished with this status on this route (e.g. "/v1/chat/completions").
  void Request(const std::string& route, int status);
  // CPU time the handler thread spent on one request of this route: the request path (parsing,
  // history, rendering, tokenizing, session match, store commit), not the engine's compute, which
  // runs on its own threads while the handler waits. Streamed bodies written after the handler
  // returns are not counted.
  void RequestCpu(const std::string& route, double seconds);
  // One turn finished. choice: a choice of a request with several (n > 1, best_of), whose prompt
  // the prompt's turn counted: mnemo_prompt_tokens_total counts a request's prompt once, however
  // many choices continue it. Where each turn's context came from is counted for every turn (a
  // choice reads the prompt's KV from T0 and feeds its last position again).
  void Turn(const TurnResult& r, bool choice = false);
  void InterToken(double seconds) { itl_.Observe(seconds); }
  // A turn refused for load: "admission" (before any work: queue full or the estimated wait past
  // the bound), "engine" (refused or timed out in the engine's queue), "draining".
  void Shed(const std::string& reason);
  // Context selections of the selective-context mode.
  void ContextSelection(int64_t dropped_tokens);
  // A turn rendered from a window of its conversation (Service's fast paths), not the whole history.
  void WindowedTurn() { windowed_++; }
  // A turn's request answered with the recorded answer of an earlier attempt (X-Mnemo-Request-Id).
  void Deduplicated() { deduplicated_++; }
  // A probe of the shared store before a turn (Service::SyncSession): what it found ("fresh",
  // "stale", "loaded", "delta", "rebuilt", "absent") and how long the probe took.
  void SessionSync(const char* result, double probe_seconds);
  // A session's turn lock taken on a shared store (Service::LockTurn): "free", "waited",
  // "timeout" (409), "unavailable", and how long the request waited for it.
  void TurnLock(const char* result, double wait_seconds);
  // A change notice from another replica changed this replica's copy of a session
  // (Service::OnStoreChange): "stale" or "dropped", and the notice's delivery latency.
  void SessionNotice(const char* action, double latency_seconds);
  // The store's change listener began listening (Service::OnStoreChange, SessionChange::resync):
  // at start, and again after each reconnect, when `marked` idle copies were marked stale because
  // notices sent meanwhile may have been lost.
  void ListenerResync(uint64_t marked);
  // This replica's name (ApiServer::replica_id), rendered as mnemo_replica_info{replica="..."} 1.
  void SetReplica(const std::string& id);

  // The whole exposition, engine gauges included.
  std::string Render(const EngineStats& engine, const QueueState& queue) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;  // (route, status) -> count
  std::map<std::string, double> request_cpu_;                  // route -> handler CPU seconds
  std::atomic<uint64_t> prompt_tokens_{0}, completion_tokens_{0};
  std::atomic<uint64_t> cached_t0_{0}, cached_t1_{0}, cached_t2_{0}, cached_remote_{0}, recomputed_{0}, fresh_{0};
  std::atomic<uint64_t> selections_{0}, selection_dropped_{0};
  std::atomic<uint64_t> windowed_{0};
  std::atomic<uint64_t> deduplicated_{0};
  std::map<std::string, uint64_t> finish_;  // finish_reason -> count
  std::map<std::string, uint64_t> shed_;    // reason -> turns refused for load
  std::map<std::string, uint64_t> syncs_;   // SessionSync result -> probes
  std::map<std::string, uint64_t> locks_;   // TurnLock result -> locks taken (or refused)
  std::map<std::string, uint64_t> notices_;  // SessionNotice action -> notices
  std::atomic<uint64_t> listens_{0}, resync_marks_{0};  // ListenerResync calls, copies marked
  std::string replica_;                     // "" until SetReplica
  Histogram ttft_, itl_, e2e_, queue_, probe_, lock_wait_, notice_latency_;
};

}  // namespace mnemo
