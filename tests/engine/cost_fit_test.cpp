// StepCostFit on synthetic step timings: it recovers the parameters that generated them, follows
// a change, keeps the prior until evidence arrives, and never goes negative.
#include "engine/cost_fit.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "base/rng.h"

namespace mnemo {
namespace {

// A batch like the engine's: a few decodes at long contexts plus prefill chunks starting anywhere.
StepSample RandomStep(Rng& rng) {
  StepSample s;
  const int decodes = static_cast<int>(rng.Next() % 6);
  for (int i = 0; i < decodes; i++) {
    s.tokens++;
    s.pairs += 1 + static_cast<double>(rng.Next() % 2000);
    s.sampled++;
  }
  const int chunks = 1 + static_cast<int>(rng.Next() % 3);
  for (int i = 0; i < chunks; i++) {
    const int begin = static_cast<int>(rng.Next() % 1800), len = 1 + static_cast<int>(rng.Next() % 256);
    s.tokens += len;
    s.pairs += double(len) * begin + 0.5 * double(len) * (len + 1);
    if (rng.Next() % 2) s.sampled++;
  }
  return s;
}

const StepCostParams kTruth{300e-6, 40e-6, 3e-9, 90e-6};
const StepCostParams kPrior{0, 10e-6, 1e-10, 10e-6};  // off by 4x and 30x, as FLOP counts are

TEST(StepCostFit, StartsAtThePrior) {
  StepCostFit fit(kPrior);
  EXPECT_EQ(fit.samples(), 0);
  EXPECT_EQ(fit.params().per_token, kPrior.per_token);
  EXPECT_EQ(fit.params().per_pair, kPrior.per_pair);
  // One sample cannot drag the estimate all the way: the prior weighs a few steps.
  Rng rng(3);
  StepSample s = RandomStep(rng);
  s.seconds = kTruth.Predict(s);
  fit.Add(s);
  EXPECT_EQ(fit.samples(), 1);
  EXPECT_GT(std::fabs(fit.params().per_pair - kTruth.per_pair), 0.05 * kTruth.per_pair);
}

TEST(StepCostFit, RecoversTheParametersOfExactTimings) {
  StepCostFit fit(kPrior);
  Rng rng(7);
  for (int i = 0; i < 2000; i++) {
    StepSample s = RandomStep(rng);
    s.seconds = kTruth.Predict(s);
    fit.Add(s);
  }
  const StepCostParams& p = fit.params();
  EXPECT_NEAR(p.per_token, kTruth.per_token, 0.01 * kTruth.per_token);
  EXPECT_NEAR(p.per_pair, kTruth.per_pair, 0.01 * kTruth.per_pair);
  EXPECT_NEAR(p.per_row, kTruth.per_row, 0.03 * kTruth.per_row);
  EXPECT_NEAR(p.step, kTruth.step, 0.03 * kTruth.step);
  EXPECT_LT(fit.rel_rms(), 0.01);
}

TEST(StepCostFit, RecoversAAndBUnderNoise) {
  // 20% multiplicative noise per step (a shared machine) still yields a and b within 10%.
  StepCostFit fit(kPrior, 4, 0.999);
  Rng rng(11);
  for (int i = 0; i < 4000; i++) {
    StepSample s = RandomStep(rng);
    s.seconds = kTruth.Predict(s) * (1 + 0.2 * (2 * rng.UniformDouble() - 1));
    fit.Add(s);
  }
  EXPECT_NEAR(fit.params().per_token, kTruth.per_token, 0.1 * kTruth.per_token);
  EXPECT_NEAR(fit.params().per_pair, kTruth.per_pair, 0.1 * kTruth.per_pair);
  const CostModel c = fit.params().cost();
  // The chunk cost the policy sees: Cost(1024, 32) within 10% of the truth's.
  const double truth = kTruth.cost().Cost(1024, 32);
  EXPECT_NEAR(c.Cost(1024, 32), truth, 0.1 * truth);
  EXPECT_GT(fit.rel_rms(), 0.05);
}

TEST(StepCostFit, FollowsAMachineThatSlowsDown) {
  StepCostFit fit(kPrior);  // forgets with a memory of ~500 steps
  Rng rng(5);
  StepCostParams slow = kTruth;
  slow.per_pair *= 3;
  for (int i = 0; i < 4000; i++) {
    StepSample s = RandomStep(rng);
    s.seconds = (i < 2000 ? kTruth : slow).Predict(s);
    fit.Add(s);
  }
  EXPECT_NEAR(fit.params().per_pair, slow.per_pair, 0.05 * slow.per_pair);
}

TEST(StepCostFit, StaysNonNegative) {
  // Timings that fall with the context (nonsense for a causal model) pin b at 0, not below.
  StepCostFit fit(kPrior);
  Rng rng(9);
  for (int i = 0; i < 500; i++) {
    StepSample s = RandomStep(rng);
    s.seconds = std::max(1e-4, 0.05 - 1e-8 * s.pairs + 1e-6 * s.tokens);
    fit.Add(s);
  }
  EXPECT_GE(fit.params().per_pair, 0);
  EXPECT_GT(fit.params().per_token, 0);
  EXPECT_GE(fit.params().step, 0);
  EXPECT_GE(fit.params().per_row, 0);
}

TEST(StepCostFit, IgnoresEmptyOrInvalidSamples) {
  StepCostFit fit(kPrior);
  fit.Add(StepSample{0, 0, 0, 0.01});
  fit.Add(StepSample{10, 100, 1, -1});
  fit.Add(StepSample{10, 100, 1, std::nan("")});
  EXPECT_EQ(fit.samples(), 0);
  EXPECT_EQ(fit.params().per_token, kPrior.per_token);
}

}  // namespace
}  // namespace mnemo
