#include "engine/batch_plan.h"

#include <algorithm>

namespace mnemo {

BatchPlan PlanBatch(std::span<const PlanInput> turns, int max_batch_tokens) {
  BatchPlan plan;
  for (int i = 0; i < static_cast<int>(turns.size()); i++) {
    if (!turns[i].decoding) continue;
    plan.seqs.push_back(PlannedSeq{i, 0, 1, true});
    plan.tokens++;
  }
  int budget = max_batch_tokens - plan.tokens;
  for (int i = 0; i < static_cast<int>(turns.size()) && budget > 0; i++) {
    const PlanInput& t = turns[i];
    if (t.decoding || t.pending <= 0) continue;
    const int k = std::min(budget, t.pending);
    plan.seqs.push_back(PlannedSeq{i, 0, k, k == t.pending});
    plan.tokens += k;
    budget -= k;
  }
  return plan;
}

int PickSuspension(std::span<const uint64_t> order, std::span<const bool> decoding) {
  int victim = -1;
  for (int i = 0; i < static_cast<int>(order.size()); i++) {
    if (decoding[i] && (victim < 0 || order[i] > order[victim])) victim = i;
  }
  return victim;
}

}  // namespace mnemo
