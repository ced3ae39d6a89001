// CacheManager, model-free. Chunks between the tiers: swap-out to the host tier and back, reviving
// a demotion in flight, the disk tier, fills from the remote tier and copies out to it.
#include <gtest/gtest.h>

#include "cache_test_util.h"
#include "kv/cache_manager.h"
#include "kv/chunk_state.h"

namespace mnemo {
namespace {

using kvtest::Drain;
using kvtest::Policy;
using kvtest::Turn;

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
