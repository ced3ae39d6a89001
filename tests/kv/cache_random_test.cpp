// CacheManager, model-free. Random operations (tests/kv/random_ops.h): the invariants after every
// step, and exact KV served through every copy, fork and truncation against a model of what each
// position should hold.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <map>
#include <optional>
#include <string>

#include "base/rng.h"
#include "cache_test_util.h"
#include "kv/cache_manager.h"
#include "kv/chunk_state.h"
#include "random_ops.h"

namespace mnemo {
namespace {

using kvtest::Policy;

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
