#include "context/layout.h"

#include <gtest/gtest.h>

#include <vector>

#include "context/selection.h"
#include "fixtures.h"

namespace mnemo::context {
namespace {

using testing::Conversation;
using testing::RandomTokens;
using testing::RandomTurns;

TEST(ContextLayout, CompactsPositionsAndGivesDeltas) {
  //                           0        1         2         3         4
  std::vector<TurnSpan> t = {{0, 10}, {10, 25}, {25, 40}, {40, 42}, {42, 60}};
  auto l = ComputeLayout(t, std::vector<int>{0, 1, 3, 4});
  ASSERT_TRUE(l.ok()) << l.error().message;
  ASSERT_EQ(l->spans.size(), 4u);
  EXPECT_EQ(l->n_tokens, 10 + 15 + 2 + 18);
  const int want[][5] = {// turn, old_begin, old_end, new_begin, new_end
                         {0, 0, 10, 0, 10},
                         {1, 10, 25, 10, 25},
                         {3, 40, 42, 25, 27},
                         {4, 42, 60, 27, 45}};
  for (int i = 0; i < 4; ++i) {
    const LayoutSpan& s = l->spans[i];
    EXPECT_EQ(s.turn, want[i][0]);
    EXPECT_EQ(s.old_begin, want[i][1]);
    EXPECT_EQ(s.old_end, want[i][2]);
    EXPECT_EQ(s.new_begin, want[i][3]);
    EXPECT_EQ(s.new_end, want[i][4]);
  }
  EXPECT_EQ(l->spans[0].delta(), 0);
  EXPECT_EQ(l->spans[1].delta(), 0);
  EXPECT_EQ(l->spans[2].delta(), -15);
  EXPECT_EQ(l->spans[3].delta(), -15);
  EXPECT_EQ(l->first_gap, 2);             // turn 3 is the first after a dropped turn
  EXPECT_EQ(l->exact_prefix_tokens, 25);  // turns 0 and 1 keep their KV in exact mode
  EXPECT_EQ(l->moved_tokens, 20);

  const std::vector<int32_t> old = l->OldPositions();
  ASSERT_EQ(static_cast<int>(old.size()), l->n_tokens);
  for (int p = 0; p < 25; ++p) EXPECT_EQ(old[p], p);
  for (int p = 25; p < 45; ++p) EXPECT_EQ(old[p], p + 15);
}

TEST(ContextLayout, NoDropOrOnlyTrailingDropsMovesNothing) {
  std::vector<TurnSpan> t = {{0, 3}, {3, 9}, {9, 20}};
  auto all = ComputeLayout(t, std::vector<int>{0, 1, 2});
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->first_gap, 3);
  EXPECT_EQ(all->exact_prefix_tokens, 20);
  EXPECT_EQ(all->moved_tokens, 0);
  auto trailing = ComputeLayout(t, std::vector<int>{0, 1});
  ASSERT_TRUE(trailing.ok());
  EXPECT_EQ(trailing->n_tokens, 9);
  EXPECT_EQ(trailing->first_gap, 2);
  EXPECT_EQ(trailing->exact_prefix_tokens, 9);
  // Dropping an empty turn removes no position: nothing moves and the KV stays exact.
  std::vector<TurnSpan> e = {{0, 3}, {3, 3}, {3, 9}};
  auto empty_drop = ComputeLayout(e, std::vector<int>{0, 2});
  ASSERT_TRUE(empty_drop.ok());
  EXPECT_EQ(empty_drop->first_gap, 2);
  EXPECT_EQ(empty_drop->exact_prefix_tokens, 9);
  EXPECT_EQ(empty_drop->spans[1].delta(), 0);
  // Turn 0 dropped (not what SelectTurns does, but the layout is general): everything moves.
  auto no_system = ComputeLayout(t, std::vector<int>{1, 2});
  ASSERT_TRUE(no_system.ok());
  EXPECT_EQ(no_system->first_gap, 0);
  EXPECT_EQ(no_system->exact_prefix_tokens, 0);
  EXPECT_EQ(no_system->moved_tokens, 17);
}

TEST(ContextLayout, RejectsBadKeptLists) {
  std::vector<TurnSpan> t = {{0, 3}, {3, 9}, {9, 20}};
  EXPECT_FALSE(ComputeLayout(t, std::vector<int>{0, 3}).ok());
  EXPECT_FALSE(ComputeLayout(t, std::vector<int>{1, 0}).ok());
  EXPECT_FALSE(ComputeLayout(t, std::vector<int>{0, 0}).ok());
  EXPECT_FALSE(ComputeLayout(t, std::vector<int>{-1}).ok());
  auto none = ComputeLayout(t, std::vector<int>{});
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->n_tokens, 0);
  Layout bad;
  bad.spans.push_back({0, 0, 30, 0, 30});
  bad.n_tokens = 30;
  EXPECT_FALSE(GatherTokens(std::vector<int32_t>(20, 1), bad).ok());
}

// For random histories and selections: the new ranges tile [0, n'), deltas map every kept token
// onto its compacted position, and the gathered context is the kept turns' tokens in order.
TEST(ContextLayout, PropertyCompactsEverySelection) {
  Rng rng(31);
  for (int trial = 0; trial < 2000; ++trial) {
    const int n = 1 + static_cast<int>(rng.Next() % 25);
    const std::vector<TurnSpan> turns = RandomTurns(rng, n, 40);
    const int total = TotalTokens(turns);
    std::vector<int32_t> log = RandomTokens(rng, total, 0, 1 << 20);
    SelectionOptions o;
    o.method = SelectionMethod::kRandom;
    o.seed = rng.Next();
    o.keep_last = static_cast<int>(rng.Next() % 3);
    auto sel = SelectTurns(turns, {}, static_cast<int>(rng.Next() % (total + 1)), o);
    ASSERT_TRUE(sel.ok());
    auto l = ComputeLayout(turns, sel->kept);
    ASSERT_TRUE(l.ok()) << l.error().message;
    ASSERT_EQ(l->n_tokens, sel->kept_tokens);
    ASSERT_EQ(l->spans.size(), sel->kept.size());
    int pos = 0, dropped_before = 0, prev_turn = -1;
    for (size_t k = 0; k < l->spans.size(); ++k) {
      const LayoutSpan& s = l->spans[k];
      for (int j = prev_turn + 1; j < s.turn; ++j) dropped_before += turns[j].size();
      prev_turn = s.turn;
      ASSERT_EQ(s.new_begin, pos);
      ASSERT_EQ(s.new_end - s.new_begin, s.old_end - s.old_begin);
      ASSERT_EQ(s.delta(), -dropped_before);  // RoPE: rotate cached keys by this many positions
      ASSERT_EQ(s.old_begin, turns[s.turn].begin);
      if (static_cast<int>(k) < l->first_gap) {
        ASSERT_EQ(s.delta(), 0);
      }
      if (static_cast<int>(k) == l->first_gap) {
        ASSERT_NE(s.delta(), 0);
      }
      pos = s.new_end;
    }
    auto gathered = GatherTokens(log, *l);
    ASSERT_TRUE(gathered.ok());
    std::vector<int32_t> want;
    for (int i : sel->kept)
      want.insert(want.end(), log.begin() + turns[i].begin, log.begin() + turns[i].end);
    ASSERT_EQ(*gathered, want);
    const std::vector<int32_t> old = l->OldPositions();
    for (int p = 0; p < l->n_tokens; ++p) ASSERT_EQ((*gathered)[p], log[old[p]]);
    // Exact mode: the prefix keeps its positions, so it is also a prefix of the full log.
    for (int p = 0; p < l->exact_prefix_tokens; ++p) ASSERT_EQ(old[p], p);
  }
}

}  // namespace
}  // namespace mnemo::context
