#include "kv/cache_manager.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <map>
#include <optional>
#include <string>

#include "base/rng.h"
#include "kv/chunk_state.h"
#include "random_ops.h"

namespace mnemo {
namespace {

std::unique_ptr<EvictionPolicy> Policy(const char* name) {
  CostModel cost{1000.0, 10.0};
  return std::move(MakeEvictionPolicy(name, cost).value());
}

// Completes every queued transfer (as a transfer engine would).
void Drain(CacheManager& cm, bool ok = true) {
  for (int round = 0; round < 8; round++) {
    auto ops = cm.TakeTransfers();
    if (ops.empty()) break;
    for (const auto& op : ops) cm.OnTransferDone(op.id, ok);
  }
}

// Acquires as the engine's steps do: while it answers kLater, upkeep makes room and copies land.
Admission Admit(CacheManager& cm, SessionId s, int n_tokens, double now, CacheManager::Acquired* a) {
  Admission r = cm.Acquire(s, n_tokens, now, a);
  for (int i = 0; i < 8 && r == Admission::kLater; i++) {
    cm.Maintain(0, now);
    Drain(cm);
    r = cm.Acquire(s, n_tokens, now, a);
  }
  return r;
}

// A turn: acquire n_tokens, complete its swap-ins, release.
Admission Turn(CacheManager& cm, SessionId s, int n_tokens, double now, CacheManager::Acquired* a = nullptr) {
  CacheManager::Acquired local;
  if (!a) a = &local;
  Admission r = Admit(cm, s, n_tokens, now, a);
  if (r != Admission::kOk) return r;
  for (const auto& op : a->swap_ins) cm.OnTransferDone(op.id, true);
  cm.Release(s, n_tokens, now);
  return r;
}

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

TEST(CacheManager, SwapOutToHostAndBackIn) {
  CacheManager cm({8, 8, 0, 0.0}, Policy("pensieve"));
  cm.AddSession(1, 0);
  ASSERT_EQ(Turn(cm, 1, 6 * 32, 0), Admission::kOk);
  cm.AddSession(2, 10);
  CacheManager::Acquired a;
  // Session 2 needs 6 blocks; 2 are free: evictions start, admission waits for them.
  ASSERT_EQ(cm.Acquire(2, 6 * 32, 10, &a), Admission::kLater);
  EXPECT_TRUE(cm.TakeTransfers().empty());  // admission only records the room it wants
  cm.Maintain(0, 10);                       // upkeep makes it
  auto ops = cm.TakeTransfers();
  ASSERT_EQ(ops.size(), 4u);
  for (const auto& op : ops) {
    EXPECT_EQ(op.src, Tier::kT0);
    EXPECT_EQ(op.dst, Tier::kT1);
    EXPECT_EQ(op.session, 1);
    EXPECT_LT(op.chunk, 4);  // the leading chunks
    cm.OnTransferDone(op.id, true);
  }
  ASSERT_EQ(cm.Acquire(2, 6 * 32, 10, &a), Admission::kOk);
  cm.Release(2, 6 * 32, 11);
  // Session 1 comes back: its 4 leading chunks swap in from T1, layer-wise.
  CacheManager::Acquired b;
  Admission r = cm.Acquire(1, 7 * 32, 20, &b);
  if (r == Admission::kLater) {
    cm.Maintain(0, 20);
    Drain(cm);
    r = cm.Acquire(1, 7 * 32, 20, &b);
  }
  ASSERT_EQ(r, Admission::kOk);
  EXPECT_EQ(b.swap_ins.size(), 4u);
  EXPECT_EQ(b.hit_tokens[1], 4 * 32);
  EXPECT_EQ(b.hit_tokens[0], 2 * 32);
  EXPECT_TRUE(b.recompute.empty());
  for (const auto& op : b.swap_ins) cm.OnTransferDone(op.id, true);
  cm.Release(1, 7 * 32, 21);
  EXPECT_TRUE(cm.CheckInvariants());
}

TEST(CacheManager, RevivingAChunkWhoseDemotionIsInFlight) {
  CacheManager cm({4, 4, 0, 0.0}, Policy("pensieve"));
  cm.AddSession(1, 0);
  ASSERT_EQ(Turn(cm, 1, 4 * 32, 0), Admission::kOk);
  cm.Maintain(2, 5);  // start demoting 2 blocks
  auto ops = cm.TakeTransfers();
  ASSERT_EQ(ops.size(), 2u);
  CacheManager::Acquired a;
  ASSERT_EQ(cm.Acquire(1, 4 * 32, 6, &a), Admission::kOk);  // needs them back at once
  EXPECT_EQ(a.hit_tokens[0], 4 * 32);
  EXPECT_EQ(cm.transitions(ChunkState::kDemoting, ChunkState::kRevived), 2);
  EXPECT_TRUE(cm.CheckInvariants());
  for (const auto& op : ops) cm.OnTransferDone(op.id, true);
  EXPECT_EQ(cm.transitions(ChunkState::kRevived, ChunkState::kResident), 2);
  EXPECT_EQ(cm.Residency(1), std::vector<Tier>(4, Tier::kT0));
  cm.Release(1, 4 * 32, 7);
  EXPECT_TRUE(cm.CheckInvariants());
}

TEST(CacheManager, DiskTierRoundTripAndCorruptReadIsRecomputed) {
  CacheManager cm({4, 2, 8, 0.0}, Policy("pensieve"));
  cm.AddSession(1, 0);
  ASSERT_EQ(Turn(cm, 1, 4 * 32, 0), Admission::kOk);
  cm.AddSession(2, 10);
  CacheManager::Acquired a;
  for (int i = 0; i < 10 && cm.Acquire(2, 4 * 32, 10, &a) != Admission::kOk; i++) {
    cm.Maintain(0, 10);
    Drain(cm);
  }
  ASSERT_TRUE(cm.acquired(2));
  cm.Release(2, 4 * 32, 11);
  cm.Maintain(0, 12);
  Drain(cm);
  auto r = cm.Residency(1);
  int on_disk = 0;
  for (Tier t : r) on_disk += t == Tier::kT2;
  EXPECT_GE(on_disk, 2);
  // Session 1 returns: disk chunks come up first (admission waits); one read fails its checksum.
  CacheManager::Acquired b;
  ASSERT_EQ(cm.Acquire(1, 4 * 32, 20, &b), Admission::kLater);
  cm.Maintain(0, 20);
  auto ops = cm.TakeTransfers();
  bool failed_one = false;
  for (const auto& op : ops) {
    bool ok = !(op.src == Tier::kT2 && !failed_one);
    if (!ok) failed_one = true;
    cm.OnTransferDone(op.id, ok);
  }
  ASSERT_TRUE(failed_one);
  Admission ad;
  for (int i = 0; i < 10 && (ad = cm.Acquire(1, 4 * 32, 20, &b)) != Admission::kOk; i++) {
    cm.Maintain(0, 20);
    Drain(cm);
  }
  ASSERT_EQ(ad, Admission::kOk);
  EXPECT_EQ(b.recompute.size(), 1u);
  EXPECT_GT(b.hit_tokens[2], 0);
  EXPECT_EQ(cm.stats().failed_reads, 1);
  for (const auto& op : b.swap_ins) cm.OnTransferDone(op.id, true);
  cm.Release(1, 4 * 32, 21);
  EXPECT_TRUE(cm.CheckInvariants());
}

// Regression: a chunk loaded from disk and then dropped (here invalidated) and recomputed holds
// KV computed in T0; its next hit is a T0 hit, not a disk hit (the "came from disk" tag once
// outlived the data it described). The state machine clears it on entering kEmpty.
TEST(CacheManager, ADiskHitTagDiesWithTheData) {
  CacheManager cm({4, 0, 4, 0.0}, Policy("pensieve"));
  cm.AddSession(1, 0);
  cm.RestoreChunk(1, 0, Tier::kT2, 2, 32);
  CacheManager::Acquired a;
  ASSERT_EQ(cm.Acquire(1, 32, 1, &a), Admission::kLater);  // loads first
  cm.Maintain(0, 1);
  Drain(cm);
  EXPECT_EQ(cm.transitions(ChunkState::kLoading, ChunkState::kResident), 1);
  EXPECT_EQ(cm.Residency(1), std::vector<Tier>{Tier::kT0});
  cm.Invalidate(1, 0);  // e.g. composed from and never computed
  ASSERT_EQ(cm.Acquire(1, 40, 2, &a), Admission::kOk);
  EXPECT_EQ(a.recompute, std::vector<int>{0});
  EXPECT_EQ(a.hit_tokens[2], 0);
  cm.Release(1, 40, 3);
  ASSERT_EQ(cm.Acquire(1, 50, 4, &a), Admission::kOk);
  EXPECT_EQ(a.hit_tokens[0], 40);
  EXPECT_EQ(a.hit_tokens[2], 0);
  cm.Release(1, 50, 5);
  EXPECT_TRUE(cm.CheckInvariants());
}

TEST(CacheManager, ForkSharesFullChunks) {
  CacheManager cm({16, 0, 0, 0.0}, Policy("pensieve"));
  cm.AddSession(1, 0);
  CacheManager::Acquired a;
  ASSERT_EQ(cm.Acquire(1, 80, 0, &a), Admission::kOk);
  cm.Release(1, 80, 0);
  auto copy = cm.Fork(1, 2, 80, 1);
  ASSERT_TRUE(copy.has_value());  // the partial chunk is copied, not shared
  EXPECT_EQ(copy->src_block, a.block_table[2]);
  CacheManager::Acquired b;
  ASSERT_EQ(cm.Acquire(2, 100, 2, &b), Admission::kOk);
  EXPECT_EQ(b.block_table[0], a.block_table[0]);
  EXPECT_EQ(b.block_table[1], a.block_table[1]);
  EXPECT_EQ(b.block_table[2], copy->dst_block);
  EXPECT_NE(b.block_table[2], a.block_table[2]);
  EXPECT_TRUE(b.recompute.empty());
  cm.Release(2, 100, 3);
  cm.RemoveSession(1);
  EXPECT_EQ(cm.Residency(2)[0], Tier::kT0);
  EXPECT_EQ(cm.used_blocks(Tier::kT0), 4);
  EXPECT_TRUE(cm.CheckInvariants());
}

// A fork of a session while a turn runs on it (acquired): dst shares the full chunks below the
// fork point, which the turn never writes, and gets its own copy of the partial chunk the turn is
// writing past the fork point; the turn's chunks past its KV at Acquire are never dst's. A chunk the
// turn is recomputing is shared but not read half-written: dst recomputes it while it is filling,
// and hits it once the turn's Release finished it.
TEST(CacheManager, ForkOfAnAcquiredSessionTakesOnlyItsKvBeforeTheTurn) {
  CacheManager cm({16, 0, 0, 0.0}, Policy("pensieve"));
  cm.AddSession(1, 0);
  ASSERT_EQ(Turn(cm, 1, 80, 0), Admission::kOk);
  cm.Invalidate(1, 0);  // its KV gone: the next turn recomputes chunk 0
  CacheManager::Acquired a;
  ASSERT_EQ(cm.Acquire(1, 150, 1, &a), Admission::kOk);  // the turn: positions 80..149
  ASSERT_EQ(a.recompute, std::vector<int>{0});
  EXPECT_EQ(cm.kv_tokens(1), 80);
  auto copy = cm.Fork(1, 2, 70, 2);  // while acquired
  ASSERT_TRUE(copy.has_value());
  EXPECT_EQ(copy->src_block, a.block_table[2]);  // chunk 2 holds positions 64..69 (and the turn's 80..)
  EXPECT_TRUE(cm.CheckInvariants());
  CacheManager::Acquired b;
  ASSERT_EQ(cm.Acquire(2, 75, 3, &b), Admission::kOk);  // both run
  ASSERT_EQ(b.block_table.size(), 3u);
  EXPECT_EQ(b.block_table[0], a.block_table[0]);
  EXPECT_EQ(b.block_table[1], a.block_table[1]);
  EXPECT_EQ(b.block_table[2], copy->dst_block);
  EXPECT_NE(b.block_table[2], a.block_table[2]);
  EXPECT_EQ(b.recompute, std::vector<int>{0});  // chunk 0 is filling: never read half-written
  EXPECT_EQ(b.hit_tokens[0], 70 - 32);
  cm.Release(2, 75, 4);
  cm.Release(1, 150, 5);
  EXPECT_TRUE(cm.CheckInvariants());
  // The turn finished chunk 0: a second fork's turn reads it.
  ASSERT_EQ(cm.Fork(1, 3, 64, 6), std::nullopt);
  CacheManager::Acquired c;
  ASSERT_EQ(cm.Acquire(3, 70, 7, &c), Admission::kOk);
  EXPECT_TRUE(c.recompute.empty());
  EXPECT_EQ(c.hit_tokens[0], 64);
  EXPECT_EQ(c.block_table[0], a.block_table[0]);
  cm.Release(3, 70, 8);
  EXPECT_TRUE(cm.CheckInvariants());
}

// Fork with T0 full and no lower tier: a chunk chosen by the policy is dropped to make room, and
// the fork's partial chunk is copied at once instead of being recomputed.
TEST(CacheManager, ForkWithAFullComputeTierEvictsToKeepThePartialChunk) {
  CacheManager cm({8, 0, 0, 0.0}, Policy("pensieve"));
  cm.AddSession(1, 0);
  CacheManager::Acquired a;
  ASSERT_EQ(cm.Acquire(1, 80, 0, &a), Admission::kOk);
  cm.Release(1, 80, 0);
  cm.AddSession(2, 1);
  ASSERT_EQ(Turn(cm, 2, 5 * 32, 1), Admission::kOk);
  ASSERT_EQ(cm.used_blocks(Tier::kT0), 8);
  auto copy = cm.Fork(1, 3, 80, 10);
  ASSERT_TRUE(copy.has_value());
  EXPECT_EQ(copy->src, Tier::kT0);
  EXPECT_EQ(copy->src_block, a.block_table[2]);
  EXPECT_EQ(copy->dst, Tier::kT0);
  EXPECT_EQ(cm.stats().drops, 1);  // session 2's leading chunk (idle longest) made room
  EXPECT_EQ(cm.Residency(2)[0], Tier::kNone);
  EXPECT_EQ(cm.stats().cow_copies, 1);
  EXPECT_EQ(cm.stats().cow_recomputes, 0);
  EXPECT_TRUE(cm.CheckInvariants());
  CacheManager::Acquired b;
  ASSERT_EQ(cm.Acquire(3, 90, 11, &b), Admission::kOk);
  EXPECT_TRUE(b.recompute.empty());
  EXPECT_EQ(b.hit_tokens[0], 80);
  EXPECT_EQ(b.block_table[2], copy->dst_block);
  cm.Release(3, 90, 12);
  EXPECT_TRUE(cm.CheckInvariants());
}

// Fork with T0 full and a host tier: T0 room is being made (a demotion), and meanwhile the
// partial chunk is copied into T1 in the background; the fork's first turn waits for it and
// swaps it in.
TEST(CacheManager, ForkWithAFullComputeTierCopiesThePartialChunkIntoTheHostTier) {
  CacheManager cm({8, 8, 0, 0.0}, Policy("pensieve"));
  cm.AddSession(1, 0);
  CacheManager::Acquired a;
  ASSERT_EQ(cm.Acquire(1, 80, 0, &a), Admission::kOk);
  cm.Release(1, 80, 0);
  cm.AddSession(2, 1);
  ASSERT_EQ(Turn(cm, 2, 5 * 32, 1), Admission::kOk);
  ASSERT_EQ(cm.used_blocks(Tier::kT0), 8);
  EXPECT_FALSE(cm.Fork(1, 3, 80, 10).has_value());
  EXPECT_EQ(cm.stats().cow_copies, 1);
  EXPECT_EQ(cm.stats().cow_recomputes, 0);
  auto ops = cm.TakeTransfers();
  const TransferOp* copy = nullptr;
  for (const auto& op : ops) {
    if (op.session == 3) copy = &op;
  }
  ASSERT_NE(copy, nullptr);
  EXPECT_EQ(copy->src, Tier::kT0);
  EXPECT_EQ(copy->src_block, a.block_table[2]);
  EXPECT_EQ(copy->dst, Tier::kT1);
  EXPECT_EQ(copy->chunk, 2);
  CacheManager::Acquired b;
  EXPECT_EQ(cm.Acquire(3, 90, 11, &b), Admission::kLater);  // the copy has not landed
  EXPECT_EQ(cm.Acquire(1, 90, 11, &b), Admission::kLater);  // nor may the source move or be written
  EXPECT_TRUE(cm.CheckInvariants());
  for (const auto& op : ops) cm.OnTransferDone(op.id, true);
  EXPECT_EQ(cm.Residency(3)[2], Tier::kT1);
  ASSERT_EQ(cm.Acquire(3, 90, 11, &b), Admission::kOk);
  EXPECT_TRUE(b.recompute.empty());
  EXPECT_EQ(b.hit_tokens[0], 64);
  EXPECT_EQ(b.hit_tokens[1], 16);
  ASSERT_EQ(b.swap_ins.size(), 1u);
  EXPECT_EQ(b.swap_ins[0].src_block, copy->dst_block);
  for (const auto& op : b.swap_ins) cm.OnTransferDone(op.id, true);
  cm.Release(3, 90, 12);
  EXPECT_TRUE(cm.CheckInvariants());
}

// A fork whose partial chunk is on disk gets its own copy read up from the slot (named for the
// owner the slot was written for); the fork's turn counts it as a disk hit. Shared chunks read
// from disk also name the slot's writer, whichever owner brings them up.
TEST(CacheManager, ForkCopiesAPartialChunkUpFromTheDiskTier) {
  CacheManager cm({8, 2, 8, 0.0}, Policy("pensieve"));
  cm.AddSession(1, 0);
  for (int c = 0; c < 3; c++) cm.RestoreChunk(1, c, Tier::kT2, c, 80);
  EXPECT_FALSE(cm.Fork(1, 3, 80, 1).has_value());
  auto ops = cm.TakeTransfers();
  ASSERT_EQ(ops.size(), 1u);
  EXPECT_EQ(ops[0].src, Tier::kT2);
  EXPECT_EQ(ops[0].src_block, 2);
  EXPECT_EQ(ops[0].dst, Tier::kT0);
  EXPECT_EQ(ops[0].session, 1);
  EXPECT_EQ(ops[0].chunk, 2);
  cm.OnTransferDone(ops[0].id, true);
  CacheManager::Acquired b;
  ASSERT_EQ(cm.Acquire(3, 90, 2, &b), Admission::kLater);  // the shared chunks come up from disk
  cm.Maintain(0, 2);
  for (const auto& op : cm.TakeTransfers()) {
    EXPECT_EQ(op.session, 1);
    cm.OnTransferDone(op.id, true);
  }
  ASSERT_EQ(cm.Acquire(3, 90, 2, &b), Admission::kOk);
  EXPECT_TRUE(b.recompute.empty());
  EXPECT_EQ(b.hit_tokens[2], 80);
  EXPECT_EQ(cm.stats().cow_copies, 1);
  cm.Release(3, 90, 3);
  EXPECT_TRUE(cm.CheckInvariants());
}

// Only when nothing can be evicted (everything else is pinned, no lower tier) is the partial
// chunk recomputed, and that is counted.
TEST(CacheManager, ForkRecomputesThePartialChunkOnlyWhenNothingCanBeEvicted) {
  CacheManager cm({8, 0, 0, 0.0}, Policy("pensieve"));
  cm.AddSession(1, 0);
  ASSERT_EQ(Turn(cm, 1, 16, 0), Admission::kOk);
  cm.AddSession(2, 1);
  CacheManager::Acquired running;
  ASSERT_EQ(cm.Acquire(2, 7 * 32, 1, &running), Admission::kOk);
  EXPECT_FALSE(cm.Fork(1, 3, 16, 5).has_value());
  EXPECT_EQ(cm.stats().cow_copies, 0);
  EXPECT_EQ(cm.stats().cow_recomputes, 1);
  EXPECT_EQ(cm.Residency(1), std::vector<Tier>{Tier::kT0});
  EXPECT_EQ(cm.Residency(3), std::vector<Tier>{Tier::kNone});
  EXPECT_TRUE(cm.CheckInvariants());
  cm.Release(2, 7 * 32, 6);
  CacheManager::Acquired b;
  ASSERT_EQ(Admit(cm, 3, 20, 7, &b), Admission::kOk);
  EXPECT_EQ(b.recompute, std::vector<int>{0});
  cm.Release(3, 20, 8);
  EXPECT_TRUE(cm.CheckInvariants());
}

// Truncating inside a chunk shared with a fork: the session gets its own copy of the kept
// positions (the fork keeps the original), and its next turn hits them instead of recomputing.
TEST(CacheManager, TruncateInsideASharedChunkKeepsTheValidPrefix) {
  CacheManager cm({16, 0, 0, 0.0}, Policy("pensieve"));
  cm.AddSession(1, 0);
  CacheManager::Acquired a;
  ASSERT_EQ(cm.Acquire(1, 96, 0, &a), Admission::kOk);
  cm.Release(1, 96, 0);
  EXPECT_FALSE(cm.Fork(1, 2, 96, 1).has_value());  // whole chunks only: all shared
  cm.Truncate(1, 70, 2);
  EXPECT_EQ(cm.kv_tokens(1), 70);
  EXPECT_EQ(cm.stats().cow_copies, 1);
  auto ops = cm.TakeTransfers();
  ASSERT_EQ(ops.size(), 1u);
  EXPECT_EQ(ops[0].src, Tier::kT0);
  EXPECT_EQ(ops[0].src_block, a.block_table[2]);
  EXPECT_EQ(ops[0].dst, Tier::kT0);
  EXPECT_EQ(ops[0].session, 1);
  EXPECT_EQ(ops[0].chunk, 2);
  CacheManager::Acquired b, c;
  EXPECT_EQ(cm.Acquire(1, 80, 3, &b), Admission::kLater);   // its copy is in flight
  // The source is being read, but it is a full T0 chunk of 2's: pinned where it is and never
  // written, so 2 is admitted meanwhile.
  ASSERT_EQ(cm.Acquire(2, 100, 3, &c), Admission::kOk);
  EXPECT_EQ(c.block_table[2], a.block_table[2]);
  EXPECT_TRUE(cm.CheckInvariants());
  cm.Release(2, 100, 3);
  cm.OnTransferDone(ops[0].id, true);
  ASSERT_EQ(cm.Acquire(1, 80, 3, &b), Admission::kOk);
  EXPECT_TRUE(b.recompute.empty());
  EXPECT_EQ(b.hit_tokens[0], 70);
  EXPECT_EQ(b.block_table[0], a.block_table[0]);
  EXPECT_EQ(b.block_table[1], a.block_table[1]);
  EXPECT_EQ(b.block_table[2], ops[0].dst_block);
  cm.Release(1, 80, 4);
  ASSERT_EQ(cm.Acquire(2, 101, 5, &c), Admission::kOk);
  EXPECT_TRUE(c.recompute.empty());
  EXPECT_EQ(c.hit_tokens[0], 100);
  EXPECT_EQ(c.block_table[2], a.block_table[2]);
  cm.Release(2, 101, 6);
  EXPECT_TRUE(cm.CheckInvariants());
}

// With T0 full the truncated session's copy goes to T1; a copy that fails leaves the chunk to be
// recomputed (counted). The source outlives its last owner until the copy reading it is done.
TEST(CacheManager, TruncateCopyIntoTheHostTierAndASourceThatOutlivesItsOwners) {
  CacheManager cm({4, 4, 0, 0.0}, Policy("pensieve"));
  cm.AddSession(1, 0);
  ASSERT_EQ(Turn(cm, 1, 96, 0), Admission::kOk);
  EXPECT_FALSE(cm.Fork(1, 2, 96, 1).has_value());
  cm.AddSession(3, 2);
  ASSERT_EQ(Turn(cm, 3, 32, 2), Admission::kOk);
  ASSERT_EQ(cm.used_blocks(Tier::kT0), 4);
  cm.Truncate(1, 70, 3);
  auto ops = cm.TakeTransfers();
  const TransferOp* copy = nullptr;
  for (const auto& op : ops) {
    if (op.session == 1 && op.chunk == 2) copy = &op;
  }
  ASSERT_NE(copy, nullptr);
  EXPECT_EQ(copy->dst, Tier::kT1);
  cm.RemoveSession(2);  // the shared chunk's last other owner goes; its block stays until the copy is done
  EXPECT_TRUE(cm.CheckInvariants());
  const int32_t used = cm.used_blocks(Tier::kT0);
  for (const auto& op : ops) cm.OnTransferDone(op.id, op.id != copy->id);
  EXPECT_EQ(cm.stats().cow_recomputes, 1);
  EXPECT_LT(cm.used_blocks(Tier::kT0), used);
  EXPECT_TRUE(cm.CheckInvariants());
  CacheManager::Acquired b;
  Admission ad;
  for (int i = 0; i < 10 && (ad = cm.Acquire(1, 80, 4, &b)) != Admission::kOk; i++) {
    cm.Maintain(0, 4);
    Drain(cm);
  }
  ASSERT_EQ(ad, Admission::kOk);
  EXPECT_EQ(b.recompute.back(), 2);
  for (const auto& op : b.swap_ins) cm.OnTransferDone(op.id, true);
  cm.Release(1, 80, 5);
  EXPECT_TRUE(cm.CheckInvariants());
}

// Random turns, tier sizes and transfer completions (in and out of order, some failing) never
// break the bookkeeping, never evict a pinned chunk, and never hand the reserve to admissions.
TEST(CacheManager, RandomOperationsKeepInvariants) {
  for (uint64_t seed = 1; seed <= 20; seed++) {
    Rng rng(seed);
    CacheConfig cfg{int32_t(8 + rng.Next() % 24), int32_t(rng.Next() % 16), int32_t(rng.Next() % 16), 0.1};
    CacheManager cm(cfg, Policy(seed % 2 ? "pensieve" : "lru"));
    std::vector<int> len(6, 0);
    std::vector<TransferOp> pending;
    for (SessionId s = 0; s < 6; s++) cm.AddSession(s, 0);
    for (int step = 0; step < 300; step++) {
      double now = step;
      SessionId s = SessionId(rng.Next() % 6);
      int want = len[s] + 1 + int(rng.Next() % 80);
      CacheManager::Acquired a;
      Admission r = cm.Acquire(s, want, now, &a);
      if (r == Admission::kOk) {
        ASSERT_LE(cm.used_blocks(Tier::kT0), cfg.t0_blocks);
        for (const auto& op : a.swap_ins) cm.OnTransferDone(op.id, true);
        if (rng.Next() % 4 == 0 && cm.Grow(s, want + 40, &a.block_table)) want += 40;
        // Pinned chunks stay in T0 while others make room.
        cm.Maintain(cfg.t0_blocks / 2, now);
        auto res = cm.Residency(s);
        for (size_t i = 0; i < a.block_table.size(); i++) ASSERT_EQ(res[i], Tier::kT0);
        if (rng.Next() % 5 == 0) {
          cm.Suspend(s, want, now);
        } else {
          cm.Release(s, want, now);
        }
        len[s] = want;
      } else if (r == Admission::kImpossible) {
        cm.RemoveSession(s);
        cm.AddSession(s, now);
        len[s] = 0;
      } else if (rng.Next() % 4) {  // the engine's upkeep; sometimes skipped (Acquire twice in a row)
        cm.Maintain(rng.Next() % 2 ? 0 : cfg.t0_blocks / 4, now);
      }
      for (auto& op : cm.TakeTransfers()) pending.push_back(op);
      while (!pending.empty() && rng.Next() % 3) {
        size_t i = rng.Next() % pending.size();
        cm.OnTransferDone(pending[i].id, rng.Next() % 10 != 0);
        pending.erase(pending.begin() + i);
      }
      ASSERT_TRUE(cm.CheckInvariants()) << "seed " << seed << " step " << step;
    }
  }
}


// Two forks share chunks whose KV was dropped. Both turns run at once: the second does not take
// the first's half-recomputed chunks as hits but recomputes them too. When one stops inside a
// shared chunk it was recomputing (a suspension), it keeps what it computed in a chunk of its
// own, and the other owner, which takes the chunk as whole, recomputes it.
TEST(CacheManager, SharedChunksBeingRecomputedAreNeverServedHalfWritten) {
  CacheManager cm({16, 0, 0, 0.0}, Policy("pensieve"));
  cm.AddSession(1, 0);
  cm.RestoreLength(1, 96);  // three chunks, no KV
  EXPECT_FALSE(cm.Fork(1, 2, 96, 0).has_value());
  CacheManager::Acquired a, b;
  ASSERT_EQ(cm.Acquire(1, 100, 1, &a), Admission::kOk);
  EXPECT_EQ(a.recompute, (std::vector<int>{0, 1, 2}));
  ASSERT_EQ(cm.Acquire(2, 100, 1, &b), Admission::kOk);
  EXPECT_EQ(b.recompute, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(b.hit_tokens[0], 0);
  EXPECT_EQ(b.block_table[0], a.block_table[0]);  // the same block: both write the same KV
  cm.Release(2, 40, 2);  // 2 stops inside chunk 1 while 1 is still recomputing it
  EXPECT_EQ(cm.Residency(2), (std::vector<Tier>{Tier::kT0, Tier::kNone}));
  EXPECT_TRUE(cm.CheckInvariants());
  cm.Release(1, 100, 3);
  CacheManager::Acquired c;
  ASSERT_EQ(cm.Acquire(2, 50, 4, &c), Admission::kOk);
  EXPECT_EQ(c.recompute, std::vector<int>{1});
  EXPECT_EQ(c.hit_tokens[0], 32);
  cm.Release(2, 50, 5);
  EXPECT_TRUE(cm.CheckInvariants());

  // Only session 3 recomputes; it stops inside chunk 1.
  cm.AddSession(3, 6);
  cm.RestoreLength(3, 96);
  EXPECT_FALSE(cm.Fork(3, 4, 96, 6).has_value());
  CacheManager::Acquired d;
  ASSERT_EQ(cm.Acquire(3, 100, 7, &d), Admission::kOk);
  cm.Release(3, 40, 8);
  EXPECT_EQ(cm.Residency(3), (std::vector<Tier>{Tier::kT0, Tier::kT0}));  // chunk 1 is its own now
  EXPECT_EQ(cm.Residency(4), (std::vector<Tier>{Tier::kT0, Tier::kNone, Tier::kNone}));
  EXPECT_TRUE(cm.CheckInvariants());
  CacheManager::Acquired e, f;
  ASSERT_EQ(cm.Acquire(3, 50, 9, &e), Admission::kOk);
  EXPECT_TRUE(e.recompute.empty());
  EXPECT_EQ(e.hit_tokens[0], 40);
  EXPECT_EQ(e.block_table[1], d.block_table[1]);
  cm.Release(3, 50, 10);
  ASSERT_EQ(cm.Acquire(4, 100, 11, &f), Admission::kOk);
  EXPECT_EQ(f.recompute, (std::vector<int>{1, 2}));
  EXPECT_EQ(f.hit_tokens[0], 32);
  cm.Release(4, 100, 12);
  EXPECT_TRUE(cm.CheckInvariants());
}

// A chunk acquired for recompute and then forgotten without being computed (as selective
// context's reuse mode does with its source) is forgotten for every owner that shares it.
TEST(CacheManager, InvalidatingASharedChunkDropsItForEveryOwner) {
  CacheManager cm({16, 0, 0, 0.0}, Policy("pensieve"));
  cm.AddSession(1, 0);
  cm.RestoreLength(1, 64);
  EXPECT_FALSE(cm.Fork(1, 2, 64, 0).has_value());
  CacheManager::Acquired a;
  ASSERT_EQ(cm.Acquire(1, 64, 1, &a), Admission::kOk);
  EXPECT_EQ(a.recompute, (std::vector<int>{0, 1}));
  cm.Release(1, 64, 2);
  cm.Invalidate(1, 0);
  cm.Invalidate(1, 1);
  EXPECT_EQ(cm.Residency(1), (std::vector<Tier>{Tier::kNone, Tier::kNone}));
  EXPECT_EQ(cm.Residency(2), (std::vector<Tier>{Tier::kNone, Tier::kNone}));
  EXPECT_EQ(cm.used_blocks(Tier::kT0), 0);
  CacheManager::Acquired b;
  ASSERT_EQ(cm.Acquire(2, 70, 3, &b), Admission::kOk);
  EXPECT_EQ(b.recompute, (std::vector<int>{0, 1}));
  cm.Release(2, 70, 4);
  EXPECT_TRUE(cm.CheckInvariants());
}

// A model of the KV data for property tests. The "KV" of a position is a hash of its session's
// tokens up to it (what real KV depends on); tier blocks hold such values and transfers copy them,
// at a random time between being taken and reported done. A chunk served as a hit is right exactly
// when its T0 block holds the values its session's own log implies.
class KvModel {
 public:
  explicit KvModel(CacheManager& cm) : cm_(cm) {}

  std::vector<uint64_t>& log(SessionId s) { return logs_[s]; }  // [kv] expected value per position
  void Forget(SessionId s) { logs_.erase(s); }
  void Append(SessionId s, int n, Rng& rng) {
    std::vector<uint64_t>& l = logs_[s];
    while (static_cast<int>(l.size()) < n) {
      uint64_t h = (l.empty() ? 0x51ed270b27a3f1a5ull : l.back()) ^ (rng.Next() | 1);
      l.push_back((h * 0x9e3779b97f4a7c15ull) | 1);  // never 0, the value of a block never written
    }
  }
  void CopyNow(const TransferOp& op) {
    if (op.dst == Tier::kNone) {  // a copy out reads the block: it must still hold the chunk it named
      if (blocks_[{int(op.src), op.src_block}] != read_.at(op.id)) bad_reads++;
      return;
    }
    blocks_[{int(op.dst), op.dst_block}] = blocks_[{int(op.src), op.src_block}];
  }
  // Copies out of s's full chunks (PlanCopiesOut), each read at a random time before it is done:
  // what it reads must be the values s's log gave the chunk when it was planned.
  void TakeCopiesOut(SessionId s, const std::vector<TransferOp>& ops, Rng& rng) {
    for (const TransferOp& op : ops) {
      Values want;
      for (int i = 0; i < kBlockTokens; i++) want[i] = logs_[s][op.chunk * kBlockTokens + i];
      read_[op.id] = want;
      const bool now = rng.Next() % 2;
      if (now) CopyNow(op);
      pending_.push_back({op, now});
    }
    copies_out += static_cast<int64_t>(ops.size());
  }
  int64_t copies_out = 0, bad_reads = 0;
  // Takes the queued transfers; half of them copy at once, the others when they complete.
  void Take(Rng& rng) {
    for (const TransferOp& op : cm_.TakeTransfers()) {
      const bool now = rng.Next() % 2;
      if (now) CopyNow(op);
      pending_.push_back({op, now});
    }
  }
  // Completes a random subset in random order; a tenth fail (no data is copied).
  void CompleteSome(Rng& rng) {
    while (!pending_.empty() && rng.Next() % 3) {
      size_t i = rng.Next() % pending_.size();
      Complete(i, rng.Next() % 10 != 0);
    }
  }
  void CompleteAll() {
    for (int round = 0; round < 16 && (Take0(), !pending_.empty()); round++) {
      while (!pending_.empty()) Complete(0, true);
    }
  }
  // After a successful Acquire of s (kv_before positions had KV; n are acquired): checks that
  // every hit holds the right values. *queries gets the positions the forward pass feeds, in its
  // order (recomputed chunks, then new positions); the caller fills a prefix of them.
  ::testing::AssertionResult Check(SessionId s, int kv_before, int n, const CacheManager::Acquired& a,
                                   std::vector<int>* queries) {
    for (const TransferOp& op : a.swap_ins) {
      CopyNow(op);
      cm_.OnTransferDone(op.id, true);
    }
    const std::vector<uint64_t>& l = logs_[s];
    for (int c = 0; c * kBlockTokens < kv_before; c++) {
      if (std::find(a.recompute.begin(), a.recompute.end(), c) != a.recompute.end()) continue;
      const Values& v = blocks_[{0, a.block_table[c]}];
      for (int p = c * kBlockTokens; p < std::min(kv_before, (c + 1) * kBlockTokens); p++) {
        if (v[p % kBlockTokens] != l[p]) {
          return ::testing::AssertionFailure() << "session " << s << " position " << p << " served wrong KV";
        }
      }
    }
    queries->clear();
    for (int c : a.recompute) {
      for (int p = c * kBlockTokens; p < std::min(kv_before, (c + 1) * kBlockTokens); p++) queries->push_back(p);
    }
    for (int p = kv_before; p < n; p++) queries->push_back(p);
    return ::testing::AssertionSuccess();
  }
  void Fill(SessionId s, const std::vector<int32_t>& table, const int* pos, size_t n) {
    for (size_t i = 0; i < n; i++) blocks_[{0, table[pos[i] / kBlockTokens]}][pos[i] % kBlockTokens] = logs_[s][pos[i]];
  }

 private:
  using Values = std::array<uint64_t, kBlockTokens>;
  void Take0() {
    for (const TransferOp& op : cm_.TakeTransfers()) pending_.push_back({op, false});
  }
  void Complete(size_t i, bool ok) {
    auto [op, copied] = pending_[i];
    pending_.erase(pending_.begin() + i);
    if (ok && !copied) CopyNow(op);
    cm_.OnTransferDone(op.id, ok);
  }
  CacheManager& cm_;
  std::map<std::pair<int, int32_t>, Values> blocks_;  // (tier, block) -> values
  std::map<uint64_t, Values> read_;                    // copy out op id -> the values it must read
  std::map<SessionId, std::vector<uint64_t>> logs_;
  std::vector<std::pair<TransferOp, bool>> pending_;  // taken, not done; copied already?
};

// The exact-KV model around the shared random-operation driver: every Acquire checks the hits,
// turns fill their queries (a quarter stop part way), forks copy, transfers copy at a random time.
class ExactKvHooks : public kvtest::RandomOpsHooks {
 public:
  explicit ExactKvHooks(CacheManager& cm) : kv_(cm) {}
  int Admitted(CacheManager&, SessionId s, int have, int want, CacheManager::Acquired& a, Rng& rng) override {
    kv_.Append(s, want, rng);
    std::vector<int> queries;
    const ::testing::AssertionResult served = kv_.Check(s, have, want, a, &queries);
    if (!served) {
      ADD_FAILURE() << served.message();
      return want;
    }
    for (int c = 0; c * kBlockTokens < have; c++) {
      hits += std::find(a.recompute.begin(), a.recompute.end(), c) == a.recompute.end();
    }
    if (rng.Next() % 4 == 0) {  // stopped part way: positions [0, queries[cut]) hold KV
      const size_t cut = rng.Next() % queries.size();
      kv_.Fill(s, a.block_table, queries.data(), cut);
      stopped += queries[cut] < have;
      return queries[cut];
    }
    kv_.Fill(s, a.block_table, queries.data(), queries.size());
    return want;
  }
  void Grown(SessionId s, int from, int to, const std::vector<int32_t>& table, Rng& rng) override {
    kv_.Append(s, to, rng);
    std::vector<int> grown;
    for (int p = from; p < to; p++) grown.push_back(p);
    kv_.Fill(s, table, grown.data(), grown.size());
  }
  void Forked(SessionId src, SessionId dst, int at, const std::optional<TransferOp>& copy) override {
    if (copy) kv_.CopyNow(*copy);
    kv_.log(dst).assign(kv_.log(src).begin(), kv_.log(src).begin() + at);
  }
  void Truncated(SessionId s, int to) override { kv_.log(s).resize(to); }
  void Removed(SessionId s) override { kv_.Forget(s); }
  void CopiesOut(SessionId s, const std::vector<TransferOp>& ops, Rng& rng) override { kv_.TakeCopiesOut(s, ops, rng); }
  void Transfers(CacheManager&, Rng& rng) override {
    kv_.Take(rng);
    kv_.CompleteSome(rng);
  }
  void CompleteAll(CacheManager&) override { kv_.CompleteAll(); }

  int64_t hits = 0, stopped = 0;
  KvModel kv_;
};

// Random turns (some stopped part way, as a suspension does), forks, truncations, invalidations
// and removals over random tiers, with transfers completing in and out of order (some failing):
// the bookkeeping stays consistent (every record's fields fit its state), and every chunk served
// as a hit holds exactly the KV its session's log implies (copy-on-write never lets one session's
// writes reach another's chunks, no copy reads a block that was reused, and a shared chunk left
// half-recomputed is not served). Copies out of the tiers (write-behind) read, whenever they run
// before being reported, the KV of the chunk they were planned for. Every edge of the chunk
// lifecycle is taken.
TEST(CacheManager, RandomForksAndTruncationsServeExactKv) {
  int64_t cow_copies = 0, hits = 0, stopped = 0, copies_out = 0;
  int64_t edges[kChunkStates][kChunkStates] = {};
  for (uint64_t seed = 1; seed <= 200; seed++) {
    Rng rng(seed * 1009);
    CacheConfig cfg{int32_t(6 + rng.Next() % 20), int32_t(rng.Next() % 3 ? rng.Next() % 12 : 0),
                    int32_t(rng.Next() % 2 ? rng.Next() % 16 : 0), 0.1};
    CacheManager cm(cfg, Policy(seed % 2 ? "pensieve" : "lru"));
    ExactKvHooks hooks(cm);
    kvtest::RandomOpsConfig rc;
    rc.steps = 400;
    const std::vector<SessionId> live = kvtest::RunRandomOps(cm, rc, hooks, rng, "seed " + std::to_string(seed));
    ASSERT_FALSE(HasFailure());
    cow_copies += cm.stats().cow_copies;
    hits += hooks.hits;
    stopped += hooks.stopped;
    copies_out += hooks.kv_.copies_out;
    EXPECT_EQ(hooks.kv_.bad_reads, 0) << "seed " << seed << ": a copy out read a block that moved or was rewritten";
    // Everything torn down: no block or record is left behind.
    hooks.CompleteAll(cm);
    for (SessionId s : live) cm.RemoveSession(s);
    hooks.CompleteAll(cm);
    ASSERT_TRUE(cm.CheckInvariants()) << "seed " << seed;
    for (Tier t : {Tier::kT0, Tier::kT1, Tier::kT2}) EXPECT_EQ(cm.used_blocks(t), 0) << "seed " << seed;
    for (int f = 0; f < kChunkStates; f++) {
      for (int t = 0; t < kChunkStates; t++) edges[f][t] += cm.transitions(ChunkState(f), ChunkState(t));
    }
  }
  EXPECT_GT(cow_copies, 100);
  EXPECT_GT(hits, 1000);
  EXPECT_GT(stopped, 50);  // stopped inside recomputed history
  EXPECT_GT(copies_out, 1000);
  for (int i = 0; i < kChunkEdgeCount; i++) {
    const ChunkEdge& e = kChunkEdges[i];
    EXPECT_GT(edges[int(e.from)][int(e.to)], 0)
        << ChunkStateName(e.from) << " -> " << ChunkStateName(e.to) << " (" << e.why << ") never taken";
  }
}

}  // namespace
}  // namespace mnemo

namespace mnemo {
namespace {

// Fills from outside the tiers (the remote tier): a restored session's dropped chunks wait as
// copy targets, Acquire waits for them, a filled chunk is a remote hit and a failed one recomputed.
TEST(CacheFills, FillsOfDroppedChunksAreWaitedForAndCounted) {
  CacheManager cm(CacheConfig{16, 8, 0, 0.1}, Policy("pensieve"));
  cm.AddSession(1, 0);
  cm.RestoreLength(1, 100);  // chunks 0..3 with no KV (3 partial)
  const auto ops = cm.PlanFills(1, {0, 1, 3}, 1.0);  // chunk 3 is partial: not filled
  ASSERT_EQ(ops.size(), 2u);
  EXPECT_EQ(ops[0].src, Tier::kNone);
  EXPECT_EQ(ops[0].dst, Tier::kT0);
  EXPECT_EQ(ops[0].chunk, 0);
  EXPECT_EQ(ops[1].chunk, 1);
  EXPECT_TRUE(cm.CheckInvariants());
  EXPECT_EQ(cm.transitions(ChunkState::kEmpty, ChunkState::kCopyTarget), 2);
  CacheManager::Acquired a;
  EXPECT_EQ(cm.Acquire(1, 110, 1.0, &a), Admission::kLater) << "fills in flight are waited for";
  EXPECT_TRUE(cm.PlanFills(1, {0, 1}, 1.0).empty()) << "a chunk already being filled is not planned again";
  cm.OnTransferDone(ops[0].id, true);
  cm.OnTransferDone(ops[1].id, false);  // a miss
  EXPECT_TRUE(cm.CheckInvariants());
  ASSERT_EQ(cm.Acquire(1, 110, 2.0, &a), Admission::kOk);
  EXPECT_EQ(a.remote_tokens, 32);
  EXPECT_EQ(a.hit_tokens[0], 0);
  EXPECT_EQ(a.recompute, (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(cm.stats().fills, 1);
  EXPECT_EQ(cm.stats().failed_fills, 1);
  cm.Release(1, 110, 2.0);
  EXPECT_TRUE(cm.CheckInvariants());
  CacheManager::Acquired again;
  ASSERT_EQ(cm.Acquire(1, 111, 3.0, &again), Admission::kOk);
  EXPECT_EQ(again.remote_tokens, 0) << "a remote hit is counted once";
  EXPECT_EQ(again.hit_tokens[0], 110);
}

TEST(CacheFills, FillsPastTheKvExtendItAndATruncationUndoesIt) {
  CacheManager cm(CacheConfig{8, 0, 0, 0.1}, Policy("pensieve"));
  cm.AddSession(1, 0);
  const auto ops = cm.PlanFills(1, {0, 1}, 1.0);  // a new session: its prompt's chunks
  ASSERT_EQ(ops.size(), 2u);
  EXPECT_EQ(cm.kv_tokens(1), 64);
  cm.Truncate(1, 10);  // the turn ended before admission: back to its log
  EXPECT_EQ(cm.kv_tokens(1), 10);
  EXPECT_TRUE(cm.CheckInvariants());
  cm.OnTransferDone(ops[1].id, true);  // a fill of a chunk nobody holds any more: its block is freed
  cm.OnTransferDone(ops[0].id, true);
  EXPECT_TRUE(cm.CheckInvariants());
  EXPECT_EQ(cm.used_blocks(Tier::kT0), 1);  // chunk 0, partial now, keeps the positions it holds
  // A KV ending inside a chunk is not extended (its last chunk would claim positions it lacks).
  cm.AddSession(2, 0);
  cm.RestoreLength(2, 40);
  EXPECT_TRUE(cm.PlanFills(2, {2}, 1.0).empty());
  EXPECT_EQ(cm.kv_tokens(2), 40);
}

TEST(CacheFills, FillsGoToT1WhenT0IsFullAndStopWhenNothingIsFree) {
  CacheManager cm(CacheConfig{2, 1, 0, 0.0}, Policy("pensieve"));
  cm.AddSession(1, 0);
  ASSERT_EQ(Turn(cm, 1, 64, 0.0), Admission::kOk);  // fills T0
  cm.AddSession(2, 1.0);
  const auto ops = cm.PlanFills(2, {0, 1, 2}, 5.0);
  ASSERT_FALSE(ops.empty());
  EXPECT_EQ(ops[0].dst, Tier::kT1);
  EXPECT_EQ(ops.size(), 1u) << "T1 holds one block: the rest are recomputed";
  EXPECT_TRUE(cm.CheckInvariants());
  for (const auto& op : ops) cm.OnTransferDone(op.id, true);
  EXPECT_TRUE(cm.CheckInvariants());
}

// Copies out of the tiers (the remote tier's write-behind): each full T0 chunk is read once, stays
// in its block while read (not evicted, not waited for by its own next turn), and one not taken is
// planned again; a chunk left partial by a truncation is read again once full.
TEST(CacheCopiesOut, FullT0ChunksAreReadOnceAndStayPutUntilReported) {
  CacheManager cm(CacheConfig{8, 8, 0, 0.0}, Policy("pensieve"));
  cm.AddSession(1, 0);
  CacheManager::Acquired a;
  ASSERT_EQ(Turn(cm, 1, 100, 1.0, &a), Admission::kOk);  // chunks 0..2 full, 3 partial
  const auto ops = cm.PlanCopiesOut(1, 100);
  ASSERT_EQ(ops.size(), 3u);
  for (int i = 0; i < 3; i++) {
    EXPECT_EQ(ops[i].chunk, i);
    EXPECT_EQ(ops[i].src, Tier::kT0);
    EXPECT_EQ(ops[i].src_block, a.block_table[i]);
    EXPECT_EQ(ops[i].dst, Tier::kNone);
  }
  EXPECT_TRUE(cm.PlanCopiesOut(1, 100).empty()) << "a chunk is read out once";
  EXPECT_TRUE(cm.CheckInvariants());
  EXPECT_EQ(cm.stats().copies_out, 3);

  // Upkeep that wants all of T0 free demotes the partial chunk only.
  cm.Maintain(8, 2.0);
  Drain(cm);
  const std::vector<Tier> where = cm.Residency(1);
  EXPECT_EQ(where, (std::vector<Tier>{Tier::kT0, Tier::kT0, Tier::kT0, Tier::kT1}));
  // The next turn is admitted at once: the chunks being read are full, pinned where they are.
  CacheManager::Acquired b;
  ASSERT_EQ(cm.Acquire(1, 110, 3.0, &b), Admission::kOk);
  for (int i = 0; i < 3; i++) EXPECT_EQ(b.block_table[i], a.block_table[i]);
  for (const auto& op : b.swap_ins) cm.OnTransferDone(op.id, true);
  cm.Release(1, 110, 3.0);
  EXPECT_TRUE(cm.CheckInvariants());

  cm.OnTransferDone(ops[0].id, true);
  cm.OnTransferDone(ops[1].id, false);  // dropped (a full put queue): planned again
  cm.OnTransferDone(ops[2].id, true);
  EXPECT_TRUE(cm.CheckInvariants());
  auto again = cm.PlanCopiesOut(1, 110);
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0].chunk, 1);
  cm.OnTransferDone(again[0].id, true);

  // Truncated inside chunk 1, then grown past it: chunk 1 holds other tokens now.
  cm.Truncate(1, 40, 4.0);
  ASSERT_EQ(Turn(cm, 1, 100, 5.0), Admission::kOk);
  again = cm.PlanCopiesOut(1, 100);
  ASSERT_EQ(again.size(), 2u);
  EXPECT_EQ(again[0].chunk, 1);
  EXPECT_EQ(again[1].chunk, 2);
  // A session removed while its chunks are read: the blocks are freed when the reads end.
  cm.RemoveSession(1);
  EXPECT_EQ(cm.used_blocks(Tier::kT0), 2);
  EXPECT_TRUE(cm.CheckInvariants());
  for (const auto& op : again) cm.OnTransferDone(op.id, true);
  EXPECT_EQ(cm.used_blocks(Tier::kT0), 0);
  EXPECT_TRUE(cm.CheckInvariants());
}

// A chunk the remote tier filled is not sent back to it.
TEST(CacheCopiesOut, FilledChunksAreNotReadOut) {
  CacheManager cm(CacheConfig{8, 0, 0, 0.1}, Policy("pensieve"));
  cm.AddSession(1, 0);
  const auto fills = cm.PlanFills(1, {0, 1}, 1.0);
  ASSERT_EQ(fills.size(), 2u);
  for (const auto& op : fills) cm.OnTransferDone(op.id, true);
  ASSERT_EQ(Turn(cm, 1, 100, 2.0), Admission::kOk);
  const auto ops = cm.PlanCopiesOut(1, 100);
  ASSERT_EQ(ops.size(), 1u);
  EXPECT_EQ(ops[0].chunk, 2);
  cm.OnTransferDone(ops[0].id, true);
  EXPECT_TRUE(cm.CheckInvariants());
}

}  // namespace
}  // namespace mnemo
