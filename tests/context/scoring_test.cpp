#include "context/scoring.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "fixtures.h"

namespace mnemo::context {
namespace {

using testing::Conversation;
using testing::EmbeddingTable;
using testing::RandomTokens;

// These tests check the embedding relevance (cosine of IdfEmbedder outputs); the keyword relevance
// has its own tests below.
ScoringOptions EmbeddingRelevance() {
  ScoringOptions o;
  o.relevance = RelevanceKind::kEmbedding;
  return o;
}

ScoringOptions Weights(double a, double b, double c) {
  ScoringOptions o = EmbeddingRelevance();
  o.weights = {a, b, c};
  return o;
}

TEST(ContextWeights, ValidationNeedsNonNegativeWeightsSummingToOne) {
  EXPECT_TRUE(ValidateWeights({0.4, 0.4, 0.2}).ok());
  EXPECT_TRUE(ValidateWeights({1, 0, 0}).ok());
  EXPECT_TRUE(ValidateWeights({0.3333333, 0.3333333, 0.3333334}).ok());
  EXPECT_TRUE(ValidateWeights({0.4 + 9e-7, 0.4, 0.2}).ok());   // within 1e-6
  EXPECT_FALSE(ValidateWeights({0.4 + 2e-6, 0.4, 0.2}).ok());  // beyond
  EXPECT_FALSE(ValidateWeights({0.5, 0.5, 0.5}).ok());
  EXPECT_FALSE(ValidateWeights({1.2, -0.2, 0}).ok());  // sums to 1, one negative
  EXPECT_FALSE(ValidateWeights({std::nan(""), 0.5, 0.5}).ok());
  EXPECT_FALSE(ValidateWeights({std::numeric_limits<double>::infinity(), 0, 0}).ok());
  auto st = ValidateWeights({0.5, 0.5, 0.5});
  EXPECT_NE(st.error().message.find("sum"), std::string::npos) << st.error().message;
}

TEST(ContextWeights, PresetsByName) {
  struct Want {
    const char* name;
    double a, b, c;
  };
  for (const Want& w : {Want{"default", 0.4, 0.4, 0.2}, Want{"factual", 0.2, 0.6, 0.2},
                        Want{"sequential", 0.6, 0.2, 0.2}, Want{"analytical", 0.2, 0.3, 0.5}}) {
    auto p = WeightPreset(w.name);
    ASSERT_TRUE(p.ok()) << w.name;
    EXPECT_DOUBLE_EQ(p->recency, w.a) << w.name;
    EXPECT_DOUBLE_EQ(p->relevance, w.b) << w.name;
    EXPECT_DOUBLE_EQ(p->information, w.c) << w.name;
    EXPECT_TRUE(ValidateWeights(*p).ok()) << w.name;
  }
  EXPECT_FALSE(WeightPreset("Default").ok());
  EXPECT_FALSE(WeightPreset("").ok());
  EXPECT_EQ(WeightPresetNames().size(), 4u);
  const ScoreWeights d;  // struct defaults are the default preset
  EXPECT_DOUBLE_EQ(d.recency, 0.4);
  EXPECT_DOUBLE_EQ(d.relevance, 0.4);
  EXPECT_DOUBLE_EQ(d.information, 0.2);
}

TEST(ContextWeights, OptionsValidation) {
  ScoringOptions o;
  EXPECT_TRUE(o.Validate().ok());
  o.recency_tau = 0;
  EXPECT_FALSE(o.Validate().ok());
  o.recency_tau = std::numeric_limits<double>::infinity();
  EXPECT_FALSE(o.Validate().ok());
  o = {};
  o.novelty_share = 1.5;
  EXPECT_FALSE(o.Validate().ok());
  o.novelty_share = std::nan("");
  EXPECT_FALSE(o.Validate().ok());
}

TEST(ContextScore, RecencyIsOneForTheNewestTurnAndStrictlyDecreasing) {
  for (double tau : {0.5, 2.0, 8.0, 100.0}) {
    EXPECT_DOUBLE_EQ(RecencyScore(1, tau), 1.0);
    double prev = 1.0;
    for (int d = 2; d < 200; ++d) {
      const double r = RecencyScore(d, tau);
      EXPECT_LT(r, prev) << "tau " << tau << " d " << d;
      EXPECT_GE(r, 0.0);
      prev = r;
    }
  }
  EXPECT_NEAR(RecencyScore(9, 8.0), std::exp(-1.0), 1e-12);
}

TEST(ContextScore, RecencyComponentOfAHistoryFollowsTurnOrder) {
  EmbeddingTable table(100, 8, 3);
  IdfEmbedder emb(table.Lookup(), 8);
  Rng rng(5);
  Conversation c;
  for (int i = 0; i < 12; ++i) c.Add(RandomTokens(rng, 10, 0, 100));
  auto s = ScoreTurns(c.log, c.turns, RandomTokens(rng, 5, 0, 100), emb, EmbeddingRelevance());
  ASSERT_TRUE(s.ok()) << s.error().message;
  EXPECT_DOUBLE_EQ(s->back().recency, 1.0);
  for (size_t i = 1; i < s->size(); ++i) EXPECT_GT((*s)[i].recency, (*s)[i - 1].recency);
}

TEST(ContextScore, RelevanceIsOneForAnIdenticalTurnAndLowestForAnOrthogonalOne) {
  // One-hot rows: turns with disjoint tokens have exactly orthogonal embeddings.
  EmbeddingTable table = EmbeddingTable::OneHot(40);
  IdfEmbedder emb(table.Lookup(), 40);
  Conversation c;
  c.Add({0, 1});            // system
  c.Add({10, 11, 12, 13});  // identical to the query
  c.Add({20, 21, 22, 23});  // orthogonal: no shared token
  c.Add({10, 11, 30, 31});  // half shared
  c.Add({10, 11, 12, 32});  // mostly shared
  const std::vector<int32_t> query = {10, 11, 12, 13};
  auto s = ScoreTurns(c.log, c.turns, query, emb, EmbeddingRelevance());
  ASSERT_TRUE(s.ok());
  EXPECT_NEAR((*s)[1].relevance, 1.0, 1e-6);
  EXPECT_EQ((*s)[2].relevance, 0.0);
  EXPECT_NEAR((*s)[3].relevance, 0.5, 1e-6);  // cos = 2 / (2 * 2)
  EXPECT_NEAR((*s)[4].relevance, 0.75, 1e-6);
  for (size_t i = 0; i < s->size(); ++i) {
    EXPECT_GE((*s)[i].relevance, 0.0);
    EXPECT_LE((*s)[i].relevance, 1.0);
  }

  // The same with random (dense) rows: identical -> 1, disjoint tokens -> the lowest.
  EmbeddingTable dense(40, 64, 7);
  IdfEmbedder emb2(dense.Lookup(), 64);
  auto s2 = ScoreTurns(c.log, c.turns, query, emb2, EmbeddingRelevance());
  ASSERT_TRUE(s2.ok());
  EXPECT_NEAR((*s2)[1].relevance, 1.0, 1e-6);
  EXPECT_LT((*s2)[2].relevance, (*s2)[3].relevance);
  EXPECT_LT((*s2)[3].relevance, (*s2)[4].relevance);
  EXPECT_LT((*s2)[4].relevance, (*s2)[1].relevance);

  // No query: relevance 0 everywhere.
  auto s3 = ScoreTurns(c.log, c.turns, {}, emb, EmbeddingRelevance());
  ASSERT_TRUE(s3.ok());
  for (const TurnScore& t : *s3) EXPECT_EQ(t.relevance, 0.0);
}

TEST(ContextScore, InformationRanksARepetitiveTurnBelowADiverseNovelOne) {
  EmbeddingTable table(200, 16, 4);
  IdfEmbedder emb(table.Lookup(), 16);
  Conversation c;
  c.Add({1, 2, 3, 4});                                   // system
  c.Add({5, 6, 7, 5, 6, 7, 8, 9});                       // ordinary
  c.Add({50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50});   // repetitive
  c.Add({100, 101, 102, 103, 104, 105, 106, 107, 108});  // diverse and novel
  c.Add({5, 6, 7, 8, 9, 1, 2, 3});                       // diverse but all seen before
  auto s = ScoreTurns(c.log, c.turns, {}, emb, EmbeddingRelevance());
  ASSERT_TRUE(s.ok());
  const TurnScore& rep = (*s)[2];
  const TurnScore& novel = (*s)[3];
  const TurnScore& seen = (*s)[4];
  EXPECT_EQ(rep.diversity, 0.0);
  EXPECT_NEAR(novel.diversity, 1.0, 1e-12);
  EXPECT_NEAR(novel.novelty, 1.0, 1e-12);
  EXPECT_NEAR(novel.information, 1.0, 1e-12);
  EXPECT_LT(rep.information, novel.information);
  EXPECT_NEAR(seen.diversity, 1.0, 1e-12);
  EXPECT_LT(seen.novelty, novel.novelty);
  EXPECT_LT(seen.information, novel.information);
  // seen: each of its tokens is in exactly one other of the 5 turns: 1 - 1/4 each.
  EXPECT_NEAR(seen.novelty, 0.75, 1e-12);
  // A token every turn holds has novelty 0.
  Conversation all;
  for (int i = 0; i < 4; ++i) all.Add({7, 7});
  auto s2 = ScoreTurns(all.log, all.turns, {}, emb, EmbeddingRelevance());
  ASSERT_TRUE(s2.ok());
  for (const TurnScore& t : *s2) EXPECT_EQ(t.novelty, 0.0);
}

TEST(ContextScore, DiversityIsNormalizedEntropy) {
  EXPECT_EQ(Diversity(TokenHistogram(std::vector<int32_t>{})), 0.0);
  EXPECT_EQ(Diversity(TokenHistogram(std::vector<int32_t>{3})), 0.0);
  EXPECT_NEAR(Diversity(TokenHistogram(std::vector<int32_t>{3, 4})), 1.0, 1e-12);
  // {a, a, b, b}: H = ln 2, n = 4 -> 0.5.
  EXPECT_NEAR(Diversity(TokenHistogram(std::vector<int32_t>{1, 2, 1, 2})), 0.5, 1e-12);
  const auto h = TokenHistogram(std::vector<int32_t>{9, 3, 9, 1});
  ASSERT_EQ(h.size(), 3u);
  EXPECT_EQ(h[0].token, 1);
  EXPECT_EQ(h[2].token, 9);
  EXPECT_EQ(h[2].count, 2);
}

TEST(ContextScore, TotalIsTheWeightedSumAndStaysInUnitRange) {
  EmbeddingTable table(300, 32, 9);
  Rng rng(11);
  for (int trial = 0; trial < 50; ++trial) {
    IdfStats stats;
    Conversation c;
    const int n = 1 + static_cast<int>(rng.Next() % 15);
    for (int i = 0; i < n; ++i) {
      c.Add(RandomTokens(rng, static_cast<int>(rng.Next() % 30), 0, 300));
      stats.AddDocument(std::span<const int32_t>(c.log).subspan(c.turns.back().begin));
    }
    stats.Publish();
    IdfEmbedder emb(table.Lookup(), 32, &stats);
    const double a = rng.UniformDouble(), b = (1 - a) * rng.UniformDouble();
    ScoringOptions o = Weights(a, b, 1 - a - b);
    o.novelty_share = rng.UniformDouble();
    auto s = ScoreTurns(c.log, c.turns, RandomTokens(rng, 8, 0, 300), emb, o);
    ASSERT_TRUE(s.ok()) << s.error().message;
    ASSERT_EQ(s->size(), c.turns.size());
    for (const TurnScore& t : *s) {
      for (double v : {t.recency, t.relevance, t.information, t.diversity, t.novelty, t.total}) {
        EXPECT_GE(v, 0.0);
        EXPECT_LE(v, 1.0 + 1e-12);
      }
      EXPECT_NEAR(t.total, a * t.recency + b * t.relevance + (1 - a - b) * t.information, 1e-12);
      EXPECT_NEAR(t.information, (1 - o.novelty_share) * t.diversity + o.novelty_share * t.novelty,
                  1e-12);
    }
  }
}

TEST(ContextScore, RejectsBadInput) {
  EmbeddingTable table(10, 4, 1);
  IdfEmbedder emb(table.Lookup(), 4);
  Conversation c;
  c.Add({1, 2});
  c.Add({3});
  EXPECT_FALSE(ScoreTurns(c.log, c.turns, {}, emb, Weights(0.5, 0.5, 0.5)).ok());
  std::vector<int32_t> short_log(c.log.begin(), c.log.end() - 1);
  EXPECT_FALSE(ScoreTurns(short_log, c.turns, {}, emb, EmbeddingRelevance()).ok());
  EXPECT_FALSE(ScoreTurns(c.log, {}, {}, emb, EmbeddingRelevance()).ok());

  struct BadEmbedder : Embedder {
    std::vector<float> Embed(std::span<const int32_t>) override { return {1, 2}; }
    int dim() const override { return 3; }
  } bad;
  auto r = ScoreTurns(c.log, c.turns, {}, bad, EmbeddingRelevance());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("dim"), std::string::npos);
}

// Distinct tokens of log[t.begin, t.end): what one IdfEmbedder::Embed of that turn looks up.
int Distinct(const std::vector<int32_t>& log, const TurnSpan& t) {
  return static_cast<int>(
      TokenHistogram(std::span<const int32_t>(log).subspan(t.begin, t.size())).size());
}

TEST(ContextTurnCache, EmbedsEachTurnOnceAcrossRounds) {
  EmbeddingTable table(500, 32, 12);
  IdfEmbedder emb(table.Lookup(), 32);
  TurnCache cache;
  Rng rng(13);
  Conversation c;
  c.Add(RandomTokens(rng, 20, 0, 500));
  int64_t expected_calls = 0;
  for (int round = 0; round < 10; ++round) {
    c.Add(RandomTokens(rng, 15 + round, 0, 500));  // the previous query + reply became a turn
    const std::vector<int32_t> query = RandomTokens(rng, 6, 0, 500);
    const int64_t before = table.calls();
    auto s = ScoreTurns(c.log, c.turns, query, emb, EmbeddingRelevance(), &cache);
    ASSERT_TRUE(s.ok());
    // Round 0 embeds both turns; later rounds only the new turn. Plus the query each round.
    int want = Distinct(c.log, c.turns.back()) + static_cast<int>(TokenHistogram(query).size());
    if (round == 0) want += Distinct(c.log, c.turns[0]);
    EXPECT_EQ(table.calls() - before, want) << "round " << round;
    expected_calls += round == 0 ? 2 : 1;
    EXPECT_EQ(cache.stats().embeds, expected_calls);
    EXPECT_EQ(cache.size(), c.turns.size());
    // Cached scores equal uncached ones.
    auto fresh = ScoreTurns(c.log, c.turns, query, emb, EmbeddingRelevance());
    ASSERT_TRUE(fresh.ok());
    for (size_t i = 0; i < s->size(); ++i) EXPECT_EQ((*s)[i].total, (*fresh)[i].total);
  }
  EXPECT_EQ(cache.stats().hits,
            2 + 3 + 4 + 5 + 6 + 7 + 8 + 9 + 10);  // round r >= 1: r + 1 old turns
}

TEST(ContextTurnCache, RecomputesOnChangedContentSpanOrEmbedderStampAndSweeps) {
  EmbeddingTable table(100, 8, 14);
  IdfStats stats;
  IdfEmbedder emb(table.Lookup(), 8, &stats);
  TurnCache cache;
  Conversation c;
  c.Add({1, 2, 3});
  c.Add({4, 5, 6, 7});
  c.Add({8, 9});
  ASSERT_TRUE(ScoreTurns(c.log, c.turns, {}, emb, EmbeddingRelevance(), &cache).ok());
  EXPECT_EQ(cache.stats().embeds, 3);

  // Same spans, one token changed in turn 1: only turn 1 is recomputed; its old entry is swept.
  c.log[5] = 42;
  ASSERT_TRUE(ScoreTurns(c.log, c.turns, {}, emb, EmbeddingRelevance(), &cache).ok());
  EXPECT_EQ(cache.stats().embeds, 4);
  EXPECT_EQ(cache.stats().swept, 1);
  EXPECT_EQ(cache.size(), 3u);

  // New IDF snapshot: every embedding is recomputed, histograms are not the issue.
  for (const TurnSpan& t : c.turns) {
    stats.AddDocument(std::span<const int32_t>(c.log).subspan(t.begin, t.size()));
  }
  stats.Publish();
  const int64_t calls = table.calls();
  ASSERT_TRUE(ScoreTurns(c.log, c.turns, {}, emb, EmbeddingRelevance(), &cache).ok());
  EXPECT_EQ(cache.stats().embeds, 7);
  EXPECT_EQ(table.calls() - calls, 3 + 4 + 2);
  ASSERT_TRUE(ScoreTurns(c.log, c.turns, {}, emb, EmbeddingRelevance(), &cache).ok());
  EXPECT_EQ(cache.stats().embeds, 7);  // stable stamp: all hits

  // Turns re-segmented (2 and 3 merged): a new span is a new key; the old ones go.
  std::vector<TurnSpan> merged = {c.turns[0], {c.turns[1].begin, c.turns[2].end, false}};
  ASSERT_TRUE(ScoreTurns(c.log, merged, {}, emb, EmbeddingRelevance(), &cache).ok());
  EXPECT_EQ(cache.stats().embeds, 8);
  EXPECT_EQ(cache.size(), 2u);
}


// Keyword relevance, by hand: 4 turns; query tokens 1 (in every turn: weight ln(5/5) = 0), 3 (in
// turns 1 and 3: ln(5/3)), 4 (turn 1 only: ln(5/2)) and 7 (in no turn: left out).
TEST(ContextScore, KeywordRelevanceIsTheIdfWeightedShareOfTheQuerysWords) {
  EmbeddingTable table(16, 4, 3);
  IdfEmbedder emb(table.Lookup(), 4);
  Conversation c;
  c.Add({1, 2});
  c.Add({1, 3, 4, 4});
  c.Add({1, 5});
  c.Add({1, 3, 6});
  ScoringOptions o;
  ASSERT_EQ(o.relevance, RelevanceKind::kKeyword);  // the default
  o.relevance_temperature = 0;                      // the share itself
  const std::vector<int32_t> query = {3, 4, 7, 1, 3};
  auto s = ScoreTurns(c.log, c.turns, query, emb, o);
  ASSERT_TRUE(s.ok()) << s.error().message;
  const double w3 = std::log(5.0 / 3.0), w4 = std::log(5.0 / 2.0);
  const double share3 = w3 / (w3 + w4);
  EXPECT_NEAR((*s)[0].relevance, 0.0, 1e-12);
  EXPECT_NEAR((*s)[1].relevance, 1.0, 1e-12);
  EXPECT_NEAR((*s)[2].relevance, 0.0, 1e-12);
  EXPECT_NEAR((*s)[3].relevance, share3, 1e-12);

  // Sharpened (the default, t = 0.1): (e^(x/t) - 1) / (e^(1/t) - 1); 0 and 1 stay, the order too.
  for (double t : {0.1, 0.5, 1e-3}) {
    o.relevance_temperature = t;
    auto sharp = ScoreTurns(c.log, c.turns, query, emb, o);
    ASSERT_TRUE(sharp.ok());
    EXPECT_NEAR((*sharp)[0].relevance, 0.0, 1e-12) << t;
    EXPECT_NEAR((*sharp)[1].relevance, 1.0, 1e-12) << t;
    EXPECT_NEAR((*sharp)[2].relevance, 0.0, 1e-12) << t;
    const double want = t >= 0.1 ? std::expm1(share3 / t) / std::expm1(1 / t) : 0.0;  // 1e-3: e^-389
    EXPECT_NEAR((*sharp)[3].relevance, want, 1e-12) << t;
    EXPECT_TRUE(std::isfinite((*sharp)[3].total)) << t;
  }
  EXPECT_LT(std::expm1(share3 / 0.1) / std::expm1(10.0), 0.05);  // share3 = 0.36: a weak match
  o.relevance_temperature = -1;
  EXPECT_FALSE(ScoreTurns(c.log, c.turns, query, emb, o).ok());
  o.relevance_temperature = 0.1;

  // fold: token 8 counts as 3 (e.g. "My" as "my"), so a query of 8 finds turns 1 and 3 equally.
  std::vector<int32_t> fold(16);
  for (int i = 0; i < 16; ++i) fold[i] = i;
  fold[8] = 3;
  o.fold = fold;
  auto f = ScoreTurns(c.log, c.turns, std::vector<int32_t>{8}, emb, o);
  ASSERT_TRUE(f.ok());
  EXPECT_NEAR((*f)[1].relevance, 1.0, 1e-12);
  EXPECT_NEAR((*f)[3].relevance, 1.0, 1e-12);
  EXPECT_NEAR((*f)[0].relevance, 0.0, 1e-12);
  o.fold = {};
  auto unfolded = ScoreTurns(c.log, c.turns, std::vector<int32_t>{8}, emb, o);
  ASSERT_TRUE(unfolded.ok());
  for (const TurnScore& t : *unfolded) EXPECT_EQ(t.relevance, 0.0);  // 8 occurs nowhere
}

// Centring removes what all turns share: with a common offset added to every embedding row, raw
// cosines all approach 1, centred ones still single out the turn equal to the query.
TEST(ContextScore, CentredAndWhitenedRelevanceIgnoreTheSharedDirection) {
  const int vocab = 32, dim = 32;
  EmbeddingTable one_hot = EmbeddingTable::OneHot(vocab);
  auto lookup = [&](int32_t t, float* out) {
    one_hot.Lookup()(t, out);
    out[0] += 20.0f;  // a direction every token shares
  };
  IdfEmbedder emb(lookup, dim);
  Conversation c;
  c.Add({1, 2});
  c.Add({3, 4});
  c.Add({5, 6});
  c.Add({7, 8});
  const std::vector<int32_t> query = {5, 6};
  ScoringOptions o;
  o.relevance = RelevanceKind::kEmbedding;
  auto raw = ScoreTurns(c.log, c.turns, query, emb, o);
  ASSERT_TRUE(raw.ok());
  for (const TurnScore& t : *raw) EXPECT_GT(t.relevance, 0.99);
  for (RelevanceKind k : {RelevanceKind::kCentred, RelevanceKind::kWhitened}) {
    o.relevance = k;
    auto s = ScoreTurns(c.log, c.turns, query, emb, o);
    ASSERT_TRUE(s.ok());
    EXPECT_GT((*s)[2].relevance, 0.9) << RelevanceKindName(k);
    for (int i : {0, 1, 3}) EXPECT_LT((*s)[i].relevance, 0.1) << RelevanceKindName(k) << " turn " << i;
  }
  EXPECT_EQ(*ParseRelevanceKind("whitened"), RelevanceKind::kWhitened);
  EXPECT_FALSE(ParseRelevanceKind("bm25").ok());
}


// Words: with word_kind, tokens 10 ("_c") + 11 ("at") are the word "cat" and 12 ("_wh") + 11 the
// word "what"; a query for "cat" finds the turn with "cat", not the one that only shares "at".
// Token 13 (".") is in no word.
TEST(ContextScore, KeywordRelevanceComparesWordsNotPieces) {
  EmbeddingTable table(16, 4, 3);
  IdfEmbedder emb(table.Lookup(), 4);
  Conversation c;
  c.Add({1, 2});
  c.Add({12, 11, 13});      // "what."
  c.Add({10, 11, 13});      // "cat."
  c.Add({1, 12, 11, 2});    // ... "what" ...
  std::vector<int8_t> kind(16, 1);
  kind[11] = 0;
  kind[13] = -1;
  ScoringOptions o;
  const std::vector<int32_t> query = {10, 11, 13};
  auto pieces = ScoreTurns(c.log, c.turns, query, emb, o);  // no word_kind: "at" matches "what"
  ASSERT_TRUE(pieces.ok());
  EXPECT_GT((*pieces)[1].relevance, 0.0);
  o.word_kind = kind;
  auto words = ScoreTurns(c.log, c.turns, query, emb, o);
  ASSERT_TRUE(words.ok());
  EXPECT_NEAR((*words)[2].relevance, 1.0, 1e-12);
  for (int i : {0, 1, 3}) EXPECT_EQ((*words)[i].relevance, 0.0) << "turn " << i;
}

}  // namespace
}  // namespace mnemo::context
