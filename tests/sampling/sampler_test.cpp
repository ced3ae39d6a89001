#include "sampling/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <set>
#include <vector>

#include <time.h>

#include "base/rng.h"

namespace mnemo {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<float> RandomLogits(int n, uint64_t seed, double scale = 3.0) {
  Rng rng(seed);
  std::vector<float> l(n);
  for (float& x : l) x = static_cast<float>(rng.Normal() * scale);
  return l;
}

int Argmax(const std::vector<float>& l) {
  int best = 0;
  for (int i = 1; i < static_cast<int>(l.size()); ++i)
    if (l[i] > l[best]) best = i;
  return best;
}

// Scalar reference for the filters: full sort by (logit desc, id asc), then top-k, top-p on the
// normalized top-k distribution, min-p relative to its max. Returns the kept ids, best first.
std::vector<int> RefKept(const std::vector<float>& l, const SamplingParams& p) {
  std::vector<int> order(l.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](int a, int b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
  if (p.top_k > 0 && p.top_k < static_cast<int>(order.size())) order.resize(p.top_k);
  std::vector<double> prob(order.size());
  double z = 0;
  for (size_t i = 0; i < order.size(); ++i) z += prob[i] = std::exp(double(l[order[i]]) - l[order[0]]);
  for (double& x : prob) x /= z;
  size_t keep = order.size();
  if (p.top_p < 1.0f) {
    double cum = 0;
    for (size_t i = 0; i < order.size(); ++i) {
      cum += prob[i];
      if (cum >= p.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  size_t keep_min_p = 0;
  while (keep_min_p < order.size() && prob[keep_min_p] >= p.min_p * prob[0]) ++keep_min_p;
  order.resize(std::min(keep, keep_min_p));
  return order;
}

// Pearson chi-square of observed counts against probabilities `p` (sum 1) over n draws.
double ChiSquare(const std::vector<int>& counts, const std::vector<double>& p, int n) {
  double chi = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const double e = p[i] * n;
    chi += (counts[i] - e) * (counts[i] - e) / e;
  }
  return chi;
}

TEST(SamplingParams, DefaultsAndBoundariesAreValid) {
  SamplingParams p;
  EXPECT_TRUE(p.Validate().ok());
  p.temperature = 0;
  p.top_p = 1;
  p.min_p = 1;
  p.frequency_penalty = -2;
  p.presence_penalty = 2;
  p.penalty_last_n = -1;
  p.top_k = 100000;
  p.repetition_penalty = 1e-3f;
  EXPECT_TRUE(p.Validate().ok()) << p.Validate().error().message;
}

TEST(SamplingParams, ValidateRejectsEachBadValue) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  struct Case {
    const char* field;
    void (*set)(SamplingParams&, float);
    std::vector<float> bad;
  };
  const std::vector<Case> cases = {
      {"temperature", [](SamplingParams& p, float v) { p.temperature = v; }, {-0.1f, nan, kInf}},
      {"top_k", [](SamplingParams& p, float v) { p.top_k = static_cast<int32_t>(v); }, {-1, -40}},
      {"top_p", [](SamplingParams& p, float v) { p.top_p = v; }, {0.0f, -0.5f, 1.0001f, nan}},
      {"min_p", [](SamplingParams& p, float v) { p.min_p = v; }, {-0.01f, 1.01f, nan}},
      {"repetition_penalty", [](SamplingParams& p, float v) { p.repetition_penalty = v; },
       {0.0f, -1.0f, nan, kInf}},
      {"frequency_penalty", [](SamplingParams& p, float v) { p.frequency_penalty = v; },
       {2.01f, -2.01f, nan}},
      {"presence_penalty", [](SamplingParams& p, float v) { p.presence_penalty = v; },
       {2.5f, -3.0f, nan}},
      {"penalty_last_n", [](SamplingParams& p, float v) { p.penalty_last_n = static_cast<int32_t>(v); },
       {-2}},
  };
  for (const Case& c : cases) {
    for (float v : c.bad) {
      SamplingParams p;
      c.set(p, v);
      Status st = p.Validate();
      ASSERT_FALSE(st.ok()) << c.field << " = " << v;
      EXPECT_NE(st.error().message.find(c.field), std::string::npos) << st.error().message;
    }
  }
}

TEST(Sampler, CreateReportsErrors) {
  SamplingParams p;
  p.top_p = 0;
  auto s = Sampler::Create(p, 100);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("top_p"), std::string::npos);
  auto s2 = Sampler::Create(SamplingParams{}, 0);
  ASSERT_FALSE(s2.ok());
  EXPECT_NE(s2.error().message.find("n_vocab"), std::string::npos);
  EXPECT_TRUE(Sampler::Create(SamplingParams{}, 10).ok());
}

TEST(Sampler, GreedyIsArgmaxLowestIdOnTies) {
  SamplingParams p;
  p.temperature = 0;
  p.top_k = 5;  // filters cannot change the argmax
  p.top_p = 0.3f;
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    std::vector<float> l = RandomLogits(1000, seed);
    Sampler s(p, 1000);
    EXPECT_EQ(s.Sample(l, {}), Argmax(l));
  }
  std::vector<float> l(50, 0.0f);
  l[7] = 2.0f;
  l[31] = 2.0f;
  l[3] = 1.0f;
  Sampler s(p, 50);
  EXPECT_EQ(s.Sample(l, {}), 7);
  std::vector<float> flat(50, -1.0f);
  EXPECT_EQ(s.Sample(flat, {}), 0);
}

TEST(Sampler, TopK1IsGreedyAtAnyTemperature) {
  for (float t : {0.1f, 1.0f, 5.0f, 1000.0f}) {
    SamplingParams p;
    p.temperature = t;
    p.top_k = 1;
    p.seed = 99;
    Sampler s(p, 500);
    for (uint64_t seed = 1; seed <= 30; ++seed) {
      std::vector<float> l = RandomLogits(500, seed * 7, 0.5);
      ASSERT_EQ(s.Sample(l, {}), Argmax(l)) << "T=" << t;
    }
  }
}

TEST(Sampler, TopKTiesKeepLowestIds) {
  for (int k : {3, 700}) {  // heap path and nth_element path
    SamplingParams p;
    p.top_k = k;
    p.seed = 5;
    Sampler s(p, 1000);
    std::vector<float> l(1000, 0.5f);
    for (int i = 0; i < 3000; ++i) ASSERT_LT(s.Sample(l, {}), k);
  }
}

// The empirical distribution matches softmax(logits / T). Seeds are fixed, so this is not flaky;
// the same draws against the T = 1 distribution must fail, which shows the test has power.
TEST(Sampler, EmpiricalDistributionMatchesSoftmaxOverTemperature) {
  const std::vector<float> l = {1.0f, 2.0f, 0.5f, -1.0f, 3.0f, 2.5f, 0.0f, 1.5f};
  const float t = 0.7f;
  SamplingParams p;
  p.temperature = t;
  p.seed = 1234;
  Sampler s(p, static_cast<int>(l.size()));
  const int n = 200000;
  std::vector<int> counts(l.size(), 0);
  for (int i = 0; i < n; ++i) ++counts[s.Sample(l, {})];

  auto softmax = [&](double temp) {
    std::vector<double> q(l.size());
    double z = 0;
    for (size_t i = 0; i < l.size(); ++i) z += q[i] = std::exp(l[i] / temp);
    for (double& x : q) x /= z;
    return q;
  };
  // 7 degrees of freedom: P(chi2 > 29) is about 1.4e-4.
  const double chi = ChiSquare(counts, softmax(t), n);
  EXPECT_LT(chi, 29.0);
  EXPECT_GT(ChiSquare(counts, softmax(1.0), n), 1000.0);
}

// All filters together on a larger vocabulary: no token outside the reference set is ever drawn,
// and the draws follow softmax(logits / T) renormalized over that set.
TEST(Sampler, CombinedFiltersMatchReference) {
  const int n_vocab = 2000;
  std::vector<float> l = RandomLogits(n_vocab, 77, 2.0);
  SamplingParams p;
  p.top_k = 40;
  p.top_p = 0.9f;
  p.min_p = 0.02f;
  p.temperature = 1.3f;
  p.seed = 4321;
  std::vector<int> kept = RefKept(l, p);
  ASSERT_GT(kept.size(), 5u);
  ASSERT_LT(kept.size(), 40u);
  std::vector<int> slot(n_vocab, -1);
  for (size_t i = 0; i < kept.size(); ++i) slot[kept[i]] = static_cast<int>(i);
  std::vector<double> q(kept.size());
  double z = 0;
  for (size_t i = 0; i < kept.size(); ++i) z += q[i] = std::exp((l[kept[i]] - l[kept[0]]) / p.temperature);
  for (double& x : q) x /= z;

  Sampler s(p, n_vocab);
  const int n = 40000;
  std::vector<int> counts(kept.size(), 0);
  for (int i = 0; i < n; ++i) {
    const int tok = s.Sample(l, {});
    ASSERT_GE(slot[tok], 0) << "token " << tok << " is outside the kept set";
    ++counts[slot[tok]];
  }
  // df = kept - 1 (about 15-30); the bound is far in the tail for those.
  EXPECT_LT(ChiSquare(counts, q, n), 3.0 * kept.size() + 20) << "kept " << kept.size();
}

// Checks that the set of drawn tokens equals the reference kept set exactly. A huge temperature
// makes the draw nearly uniform over the kept set, so every kept token shows up.
void ExpectKeptSetIs(const std::vector<float>& l, SamplingParams p, int draws) {
  const std::vector<int> kept = RefKept(l, p);
  p.temperature = 1e6f;
  Sampler s(p, static_cast<int>(l.size()));
  std::set<int> seen;
  for (int i = 0; i < draws; ++i) seen.insert(s.Sample(l, {}));
  EXPECT_EQ(seen, std::set<int>(kept.begin(), kept.end()))
      << "top_k " << p.top_k << " top_p " << p.top_p << " min_p " << p.min_p;
}

TEST(Sampler, TopPKeepsSmallestPrefixWithEnoughMass) {
  // Probabilities 0.4, 0.3, 0.2, 0.1 at shuffled ids.
  const std::vector<float> l = {std::log(0.2f), std::log(0.4f), std::log(0.1f), std::log(0.3f)};
  SamplingParams p;
  p.top_p = 0.35f;
  EXPECT_EQ(RefKept(l, p), (std::vector<int>{1}));
  ExpectKeptSetIs(l, p, 500);
  p.top_p = 0.65f;
  EXPECT_EQ(RefKept(l, p), (std::vector<int>{1, 3}));
  ExpectKeptSetIs(l, p, 500);
  p.top_p = 0.75f;
  EXPECT_EQ(RefKept(l, p), (std::vector<int>{1, 3, 0}));
  ExpectKeptSetIs(l, p, 500);
  p.top_p = 0.95f;
  ExpectKeptSetIs(l, p, 500);

  // Large vocabulary, flat-ish logits: the prefix spans several lazy-sort chunks (64, 256, ...).
  const std::vector<float> big = RandomLogits(5000, 3, 0.5);
  for (float top_p : {0.01f, 0.05f, 0.2f}) {
    p.top_p = top_p;
    const size_t k = RefKept(big, p).size();
    ASSERT_GT(k, 10u);
    ExpectKeptSetIs(big, p, static_cast<int>(k) * 15);
  }
}

TEST(Sampler, MinPKeepsTokensAboveThreshold) {
  // p_max = 0.5; min_p 0.3 keeps p >= 0.15.
  const std::vector<float> l = {std::log(0.1f), std::log(0.5f), std::log(0.16f), std::log(0.14f),
                                std::log(0.1f)};
  SamplingParams p;
  p.min_p = 0.3f;
  EXPECT_EQ(RefKept(l, p), (std::vector<int>{1, 2}));
  ExpectKeptSetIs(l, p, 500);
  p.min_p = 1.0f;
  ExpectKeptSetIs(l, p, 100);
  const std::vector<float> big = RandomLogits(6000, 11, 1.0);
  p.min_p = 0.2f;
  p.top_k = 1000;  // bucket path
  ASSERT_GT(RefKept(big, p).size(), 30u);
  ExpectKeptSetIs(big, p, 3000);
  p.top_k = 300;  // heap path, with top-p
  p.top_p = 0.5f;
  ExpectKeptSetIs(big, p, 3000);
}

// Large k goes through the bucket histogram rather than the heap, also with masked tokens
// (-inf, or a huge negative mask value that must not squash the real logits into one bucket).
TEST(Sampler, LargeTopKAndTopPOnLargeSets) {
  std::vector<float> l = RandomLogits(3000, 5, 1.0);
  SamplingParams p;
  p.top_k = 700;
  ExpectKeptSetIs(l, p, 700 * 12);
  p.top_k = 1500;  // then top-p over an explicit set too big to sort outright
  p.top_p = 0.6f;
  ASSERT_GT(RefKept(l, p).size(), 300u);
  ExpectKeptSetIs(l, p, static_cast<int>(RefKept(l, p).size()) * 12);
  Rng rng(9);
  for (float mask : {-1e30f, -kInf}) {
    std::vector<float> masked = l;
    for (int i = 0; i < 2000; ++i) masked[rng.Next() % masked.size()] = mask;
    SamplingParams q;
    q.top_k = 600;  // fewer than the ~1100 unmasked tokens
    ExpectKeptSetIs(masked, q, 600 * 12);
  }
}

TEST(Sampler, PenaltiesChangeExactlyTheRightLogits) {
  const std::vector<float> l = {2.0f, -1.0f, 0.5f, 3.0f, -2.0f, 1.0f, 0.0f, 4.0f};
  // Token 7 only occurs before the window of 6; 2 occurs 3 times, 4 twice, 6 and 5 once.
  // -1 and 99 are out of range and ignored.
  const std::vector<int32_t> history = {7, 7, 2, 4, 2, 6, 2, 4, -1, 99, 5};
  SamplingParams p;
  p.repetition_penalty = 1.5f;
  p.frequency_penalty = 0.25f;
  p.presence_penalty = 0.5f;
  p.penalty_last_n = 9;
  Sampler s(p, static_cast<int>(l.size()));
  const std::span<const float> got_span = s.PenalizedLogits(l, history);
  std::vector<float> got(got_span.begin(), got_span.end());
  auto pen = [&](float x, int count) {
    x = x > 0 ? x / 1.5f : x * 1.5f;
    return x - count * 0.25f - 0.5f;
  };
  const std::vector<float> want = {2.0f, -1.0f, pen(0.5f, 3), 3.0f, pen(-2.0f, 2), pen(1.0f, 1),
                                   pen(0.0f, 1), 4.0f};
  for (size_t i = 0; i < l.size(); ++i) EXPECT_FLOAT_EQ(got[i], want[i]) << "token " << i;

  // The scratch counts are cleared between calls: the same call gives the same result.
  const std::span<const float> again_span = s.PenalizedLogits(l, history);
  std::vector<float> again(again_span.begin(), again_span.end());
  EXPECT_EQ(again, got);

  // Window -1 takes the whole history (token 7 twice); window 0 turns penalties off.
  p.penalty_last_n = -1;
  Sampler all(p, static_cast<int>(l.size()));
  EXPECT_FLOAT_EQ(all.PenalizedLogits(l, history)[7], pen(4.0f, 2));
  p.penalty_last_n = 0;
  Sampler none(p, static_cast<int>(l.size()));
  const std::span<const float> off_span = none.PenalizedLogits(l, history);
  std::vector<float> off(off_span.begin(), off_span.end());
  EXPECT_EQ(off, l);

  // Greedy sees the penalties: 7 is the argmax until it is penalized.
  SamplingParams g;
  g.temperature = 0;
  g.presence_penalty = 2.0f;
  Sampler greedy(g, static_cast<int>(l.size()));
  EXPECT_EQ(greedy.Sample(l, {}), 7);
  EXPECT_EQ(greedy.Sample(l, std::vector<int32_t>{7}), 3);
}

TEST(Sampler, SameSeedSameTokensDifferentSeedDifferent) {
  const int n_vocab = 5000;
  auto run = [&](uint64_t seed) {
    SamplingParams p;
    p.seed = seed;
    p.temperature = 0.9f;
    p.top_p = 0.95f;
    p.repetition_penalty = 1.1f;
    Sampler s(p, n_vocab);
    std::vector<int32_t> tokens;
    for (int step = 0; step < 200; ++step) {
      std::vector<float> l = RandomLogits(n_vocab, 1000 + step, 1.0);
      tokens.push_back(s.Sample(l, tokens));
    }
    return tokens;
  };
  const auto a = run(42);
  EXPECT_EQ(a, run(42));
  EXPECT_NE(a, run(43));
}

TEST(Sampler, NonFiniteLogits) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> l = {nan, 1.0f, nan, 0.5f, -kInf};
  SamplingParams p;
  p.seed = 3;
  Sampler s(p, 5);
  for (int i = 0; i < 2000; ++i) {
    const int t = s.Sample(l, {});
    ASSERT_TRUE(t == 1 || t == 3) << t;
  }
  l[4] = kInf;  // +inf takes all the mass
  for (int i = 0; i < 100; ++i) ASSERT_EQ(s.Sample(l, {}), 4);
  std::vector<float> masked(5, -kInf);  // every token masked: fall back to the lowest id
  EXPECT_EQ(s.Sample(masked, {}), 0);
  p.temperature = 1e-30f;  // tiny but non-zero: still the argmax, no NaN
  Sampler cold(p, 5);
  l[4] = -kInf;
  EXPECT_EQ(cold.Sample(l, {}), 1);
}

TEST(LogSoftmax, MatchesScalarReference) {
  const std::vector<float> l = RandomLogits(1000, 8, 5.0);
  const std::vector<float> ls = LogSoftmax(l);
  double z = 0;
  for (float x : l) z += std::exp(double(x));
  for (size_t i = 0; i < l.size(); ++i) EXPECT_NEAR(ls[i], l[i] - std::log(z), 1e-4);
  std::vector<float> pr(l.size());
  Softmax(l, pr);
  double sum = 0;
  for (size_t i = 0; i < l.size(); ++i) {
    sum += pr[i];
    EXPECT_NEAR(pr[i], std::exp(ls[i]), 1e-6);
  }
  EXPECT_NEAR(sum, 1.0, 1e-5);
  // Shift invariance at large magnitudes (no overflow).
  std::vector<float> shifted(l);
  for (float& x : shifted) x += 1e4f;
  const std::vector<float> ls2 = LogSoftmax(shifted);
  for (size_t i = 0; i < l.size(); ++i) EXPECT_NEAR(ls2[i], ls[i], 2e-2);
}

TEST(ScanLogprobs, MatchesLogSoftmaxAndRanksTheTop) {
  std::vector<float> l = RandomLogits(1000, 9, 4.0);
  l[17] = l[18] = 30.0f;  // a tie at the top: the lower id first
  const std::vector<float> ls = LogSoftmax(l);
  LogprobScan scan;
  ScanLogprobs(l, 5, &scan);
  for (int32_t id : {0, 17, 500, 999}) {
    const PositionLogprobs p = scan.For(id, l[id]);
    EXPECT_EQ(p.chosen.id, id);
    EXPECT_NEAR(p.chosen.logprob, ls[id], 1e-4);
  }
  std::vector<int32_t> order(l.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return l[a] > l[b]; });
  ASSERT_EQ(scan.top.size(), 5u);
  EXPECT_EQ(scan.top[0].id, 17);
  EXPECT_EQ(scan.top[1].id, 18);
  for (size_t k = 0; k < 5; ++k) {
    EXPECT_EQ(scan.top[k].id, order[k]);
    EXPECT_NEAR(scan.top[k].logprob, ls[order[k]], 1e-4);
  }
  // More than 20 alternatives are clamped; none asked gives none; reuse clears the last row's.
  ScanLogprobs(l, 50, &scan);
  EXPECT_EQ(scan.top.size(), size_t(kMaxTopLogprobs));
  ScanLogprobs(l, 0, &scan);
  EXPECT_TRUE(scan.top.empty());
  // NaN counts as -inf, +inf as the largest float; a row of nothing but -inf gives -inf.
  std::vector<float> odd = {0.0f, std::nanf(""), kInf, -kInf};
  ScanLogprobs(odd, 4, &scan);
  EXPECT_NEAR(scan.For(2, odd[2]).chosen.logprob, 0.0f, 1e-6);
  EXPECT_EQ(scan.For(1, odd[1]).chosen.logprob, -kInf);
  EXPECT_EQ(scan.top[0].id, 2);
  // Without +inf (the fast path): a NaN is never among the top and weighs nothing.
  std::vector<float> nan_row = {0.0f, std::nanf(""), 1.0f};
  ScanLogprobs(nan_row, 3, &scan);
  ASSERT_EQ(scan.top.size(), 2u);
  EXPECT_EQ(scan.top[0].id, 2);
  EXPECT_NEAR(scan.top[0].logprob, 1.0 - std::log(1.0 + std::exp(1.0)), 1e-6);
  EXPECT_EQ(scan.For(1, nan_row[1]).chosen.logprob, -kInf);
  std::vector<float> none = {-kInf, -kInf};
  ScanLogprobs(none, 2, &scan);
  EXPECT_EQ(scan.For(0, none[0]).chosen.logprob, -kInf);
  EXPECT_TRUE(scan.top.empty());
}

// Per-call cost at a Llama-3-sized vocabulary. Prints figures; the bound only catches a blowup
// (for example a full sort per call), not noise on a shared machine.
static double ThreadCpuMicros() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return 1e6 * double(ts.tv_sec) + 1e-3 * double(ts.tv_nsec);
}

TEST(Sampler, LargeVocabCost) {
  const int n_vocab = 128256;
  const std::vector<float> l = RandomLogits(n_vocab, 21, 2.5);
  std::vector<int32_t> history(64);
  for (int i = 0; i < 64; ++i) history[i] = (i * 7919) % n_vocab;
  struct Config {
    const char* name;
    SamplingParams p;
  };
  std::vector<Config> configs(5);
  configs[0].name = "greedy";
  configs[0].p.temperature = 0;
  configs[1].name = "T=0.8 top_k=40 top_p=0.95 rep=1.1";
  configs[1].p.temperature = 0.8f;
  configs[1].p.top_k = 40;
  configs[1].p.top_p = 0.95f;
  configs[1].p.repetition_penalty = 1.1f;
  configs[2].name = "T=1 (no filters)";
  configs[3].name = "T=0.7 top_p=0.9";
  configs[3].p.temperature = 0.7f;
  configs[3].p.top_p = 0.9f;
  configs[4].name = "T=1 min_p=0.05";
  configs[4].p.min_p = 0.05f;
  for (const Config& c : configs) {
    Sampler s(c.p, n_vocab);
    s.Sample(l, history);  // warm up
    const int iters = 30;
    // The thread's CPU time, not the wall clock: a guard against a blow-up (a sort or a scan per
    // candidate), not a benchmark, so a busy machine must not fail it (96 ms wall at load 11).
    const double t0 = ThreadCpuMicros();
    for (int i = 0; i < iters; ++i) s.Sample(l, history);
    const double us = (ThreadCpuMicros() - t0) / iters;
    std::printf("  Sample, n_vocab %d, %-36s %8.1f us/call\n", n_vocab, c.name, us);
    EXPECT_LT(us, 50000.0) << c.name;
  }
}

TEST(Sampler, MaskKeepsDrawsAmongAllowedTokens) {
  const int n_vocab = 200;
  std::vector<float> l(n_vocab);
  for (int i = 0; i < n_vocab; ++i) l[i] = static_cast<float>(i % 17) * 0.3f;
  std::vector<uint64_t> allowed((n_vocab + 63) / 64, 0);
  for (int i : {3, 64, 65, 130, 199}) allowed[i >> 6] |= uint64_t{1} << (i & 63);
  for (float t : {0.0f, 0.8f, 1.5f}) {
    SamplingParams p;
    p.temperature = t;
    p.top_k = 2;  // applies among the allowed tokens
    p.seed = 5;
    Sampler s(p, n_vocab);
    std::set<int> seen;
    for (int i = 0; i < 500; ++i) seen.insert(s.Sample(l, {}, allowed));
    for (int id : seen) EXPECT_TRUE((allowed[id >> 6] >> (id & 63)) & 1) << id;
    EXPECT_EQ(seen.size(), t == 0.0f ? 1u : 2u);
  }
  // Every allowed logit -inf: the lowest allowed id, never a refused one.
  std::vector<float> dead(n_vocab, 1.0f);
  for (int i : {3, 64, 65, 130, 199}) dead[i] = -std::numeric_limits<float>::infinity();
  Sampler s(SamplingParams{}, n_vocab);
  EXPECT_EQ(s.Sample(dead, {}, allowed), 3);
}

// A mask keeping few tokens is sampled over those alone, a larger one over the whole row: both
// must draw from softmax(penalized logits / T) over the filters' kept set among the allowed
// tokens, with biases and penalties applied as the whole pass applies them.
TEST(Sampler, SparseAndDenseMasksDrawTheSameDistribution) {
  const int n_vocab = 2000;
  const std::vector<float> l = RandomLogits(n_vocab, 91, 2.0);
  std::vector<int32_t> history;
  for (int i = 0; i < 30; ++i) history.push_back((i * 37) % n_vocab);
  for (const int step : {97, 3}) {  // ~20 allowed tokens (sparse), ~670 (dense)
    std::vector<uint64_t> allowed((n_vocab + 63) / 64, 0);
    for (int i = 0; i < n_vocab; i += step) allowed[i >> 6] |= uint64_t{1} << (i & 63);
    std::vector<SamplingParams> configs(5);
    configs[0].temperature = 0;
    configs[1].temperature = 1.2f;
    configs[2].top_k = 5;
    configs[2].repetition_penalty = 1.3f;
    configs[3].top_p = 0.8f;
    configs[3].frequency_penalty = 0.5f;
    configs[3].logit_bias = {{0, 3.0f}, {97, -2.0f}, {1, 50.0f}};  // 1 is refused: no effect
    configs[4].min_p = 0.1f;
    configs[4].temperature = 0.7f;
    for (SamplingParams p : configs) {
      p.seed = 17;
      // The reference: the whole pass's logits (refused tokens -inf), the filters' kept set.
      Sampler ref(p, n_vocab);
      const auto pl = ref.PenalizedLogits(l, history, allowed);
      std::vector<float> w(pl.begin(), pl.end());
      std::vector<int> kept;
      for (int id : RefKept(w, p)) {
        if (w[id] != -kInf) kept.push_back(id);
      }
      ASSERT_FALSE(kept.empty());
      Sampler s(p, n_vocab);
      if (p.temperature == 0) {
        EXPECT_EQ(s.Sample(l, history, allowed), kept[0]) << "step " << step;
        continue;
      }
      std::vector<int> slot(n_vocab, -1);
      for (size_t i = 0; i < kept.size(); ++i) slot[kept[i]] = static_cast<int>(i);
      std::vector<double> q(kept.size());
      double z = 0;
      for (size_t i = 0; i < kept.size(); ++i) z += q[i] = std::exp((w[kept[i]] - w[kept[0]]) / p.temperature);
      for (double& x : q) x /= z;
      const int n = 20000;
      std::vector<int> counts(kept.size(), 0);
      for (int i = 0; i < n; ++i) {
        const int tok = s.Sample(l, history, allowed);
        ASSERT_GE(slot[tok], 0) << "token " << tok << " outside the kept set, step " << step;
        ++counts[slot[tok]];
      }
      if (kept.size() > 1) {
        EXPECT_LT(ChiSquare(counts, q, n), 3.0 * kept.size() + 20) << "step " << step << " kept " << kept.size();
      }
    }
  }
}

}  // namespace
}  // namespace mnemo
