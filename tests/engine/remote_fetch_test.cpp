// When a remote fetch beats recomputing (engine/remote_fetch.h), on figures alone.
#include "engine/remote_fetch.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace mnemo {
namespace {

StepCostParams Cost(double per_token, double per_pair) {
  StepCostParams p;
  p.per_token = per_token;
  p.per_pair = per_pair;
  return p;
}

TEST(RemoteFetch, RecomputeCostGrowsWithPosition) {
  const StepCostParams p = Cost(1e-4, 1e-8);
  // Chunk 0: 32 tokens at a, pairs 1 + 2 + ... + 32 = 528.
  EXPECT_DOUBLE_EQ(RecomputeChunkSeconds(p, 0), 32 * 1e-4 + 528 * 1e-8);
  // Chunk 10: pairs 321 + ... + 352.
  EXPECT_DOUBLE_EQ(RecomputeChunkSeconds(p, 10), 32 * 1e-4 + (32 * 321 + 496) * 1e-8);
  EXPECT_LT(RecomputeChunkSeconds(p, 3), RecomputeChunkSeconds(p, 4));
}

TEST(RemoteFetch, FetchesTheLaterChunksWhenEarlyOnesAreCheaperToRecompute) {
  // 1 MB chunks at 1 GB/s: 1 ms each. Recompute: 0.5 ms + 1 us per 32 positions of depth.
  const StepCostParams p = Cost(0.5e-3 / 32, 1e-6 / (32.0 * 32));
  const RemoteFetchCost f{1e-4, 1e9, 1000000};
  std::vector<int> all;
  for (int c = 0; c < 1000; c += 100) all.push_back(c);
  const auto chosen = ChooseRemoteFetches(all, p, f, false);
  ASSERT_FALSE(chosen.empty());
  for (int c : chosen) EXPECT_GT(RecomputeChunkSeconds(p, c), 1e-3) << c;
  for (int c : all) {
    if (RecomputeChunkSeconds(p, c) <= 1e-3) {
      EXPECT_EQ(std::count(chosen.begin(), chosen.end(), c), 0) << c;
    }
  }
  EXPECT_EQ(chosen.back(), 900);
}

TEST(RemoteFetch, NothingWhenTheRoundTripEatsTheSaving) {
  const StepCostParams p = Cost(1e-6, 1e-10);  // a tiny model: a chunk recomputes in ~35 us
  const RemoteFetchCost f{5e-4, 1e9, 4096};
  EXPECT_TRUE(ChooseRemoteFetches({0, 1, 2}, p, f, false).empty());
  EXPECT_EQ(ChooseRemoteFetches({0, 1, 2}, p, f, true), (std::vector<int>{0, 1, 2}));
  // Slow recompute (a big model): worth it.
  EXPECT_EQ(ChooseRemoteFetches({0, 1, 2}, Cost(1e-3, 1e-7), f, false), (std::vector<int>{0, 1, 2}));
}

}  // namespace
}  // namespace mnemo
