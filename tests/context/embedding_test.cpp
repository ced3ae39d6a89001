#include "context/embedding.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

#include "fixtures.h"

namespace mnemo::context {
namespace {

using testing::EmbeddingTable;

TEST(ContextIdfStats, IdfFollowsTheSmoothedFormulaOnPublishedCounts) {
  IdfStats s;
  EXPECT_FLOAT_EQ(s.Idf(7), 1.0f);  // nothing published: uniform weights
  s.AddDocument(std::vector<int32_t>{1, 2, 2, 2});
  s.AddDocument(std::vector<int32_t>{1, 3});
  s.AddDocument(std::vector<int32_t>{1});
  EXPECT_EQ(s.documents(), 3);
  EXPECT_FLOAT_EQ(s.Idf(1), 1.0f);  // still unpublished
  s.Publish();
  EXPECT_EQ(s.published_documents(), 3);
  EXPECT_NEAR(s.Idf(1), std::log(4.0 / 4.0) + 1, 1e-6);  // in every document
  EXPECT_NEAR(s.Idf(2), std::log(4.0 / 2.0) + 1, 1e-6);  // df counts documents, not occurrences
  EXPECT_NEAR(s.Idf(3), std::log(4.0 / 2.0) + 1, 1e-6);
  EXPECT_NEAR(s.Idf(99), std::log(4.0 / 1.0) + 1, 1e-6);  // unseen
  s.AddDocument(std::vector<int32_t>{2});
  EXPECT_NEAR(s.Idf(2), std::log(2.0) + 1, 1e-6);  // the snapshot does not move until published
}

TEST(ContextIdfStats, MaybePublishDoublesAndStampsAreUnique) {
  IdfStats s;
  EXPECT_FALSE(s.MaybePublish());  // nothing counted
  std::vector<int> published_at;
  for (int n = 1; n <= 40; ++n) {
    s.AddDocument(std::vector<int32_t>{n});
    if (s.MaybePublish()) published_at.push_back(n);
  }
  EXPECT_EQ(published_at, (std::vector<int>{1, 2, 4, 8, 16, 32}));
  IdfStats other;
  other.AddDocument(std::vector<int32_t>{1});
  other.Publish();
  EXPECT_NE(other.stamp(), 0u);
  EXPECT_NE(other.stamp(), s.stamp());
  const uint64_t before = other.stamp();
  other.Publish();
  EXPECT_NE(other.stamp(), before);
}

TEST(ContextIdfEmbedder, MatchesAScalarWeightedMeanAndLooksUpDistinctTokensOnce) {
  EmbeddingTable table(50, 16, 1);
  IdfStats stats;
  stats.AddDocument(std::vector<int32_t>{1, 2, 3});
  stats.AddDocument(std::vector<int32_t>{1, 4});
  stats.Publish();
  IdfEmbedder emb(table.Lookup(), 16, &stats);
  const std::vector<int32_t> tokens = {4, 1, 7, 1, 1, 4, 30};
  const std::vector<float> e = emb.Embed(tokens);
  EXPECT_EQ(table.calls(), 4);  // distinct: 1, 4, 7, 30
  ASSERT_EQ(e.size(), 16u);
  // Reference: per occurrence weight idf(t), mean over occurrences.
  for (int d = 0; d < 16; ++d) {
    double num = 0, den = 0;
    for (int32_t t : tokens) {
      num += stats.Idf(t) * table.row(t)[d];
      den += stats.Idf(t);
    }
    EXPECT_NEAR(e[d], num / den, 1e-5) << d;
  }
  EXPECT_EQ(emb.stamp(), stats.stamp());
  EXPECT_EQ(emb.dim(), 16);
}

TEST(ContextIdfEmbedder, PlainMeanWithoutStatsAndZeroForNoTokens) {
  EmbeddingTable table(10, 4, 2);
  IdfEmbedder emb(table.Lookup(), 4);
  const std::vector<float> e = emb.Embed(std::vector<int32_t>{3, 5});
  for (int d = 0; d < 4; ++d) EXPECT_NEAR(e[d], (table.row(3)[d] + table.row(5)[d]) / 2, 1e-6);
  const std::vector<float> z = emb.Embed({});
  ASSERT_EQ(z.size(), 4u);
  for (float v : z) EXPECT_EQ(v, 0.0f);
  EXPECT_EQ(emb.stamp(), 0u);
}

TEST(ContextIdfEmbedder, RareTokensOutweighCommonOnes) {
  // Token 0 is in every document; 1 and 2 each in one. One-hot rows make the weights readable.
  EmbeddingTable table = EmbeddingTable::OneHot(3);
  IdfStats stats;
  for (int i = 0; i < 9; ++i) stats.AddDocument(std::vector<int32_t>{0});
  stats.AddDocument(std::vector<int32_t>{0, 1});
  stats.Publish();
  IdfEmbedder emb(table.Lookup(), 3, &stats);
  const std::vector<float> e = emb.Embed(std::vector<int32_t>{0, 1});
  EXPECT_GT(e[1], 2 * e[0]);  // idf(1) = ln(11/2) + 1 = 2.70 vs idf(0) = 1
  EXPECT_NEAR(e[1] / e[0], std::log(11.0 / 2.0) + 1, 1e-5);
}

TEST(ContextCosine, IdenticalOrthogonalOppositeAndZero) {
  std::vector<float> a = {1, 2, 3}, b = {2, 4, 6}, c = {-1, -2, -3}, o = {3, 0, -1}, z = {0, 0, 0};
  EXPECT_NEAR(CosineSimilarity(a, b), 1.0, 1e-12);
  EXPECT_NEAR(CosineSimilarity(a, c), -1.0, 1e-12);
  EXPECT_NEAR(CosineSimilarity(a, o), 0.0, 1e-12);
  EXPECT_EQ(CosineSimilarity(a, z), 0.0);
}

}  // namespace
}  // namespace mnemo::context
