// The policy simulator: the real cache manager and scheduler on a virtual clock. Deterministic,
// so the checks below are exact, and each can fail: accounting, the no-pressure baseline, refusals,
// and Pensieve's defining property (it drops cheap leading chunks, LRU the expensive tails).
#include "workload/policy_sim.h"

#include <gtest/gtest.h>

#include <cmath>

namespace mnemo {
namespace {

WorkloadConfig LongWorkload(uint64_t seed) {
  WorkloadConfig w;
  w.seed = seed;
  w.conversations = 24;
  w.mean_turns = 10;
  w.max_turns = 16;
  w.input_median = 150;
  w.output_median = 120;
  w.think_mean_s = 0.5;
  return w;
}

PolicySimConfig Config(const std::string& policy, int t0_blocks, int t1_blocks) {
  PolicySimConfig c;
  c.users = 12;
  c.policy = policy;
  c.cache.t0_blocks = t0_blocks;
  c.cache.t1_blocks = t1_blocks;
  c.step = StepCostParams{3e-3, 57e-6, 14e-9, 0};
  return c;
}

int TotalTurns(const std::vector<ConversationPlan>& convs) {
  int n = 0;
  for (const auto& c : convs) n += static_cast<int>(c.turns.size());
  return n;
}

TEST(PolicySim, RunsAreAFunctionOfTheirInputs) {
  const auto convs = MakeWorkload(LongWorkload(3));
  auto a = SimulatePolicy(Config("pensieve", 400, 200), convs);
  auto b = SimulatePolicy(Config("pensieve", 400, 200), convs);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_GT(a->recomputed_positions, 0);
  EXPECT_EQ(a->recomputed_positions, b->recomputed_positions);
  EXPECT_EQ(a->recomputed_pairs, b->recomputed_pairs);
  EXPECT_EQ(a->steps, b->steps);
  EXPECT_DOUBLE_EQ(a->duration_s, b->duration_s);
  ASSERT_EQ(a->turns.size(), b->turns.size());
  for (size_t i = 0; i < a->turns.size(); i++) EXPECT_DOUBLE_EQ(a->turns[i].ttft, b->turns[i].ttft);
}

TEST(PolicySim, EveryTurnIsAccountedFor) {
  const auto convs = MakeWorkload(LongWorkload(4));
  auto r = SimulatePolicy(Config("lru", 300, 100), convs);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(static_cast<int>(r->turns.size()), TotalTurns(convs));
  int64_t positions = 0;
  double seconds = 0;
  for (const SimTurn& t : r->turns) {
    EXPECT_FALSE(t.refused);
    EXPECT_GT(t.ttft, 0);
    positions += t.recomputed_positions;
    seconds += t.recompute_s;
  }
  EXPECT_EQ(positions, r->recomputed_positions);
  EXPECT_NEAR(seconds, r->recompute_s, 1e-9 * std::max(1.0, seconds));
  // A recomputed position costs at least a token's time and at most a token and its full context.
  EXPECT_GE(r->recompute_s, r->recomputed_positions * 57e-6);
}

TEST(PolicySim, NoPressureNoRecomputation) {
  const auto convs = MakeWorkload(LongWorkload(5));
  int longest = 0;
  for (const auto& c : convs) longest = std::max(longest, SimContextAfter(c, static_cast<int>(c.turns.size()) - 1, 6));
  // Room for every conversation at its longest at once.
  const int blocks = static_cast<int>(convs.size()) * (longest / kBlockTokens + 2) * 2;
  for (const char* p : {"lru", "pensieve"}) {
    auto r = SimulatePolicy(Config(p, blocks, 0), convs);
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->recomputed_positions, 0) << p;
    EXPECT_EQ(r->cache.drops, 0) << p;
    EXPECT_EQ(static_cast<int>(r->turns.size()), TotalTurns(convs));
  }
}

TEST(PolicySim, ATurnThatCanNeverFitIsRefusedNotLoopedOn) {
  const auto convs = MakeWorkload(LongWorkload(6));
  auto r = SimulatePolicy(Config("pensieve", 24, 0), convs);  // 768 tokens: long turns cannot fit
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_GT(r->refused, 0);
  // A refusal ends its conversation (as a client would give up): it is that conversation's last turn.
  std::vector<int> last_turn(convs.size(), -1);
  int refused = 0;
  for (const SimTurn& t : r->turns) {
    EXPECT_GT(t.turn, last_turn[t.conv]);
    last_turn[t.conv] = t.turn;
    refused += t.refused;
  }
  EXPECT_EQ(refused, r->refused);
  for (const SimTurn& t : r->turns) {
    if (t.refused) {
      EXPECT_EQ(t.turn, last_turn[t.conv]);
    }
  }
}

// Pensieve's rule: the leading chunks of idle sessions go first (cheap to recompute: attention
// over a short prefix), where LRU drops the tails of the least recent session. With a host tier
// and long contexts, Pensieve recomputes about as many positions but far fewer attention pairs.
TEST(PolicySim, PensieveRecomputesCheaperPositionsThanLru) {
  const auto convs = MakeWorkload(LongWorkload(1));
  auto lru = SimulatePolicy(Config("lru", 500, 250), convs);
  auto pens = SimulatePolicy(Config("pensieve", 500, 250), convs);
  ASSERT_TRUE(lru.ok() && pens.ok());
  ASSERT_GT(lru->recomputed_positions, 1000);
  const double pairs = double(pens->recomputed_pairs) / double(lru->recomputed_pairs);
  const double positions = double(pens->recomputed_positions) / double(lru->recomputed_positions);
  EXPECT_LT(pairs, 0.8) << "positions ratio " << positions;
  EXPECT_LT(positions, 1.15);
  EXPECT_LT(pens->recompute_s, lru->recompute_s);
}

}  // namespace
}  // namespace mnemo
