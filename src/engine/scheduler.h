// The scheduling half of an engine step (schedule -> execute -> update, as in vLLM's engine core):
// `ScheduleStep` decides, against the cache manager, which running turns keep their blocks (or are
// suspended), which waiting turns are admitted, which query positions each sequence of the batch
// feeds, through which T0 blocks, and which swap-ins must land before the forward pass. It returns
// all of that as a plain `StepPlan`; the engine executes it (builds the batch, submits the
// swap-ins, runs the model, samples) and applies the outputs (step.cpp).
//
// Knows no model, tokenizer or sampling: inputs are session ids, lengths and positions, so the
// rules are tested with a real cache manager and no model file (tests/engine/scheduler_test.cpp).
// The only effects are on the cache manager (pins, evictions, suspensions: what admission and
// growth mean) and through `CopyWaiter` (reporting and waiting for copies in flight).
//
// Rules, in order:
//  1. Running decodes get the block for their next position (CacheManager::Grow, reserve
//     included). When none can be had: finished copies are collected; if demotions in flight will
//     free T0 blocks, the step waits for those copies; otherwise the youngest decoding turn
//     (batch_plan.h: PickSuspension) is suspended, its KV demoted, and the step retries. A
//     suspended turn is not admitted again in the same step.
//  2. Waiting turns are admitted first come first served up to max_running, passing over those
//     whose session a composition reads; the first kLater stops admission (nobody overtakes it);
//     kImpossible refuses the turn.
//  3. The token budget (batch_plan.h: PlanBatch): every decode one token, then prefill chunks of
//     running turns and then of this step's admissions, in order.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/batch_plan.h"
#include "engine/request.h"
#include "kv/cache_manager.h"

namespace mnemo {

// A turn waiting for admission, as the scheduler sees it (queue order: the head first).
struct WaitingTurn {
  SessionId session = -1;
  int n_tokens = 0;          // its sequence's length: positions [0, n_tokens) must hold KV or be fed
  bool passed_over = false;  // may not be admitted now (a composition reads its session)
};

// A turn holding T0 blocks, as the scheduler sees it.
struct RunningTurn {
  SessionId session = -1;
  uint64_t order = 0;               // admission order (suspension takes the largest)
  int n_tokens = 0;                 // its sequence's length (context + generated tokens)
  bool decoding = false;            // all positions fed but the last, just sampled: it feeds n_tokens - 1
  std::span<const int32_t> pending; // positions not fed yet, ascending (empty when decoding)
  std::span<const int32_t> table;   // [ceil(n_tokens' / 32)] its T0 block per chunk, as acquired or grown
};

// A waiting turn admitted this step.
struct PlannedAdmission {
  int waiting = 0;                // index into the waiting input
  std::vector<int32_t> table;     // [ceil(n_tokens / 32)] T0 block per chunk
  std::vector<int32_t> queries;   // positions to feed, ascending: the recomputed history, then the
                                  // positions past the cached KV (at least the last one, for its logits)
  int n_recompute = 0;            // queries[0, n_recompute) recompute KV that was gone
  int64_t recompute_pairs = 0;    // sum of (p + 1) over them (attention work of the recomputation)
  TokenSources sources;           // where its context came from
};

// One sequence of the batch.
struct StepSeq {
  int turn = 0;                     // < running.size(): that running turn; else the
                                    // (turn - running.size())-th admission of this plan
  std::vector<int32_t> positions;   // [count] query positions fed this step, ascending
  std::vector<int32_t> table;       // its T0 block table, covering every position it attends to
  bool sample = false;              // the last position's logits are sampled
};

struct StepPlan {
  std::vector<int> suspended;               // running turns suspended (KV demoted), in order; the
                                            // engine queues each at the head of the waiting queue
  std::vector<PlannedAdmission> admitted;   // in admission order
  std::vector<int> refused;                 // waiting turns that can never fit (kImpossible)
  std::vector<TransferOp> swap_ins;         // T1 -> T0 copies of the admissions, to land before
                                            // the forward pass reads them (layer by layer)
  std::vector<StepSeq> seqs;                // the batch: decodes first, then prefill chunks
  int tokens = 0;                           // positions fed (sum of seqs' sizes)
};

// What the scheduler needs of the copies in flight. The engine implements it over its transfer
// engine; a model-free test over a simulated one.
class CopyWaiter {
 public:
  virtual ~CopyWaiter() = default;
  // Reports every copy finished so far to the cache manager (OnTransferDone). Must not block.
  virtual void Poll() = 0;
  // Starts the copies the cache manager planned (TakeTransfers), blocks until the copies `ops`
  // have finished, then reports them (as Poll).
  virtual void WaitFor(std::span<const uint64_t> ops) = 0;
};

struct ScheduleLimits {
  int max_batch_tokens = 512;  // positions per forward pass (decodes may exceed it, never wait)
  int max_running = 64;        // turns holding T0 blocks at once
};

// Seconds of idle time one place in the queue counts for (MarkQueued).
inline constexpr double kQueuePlaceSeconds = 1e-3;

// The sessions of queued turns are about to be read, in queue order (head first): keep them from
// looking idle, or they become the policy's victims exactly while they wait (the longer the
// queue, the idler they look) and are recomputed at admission. The k-th session is marked active
// at now - k * kQueuePlaceSeconds, so among queued sessions the tail looks idlest: room for the
// head is made from the KV read last (as Belady's rule would), while any session idle for longer
// than the queue's length in milliseconds (a user thinking) still goes first. Measured on the
// virtual clock (docs/benchmarks.md §3d): 7-16% less recomputation for both policies where the
// queue is long (think time 0). Cost: O(Σ chunks of the queued sessions).
void MarkQueued(CacheManager& cache, std::span<const SessionId> queue, double now);

// Plans one step (rules above). `running` and `waiting` are the engine's lists; the plan names
// them by index. Cost: O(running + admitted + the batch's positions and tables), plus the cache
// manager's admission and growth.
StepPlan ScheduleStep(CacheManager& cache, std::span<const RunningTurn> running, std::span<const WaitingTurn> waiting,
                      const ScheduleLimits& limits, double now, CopyWaiter& copies);

}  // namespace mnemo
