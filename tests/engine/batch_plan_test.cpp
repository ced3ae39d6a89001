// The step planner without a model: token budget, decode starvation, FCFS prefill, chunking and
// suspension order.
#include "engine/batch_plan.h"

#include <gtest/gtest.h>

#include <deque>
#include <memory>

namespace mnemo {
namespace {

PlanInput Decode() { return PlanInput{true, 0}; }
PlanInput Prefill(int n) { return PlanInput{false, n}; }

TEST(BatchPlan, DecodesFirstThenPrefillWithinTheBudget) {
  std::vector<PlanInput> in = {Prefill(100), Decode(), Prefill(30), Decode()};
  BatchPlan p = PlanBatch(in, 64);
  ASSERT_EQ(p.seqs.size(), 3u);
  EXPECT_EQ(p.seqs[0].turn, 1);
  EXPECT_EQ(p.seqs[1].turn, 3);
  EXPECT_TRUE(p.seqs[0].sample && p.seqs[1].sample);
  EXPECT_EQ(p.seqs[2].turn, 0);  // the first prefill takes all that is left: 64 - 2
  EXPECT_EQ(p.seqs[2].count, 62);
  EXPECT_FALSE(p.seqs[2].sample);  // 38 positions still pending
  EXPECT_EQ(p.tokens, 64);
}

TEST(BatchPlan, EveryDecodeRunsEvenPastTheBudget) {
  std::vector<PlanInput> in(10, Decode());
  in.push_back(Prefill(5));
  BatchPlan p = PlanBatch(in, 4);
  EXPECT_EQ(p.seqs.size(), 10u);  // no decode starved; no prefill this step
  EXPECT_EQ(p.tokens, 10);
  for (const auto& s : p.seqs) EXPECT_EQ(s.count, 1);
}

TEST(BatchPlan, PrefillIsFirstComeFirstServed) {
  std::vector<PlanInput> in = {Prefill(40), Prefill(40), Prefill(40)};
  BatchPlan p = PlanBatch(in, 64);
  ASSERT_EQ(p.seqs.size(), 2u);
  EXPECT_EQ(p.seqs[0].turn, 0);
  EXPECT_EQ(p.seqs[0].count, 40);
  EXPECT_TRUE(p.seqs[0].sample);
  EXPECT_EQ(p.seqs[1].turn, 1);
  EXPECT_EQ(p.seqs[1].count, 24);
  EXPECT_FALSE(p.seqs[1].sample);
}

// A long prompt is chunked across steps; the chunks add up to it, each within the budget, and
// decodes admitted meanwhile still get a token every step.
TEST(BatchPlan, ChunkedPrefillCoversTheWholePrompt) {
  int pending = 1000;
  int steps = 0, decoded = 0;
  while (pending > 0) {
    std::vector<PlanInput> in = {Decode(), Prefill(pending), Decode()};
    BatchPlan p = PlanBatch(in, 128);
    EXPECT_LE(p.tokens, 128);
    int fed = 0;
    for (const auto& s : p.seqs) {
      if (s.turn == 1) {
        fed = s.count;
        EXPECT_EQ(s.sample, s.count == pending);
      } else {
        decoded++;
      }
    }
    ASSERT_GT(fed, 0);
    pending -= fed;
    steps++;
  }
  EXPECT_EQ(steps, (1000 + 125) / 126);
  EXPECT_EQ(decoded, 2 * steps);
}

TEST(BatchPlan, NothingToDo) {
  EXPECT_TRUE(PlanBatch(std::vector<PlanInput>{}, 64).seqs.empty());
  EXPECT_TRUE(PlanBatch(std::vector<PlanInput>{Prefill(0)}, 64).seqs.empty());
}

TEST(Suspension, YoungestDecodingTurnFirst) {
  std::vector<uint64_t> order = {5, 9, 7, 12};
  bool d[4] = {true, true, true, false};  // the youngest (12) is still prefilling: not a candidate
  EXPECT_EQ(PickSuspension(order, std::span<const bool>(d, 4)), 1);
  d[1] = false;
  EXPECT_EQ(PickSuspension(order, std::span<const bool>(d, 4)), 2);
  bool none[4] = {false, false, false, false};
  EXPECT_EQ(PickSuspension(order, std::span<const bool>(none, 4)), -1);
}

// Repeated suspension under a shrinking budget goes youngest to oldest and never drops a turn:
// each victim leaves the running set and is queued again at the head, in suspension order.
TEST(Suspension, RepeatedSuspensionsKeepEveryTurn) {
  std::vector<uint64_t> order = {1, 2, 3, 4, 5};
  std::deque<uint64_t> waiting;
  while (order.size() > 1) {
    std::unique_ptr<bool[]> d(new bool[order.size()]);
    for (size_t i = 0; i < order.size(); i++) d[i] = true;
    int v = PickSuspension(order, std::span<const bool>(d.get(), order.size()));
    ASSERT_GE(v, 0);
    waiting.push_front(order[v]);
    order.erase(order.begin() + v);
  }
  EXPECT_EQ(order, std::vector<uint64_t>({1}));
  EXPECT_EQ(waiting, std::deque<uint64_t>({2, 3, 4, 5}));  // the oldest suspended resumes first
}

}  // namespace
}  // namespace mnemo
