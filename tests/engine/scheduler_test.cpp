// The step scheduler without a model: a real cache manager, copies carried out by a simulated
// transfer queue (FIFO, as the transfer engine runs background copies). Checks the plan's data
// (admissions, refusals, suspensions, block tables, query positions, swap-ins, the token budget)
// and the cache state it leaves.
#include "engine/scheduler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <memory>
#include <numeric>

namespace mnemo {
namespace {

std::unique_ptr<EvictionPolicy> Policy() { return std::move(MakeEvictionPolicy("pensieve", CostModel{1000.0, 10.0}).value()); }

// Copies in flight, finished in submission order when waited for (none finishes on its own).
class SimCopies final : public CopyWaiter {
 public:
  explicit SimCopies(CacheManager& cm) : cm_(cm) {}
  void Poll() override { polls++; }
  void WaitFor(std::span<const uint64_t> ops) override {
    waits.push_back(std::vector<uint64_t>(ops.begin(), ops.end()));
    for (const TransferOp& op : cm_.TakeTransfers()) queue_.push_back(op.id);
    auto pending = [&] {
      for (uint64_t id : ops) {
        if (std::find(queue_.begin(), queue_.end(), id) != queue_.end()) return true;
      }
      return false;
    };
    while (pending()) {
      cm_.OnTransferDone(queue_.front(), true);
      queue_.pop_front();
      landed++;
    }
  }
  // Lands everything (as between steps).
  void LandAll() {
    for (const TransferOp& op : cm_.TakeTransfers()) queue_.push_back(op.id);
    for (uint64_t id : queue_) cm_.OnTransferDone(id, true);
    queue_.clear();
  }
  size_t in_flight() const { return queue_.size(); }

  int polls = 0;
  int landed = 0;
  std::vector<std::vector<uint64_t>> waits;

 private:
  CacheManager& cm_;
  std::deque<uint64_t> queue_;
};

// A turn that holds its blocks: acquired for n_tokens positions, then decoding position n_tokens
// (its sampled token, unfed) or prefilling `pending` positions.
struct Held {
  SessionId session;
  std::vector<int32_t> table;
  std::vector<int32_t> pending;
  RunningTurn view(uint64_t order, int n_tokens, bool decoding) const {
    RunningTurn r;
    r.session = session;
    r.order = order;
    r.n_tokens = n_tokens;
    r.decoding = decoding;
    r.pending = pending;
    r.table = table;
    return r;
  }
};

Held Hold(CacheManager& cm, SessionId s, int n_tokens, double now) {
  if (!cm.HasSession(s)) cm.AddSession(s, now);
  CacheManager::Acquired a;
  EXPECT_EQ(cm.Acquire(s, n_tokens, now, &a), Admission::kOk);
  return Held{s, a.block_table, {}};
}

// A session with n_tokens of KV at rest in T0.
void Idle(CacheManager& cm, SessionId s, int n_tokens, double now) {
  Hold(cm, s, n_tokens, now);
  cm.Release(s, n_tokens, now);
}

std::vector<int32_t> Range(int begin, int end) {
  std::vector<int32_t> v(end - begin);
  std::iota(v.begin(), v.end(), begin);
  return v;
}

TEST(Scheduler, AdmitsFirstComeFirstServedAndRefusesWhatCanNeverFit) {
  CacheManager cm({8, 0, 0, 0.1}, Policy());  // 7 blocks for admissions, 1 reserved
  for (SessionId s = 1; s <= 5; s++) cm.AddSession(s, 0);
  SimCopies copies(cm);
  const std::vector<WaitingTurn> waiting = {
      {1, 300, false},  // 10 chunks > 7: never
      {2, 10, true},    // its session is being composed: passed over
      {3, 100, false},  // 4 chunks: admitted
      {4, 128, false},  // 4 more do not fit beside 3's: later
      {5, 10, false},   // would fit, but does not overtake 4
  };
  StepPlan p = ScheduleStep(cm, {}, waiting, ScheduleLimits{512, 64}, 1.0, copies);
  EXPECT_EQ(p.refused, std::vector<int>({0}));
  ASSERT_EQ(p.admitted.size(), 1u);
  const PlannedAdmission& a = p.admitted[0];
  EXPECT_EQ(a.waiting, 2);
  EXPECT_EQ(a.table.size(), 4u);
  EXPECT_EQ(a.queries, Range(0, 100));
  EXPECT_EQ(a.n_recompute, 0);
  EXPECT_EQ(a.sources.fresh, 100);
  EXPECT_TRUE(cm.acquired(3));
  EXPECT_TRUE(cm.HoldsT0(3, a.table));
  EXPECT_FALSE(cm.acquired(2) || cm.acquired(4) || cm.acquired(5));
  EXPECT_TRUE(p.suspended.empty());
  EXPECT_TRUE(p.swap_ins.empty());
  // The batch: the admission's 100 positions in one sequence through its blocks, sampled.
  ASSERT_EQ(p.seqs.size(), 1u);
  EXPECT_EQ(p.seqs[0].turn, 0);  // no running turns: the first admission
  EXPECT_EQ(p.seqs[0].positions, Range(0, 100));
  EXPECT_EQ(p.seqs[0].table, a.table);
  EXPECT_TRUE(p.seqs[0].sample);
  EXPECT_EQ(p.tokens, 100);
  EXPECT_TRUE(cm.CheckInvariants());
}

TEST(Scheduler, AdmitsNoMoreThanMaxRunning) {
  CacheManager cm({16, 0, 0, 0.1}, Policy());
  Held r = Hold(cm, 1, 10, 0);
  for (SessionId s = 2; s <= 4; s++) cm.AddSession(s, 0);
  SimCopies copies(cm);
  const RunningTurn running[] = {r.view(1, 11, true)};
  const std::vector<WaitingTurn> waiting = {{2, 10, false}, {3, 10, false}, {4, 10, false}};
  StepPlan p = ScheduleStep(cm, running, waiting, ScheduleLimits{512, 3}, 1.0, copies);
  ASSERT_EQ(p.admitted.size(), 2u);
  EXPECT_EQ(p.admitted[0].waiting, 0);
  EXPECT_EQ(p.admitted[1].waiting, 1);
  EXPECT_FALSE(cm.acquired(4));
  // Turn indices: the running decode, then admissions 0 and 1 (indices 1 and 2).
  ASSERT_EQ(p.seqs.size(), 3u);
  EXPECT_EQ(p.seqs[0].turn, 0);
  EXPECT_EQ(p.seqs[0].positions, std::vector<int32_t>({10}));
  EXPECT_EQ(p.seqs[1].turn, 1);
  EXPECT_EQ(p.seqs[2].turn, 2);
}

// A session whose KV went to T1 comes back by swap-ins that the plan names, into the blocks of
// its table; only the new positions are fed.
TEST(Scheduler, SwapInsAreInThePlanAndLandInTheTable) {
  CacheManager cm({8, 16, 0, 0.1}, Policy());
  SimCopies copies(cm);
  Hold(cm, 1, 128, 0);
  cm.Suspend(1, 128, 0);  // all 4 chunks demoted to T1
  copies.LandAll();
  const std::vector<WaitingTurn> waiting = {{1, 140, false}};
  StepPlan p = ScheduleStep(cm, {}, waiting, ScheduleLimits{512, 64}, 1.0, copies);
  ASSERT_EQ(p.admitted.size(), 1u);
  const PlannedAdmission& a = p.admitted[0];
  EXPECT_EQ(a.sources.t1, 128);
  EXPECT_EQ(a.sources.fresh, 12);
  EXPECT_EQ(a.queries, Range(128, 140));
  ASSERT_EQ(p.swap_ins.size(), 4u);
  for (const TransferOp& op : p.swap_ins) {
    EXPECT_EQ(op.src, Tier::kT1);
    EXPECT_EQ(op.dst, Tier::kT0);
    EXPECT_EQ(op.dst_block, a.table[op.chunk]);
  }
  EXPECT_EQ(p.seqs[0].positions, Range(128, 140));
  EXPECT_TRUE(cm.CheckInvariants());
}

// Without a host tier the suspended KV is dropped: the next admission recomputes it first.
TEST(Scheduler, DroppedHistoryIsRecomputedAheadOfTheNewPositions) {
  CacheManager cm({8, 0, 0, 0.1}, Policy());
  SimCopies copies(cm);
  Hold(cm, 1, 128, 0);
  cm.Suspend(1, 128, 0);
  const std::vector<WaitingTurn> waiting = {{1, 140, false}};
  StepPlan p = ScheduleStep(cm, {}, waiting, ScheduleLimits{64, 64}, 1.0, copies);
  ASSERT_EQ(p.admitted.size(), 1u);
  const PlannedAdmission& a = p.admitted[0];
  EXPECT_EQ(a.queries, Range(0, 140));
  EXPECT_EQ(a.n_recompute, 128);
  EXPECT_EQ(a.recompute_pairs, 128 * 129 / 2);
  EXPECT_EQ(a.sources.recomputed, 128);
  EXPECT_TRUE(p.swap_ins.empty());
  // Chunked: 64 positions this step, not sampled.
  ASSERT_EQ(p.seqs.size(), 1u);
  EXPECT_EQ(p.seqs[0].positions, Range(0, 64));
  EXPECT_FALSE(p.seqs[0].sample);
}

// A decode crossing into a new chunk gets a block appended to its table in the plan; one that
// does not keeps its table.
TEST(Scheduler, DecodesGrowTheirTablesInThePlan) {
  CacheManager cm({8, 0, 0, 0.1}, Policy());
  SimCopies copies(cm);
  Held a = Hold(cm, 1, 64, 0), b = Hold(cm, 2, 40, 0);
  const RunningTurn running[] = {a.view(1, 65, true), b.view(2, 41, true)};
  StepPlan p = ScheduleStep(cm, running, {}, ScheduleLimits{512, 64}, 1.0, copies);
  ASSERT_EQ(p.seqs.size(), 2u);
  EXPECT_EQ(p.seqs[0].positions, std::vector<int32_t>({64}));
  ASSERT_EQ(p.seqs[0].table.size(), 3u);
  EXPECT_TRUE(std::equal(a.table.begin(), a.table.end(), p.seqs[0].table.begin()));
  EXPECT_TRUE(cm.HoldsT0(1, p.seqs[0].table));
  EXPECT_EQ(p.seqs[1].table, b.table);
  EXPECT_TRUE(p.suspended.empty());
}

// T0 is full and an idle session holds blocks: the decode's growth demotes one of its chunks and
// waits for that copy alone (not for the other copies queued behind it), and nobody is suspended.
TEST(Scheduler, DecodeWaitsForTheDemotionItNeedsRatherThanSuspend) {
  CacheManager cm({8, 16, 0, 0.1}, Policy());  // 7 for admissions
  SimCopies copies(cm);
  Idle(cm, 9, 96, 0);                           // 3 blocks, evictable
  Held a = Hold(cm, 1, 64, 1), b = Hold(cm, 2, 64, 1);  // 4 pinned, 1 free
  const RunningTurn running[] = {a.view(1, 65, true), b.view(2, 65, true)};
  StepPlan p = ScheduleStep(cm, running, {}, ScheduleLimits{512, 64}, 2.0, copies);
  EXPECT_TRUE(p.suspended.empty());
  ASSERT_EQ(p.seqs.size(), 2u);
  EXPECT_EQ(p.seqs[0].table.size(), 3u);
  EXPECT_EQ(p.seqs[1].table.size(), 3u);
  ASSERT_EQ(copies.waits.size(), 1u);
  EXPECT_EQ(copies.waits[0].size(), 1u);  // one copy named
  EXPECT_EQ(copies.landed, 1);
  EXPECT_EQ(cm.stats().evictions[0], 1);  // one chunk of session 9, not all three
  EXPECT_TRUE(cm.HoldsT0(1, p.seqs[0].table) && cm.HoldsT0(2, p.seqs[1].table));
  EXPECT_TRUE(cm.CheckInvariants());
}

// Nothing can be evicted and nothing is on its way: the youngest decoding turn is suspended (a
// prefilling turn is not a candidate), its KV demoted, and the others get their blocks in the same
// plan once that demotion lands.
TEST(Scheduler, SuspendsTheYoungestDecodeWhenNoBlockIsComing) {
  CacheManager cm({8, 16, 0, 0.1}, Policy());
  SimCopies copies(cm);
  Held a = Hold(cm, 1, 64, 0), b = Hold(cm, 2, 64, 0), c = Hold(cm, 3, 64, 0);  // 6 pinned, 2 free
  Held d = Hold(cm, 4, 10, 0);                                                   // 7 pinned, 1 free
  d.pending = Range(5, 10);  // still prefilling (the youngest of all)
  const RunningTurn running[] = {a.view(20, 65, true), b.view(30, 65, true), c.view(10, 65, true),
                                 d.view(40, 10, false)};
  StepPlan p = ScheduleStep(cm, running, {}, ScheduleLimits{512, 64}, 1.0, copies);
  // a takes the free block; b finds none, nothing evictable: b (order 30) is the youngest decode.
  EXPECT_EQ(p.suspended, std::vector<int>({1}));
  EXPECT_FALSE(cm.acquired(2));
  EXPECT_EQ(cm.kv_tokens(2), 64);
  ASSERT_EQ(p.seqs.size(), 3u);  // a, c decode; d prefills
  EXPECT_EQ(p.seqs[0].turn, 0);
  EXPECT_EQ(p.seqs[1].turn, 2);
  EXPECT_EQ(p.seqs[1].table.size(), 3u);
  EXPECT_EQ(p.seqs[2].turn, 3);
  EXPECT_EQ(p.seqs[2].positions, Range(5, 10));
  EXPECT_TRUE(cm.HoldsT0(3, p.seqs[1].table));
  copies.LandAll();
  std::vector<Tier> where = cm.Residency(2);
  EXPECT_EQ(std::count(where.begin(), where.end(), Tier::kT1), 2);  // demoted, not dropped
  EXPECT_TRUE(cm.CheckInvariants());
}

// Suspensions under growing pressure go youngest first, one at a time, and a decode never waits
// on the budget: every surviving decode has its token in every plan.
TEST(Scheduler, RepeatedPressureSuspendsYoungestFirst) {
  CacheManager cm({10, 0, 0, 0.1}, Policy());  // no host tier: suspension drops, frees at once
  SimCopies copies(cm);
  std::vector<Held> held;
  std::vector<int> n;
  for (SessionId s = 1; s <= 4; s++) {
    held.push_back(Hold(cm, s, 32, 0));  // 4 blocks
    n.push_back(32);
  }
  std::vector<uint64_t> order = {1, 2, 3, 4};
  std::vector<SessionId> suspended;
  for (int step = 0; step < 200 && held.size() > 1; step++) {
    std::vector<RunningTurn> running;
    for (size_t i = 0; i < held.size(); i++) running.push_back(held[i].view(order[i], n[i] + 1, true));
    StepPlan p = ScheduleStep(cm, running, {}, ScheduleLimits{2, 64}, step, copies);
    ASSERT_EQ(p.seqs.size() + p.suspended.size(), held.size());  // past the budget of 2
    for (const StepSeq& s : p.seqs) {
      held[s.turn].table = s.table;
      n[s.turn]++;
    }
    for (int v : p.suspended) suspended.push_back(held[v].session);
    std::vector<int> gone = p.suspended;
    std::sort(gone.rbegin(), gone.rend());
    for (int v : gone) {
      held.erase(held.begin() + v);
      n.erase(n.begin() + v);
      order.erase(order.begin() + v);
    }
    ASSERT_TRUE(cm.CheckInvariants());
  }
  EXPECT_EQ(suspended, std::vector<SessionId>({4, 3, 2}));
  EXPECT_EQ(held[0].session, 1);
}

// The token budget: every decode, then the running prefill, then the admission, in that order.
TEST(Scheduler, BudgetGoesToDecodesThenRunningPrefillThenAdmissions) {
  CacheManager cm({32, 0, 0, 0.1}, Policy());
  SimCopies copies(cm);
  std::vector<Held> dec;
  for (SessionId s = 1; s <= 5; s++) dec.push_back(Hold(cm, s, 10, 0));
  Held pre = Hold(cm, 6, 100, 0);
  pre.pending = Range(0, 100);
  cm.AddSession(7, 0);
  std::vector<RunningTurn> running;
  for (size_t i = 0; i < dec.size(); i++) running.push_back(dec[i].view(i, 11, true));
  running.push_back(pre.view(9, 100, false));
  const std::vector<WaitingTurn> waiting = {{7, 50, false}};
  StepPlan p = ScheduleStep(cm, running, waiting, ScheduleLimits{8, 64}, 1.0, copies);
  ASSERT_EQ(p.admitted.size(), 1u);  // admitted (it holds its blocks) though the budget is spent
  ASSERT_EQ(p.seqs.size(), 6u);
  for (int i = 0; i < 5; i++) EXPECT_EQ(p.seqs[i].positions.size(), 1u);
  EXPECT_EQ(p.seqs[5].turn, 5);
  EXPECT_EQ(p.seqs[5].positions, Range(0, 3));
  EXPECT_EQ(p.tokens, 8);

  cm.Release(7, 0, 1.0);
  StepPlan q = ScheduleStep(cm, running, waiting, ScheduleLimits{200, 64}, 2.0, copies);
  ASSERT_EQ(q.seqs.size(), 7u);
  EXPECT_EQ(q.seqs[5].positions, Range(0, 100));
  EXPECT_TRUE(q.seqs[5].sample);
  EXPECT_EQ(q.seqs[6].turn, 6);
  EXPECT_EQ(q.seqs[6].positions, Range(0, 50));
  EXPECT_EQ(q.tokens, 155);
}

}  // namespace
}  // namespace mnemo

namespace mnemo {
namespace {

// Queued sessions: the head is read first, so room is made from the tail's KV; a session idle
// longer than the queue (a thinking user) still goes before any queued one. Both policies.
TEST(Scheduler, RoomForTheHeadOfTheQueueComesFromItsTail) {
  for (const char* name : {"pensieve", "lru"}) {
    CacheManager cm({14, 0, 0, 0.1}, std::move(MakeEvictionPolicy(name, CostModel{1000.0, 10.0}).value()));
    Idle(cm, 9, 2 * kBlockTokens, 0.0);  // a thinking user's session, idle since 0
    for (SessionId s = 1; s <= 3; s++) Idle(cm, s, 4 * kBlockTokens, 1.0);  // released together
    // The queue: 1, 2, 3, then 4 (new); 9 is not queued.
    const std::vector<SessionId> queue = {1, 2, 3, 4};
    cm.AddSession(4, 2.0);
    MarkQueued(cm, queue, 2.0);
    // T0 is full (14 blocks, none pinned) and 4 needs 6: 2 from session 9 first, then the tail's 4.
    CacheManager::Acquired a;
    ASSERT_EQ(cm.Acquire(4, 6 * kBlockTokens, 2.0, &a), Admission::kLater) << name;
    cm.Maintain(0, 2.0);  // makes the room the admission asked for (no host tier: drops)
    ASSERT_TRUE(cm.TakeTransfers().empty());
    ASSERT_EQ(cm.Acquire(4, 6 * kBlockTokens, 2.0, &a), Admission::kOk) << name;
    auto resident = [&](SessionId s) {
      int n = 0;
      for (Tier t : cm.Residency(s)) n += t == Tier::kT0;
      return n;
    };
    EXPECT_EQ(resident(9), 0) << name;
    EXPECT_EQ(resident(1), 4) << name;
    EXPECT_EQ(resident(2), 4) << name;
    EXPECT_EQ(resident(3), 0) << name;
    EXPECT_TRUE(cm.CheckInvariants());
  }
}

}  // namespace
}  // namespace mnemo
