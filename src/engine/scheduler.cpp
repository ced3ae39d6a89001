#include "engine/scheduler.h"

#include <algorithm>
#include <memory>

#include "base/status.h"

namespace mnemo {
namespace {

// Rule 1 for decode i: true when it has the block for its next position in *table.
bool GrowOrWait(CacheManager& cache, const RunningTurn& r, std::vector<int32_t>* table, CopyWaiter& copies) {
  if (cache.Grow(r.session, r.n_tokens, table)) return true;
  copies.Poll();  // demotions that finished free blocks
  if (cache.Grow(r.session, r.n_tokens, table)) return true;
  // Blocks are on their way (demotions Grow started or counts): wait for those copies rather than
  // suspend a turn, whose KV would be demoted too and swapped back in later. A T0 -> T1 copy
  // takes microseconds a block; the wait is for the oldest such copy (and what is queued before
  // it), not for every copy queued. Each round lands one, so this ends.
  for (std::vector<uint64_t> freeing = cache.T0FreeingOps(); !freeing.empty(); freeing = cache.T0FreeingOps()) {
    copies.WaitFor(std::span<const uint64_t>(freeing.data(), 1));
    if (cache.Grow(r.session, r.n_tokens, table)) return true;
  }
  return false;
}

}  // namespace

void MarkQueued(CacheManager& cache, std::span<const SessionId> queue, double now) {
  for (size_t k = 0; k < queue.size(); k++) cache.MarkActive(queue[k], now - static_cast<double>(k) * kQueuePlaceSeconds);
}

StepPlan ScheduleStep(CacheManager& cache, std::span<const RunningTurn> running, std::span<const WaitingTurn> waiting,
                      const ScheduleLimits& limits, double now, CopyWaiter& copies) {
  StepPlan plan;
  const int n_running = static_cast<int>(running.size());
  // 1. Blocks for the decodes' next positions; suspension when T0 is out of them.
  std::vector<std::vector<int32_t>> tables(n_running);  // [running] tables of decodes, grown
  std::unique_ptr<bool[]> live(new bool[n_running]);      // not suspended
  std::unique_ptr<bool[]> decoding(new bool[n_running]);  // suspension candidates
  std::vector<uint64_t> order(n_running);
  for (int i = 0; i < n_running; i++) {
    live[i] = true;
    decoding[i] = running[i].decoding;
    order[i] = running[i].order;
    if (running[i].decoding) tables[i].assign(running[i].table.begin(), running[i].table.end());
  }
  for (bool retry = true; retry;) {
    retry = false;
    for (int i = 0; i < n_running; i++) {
      if (!live[i] || !running[i].decoding) continue;
      if (GrowOrWait(cache, running[i], &tables[i], copies)) continue;
      const int v = PickSuspension(order, std::span<const bool>(decoding.get(), n_running));
      MNEMO_CHECK(v >= 0);  // i itself decodes
      cache.Suspend(running[v].session, running[v].n_tokens - 1, now);  // its last token is unfed
      live[v] = false;
      decoding[v] = false;
      tables[v].clear();
      plan.suspended.push_back(v);
      retry = true;  // the demotions started may be what i (or an earlier decode) waits for
      break;
    }
  }

  // 2. Admission, first come first served.
  int holding = n_running - static_cast<int>(plan.suspended.size());
  for (int w = 0; w < static_cast<int>(waiting.size()) && holding < limits.max_running; w++) {
    const WaitingTurn& t = waiting[w];
    if (t.passed_over) continue;
    const int kv_before = cache.kv_tokens(t.session);
    CacheManager::Acquired a;
    const Admission ad = cache.Acquire(t.session, t.n_tokens, now, &a);
    if (ad == Admission::kLater) break;  // nobody overtakes it
    if (ad == Admission::kImpossible) {
      plan.refused.push_back(w);
      continue;
    }
    PlannedAdmission pa;
    pa.waiting = w;
    pa.table = std::move(a.block_table);
    for (int c : a.recompute) {
      for (int p = c * kBlockTokens; p < std::min((c + 1) * kBlockTokens, kv_before); p++) {
        pa.queries.push_back(p);
        pa.recompute_pairs += p + 1;
      }
    }
    pa.n_recompute = static_cast<int>(pa.queries.size());  // ascending: the recomputed history first
    for (int p = kv_before; p < t.n_tokens; p++) pa.queries.push_back(p);
    // Everything is cached (e.g. a regenerated reply): feed the last position again for its logits.
    if (pa.queries.empty() || pa.queries.back() != t.n_tokens - 1) pa.queries.push_back(t.n_tokens - 1);
    pa.sources = TokenSources{a.hit_tokens[0], a.hit_tokens[1], a.hit_tokens[2], pa.n_recompute,
                              static_cast<int64_t>(t.n_tokens) - kv_before, a.remote_tokens};
    plan.swap_ins.insert(plan.swap_ins.end(), a.swap_ins.begin(), a.swap_ins.end());
    plan.admitted.push_back(std::move(pa));
    holding++;
  }

  // 3. The token budget over the turns that hold blocks: running ones, then admissions.
  std::vector<PlanInput> inputs;
  std::vector<int> turn_of;  // [inputs] plan turn index
  for (int i = 0; i < n_running; i++) {
    if (!live[i]) continue;
    inputs.push_back(PlanInput{running[i].decoding, static_cast<int>(running[i].pending.size())});
    turn_of.push_back(i);
  }
  for (size_t k = 0; k < plan.admitted.size(); k++) {
    inputs.push_back(PlanInput{false, static_cast<int>(plan.admitted[k].queries.size())});
    turn_of.push_back(n_running + static_cast<int>(k));
  }
  const BatchPlan batch = PlanBatch(inputs, limits.max_batch_tokens);
  for (const PlannedSeq& ps : batch.seqs) {
    const int turn = turn_of[ps.turn];
    StepSeq seq;
    seq.turn = turn;
    seq.sample = ps.sample;
    if (turn < n_running) {
      const RunningTurn& r = running[turn];
      if (r.decoding) {
        seq.positions = {r.n_tokens - 1};
        seq.table = tables[turn];
      } else {
        seq.positions.assign(r.pending.begin() + ps.begin, r.pending.begin() + ps.begin + ps.count);
        seq.table.assign(r.table.begin(), r.table.end());
      }
    } else {
      const PlannedAdmission& pa = plan.admitted[turn - n_running];
      seq.positions.assign(pa.queries.begin() + ps.begin, pa.queries.begin() + ps.begin + ps.count);
      seq.table = pa.table;
    }
    plan.tokens += ps.count;
    plan.seqs.push_back(std::move(seq));
  }
  return plan;
}

}  // namespace mnemo
