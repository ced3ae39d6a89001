#include "context/selection.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "fixtures.h"

namespace mnemo::context {
namespace {

using testing::Conversation;
using testing::EmbeddingTable;
using testing::RandomTokens;
using testing::RandomTurns;

constexpr SelectionMethod kAllMethods[] = {SelectionMethod::kScore, SelectionMethod::kRelevance,
                                           SelectionMethod::kRecency, SelectionMethod::kRecentOnly,
                                           SelectionMethod::kRandom};

std::vector<TurnSpan> Sizes(const std::vector<int>& sizes, const std::set<int>& pinned = {}) {
  std::vector<TurnSpan> t;
  int pos = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    t.push_back({pos, pos + sizes[i], pinned.count(static_cast<int>(i)) > 0});
    pos += sizes[i];
  }
  return t;
}

std::vector<TurnScore> Totals(const std::vector<double>& totals) {
  std::vector<TurnScore> s(totals.size());
  for (size_t i = 0; i < totals.size(); ++i) s[i].total = s[i].relevance = totals[i];
  return s;
}

// The cases below were written for ConvKV's preset of two newest turns kept (the default is 1).
SelectionOptions KeepLast2() {
  SelectionOptions o;
  o.keep_last = 2;
  return o;
}

Selection MustSelect(std::span<const TurnSpan> turns, std::span<const TurnScore> scores, int budget,
                     const SelectionOptions& o) {
  auto r = SelectTurns(turns, scores, budget, o);
  EXPECT_TRUE(r.ok()) << r.error().message;
  return r.ok() ? *r : Selection{};
}

TEST(ContextBudget, ResolvesAbsoluteCountsAndFractions) {
  EXPECT_EQ(*ResolveBudget(1, 1000), 1);  // 1 is one token, not 100%
  EXPECT_EQ(*ResolveBudget(500, 1000), 500);
  EXPECT_EQ(*ResolveBudget(5000, 1000), 5000);  // larger than the history: keeps everything
  EXPECT_EQ(*ResolveBudget(750.9, 1000), 750);
  EXPECT_EQ(*ResolveBudget(0.5, 1000), 500);
  EXPECT_EQ(*ResolveBudget(0.3333, 1000), 333);
  EXPECT_EQ(*ResolveBudget(0.999, 10), 9);
  EXPECT_EQ(*ResolveBudget(0.01, 10), 0);
  EXPECT_FALSE(ResolveBudget(0, 1000).ok());
  EXPECT_FALSE(ResolveBudget(-3, 1000).ok());
  EXPECT_FALSE(ResolveBudget(std::nan(""), 1000).ok());
  EXPECT_FALSE(ResolveBudget(std::numeric_limits<double>::infinity(), 1000).ok());
  EXPECT_FALSE(ResolveBudget(1e12, 1000).ok());
  EXPECT_FALSE(ResolveBudget(0.5, -1).ok());
}

TEST(ContextSelection, MethodNamesRoundTrip) {
  for (SelectionMethod m : kAllMethods) {
    auto p = ParseSelectionMethod(SelectionMethodName(m));
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(*p, m);
  }
  EXPECT_EQ(SelectionMethodName(SelectionMethod::kRecentOnly), "recent-only");
  EXPECT_FALSE(ParseSelectionMethod("convkv").ok());
}

TEST(ContextSelection, KeepsSystemLastKAndPinnedThenBestScoresThatFit) {
  //                      0   1   2   3   4   5   6   7
  const auto turns = Sizes({8, 10, 10, 10, 10, 10, 10, 10}, {2});
  const auto scores = Totals({0, 0.9, 0.1, 0.8, 0.2, 0.7, 0.0, 0.0});
  SelectionOptions o;  // score
  o.keep_last = 2;
  Selection s = MustSelect(turns, scores, 8 + 10 + 20 + 20, o);  // system, pin, last 2, 2 more
  EXPECT_EQ(s.kept, (std::vector<int>{0, 1, 2, 3, 6, 7}));
  EXPECT_EQ(s.dropped, (std::vector<int>{4, 5}));
  EXPECT_EQ(s.kept_tokens, 58);
  EXPECT_EQ(s.dropped_tokens, 20);
  EXPECT_EQ(s.mandatory_tokens, 38);
  EXPECT_EQ(s.overflow_tokens, 0);
  EXPECT_EQ(s.budget_tokens, 58);

  o.keep_last = 0;
  s = MustSelect(turns, scores, 8 + 10 + 30, o);
  EXPECT_EQ(s.kept, (std::vector<int>{0, 1, 2, 3, 5}));
  o.keep_last = 100;  // more than there are turns: everything is mandatory
  s = MustSelect(turns, scores, 1000, o);
  EXPECT_TRUE(s.dropped.empty());
}

TEST(ContextSelection, FirstFitSkipsATurnTooLargeAndTriesTheNext) {
  const auto turns = Sizes({5, 40, 10, 10, 10});
  const auto scores = Totals({0, 0.9, 0.5, 0.0, 0.0});
  Selection s = MustSelect(turns, scores, 5 + 20 + 15, KeepLast2());
  EXPECT_EQ(s.kept, (std::vector<int>{0, 2, 3, 4}));  // 1 (best) does not fit, 2 does
}

TEST(ContextSelection, TiesGoToTheNewerTurnDeterministically) {
  const auto turns = Sizes({4, 10, 10, 10, 10, 10, 10});
  const auto scores = Totals({0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5});
  for (SelectionMethod m : {SelectionMethod::kScore, SelectionMethod::kRelevance}) {
    SelectionOptions o = KeepLast2();
    o.method = m;
    for (int rep = 0; rep < 3; ++rep) {
      Selection s = MustSelect(turns, scores, 4 + 20 + 20, o);
      EXPECT_EQ(s.kept, (std::vector<int>{0, 3, 4, 5, 6})) << SelectionMethodName(m);
    }
  }
}

TEST(ContextSelection, BudgetBelowTheMandatorySetKeepsItAndReportsTheOverflow) {
  const auto turns = Sizes({20, 10, 10, 30, 40}, {1});
  const auto scores = Totals({0, 1, 1, 1, 1});
  for (SelectionMethod m : kAllMethods) {
    SelectionOptions o = KeepLast2();
    o.method = m;
    Selection s = MustSelect(turns, scores, 50, o);
    EXPECT_EQ(s.kept, (std::vector<int>{0, 1, 3, 4})) << SelectionMethodName(m);
    EXPECT_EQ(s.dropped, (std::vector<int>{2}));
    EXPECT_EQ(s.mandatory_tokens, 100);
    EXPECT_EQ(s.kept_tokens, 100);
    EXPECT_EQ(s.overflow_tokens, 50);
    o.strict = true;
    auto r = SelectTurns(turns, scores, 50, o);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message.find("cannot hold"), std::string::npos) << r.error().message;
    // Exactly the mandatory size is not degenerate.
    Selection fit = MustSelect(turns, scores, 100, o);
    EXPECT_EQ(fit.overflow_tokens, 0);
    EXPECT_EQ(fit.kept_tokens, 100);
  }
  Selection zero = MustSelect(turns, scores, 0, KeepLast2());
  EXPECT_EQ(zero.overflow_tokens, 100);
}

TEST(ContextSelection, RejectsBadInput) {
  const auto turns = Sizes({5, 10, 10});
  const auto scores = Totals({0, 1, 1});
  EXPECT_FALSE(SelectTurns(turns, scores, -1, {}).ok());
  SelectionOptions o;
  o.keep_last = -1;
  EXPECT_FALSE(SelectTurns(turns, scores, 10, o).ok());
  EXPECT_FALSE(SelectTurns(turns, Totals({0, 1}), 10, {}).ok());  // scores missing
  EXPECT_FALSE(SelectTurns(turns, Totals({0, std::nan(""), 1}), 10, {}).ok());
  EXPECT_FALSE(SelectTurns({}, {}, 10, {}).ok());
  std::vector<TurnSpan> gap = {{0, 5}, {6, 9}};
  EXPECT_FALSE(SelectTurns(gap, Totals({0, 1}), 10, {}).ok());
  o = {};
  o.method = SelectionMethod::kRecency;  // needs no scores
  EXPECT_TRUE(SelectTurns(turns, {}, 10, o).ok());
}

TEST(ContextSelection, RecencyFillsNewestFirstAndRecentOnlyTruncates) {
  //                      0   1   2   3   4   5   6
  const auto turns = Sizes({5, 10, 10, 50, 10, 10, 10});
  SelectionOptions o;
  o.method = SelectionMethod::kRecency;
  Selection rec = MustSelect(turns, {}, 25 + 20, o);
  EXPECT_EQ(rec.kept, (std::vector<int>{0, 2, 4, 5, 6}));  // 3 skipped, 2 still fits
  o.method = SelectionMethod::kRecentOnly;
  Selection trunc = MustSelect(turns, {}, 25 + 20, o);
  EXPECT_EQ(trunc.kept, (std::vector<int>{0, 4, 5, 6}));  // stops at 3: a contiguous suffix
  Selection all = MustSelect(turns, {}, 1000, o);
  EXPECT_TRUE(all.dropped.empty());
}

TEST(ContextSelection, RandomIsSeededAndCoversTheCandidates) {
  const auto turns = Sizes({5, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10});
  SelectionOptions o;
  o.method = SelectionMethod::kRandom;
  o.keep_last = 1;
  std::vector<int> kept_count(turns.size(), 0);
  std::set<std::vector<int>> distinct;
  for (uint64_t seed = 0; seed < 400; ++seed) {
    o.seed = seed;
    Selection a = MustSelect(turns, {}, 5 + 10 + 30, o);
    Selection b = MustSelect(turns, {}, 5 + 10 + 30, o);
    EXPECT_EQ(a.kept, b.kept);  // same seed, same selection
    EXPECT_EQ(a.kept.size(), 5u);
    distinct.insert(a.kept);
    for (int i : a.kept) kept_count[i]++;
  }
  EXPECT_GT(distinct.size(), 50u);
  // Each of the 9 candidates is kept with probability 3/9: 400/3 = 133 expected.
  for (int i = 1; i < 10; ++i) {
    EXPECT_GT(kept_count[i], 90) << i;
    EXPECT_LT(kept_count[i], 180) << i;
  }
}

// Ranking key for the methods with a known order: larger first.
using Rank = std::function<bool(int, int)>;

// Checks what every selection must satisfy, and that first-fit filling follows `rank` when given.
void CheckSelection(const std::vector<TurnSpan>& turns, const std::vector<TurnScore>& scores,
                    int budget, const SelectionOptions& o, const Selection& s, const Rank& rank) {
  const int n = static_cast<int>(turns.size());
  std::vector<int> all;
  std::merge(s.kept.begin(), s.kept.end(), s.dropped.begin(), s.dropped.end(),
             std::back_inserter(all));
  ASSERT_EQ(static_cast<int>(all.size()), n);
  for (int i = 0; i < n; ++i) ASSERT_EQ(all[i], i);  // a partition, both sorted
  ASSERT_TRUE(std::is_sorted(s.kept.begin(), s.kept.end()));
  std::vector<char> kept(n, 0), mandatory(n, 0);
  int kept_tokens = 0, mandatory_tokens = 0;
  for (int i : s.kept) {
    kept[i] = 1;
    kept_tokens += turns[i].size();
  }
  for (int i = 0; i < n; ++i) {
    mandatory[i] = i == 0 || i >= n - o.keep_last || turns[i].pinned;
    if (mandatory[i]) {
      mandatory_tokens += turns[i].size();
      ASSERT_TRUE(kept[i]) << "mandatory turn " << i << " dropped";
    }
  }
  ASSERT_EQ(s.kept_tokens, kept_tokens);
  ASSERT_EQ(s.kept_tokens + s.dropped_tokens, TotalTokens(turns));
  ASSERT_EQ(s.mandatory_tokens, mandatory_tokens);
  if (mandatory_tokens > budget) {
    ASSERT_EQ(s.kept_tokens, mandatory_tokens);  // exactly the mandatory set
    ASSERT_EQ(s.overflow_tokens, mandatory_tokens - budget);
    return;
  }
  ASSERT_LE(s.kept_tokens, budget) << "over budget";
  ASSERT_EQ(s.overflow_tokens, 0);
  const int left = budget - kept_tokens;
  std::vector<int> cand;
  for (int i = 0; i < n; ++i) {
    if (!mandatory[i]) cand.push_back(i);
  }
  if (o.method == SelectionMethod::kRecentOnly) {
    // Kept candidates are the newest ones; the newest dropped one did not fit.
    int newest_dropped = -1;
    for (int i : cand) {
      if (!kept[i]) newest_dropped = i;
    }
    for (int i : cand) {
      if (i < newest_dropped) {
        ASSERT_FALSE(kept[i]) << "recent-only kept " << i;
      }
    }
    if (newest_dropped >= 0) {
      int used_newer = 0;
      for (int i : cand) {
        if (i > newest_dropped) used_newer += turns[i].size();
      }
      ASSERT_GT(turns[newest_dropped].size(), budget - mandatory_tokens - used_newer);
    }
    return;
  }
  for (int i : cand) {  // first fit: nothing dropped would still fit
    if (!kept[i]) {
      ASSERT_GT(turns[i].size(), left) << "turn " << i << " would fit";
    }
  }
  if (!rank) return;
  // Exact first-fit order: a candidate was kept iff it fit in what the higher-ranked kept ones
  // left.
  for (int i : cand) {
    int before = 0;
    for (int j : cand) {
      if (j != i && kept[j] && rank(j, i)) before += turns[j].size();
    }
    const bool fits = turns[i].size() <= budget - mandatory_tokens - before;
    ASSERT_EQ(static_cast<bool>(kept[i]), fits) << "turn " << i;
  }
}

TEST(ContextSelection, PropertyNeverOverBudgetKeepsMandatoryAndFollowsTheRanking) {
  Rng rng(2024);
  int degenerate = 0, partial = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const int n = 1 + static_cast<int>(rng.Next() % 30);
    const auto turns = RandomTurns(rng, n, trial % 3 == 0 ? 5 : 120);
    std::vector<TurnScore> scores(n);
    for (TurnScore& s : scores) {
      // Coarse values make ties common.
      s.total = std::floor(rng.Uniform() * 5) / 4;
      s.relevance = rng.Uniform();
    }
    const int total = TotalTokens(turns);
    const int budget = static_cast<int>(rng.Next() % static_cast<uint64_t>(total + 20));
    SelectionOptions o;
    o.keep_last = static_cast<int>(rng.Next() % 5);
    o.seed = rng.Next();
    for (SelectionMethod m : kAllMethods) {
      o.method = m;
      auto r = SelectTurns(turns, scores, budget, o);
      ASSERT_TRUE(r.ok()) << r.error().message;
      Rank rank;
      if (m == SelectionMethod::kScore) {
        rank = [&](int a, int b) {
          return scores[a].total != scores[b].total ? scores[a].total > scores[b].total : a > b;
        };
      } else if (m == SelectionMethod::kRelevance) {
        rank = [&](int a, int b) {
          return scores[a].relevance != scores[b].relevance
                     ? scores[a].relevance > scores[b].relevance
                     : a > b;
        };
      } else if (m == SelectionMethod::kRecency) {
        rank = [](int a, int b) { return a > b; };
      }
      CheckSelection(turns, scores, budget, o, *r, rank);
      if (HasFatalFailure()) {
        FAIL() << "trial " << trial << " method " << SelectionMethodName(m) << " budget " << budget;
      }
      if (m == SelectionMethod::kScore) {
        degenerate += r->overflow_tokens > 0;
        partial += r->overflow_tokens == 0 && !r->dropped.empty();
      }
      // Deterministic: the same call gives the same answer.
      auto again = SelectTurns(turns, scores, budget, o);
      ASSERT_EQ(again->kept, r->kept);
    }
  }
  // The generator exercises both regimes.
  EXPECT_GT(degenerate, 100);
  EXPECT_GT(partial, 1000);
}

// A conversation over three topics (disjoint vocabularies of 20 tokens) sharing chat-template
// tokens; the new question returns to topic A, last discussed in turns 1 and 4. With random
// embedding rows, similarity comes from shared tokens only (a real table adds semantic neighbours).
TEST(ContextSelection, ScoreAndRelevanceKeepTheTurnsTheQuestionIsAbout) {
  EmbeddingTable table(1000, 256, 77);
  Rng rng(99);
  const std::vector<int32_t> templ = {1, 2, 3};  // chat markers in every turn
  auto topic_tokens = [&](int topic, int n) {
    std::vector<int32_t> t = templ;
    auto words = RandomTokens(rng, n, 100 + 300 * topic, 100 + 300 * topic + 20);
    t.insert(t.end(), words.begin(), words.end());
    return t;
  };
  Conversation c;
  c.Add({1, 4, 5, 6, 7, 8});  // system
  const int topics[] = {0, 1, 2, 0, 1, 2, 1, 2, 1, 2, 1, 2};
  std::vector<int> turn_topic = {-1};
  IdfStats stats;  // per-session corpus, published on doubling as recommended
  stats.AddDocument(c.log);
  for (int tp : topics) {
    c.Add(topic_tokens(tp, 30));
    turn_topic.push_back(tp);
    stats.AddDocument(std::span<const int32_t>(c.log).subspan(c.turns.back().begin));
    stats.MaybePublish();
  }
  IdfEmbedder emb(table.Lookup(), 256, &stats);
  const std::vector<int32_t> query = topic_tokens(0, 15);
  auto count_topic0 = [&](SelectionMethod m, const char* preset) {
    ScoringOptions so;
    so.weights = *WeightPreset(preset);
    so.relevance = RelevanceKind::kEmbedding;  // the relevance this test was written for
    auto scores = ScoreTurns(c.log, c.turns, query, emb, so);
    EXPECT_TRUE(scores.ok());
    for (size_t i = 1; i < c.turns.size(); ++i) {  // topic-A turns are the most relevant
      for (size_t j = 1; j < c.turns.size() && turn_topic[i] == 0; ++j) {
        if (turn_topic[j] != 0) {
          EXPECT_GT((*scores)[i].relevance, (*scores)[j].relevance + 0.2) << i << " vs " << j;
        }
      }
    }
    SelectionOptions o;
    o.method = m;
    // System + last 2 turns + room for 2 more of the 33-token turns.
    Selection s = MustSelect(c.turns, *scores, c.turns[0].size() + 4 * 33, o);
    EXPECT_EQ(s.kept.size(), 5u);
    int n = 0;
    for (int i : s.kept) n += turn_topic[i] == 0;
    return n;
  };
  EXPECT_EQ(count_topic0(SelectionMethod::kRelevance, "default"), 2);
  EXPECT_EQ(count_topic0(SelectionMethod::kScore, "factual"), 2);
  // Default weights trade relevance against recency: the topic-A turn 8 turns back (turn 4) beats
  // the topic-C turn 2 back, the one 11 turns back (turn 1) does not.
  EXPECT_GE(count_topic0(SelectionMethod::kScore, "default"), 1);
  EXPECT_EQ(count_topic0(SelectionMethod::kScore, "sequential"), 0);  // recency-heavy
  EXPECT_EQ(count_topic0(SelectionMethod::kRecency, "default"), 0);
  EXPECT_EQ(count_topic0(SelectionMethod::kRecentOnly, "default"), 0);
}

}  // namespace
}  // namespace mnemo::context
