// CacheManager, model-free. Eviction and admission: which chunks go first (Pensieve, LRU), by whose
// clock, and that a waiting admission or a retried growth evicts only what it needs.
#include <gtest/gtest.h>

#include <algorithm>

#include "cache_test_util.h"
#include "kv/cache_manager.h"

namespace mnemo {
namespace {

using kvtest::Admit;
using kvtest::Policy;
using kvtest::Turn;

TEST(Eviction, PensieveEvictsLeadingChunksOfIdleSessionsFirst) {
  PensievePolicy p(CostModel{1000.0, 10.0});
  EvictionCandidate lead{0, 0, 32, 10.0, 0.0}, tail{5, 160, 32, 10.0, 0.0};
  EXPECT_LT(p.Key(lead), p.Key(tail));
  EvictionCandidate idle{3, 96, 32, 100.0, 0.0}, active{3, 96, 32, 1.0, 99.0};
  EXPECT_LT(p.Key(idle), p.Key(active));
  EvictionCandidate partial_tail{6, 192, 4, 10.0, 0.0};  // 4 positions: cheap, yet after the front
  EXPECT_LT(p.Key(lead), p.Key(partial_tail));
}

TEST(Eviction, LruEvictsOldestSessionTailFirst) {
  LruPolicy p;
  EvictionCandidate old_tail{5, 160, 32, 0, 1.0}, old_head{0, 0, 32, 0, 1.0}, recent{0, 0, 32, 0, 2.0};
  EXPECT_LT(p.Key(old_tail), p.Key(old_head));
  EXPECT_LT(p.Key(old_head), p.Key(recent));
  EXPECT_FALSE(MakeEvictionPolicy("fifo", CostModel{}).ok());
}

TEST(CacheManager, TurnsReuseT0Blocks) {
  CacheManager cm({16, 0, 0, 0.1}, Policy("pensieve"));
  cm.AddSession(1, 0);
  CacheManager::Acquired a;
  ASSERT_EQ(cm.Acquire(1, 70, 0, &a), Admission::kOk);
  EXPECT_EQ(a.block_table.size(), 3u);
  EXPECT_TRUE(a.recompute.empty());
  cm.Release(1, 70, 1);
  CacheManager::Acquired b;
  ASSERT_EQ(cm.Acquire(1, 100, 2, &b), Admission::kOk);
  EXPECT_EQ(b.hit_tokens[0], 70);
  EXPECT_EQ(std::vector<int32_t>(b.block_table.begin(), b.block_table.begin() + 3), a.block_table);
  cm.Release(1, 100, 3);
  EXPECT_TRUE(cm.CheckInvariants());
}

TEST(CacheManager, WithoutLowerTiersLeadingChunksAreDroppedAndRecomputed) {
  CacheManager cm({10, 0, 0, 0.1}, Policy("pensieve"));
  cm.AddSession(1, 0);
  ASSERT_EQ(Turn(cm, 1, 6 * 32, 0), Admission::kOk);  // 6 blocks
  cm.AddSession(2, 50);
  ASSERT_EQ(Turn(cm, 2, 6 * 32, 50), Admission::kOk);  // needs 2 of session 1's blocks
  auto r = cm.Residency(1);
  EXPECT_EQ(r[0], Tier::kNone);
  EXPECT_EQ(r[1], Tier::kNone);
  EXPECT_EQ(r[2], Tier::kT0);
  EXPECT_EQ(r[5], Tier::kT0);
  // The next turn of session 1 recomputes exactly the dropped leading chunks.
  CacheManager::Acquired a;
  ASSERT_EQ(Admit(cm, 1, 7 * 32, 100, &a), Admission::kOk);
  EXPECT_EQ(a.recompute, (std::vector<int>{0, 1}));
  EXPECT_EQ(a.hit_tokens[0], 4 * 32);
  EXPECT_TRUE(cm.CheckInvariants());
}

TEST(CacheManager, LruDropsTheTailOfTheOldestSession) {
  CacheManager cm({10, 0, 0, 0.1}, Policy("lru"));
  cm.AddSession(1, 0);
  ASSERT_EQ(Turn(cm, 1, 6 * 32, 0), Admission::kOk);
  cm.AddSession(2, 50);
  ASSERT_EQ(Turn(cm, 2, 6 * 32, 50), Admission::kOk);
  auto r = cm.Residency(1);
  EXPECT_EQ(r[0], Tier::kT0);
  EXPECT_EQ(r[4], Tier::kNone);
  EXPECT_EQ(r[5], Tier::kNone);
}

TEST(CacheManager, ASessionMarkedActiveIsNotTheIdleVictim) {
  // Session 1 was used first, session 2 later; then a turn of session 1 is queued (the engine
  // marks its session active while it waits). Admitting a third session must take session 2's
  // blocks, not those of the session about to be served.
  for (const char* policy : {"pensieve", "lru"}) {
    CacheManager cm({12, 0, 0, 0.0}, Policy(policy));
    cm.AddSession(1, 0);
    ASSERT_EQ(Turn(cm, 1, 4 * 32, 0), Admission::kOk);
    cm.AddSession(2, 10);
    ASSERT_EQ(Turn(cm, 2, 4 * 32, 10), Admission::kOk);
    cm.MarkActive(1, 20);
    cm.AddSession(3, 21);
    ASSERT_EQ(Turn(cm, 3, 8 * 32, 21), Admission::kOk);  // 4 blocks must be evicted
    for (Tier t : cm.Residency(1)) EXPECT_EQ(t, Tier::kT0) << policy;
    const auto r2 = cm.Residency(2);
    EXPECT_EQ(std::count(r2.begin(), r2.end(), Tier::kNone), 4) << policy;
    EXPECT_TRUE(cm.CheckInvariants());
  }
}

TEST(CacheManager, AdmissionNeverTakesTheReserve) {
  CacheManager cm({20, 0, 0, 0.1}, Policy("pensieve"));  // reserve 2 blocks, admission share 18
  EXPECT_EQ(cm.admission_blocks(), 18);
  cm.AddSession(1, 0);
  cm.AddSession(2, 0);
  CacheManager::Acquired a, b;
  EXPECT_EQ(cm.Acquire(1, 19 * 32, 0, &a), Admission::kImpossible);
  ASSERT_EQ(cm.Acquire(1, 10 * 32, 0, &a), Admission::kOk);
  EXPECT_EQ(cm.Acquire(2, 9 * 32, 0, &b), Admission::kLater);  // 10 + 9 > 18 while 1 runs
  ASSERT_EQ(cm.Acquire(2, 8 * 32, 0, &b), Admission::kOk);
  // Running requests grow into the reserve...
  EXPECT_TRUE(cm.Grow(1, 11 * 32, &a.block_table));
  EXPECT_TRUE(cm.Grow(2, 9 * 32, &b.block_table));
  // ...and when it is gone they cannot grow: the caller suspends one.
  EXPECT_FALSE(cm.Grow(1, 12 * 32, &a.block_table));
  cm.Suspend(2, 9 * 32, 1);
  EXPECT_TRUE(cm.Grow(1, 12 * 32, &a.block_table));
  EXPECT_TRUE(cm.CheckInvariants());
}

// Regression: a turn waiting for room, retried once per step without the copies landing, must not
// start a new batch of demotions at each try (it once demoted 4, 8, 12... chunks for 4 blocks).
// Admission records the room it wants; upkeep (Maintain) makes it, counting demotions in flight.
TEST(CacheManager, AWaitingAdmissionEvictsOnlyWhatItNeeds) {
  CacheManager cm({16, 64, 0, 0.0}, Policy("pensieve"));
  cm.AddSession(1, 0);
  ASSERT_EQ(Turn(cm, 1, 14 * 32, 0), Admission::kOk);  // 14 of 16 blocks, then idle
  cm.AddSession(2, 10);
  int demotions = 0;
  std::vector<TransferOp> in_flight;
  for (int step = 0; step < 6; step++) {
    CacheManager::Acquired a;
    ASSERT_EQ(cm.Acquire(2, 6 * 32, 10 + step, &a), Admission::kLater);  // lacks 4 blocks
    cm.Maintain(0, 10 + step);
    for (const auto& op : cm.TakeTransfers()) {
      demotions += op.src == Tier::kT0;
      in_flight.push_back(op);
    }
    EXPECT_EQ(demotions, 4) << "step " << step;
    EXPECT_TRUE(cm.CheckInvariants());
  }
  for (const auto& op : in_flight) cm.OnTransferDone(op.id, true);
  CacheManager::Acquired a;
  ASSERT_EQ(cm.Acquire(2, 6 * 32, 20, &a), Admission::kOk);
  EXPECT_EQ(cm.stats().evictions[0], 4);
  auto r = cm.Residency(1);
  EXPECT_EQ(std::count(r.begin(), r.end(), Tier::kT1), 4);
  cm.Release(2, 6 * 32, 21);
  EXPECT_TRUE(cm.CheckInvariants());
}

// Regression: Pensieve evicts a session from its front; the partial tail chunk (few valid
// positions, so a small recompute cost) goes after the leading chunks, not before them.
TEST(CacheManager, PensieveEvictsThePartialTailAfterTheLeadingChunks) {
  CacheManager cm({8, 0, 0, 0.0}, Policy("pensieve"));
  cm.AddSession(1, 0);
  ASSERT_EQ(Turn(cm, 1, 3 * 32 + 4, 0), Admission::kOk);  // chunks 0-2 full, chunk 3 holds 4 positions
  cm.AddSession(2, 50);
  ASSERT_EQ(Turn(cm, 2, 5 * 32, 50), Admission::kOk);  // 4 free: one chunk of session 1 goes
  EXPECT_EQ(cm.Residency(1), (std::vector<Tier>{Tier::kNone, Tier::kT0, Tier::kT0, Tier::kT0}));
  EXPECT_TRUE(cm.CheckInvariants());
}

// Regression: eviction during decode (Grow) measures idle time on the engine's clock, not from
// the growing session's admission (which made everything touched since look 1 ms idle).
TEST(CacheManager, GrowEvictsByTheEnginesClock) {
  CacheManager cm({12, 0, 0, 0.0}, Policy("pensieve"));
  cm.AddSession(1, 0);  // idle since 0, only its deep chunks 6 and 7 hold KV (expensive)
  cm.RestoreChunk(1, 6, Tier::kT0, 0, 8 * 32);
  cm.RestoreChunk(1, 7, Tier::kT0, 1, 8 * 32);
  cm.AddSession(3, 10);
  CacheManager::Acquired g;
  ASSERT_EQ(cm.Acquire(3, 4 * 32, 10, &g), Admission::kOk);  // the growing turn, admitted at 10
  cm.AddSession(2, 20);
  ASSERT_EQ(Turn(cm, 2, 6 * 32, 20), Admission::kOk);  // released at 20; T0 is now full
  ASSERT_EQ(cm.used_blocks(Tier::kT0), 12);
  cm.Maintain(0, 1000);  // the engine's clock moves on
  ASSERT_TRUE(cm.Grow(3, 5 * 32, &g.block_table));
  // At 1000 both sessions are ~1000 s idle: session 2's leading chunk is the cheapest to redo.
  EXPECT_EQ(cm.Residency(2)[0], Tier::kNone);
  EXPECT_EQ(cm.Residency(1)[6], Tier::kT0);
  cm.Release(3, 5 * 32, 1001);
  EXPECT_TRUE(cm.CheckInvariants());
}

// Regression: a decode that cannot get a block, retried while the demotion it started is in
// flight (the engine tries Grow again after polling, after a suspension, at the next step), must
// not start another demotion at each try: demotions in flight are counted as blocks on their way,
// as upkeep counts them for a waiting admission. It once demoted 1, 2, 3... chunks for 1 block.
TEST(CacheManager, AGrowRetriedWhileDemotionsAreInFlightEvictsOnlyWhatItNeeds) {
  CacheManager cm({8, 16, 0, 0.0}, Policy("pensieve"));
  cm.AddSession(1, 0);
  ASSERT_EQ(Turn(cm, 1, 6 * 32, 0), Admission::kOk);  // 6 of 8 blocks, then idle
  cm.AddSession(2, 10);
  CacheManager::Acquired a;
  ASSERT_EQ(cm.Acquire(2, 2 * 32, 10, &a), Admission::kOk);  // T0 is full
  std::vector<TransferOp> in_flight;
  for (int attempt = 0; attempt < 5; attempt++) {
    EXPECT_FALSE(cm.Grow(2, 2 * 32 + 1, &a.block_table)) << "attempt " << attempt;  // one block short
    for (const auto& op : cm.TakeTransfers()) in_flight.push_back(op);
    EXPECT_EQ(in_flight.size(), 1u) << "attempt " << attempt;
    EXPECT_TRUE(cm.CheckInvariants());
  }
  // Two blocks short: one more demotion (the one in flight covers the other), once.
  for (int attempt = 0; attempt < 3; attempt++) {
    EXPECT_FALSE(cm.Grow(2, 3 * 32 + 1, &a.block_table));
    for (const auto& op : cm.TakeTransfers()) in_flight.push_back(op);
    EXPECT_EQ(in_flight.size(), 2u) << "attempt " << attempt;
  }
  for (const auto& op : in_flight) cm.OnTransferDone(op.id, true);
  EXPECT_TRUE(cm.Grow(2, 3 * 32 + 1, &a.block_table));
  EXPECT_EQ(a.block_table.size(), 4u);
  EXPECT_EQ(cm.stats().evictions[0], 2);
  EXPECT_TRUE(cm.HoldsT0(2, a.block_table));
  cm.Release(2, 3 * 32 + 1, 11);
  EXPECT_TRUE(cm.CheckInvariants());
}

}  // namespace
}  // namespace mnemo
