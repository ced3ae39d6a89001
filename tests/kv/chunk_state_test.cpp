// The chunk lifecycle's transition table (src/kv/chunk_state.h): the moves it allows and refuses.
// That the cache manager takes every allowed edge, and keeps each state's fields, is checked by
// the random-operation tests (cache_random_test, victim_index_test).
#include "kv/chunk_state.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <utility>

#include "base/log.h"

namespace mnemo {
namespace {

using S = ChunkState;

std::set<std::pair<S, S>> Edges() {
  std::set<std::pair<S, S>> e;
  for (int i = 0; i < kChunkEdgeCount; i++) e.insert({kChunkEdges[i].from, kChunkEdges[i].to});
  return e;
}

TEST(ChunkState, TheTableAllowsExactlyItsEdges) {
  const auto edges = Edges();
  EXPECT_EQ(edges.size(), static_cast<size_t>(kChunkEdgeCount));  // no edge listed twice
  int allowed = 0;
  for (int f = 0; f < kChunkStates; f++) {
    for (int t = 0; t < kChunkStates; t++) {
      const bool ok = ChunkTransitionAllowed(S(f), S(t));
      EXPECT_EQ(ok, edges.count({S(f), S(t)}) == 1) << ChunkStateName(S(f)) << " -> " << ChunkStateName(S(t));
      allowed += ok;
      if (f == t) EXPECT_FALSE(ok) << "a self edge: " << ChunkStateName(S(f));
    }
  }
  EXPECT_EQ(allowed, kChunkEdgeCount);
  for (int i = 0; i < kChunkEdgeCount; i++) EXPECT_NE(std::string(kChunkEdges[i].why), "");
}

// Moves that would each be a bug: data appearing from nowhere, a transfer in flight changing its
// kind, a record reused while something still points at it.
TEST(ChunkState, TheTableRefusesMovesTheLifecycleLacks) {
  const std::pair<S, S> refused[] = {
      {S::kFree, S::kResident},       // a recycled record must be made a chunk first (NewRec)
      {S::kFree, S::kFilling},
      {S::kResident, S::kFree},       // data is freed (kEmpty) before the record is recycled
      {S::kDemoting, S::kFree},       // a transfer still uses it
      {S::kCopyTarget, S::kFree},
      {S::kDemoting, S::kLoading},    // a move never turns around; a revived one is kRevived
      {S::kLoading, S::kDemoting},
      {S::kLoading, S::kRevived},     // only demotions out of T0 can be taken back
      {S::kRevived, S::kDemoting},    // a revived demotion is not un-revived
      {S::kResident, S::kRevived},    // nothing to revive without a demotion in flight
      {S::kEmpty, S::kDemoting},      // no data to move
      {S::kEmpty, S::kLoading},
      {S::kFilling, S::kDemoting},    // a chunk being recomputed is never moved
      {S::kFilling, S::kCopyTarget},
      {S::kResident, S::kFilling},    // only a chunk with no KV is recomputed
      {S::kCopyTarget, S::kFilling},  // an admission waits for the copy
      {S::kResident, S::kCopyTarget}, // a copy fills only an empty record
  };
  for (const auto& [from, to] : refused) {
    EXPECT_FALSE(ChunkTransitionAllowed(from, to)) << ChunkStateName(from) << " -> " << ChunkStateName(to);
  }
  // Every state but kFree is left for kEmpty or kResident somehow; kFree only through kEmpty.
  for (int t = 0; t < kChunkStates; t++) EXPECT_EQ(ChunkTransitionAllowed(S::kFree, S(t)), S(t) == S::kEmpty);
  for (int f = 0; f < kChunkStates; f++) EXPECT_EQ(ChunkTransitionAllowed(S(f), S::kFree), S(f) == S::kEmpty);
}

// The cache manager's guard: an illegal move is a CHECK failure naming both states, not a silent
// corruption of the bookkeeping.
TEST(ChunkStateDeathTest, AnIllegalTransitionIsRefused) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  InitLogging();  // CHECK failures are logged; to stderr, where the death test reads them
  EXPECT_DEATH(CheckChunkTransition(S::kDemoting, S::kLoading), "demoting -> loading is not in the transition table");
  EXPECT_DEATH(CheckChunkTransition(S::kFree, S::kResident), "free -> resident");
  CheckChunkTransition(S::kDemoting, S::kRevived);  // a legal one passes
}

}  // namespace
}  // namespace mnemo
