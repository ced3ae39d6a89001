// CacheManager, model-free. Forks and truncations: shared full chunks, copy-on-write partial chunks
// from any tier, shared chunks being recomputed or invalidated.
#include <gtest/gtest.h>

#include <optional>

#include "cache_test_util.h"
#include "kv/cache_manager.h"

namespace mnemo {
namespace {

using kvtest::Admit;
using kvtest::Drain;
using kvtest::Policy;
using kvtest::Turn;

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

}  // namespace
}  // namespace mnemo
