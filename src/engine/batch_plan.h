// The plan of one engine step (schedule -> execute -> update, as in vLLM's engine core): which
// running turns feed how many of their query positions, and which turn to suspend when T0 runs
// out. Pure functions over plain numbers: no model, no cache, no clock, so the rules below are
// tested without a model file (tests/engine/batch_plan_test.cpp). The engine builds the batch
// from the plan, runs the forward pass and applies the outputs (step.cpp).
//
// One rule covers prefill, chunked prefill, recomputed prefixes and decode: a turn has `pending`
// query positions before its next sample (a decode has exactly one, the token it just sampled).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace mnemo {

// One running turn as the planner sees it, in admission order (first come first).
struct PlanInput {
  bool decoding = false;  // all context positions fed: the next step feeds its one sampled token
  int pending = 0;        // query positions not yet fed (prefill / recompute); ignored when decoding
};

// One sequence of the batch: query positions [begin, begin + count) of the turn's pending ones.
struct PlannedSeq {
  int turn = 0;        // index into the planner's input
  int begin = 0;       // offset into the turn's pending positions (0 for a decode)
  int count = 0;       // positions fed this step (1 for a decode)
  bool sample = false; // its last position's logits are sampled (the turn has no pending left)
};

struct BatchPlan {
  std::vector<PlannedSeq> seqs;  // decodes first (input order), then prefill chunks (input order)
  int tokens = 0;                // sum of counts
};

// Every decoding turn gets its one token each step, even when the decodes alone exceed
// max_batch_tokens (a decode is never starved by prefill: inter-token latency stays bounded).
// The budget left goes to prefilling turns in admission order (FCFS), each taking
// min(pending, budget left): a long prompt is chunked across steps, and a later turn prefills only
// once the earlier ones are fully scheduled or the budget has room for both. Cost: O(turns).
BatchPlan PlanBatch(std::span<const PlanInput> turns, int max_batch_tokens);

// Which running turn to suspend when a decode cannot get a block for its next token: the most
// recently admitted (largest order) among the decoding turns, so older turns, which have waited
// longest and hold the most KV, keep running. -1 when no turn decodes. Suspension never fails a
// turn: the victim goes back to the head of the waiting queue with its KV demoted.
int PickSuspension(std::span<const uint64_t> order, std::span<const bool> decoding);

}  // namespace mnemo
