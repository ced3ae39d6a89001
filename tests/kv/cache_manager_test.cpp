#include "kv/cache_manager.h"

#include <gtest/gtest.h>

#include "base/rng.h"

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

// A turn: acquire n_tokens, complete its swap-ins, release.
Admission Turn(CacheManager& cm, SessionId s, int n_tokens, double now, CacheManager::Acquired* a = nullptr) {
  CacheManager::Acquired local;
  if (!a) a = &local;
  Admission r = cm.Acquire(s, n_tokens, now, a);
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
  ASSERT_EQ(cm.Acquire(1, 7 * 32, 100, &a), Admission::kOk);
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

TEST(CacheManager, SwapOutToHostAndBackIn) {
  CacheManager cm({8, 8, 0, 0.0}, Policy("pensieve"));
  cm.AddSession(1, 0);
  ASSERT_EQ(Turn(cm, 1, 6 * 32, 0), Admission::kOk);
  cm.AddSession(2, 10);
  CacheManager::Acquired a;
  // Session 2 needs 6 blocks; 2 are free: evictions start, admission waits for them.
  ASSERT_EQ(cm.Acquire(2, 6 * 32, 10, &a), Admission::kLater);
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
  for (const auto& op : ops) cm.OnTransferDone(op.id, true);
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
  for (int i = 0; i < 10 && cm.Acquire(2, 4 * 32, 10, &a) != Admission::kOk; i++) Drain(cm);
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
  auto ops = cm.TakeTransfers();
  bool failed_one = false;
  for (const auto& op : ops) {
    bool ok = !(op.src == Tier::kT2 && !failed_one);
    if (!ok) failed_one = true;
    cm.OnTransferDone(op.id, ok);
  }
  ASSERT_TRUE(failed_one);
  Admission ad;
  for (int i = 0; i < 10 && (ad = cm.Acquire(1, 4 * 32, 20, &b)) != Admission::kOk; i++) Drain(cm);
  ASSERT_EQ(ad, Admission::kOk);
  EXPECT_EQ(b.recompute.size(), 1u);
  EXPECT_GT(b.hit_tokens[2], 0);
  EXPECT_EQ(cm.stats().failed_reads, 1);
  for (const auto& op : b.swap_ins) cm.OnTransferDone(op.id, true);
  cm.Release(1, 4 * 32, 21);
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

}  // namespace
}  // namespace mnemo
