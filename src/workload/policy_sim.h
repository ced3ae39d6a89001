// A model-free replay of a multi-turn workload against the real cache manager and step scheduler
// on a virtual clock: the cache policy's outcome without the noise of a shared machine.
//
// `bench multiturn` runs the real engine in real time, so how many sessions are live at once (and
// so the pressure on T0) follows the machine's load: on the 2-core machine the same workload took
// 9.6-35 s of wall time and one policy's recomputed positions varied 1.06-1.57x between runs of
// one configuration (docs/benchmarks.md §3c). Here every forward step takes the time a step-cost
// model (engine/cost_fit.h, measured on the real engine) gives it, copies between T0 and T1 take
// a fixed time per block on one FIFO channel, users think for the workload's think times on the
// same clock: a run is a function of its inputs, so two policies can be compared point by point
// and a grid of hundreds of points runs in seconds.
//
// What is real: CacheManager (admission, growth, eviction policy, demotion, swap-in, the chunk
// state machine) and ScheduleStep (the engine's plan: suspension, FCFS admission, the token
// budget). What is modelled: the forward pass (time only: StepCostParams::Predict over the plan's
// positions; swap-ins overlap it layer by layer, so a step takes the longer of the two), copies
// (time per block), tokens (counts: a user message adds `turn_overhead_tokens` to its planned
// length, the first also the system prompt and BOS). The engine's other duties (sampling, HTTP,
// sessions' expiry, compositions) are not here.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"
#include "engine/cost_fit.h"
#include "engine/scheduler.h"
#include "kv/cache_manager.h"
#include "workload/workload.h"

namespace mnemo {

struct PolicySimConfig {
  int users = 8;                     // closed loop: user u runs conversations u, u + users, ...
  std::string policy = "pensieve";   // eviction policy (MakeEvictionPolicy)
  CacheConfig cache;                 // blocks per tier (T2 unused: 0)
  StepCostParams step;               // modelled forward step time, seconds
  CostModel policy_cost;             // the chunk prices the policy gets (per_token 0 = step.cost())
  double copy_block_s = 20e-6;       // one block's copy between T0 and T1, seconds
  ScheduleLimits limits;
  int turn_overhead_tokens = 6;      // template tokens around each user message
  int max_context = 1 << 20;         // a turn longer than this ends its conversation
};

// One turn's outcome (times on the virtual clock, seconds).
struct SimTurn {
  int conv = 0, turn = 0;
  double submitted = 0;
  double ttft = -1;                  // submission to first sampled token; < 0 if never
  int prompt_tokens = 0;
  int recomputed_positions = 0;      // over all its admissions
  double recompute_s = 0;            // modelled time of those positions
  int suspensions = 0;
  bool refused = false;
};

struct PolicySimResult {
  std::vector<SimTurn> turns;        // in completion order
  int64_t recomputed_positions = 0;
  int64_t recomputed_pairs = 0;      // Σ (p + 1) over them
  double recompute_s = 0;            // modelled time of the recomputations
  int64_t suspensions = 0;
  int64_t refused = 0;
  int64_t steps = 0;
  int64_t copy_waits = 0;            // times a step waited for a demotion to land
  double copy_wait_s = 0;
  int64_t swapped_in_blocks = 0;
  double duration_s = 0;             // virtual time from the first arrival to the last finish
  CacheStats cache;
};

// Replays `convs` (think times, message and reply lengths) with `cfg`. Errors: an unknown policy,
// a configuration under which the queue can never move (reported, not looped on).
Result<PolicySimResult> SimulatePolicy(const PolicySimConfig& cfg, const std::vector<ConversationPlan>& convs);

// Context length (tokens) of conversation c after turn t, as the simulator counts them.
int SimContextAfter(const ConversationPlan& c, int t, int turn_overhead_tokens);

}  // namespace mnemo
