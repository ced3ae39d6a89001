// A random-operation driver over a CacheManager for property tests: turns (some stopped part way,
// as a suspension does; some growing; some followed by copies out of their full chunks, as the
// remote tier's write-behind makes; some forked while they run), forks at any point, truncations,
// invalidations, removals, the engine's upkeep (sometimes skipped, so Acquire runs twice in a row),
// and transfers that complete in and out of order, some failing. After every step it checks
// CheckInvariants (every chunk record's fields fit its state, chunk_state.h) and then whatever the
// test adds (Hooks).
//
// Used by cache_random_test (exact KV served through copies) and victim_index_test (every victim
// equals a brute-force scan).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <vector>

#include "base/block.h"
#include "base/rng.h"
#include "kv/cache_manager.h"

namespace mnemo::kvtest {

// What a test does around the driver's operations. The defaults model a transfer engine that does
// not look at the data.
class RandomOpsHooks {
 public:
  virtual ~RandomOpsHooks() = default;
  // s was admitted for [0, want) with `a`; kv_before positions had KV. Lands a's swap-ins and
  // "computes" the turn; returns the end of the positions that hold KV when it stops (want, or
  // less for a turn stopped part way).
  virtual int Admitted(CacheManager& cm, SessionId s, int kv_before, int want, CacheManager::Acquired& a, Rng&) {
    (void)s, (void)kv_before;
    for (const TransferOp& op : a.swap_ins) cm.OnTransferDone(op.id, true);
    return want;
  }
  // s grew from `from` to `to` positions (decode); table holds its T0 blocks.
  virtual void Grown(SessionId, int from, int to, const std::vector<int32_t>& table, Rng&) {
    (void)from, (void)to, (void)table;
  }
  // dst forked from src at `at`; `copy` is the synchronous copy the caller must make now.
  virtual void Forked(SessionId src, SessionId dst, int at, const std::optional<TransferOp>& copy) {
    (void)src, (void)dst, (void)at, (void)copy;
  }
  virtual void Truncated(SessionId, int to) { (void)to; }
  // s's turn ended and ops (PlanCopiesOut) read its full chunks out of T0; they are reported with
  // the other transfers (Transfers).
  virtual void CopiesOut(SessionId s, const std::vector<TransferOp>& ops, Rng&) {
    (void)s;
    pending_.insert(pending_.end(), ops.begin(), ops.end());
  }
  virtual void Removed(SessionId) {}
  // Takes the queued transfers and completes a random subset in random order (a tenth fail).
  virtual void Transfers(CacheManager& cm, Rng& rng) {
    for (const TransferOp& op : cm.TakeTransfers()) pending_.push_back(op);
    while (!pending_.empty() && rng.Next() % 3) {
      const size_t i = rng.Next() % pending_.size();
      cm.OnTransferDone(pending_[i].id, rng.Next() % 10 != 0);
      pending_.erase(pending_.begin() + i);
    }
  }
  // Completes everything still in flight (before a teardown).
  virtual void CompleteAll(CacheManager& cm) {
    for (int round = 0; round < 16; round++) {
      for (const TransferOp& op : cm.TakeTransfers()) pending_.push_back(op);
      if (pending_.empty()) break;
      for (const TransferOp& op : pending_) cm.OnTransferDone(op.id, true);
      pending_.clear();
    }
  }
  // After every step, once CheckInvariants held: the test's own property (gtest assertions).
  virtual void AfterStep(CacheManager&, double now) { (void)now; }

 private:
  std::vector<TransferOp> pending_;
};

struct RandomOpsConfig {
  int sessions = 4;              // live at the start; forks add more, the oldest leave past max_sessions
  int max_sessions = 8;
  int steps = 300;
  int max_new_tokens = 70;       // a turn appends 1..max_new_tokens positions
  int grow_one_in = 4;           // a turn that finished grows by 40 positions with chance 1/grow_one_in
  bool fractional_time = false;  // the clock moves by 0, .25, .5 or .75 per step (ties); else by 1
  int fork_running_one_in = 6;   // a turn's session is forked while acquired with chance 1/this (0: never)
};

// Runs cfg.steps random operations on cm (whose sessions must not exist yet); returns the sessions
// still live. Fails the calling test (gtest) on the first step after which CheckInvariants does not
// hold; `label` names the run in failure messages.
inline std::vector<SessionId> RunRandomOps(CacheManager& cm, const RandomOpsConfig& cfg, RandomOpsHooks& hooks,
                                           Rng& rng, const std::string& label) {
  std::vector<SessionId> live;
  SessionId next = 0;
  for (; next < cfg.sessions; next++) {
    cm.AddSession(next, 0);
    live.push_back(next);
  }
  const int t0 = cm.capacity(Tier::kT0);
  double now = 0;
  auto trim = [&] {  // past max_sessions (forks added some), the oldest session is forgotten
    if (static_cast<int>(live.size()) <= cfg.max_sessions) return;
    cm.RemoveSession(live.front());
    hooks.Removed(live.front());
    live.erase(live.begin());
  };
  for (int step = 0; step < cfg.steps; step++) {
    now += cfg.fractional_time ? double(rng.Next() % 4) * 0.25 : 1.0;
    const SessionId s = live[rng.Next() % live.size()];
    const int have = cm.kv_tokens(s);
    const int what = int(rng.Next() % 20);
    if (what < 10) {  // a turn
      const int want = have + 1 + int(rng.Next() % cfg.max_new_tokens);
      CacheManager::Acquired a;
      const Admission r = cm.Acquire(s, want, now, &a);
      if (r == Admission::kOk) {
        int end = hooks.Admitted(cm, s, have, want, a, rng);
        if (::testing::Test::HasFatalFailure()) return live;
        if (end == want && rng.Next() % cfg.grow_one_in == 0 && cm.Grow(s, want + 40, &a.block_table)) {
          end = want + 40;
          hooks.Grown(s, want, end, a.block_table, rng);
        }
        // A fork of what s had before this turn, taken while the turn runs (the server forks a
        // session whose turn is running at its committed log): it shares s's chunks that the turn
        // is recomputing, and copies a partial chunk the turn has written past the fork point.
        if (cfg.fork_running_one_in > 0 && rng.Next() % cfg.fork_running_one_in == 0) {
          const int at = int(rng.Next() % (have + 1));
          const SessionId d = next++;
          hooks.Forked(s, d, at, cm.Fork(s, d, at, now));
          live.push_back(d);
        }
        // Pinned chunks stay in T0 while upkeep makes room for others.
        cm.Maintain(t0 / 2, now);
        EXPECT_TRUE(cm.HoldsT0(s, a.block_table)) << label << " step " << step;
        if (rng.Next() % 5 == 0) {
          cm.Suspend(s, end, now);
        } else {
          cm.Release(s, end, now);
          if (rng.Next() % 2) hooks.CopiesOut(s, cm.PlanCopiesOut(s, end), rng);  // write-behind
        }
        trim();
      } else if (r == Admission::kImpossible) {
        cm.Truncate(s, 0, now);
        hooks.Truncated(s, 0);
      } else if (rng.Next() % 4) {  // the engine's upkeep; sometimes skipped (Acquire twice in a row)
        cm.Maintain(rng.Next() % 2 ? 0 : t0 / 4, now);
      }
    } else if (what < 14) {  // a fork at any point of s's KV
      const int at = int(rng.Next() % (have + 1));
      const SessionId d = next++;
      hooks.Forked(s, d, at, cm.Fork(s, d, at, now));
      live.push_back(d);
      trim();
    } else if (what < 17) {  // a truncation
      const int to = int(rng.Next() % (have + 1));
      cm.Truncate(s, to, now);
      hooks.Truncated(s, to);
    } else if (what < 19) {  // lose one chunk's KV
      if (have > 0) cm.Invalidate(s, int(rng.Next() % ((have + kBlockTokens - 1) / kBlockTokens)));
    } else if (live.size() > 2) {
      cm.RemoveSession(s);
      hooks.Removed(s);
      live.erase(std::find(live.begin(), live.end(), s));
    }
    hooks.Transfers(cm, rng);
    if (!cm.CheckInvariants()) {
      ADD_FAILURE() << label << " step " << step << ": CheckInvariants failed";
      return live;
    }
    hooks.AfterStep(cm, now);
    if (::testing::Test::HasFatalFailure()) return live;
  }
  return live;
}

}  // namespace mnemo::kvtest
