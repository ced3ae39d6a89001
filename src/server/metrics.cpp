#include "server/metrics.h"

#include <cstdarg>
#include <cmath>
#include <cstdio>
#include <string_view>

namespace mnemo {
namespace {

void Line(std::string* out, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
void Line(std::string* out, const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  *out += buf;
  *out += '\n';
}

void Header(std::string* out, const char* name, const char* type, const char* help) {
  Line(out, "# HELP %s %s", name, help);
  Line(out, "# TYPE %s %s", name, type);
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1) {}

void Histogram::Observe(double v) {
  std::lock_guard<std::mutex> lock(mu_);
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) i++;
  counts_[i]++;
  sum_ += v;
  n_++;
}

void Histogram::Render(const std::string& name, const std::string& help, std::string* out) const {
  std::lock_guard<std::mutex> lock(mu_);
  Header(out, name.c_str(), "histogram", help.c_str());
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); i++) {
    cum += counts_[i];
    Line(out, "%s_bucket{le=\"%g\"} %llu", name.c_str(), bounds_[i], static_cast<unsigned long long>(cum));
  }
  cum += counts_.back();
  Line(out, "%s_bucket{le=\"+Inf\"} %llu", name.c_str(), static_cast<unsigned long long>(cum));
  Line(out, "%s_sum %g", name.c_str(), sum_);
  Line(out, "%s_count %llu", name.c_str(), static_cast<unsigned long long>(n_));
}

Metrics::Metrics()
    : ttft_({0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}),
      itl_({0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1}),
      e2e_({0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120}),
      queue_({0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}),
      probe_({0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 1}),
      lock_wait_({0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}),
      notice_latency_({0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 1}) {}

void Metrics::SessionSync(const char* result, double probe_seconds) {
  probe_.Observe(probe_seconds);
  std::lock_guard<std::mutex> lock(mu_);
  syncs_[result]++;
}

void Metrics::TurnLock(const char* result, double wait_seconds) {
  if (std::string_view(result) != "free") lock_wait_.Observe(wait_seconds);  // a free lock is no wait
  std::lock_guard<std::mutex> lock(mu_);
  locks_[result]++;
}

void Metrics::SessionNotice(const char* action, double latency_seconds) {
  notice_latency_.Observe(latency_seconds);
  std::lock_guard<std::mutex> lock(mu_);
  notices_[action]++;
}

void Metrics::ListenerResync(uint64_t marked) {
  listens_++;
  resync_marks_ += marked;
}

void Metrics::Shed(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  shed_[reason]++;
}

void Metrics::Request(const std::string& route, int status) {
  std::lock_guard<std::mutex> lock(mu_);
  requests_[{route, status}]++;
}

void Metrics::RequestCpu(const std::string& route, double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  request_cpu_[route] += seconds;
}

void Metrics::Turn(const TurnResult& r, bool choice) {
  if (!choice) prompt_tokens_ += r.prompt_tokens;
  completion_tokens_ += r.tokens.size();
  cached_t0_ += r.sources.t0;
  cached_t1_ += r.sources.t1;
  cached_t2_ += r.sources.t2;
  cached_remote_ += r.sources.remote;
  recomputed_ += r.sources.recomputed;
  fresh_ += r.sources.fresh;
  if (!r.tokens.empty()) ttft_.Observe(r.ttft_seconds);
  e2e_.Observe(r.total_seconds);
  // Turns that reached the batch, and turns ended for waiting too long (cancelled ones did not wait it out).
  if (r.admitted || r.finish_reason == FinishReason::kError) queue_.Observe(r.queue_seconds);
  std::lock_guard<std::mutex> lock(mu_);
  finish_[FinishReasonName(r.finish_reason)]++;
}

void Metrics::SetReplica(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  replica_ = id;
}

void Metrics::ContextSelection(int64_t dropped_tokens) {
  selections_++;
  selection_dropped_ += dropped_tokens;
}

std::string Metrics::Render(const EngineStats& e, const QueueState& q) const {
  std::string out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!replica_.empty()) {  // printable ASCII without spaces (ApiServer::Start checks): escape \ and "
      std::string label;
      for (char c : replica_) {
        if (c == '\\' || c == '"') label += '\\';
        label += c;
      }
      Header(&out, "mnemo_replica_info", "gauge", "This replica's name (--replica-id), as a label");
      Line(&out, "mnemo_replica_info{replica=\"%s\"} 1", label.c_str());
    }
    Header(&out, "mnemo_http_requests_total", "counter", "HTTP requests by route and status");
    for (const auto& [k, v] : requests_) {
      Line(&out, "mnemo_http_requests_total{route=\"%s\",status=\"%d\"} %llu", k.first.c_str(), k.second,
           static_cast<unsigned long long>(v));
    }
    Header(&out, "mnemo_request_cpu_seconds_total", "counter",
           "CPU time of HTTP handler threads by route (the request path, without the engine's compute)");
    for (const auto& [k, v] : request_cpu_) Line(&out, "mnemo_request_cpu_seconds_total{route=\"%s\"} %.9f", k.c_str(), v);
    Header(&out, "mnemo_turns_total", "counter", "Turns finished by finish reason");
    for (const auto& [k, v] : finish_) {
      Line(&out, "mnemo_turns_total{finish_reason=\"%s\"} %llu", k.c_str(), static_cast<unsigned long long>(v));
    }
    Header(&out, "mnemo_shed_total", "counter",
           "Turns refused for load: admission (before any work), engine (in the engine's queue), draining");
    for (const auto& [k, v] : shed_) {
      Line(&out, "mnemo_shed_total{reason=\"%s\"} %llu", k.c_str(), static_cast<unsigned long long>(v));
    }
    Header(&out, "mnemo_session_syncs_total", "counter",
           "Probes of a shared store before a turn, by what they found: fresh (the copy is the stored log), "
           "stale (it is not: then delta or rebuilt), loaded (not held here), delta (stored turns appended), "
           "rebuilt (diverged: rebuilt from the stored tokens), absent (deleted from the store)");
    for (const auto& [k, v] : syncs_) {
      Line(&out, "mnemo_session_syncs_total{result=\"%s\"} %llu", k.c_str(), static_cast<unsigned long long>(v));
    }
    Header(&out, "mnemo_turn_locks_total", "counter",
           "Session turn locks on a shared store, by what taking one found: free, waited (another replica's "
           "turn held it), timeout (still held after the wait bound: 409), unavailable (the turn went on without)");
    for (const auto& [k, v] : locks_) {
      Line(&out, "mnemo_turn_locks_total{result=\"%s\"} %llu", k.c_str(), static_cast<unsigned long long>(v));
    }
    Header(&out, "mnemo_session_notices_total", "counter",
           "Change notices from other replicas that changed a local copy: stale (appended elsewhere: the next "
           "turn appends the stored turns), dropped (cut or deleted elsewhere)");
    for (const auto& [k, v] : notices_) {
      Line(&out, "mnemo_session_notices_total{action=\"%s\"} %llu", k.c_str(), static_cast<unsigned long long>(v));
    }
    Header(&out, "mnemo_store_listens_total", "counter",
           "Times the store's change listener began listening: 1 at start, one more after each reconnect "
           "(notices sent while it was away are lost)");
    Line(&out, "mnemo_store_listens_total %llu", static_cast<unsigned long long>(listens_.load()));
    Header(&out, "mnemo_session_resync_marks_total", "counter",
           "Local copies of stored sessions marked stale when the listener began listening again: each is "
           "checked against the store on its next turn");
    Line(&out, "mnemo_session_resync_marks_total %llu", static_cast<unsigned long long>(resync_marks_.load()));
  }
  auto counter = [&](const char* name, const char* help, uint64_t v) {
    Header(&out, name, "counter", help);
    Line(&out, "%s %llu", name, static_cast<unsigned long long>(v));
  };
  auto gauge = [&](const char* name, const char* help, double v) {
    Header(&out, name, "gauge", help);
    Line(&out, "%s %g", name, v);
  };
  counter("mnemo_prompt_tokens_total", "Context tokens of finished turns (a request's prompt once, whatever its choices)",
          prompt_tokens_);
  counter("mnemo_completion_tokens_total", "Generated tokens of finished turns", completion_tokens_);
  Header(&out, "mnemo_context_tokens_total", "counter", "Context tokens of finished turns by where their KV came from");
  Line(&out, "mnemo_context_tokens_total{source=\"t0\"} %llu", static_cast<unsigned long long>(cached_t0_));
  Line(&out, "mnemo_context_tokens_total{source=\"t1\"} %llu", static_cast<unsigned long long>(cached_t1_));
  Line(&out, "mnemo_context_tokens_total{source=\"t2\"} %llu", static_cast<unsigned long long>(cached_t2_));
  Line(&out, "mnemo_context_tokens_total{source=\"remote\"} %llu", static_cast<unsigned long long>(cached_remote_));
  Line(&out, "mnemo_context_tokens_total{source=\"recomputed\"} %llu", static_cast<unsigned long long>(recomputed_));
  Line(&out, "mnemo_context_tokens_total{source=\"new\"} %llu", static_cast<unsigned long long>(fresh_));
  counter("mnemo_cached_tokens_total", "Context tokens served from the cache (any tier)",
          cached_t0_ + cached_t1_ + cached_t2_ + cached_remote_);
  counter("mnemo_recomputed_tokens_total", "History tokens recomputed because their KV was gone", recomputed_);
  counter("mnemo_swap_ins_total", "Chunks copied from host RAM into the compute tier", e.cache.swap_ins);
  counter("mnemo_swap_outs_total", "Chunks demoted out of the compute tier by copy", e.cache.swap_outs);
  counter("mnemo_cow_copies_total", "Partial chunks copied when a session forked or was truncated", e.cache.cow_copies);
  counter("mnemo_cow_recomputes_total", "Partial chunks a fork or truncation could not copy (recomputed)",
          e.cache.cow_recomputes);
  Header(&out, "mnemo_evictions_total", "counter", "Chunks evicted, by tier");
  Line(&out, "mnemo_evictions_total{tier=\"t0\"} %lld", static_cast<long long>(e.cache.evictions[0]));
  Line(&out, "mnemo_evictions_total{tier=\"t1\"} %lld", static_cast<long long>(e.cache.evictions[1]));
  Line(&out, "mnemo_evictions_total{tier=\"t2\"} %lld", static_cast<long long>(e.cache.evictions[2]));
  counter("mnemo_dropped_chunks_total", "Chunks whose KV was discarded (raw tokens remain)", e.cache.drops);
  counter("mnemo_disk_read_failures_total", "Disk chunks that failed their checksum and were recomputed",
          e.cache.failed_reads);
  Header(&out, "mnemo_bytes_moved_total", "counter", "KV bytes moved between tiers");
  Line(&out, "mnemo_bytes_moved_total{direction=\"in\"} %lld", static_cast<long long>(e.transfer.bytes_in));
  Line(&out, "mnemo_bytes_moved_total{direction=\"out\"} %lld", static_cast<long long>(e.transfer.bytes_out));
  Line(&out, "mnemo_bytes_moved_total{direction=\"disk_write\"} %lld", static_cast<long long>(e.transfer.bytes_disk_w));
  Line(&out, "mnemo_bytes_moved_total{direction=\"disk_read\"} %lld", static_cast<long long>(e.transfer.bytes_disk_r));
  if (e.remote_on) {  // the remote KV tier (--kv-remote): Redis, shared by the replicas
    const RemoteStats& r = e.remote;
    Header(&out, "mnemo_remote_kv_gets_total", "counter", "Remote KV chunks fetched, by result");
    Line(&out, "mnemo_remote_kv_gets_total{result=\"hit\"} %lld", static_cast<long long>(r.hits));
    Line(&out, "mnemo_remote_kv_gets_total{result=\"miss\"} %lld", static_cast<long long>(r.misses));
    Line(&out, "mnemo_remote_kv_gets_total{result=\"rejected\"} %lld", static_cast<long long>(r.rejected));
    Line(&out, "mnemo_remote_kv_gets_total{result=\"failed\"} %lld", static_cast<long long>(r.failed));
    counter("mnemo_remote_kv_hits_total", "Remote KV chunks fetched and used instead of recomputed", r.hits);
    Header(&out, "mnemo_remote_kv_puts_total", "counter", "Remote KV chunk puts, by result");
    Line(&out, "mnemo_remote_kv_puts_total{result=\"stored\"} %lld", static_cast<long long>(r.puts));
    Line(&out, "mnemo_remote_kv_puts_total{result=\"dropped\"} %lld", static_cast<long long>(r.puts_dropped));
    Line(&out, "mnemo_remote_kv_puts_total{result=\"failed\"} %lld", static_cast<long long>(r.puts_failed));
    Header(&out, "mnemo_remote_kv_bytes_total", "counter", "Remote KV value bytes, by direction");
    Line(&out, "mnemo_remote_kv_bytes_total{direction=\"read\"} %lld", static_cast<long long>(r.bytes_read));
    Line(&out, "mnemo_remote_kv_bytes_total{direction=\"write\"} %lld", static_cast<long long>(r.bytes_written));
    gauge("mnemo_remote_kv_up", "1 while the remote KV tier answers (0: down, chunks are recomputed)", r.available ? 1 : 0);
    gauge("mnemo_remote_kv_rtt_seconds", "Measured round trip to the remote KV tier", r.rtt_s);
    gauge("mnemo_remote_kv_bytes_per_second", "Measured remote KV fetch throughput", r.bytes_per_s);
  }
  counter("mnemo_suspensions_total", "Running turns suspended for memory", e.suspensions);
  Header(&out, "mnemo_recompute_seconds_total", "counter", "Forward time spent recomputing KV that was gone");
  Line(&out, "mnemo_recompute_seconds_total %g", e.recompute_seconds);
  // The step-time model the engine calibrated from its prefill steps (engine/cost_fit.h): what
  // the eviction policy prices chunks with once fitted.
  gauge("mnemo_cost_per_token_seconds", "Calibrated forward time per query token (a)", e.step_cost.per_token);
  gauge("mnemo_cost_per_pair_seconds", "Calibrated forward time per attention (query, key) pair (b)",
        e.step_cost.per_pair);
  gauge("mnemo_cost_fit_steps", "Prefill steps the cost model was fitted on", static_cast<double>(e.step_cost_samples));
  gauge("mnemo_cost_fit_rel_rms", "Relative RMS error of the fitted step-time model", e.step_cost_rel_rms);
  counter("mnemo_engine_steps_total", "Forward passes", e.steps);
  counter("mnemo_context_selections_total", "Turns served with selective context", selections_);
  counter("mnemo_windowed_turns_total", "Turns rendered from a window of the conversation, not the whole history",
          windowed_);
  counter("mnemo_deduplicated_requests_total",
          "Turn requests answered with an earlier attempt's recorded answer (X-Mnemo-Request-Id)", deduplicated_);
  counter("mnemo_context_dropped_tokens_total", "Tokens left out by selective context", selection_dropped_);
  gauge("mnemo_queue_depth", "Turns waiting for admission", e.waiting);
  gauge("mnemo_running", "Turns in the batch", e.running);
  gauge("mnemo_queue_estimated_wait_seconds", "Estimated admission wait of a turn submitted now",
        std::isfinite(q.estimated_wait_s) ? q.estimated_wait_s : 1e9);
  gauge("mnemo_queue_drain_rate", "Turns admitted per second of backlog (-1: not measured yet)", q.drain_rate);
  gauge("mnemo_queue_max_seconds", "Admission wait bound (--max-queue-ms; 0: none)", q.max_queue_s);
  gauge("mnemo_sessions", "Sessions held by the engine", e.sessions);
  Header(&out, "mnemo_tier_blocks", "gauge", "KV blocks per tier: used and capacity");
  const char* tiers[3] = {"t0", "t1", "t2"};
  for (int t = 0; t < 3; t++) {
    Line(&out, "mnemo_tier_blocks{tier=\"%s\",state=\"used\"} %d", tiers[t], e.used_blocks[t]);
    Line(&out, "mnemo_tier_blocks{tier=\"%s\",state=\"capacity\"} %d", tiers[t], e.capacity[t]);
  }
  gauge("mnemo_block_bytes", "Bytes of one KV block (all layers)", static_cast<double>(e.block_bytes));
  ttft_.Render("mnemo_ttft_seconds", "Time to first token", &out);
  itl_.Render("mnemo_inter_token_seconds", "Time between streamed tokens", &out);
  e2e_.Render("mnemo_request_seconds", "Turn latency, submit to done", &out);
  queue_.Render("mnemo_queue_wait_seconds", "Time turns waited for admission to the batch", &out);
  probe_.Render("mnemo_store_probe_seconds", "Per-turn probe of a shared store (Store::GetSessionVersion)", &out);
  lock_wait_.Render("mnemo_turn_lock_wait_seconds",
                    "Time a turn waited for its session's turn lock held by another replica's turn", &out);
  notice_latency_.Render("mnemo_session_notice_latency_seconds",
                         "Delivery latency of change notices from other replicas (the writer's clock)", &out);
  return out;
}

}  // namespace mnemo
