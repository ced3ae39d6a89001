#include "context/turns.h"

#include <gtest/gtest.h>

#include <vector>

namespace mnemo::context {
namespace {

TEST(ContextTurns, ValidateAcceptsATilingAndRejectsTheRest) {
  std::vector<TurnSpan> ok = {{0, 5}, {5, 5}, {5, 12}};
  EXPECT_TRUE(ValidateTurns(ok, 12).ok());
  EXPECT_FALSE(ValidateTurns(ok, 13).ok());  // does not reach the end
  EXPECT_FALSE(ValidateTurns({}, 0).ok());   // no system turn
  std::vector<TurnSpan> gap = {{0, 5}, {6, 8}};
  EXPECT_FALSE(ValidateTurns(gap, 8).ok());
  std::vector<TurnSpan> overlap = {{0, 5}, {4, 8}};
  EXPECT_FALSE(ValidateTurns(overlap, 8).ok());
  std::vector<TurnSpan> reversed = {{0, 5}, {5, 3}};
  EXPECT_FALSE(ValidateTurns(reversed, 3).ok());
  std::vector<TurnSpan> late = {{1, 5}};
  EXPECT_FALSE(ValidateTurns(late, 5).ok());
}

TEST(ContextTurns, SegmentSplitsTheSystemPromptOutOfTheFirstTurn) {
  // Engine turn 0 = system prompt (10 tokens) + first user message, reply from 25 to 40.
  std::vector<TurnBounds> engine = {{0, 25, 40}, {40, 52, 70}, {70, 80, 95}};
  auto r = SegmentTurns(engine, 95, 10, std::vector<int>{2});
  ASSERT_TRUE(r.ok()) << r.error().message;
  const std::vector<TurnSpan>& t = *r;
  ASSERT_EQ(t.size(), 4u);
  EXPECT_EQ(t[0].begin, 0);
  EXPECT_EQ(t[0].end, 10);
  EXPECT_EQ(t[1].begin, 10);
  EXPECT_EQ(t[1].end, 40);
  EXPECT_EQ(t[2].begin, 40);
  EXPECT_EQ(t[3].end, 95);
  EXPECT_FALSE(t[0].pinned);
  EXPECT_FALSE(t[1].pinned);
  EXPECT_TRUE(t[2].pinned);
  EXPECT_TRUE(ValidateTurns(t, 95).ok());
}

TEST(ContextTurns, SegmentHandlesASystemOnlyFirstTurnAndNoSystemPrompt) {
  std::vector<TurnBounds> engine = {{0, 8, 8}, {8, 20, 30}};
  auto with_system = SegmentTurns(engine, 30, 8);
  ASSERT_TRUE(with_system.ok());
  ASSERT_EQ(with_system->size(), 2u);  // the empty remainder of turn 0 is not a turn
  EXPECT_EQ((*with_system)[0].end, 8);
  EXPECT_EQ((*with_system)[1].begin, 8);

  auto no_system = SegmentTurns(engine, 30, 0);
  ASSERT_TRUE(no_system.ok());
  ASSERT_EQ(no_system->size(), 3u);  // an empty turn 0 keeps the indices uniform
  EXPECT_EQ((*no_system)[0].size(), 0);
  EXPECT_EQ((*no_system)[1].end, 8);

  auto empty = SegmentTurns({}, 0, 0);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->size(), 1u);
}

TEST(ContextTurns, SegmentRejectsBadInput) {
  std::vector<TurnBounds> engine = {{0, 25, 40}, {40, 52, 70}};
  EXPECT_FALSE(SegmentTurns(engine, 71, 10).ok());  // log length
  EXPECT_FALSE(SegmentTurns(engine, 70, 41).ok());  // system past turn 0
  EXPECT_FALSE(SegmentTurns(engine, 70, -1).ok());
  EXPECT_FALSE(SegmentTurns(engine, 70, 10, std::vector<int>{3}).ok());  // pin out of range
  EXPECT_FALSE(SegmentTurns(engine, 70, 10, std::vector<int>{-1}).ok());
  std::vector<TurnBounds> bad_prompt = {{0, 45, 40}};
  EXPECT_FALSE(SegmentTurns(bad_prompt, 40, 0).ok());
  std::vector<TurnBounds> gap = {{0, 5, 10}, {11, 12, 20}};
  EXPECT_FALSE(SegmentTurns(gap, 20, 0).ok());
}

TEST(ContextTurns, HashTokensIsContentAndOrderSensitive) {
  std::vector<int32_t> a = {1, 2, 3}, b = {1, 2, 3}, c = {3, 2, 1}, d = {1, 2, 3, 0}, e = {};
  EXPECT_EQ(HashTokens(a), HashTokens(b));
  EXPECT_NE(HashTokens(a), HashTokens(c));
  EXPECT_NE(HashTokens(a), HashTokens(d));
  EXPECT_NE(HashTokens(e), HashTokens(std::vector<int32_t>{0}));
  EXPECT_EQ(TotalTokens(std::vector<TurnSpan>{{0, 3}, {3, 10}}), 10);
}

}  // namespace
}  // namespace mnemo::context
