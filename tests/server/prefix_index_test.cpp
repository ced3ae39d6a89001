// The token-prefix index of the service's session match against a brute-force scan (the rule
// Service::BestSession had as a scan, for sessions to continue and for sessions to fork), under
// random inserts, appends, truncations, removals and changes of use (idle, busy, busy and not
// forkable), many seeds; model-free.
#include "server/prefix_index.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <set>

#include "base/rng.h"

namespace mnemo {
namespace {

using Use = PrefixIndex::Use;

struct Model {  // what the index stands for, scanned
  struct S {
    std::string owner;
    std::vector<int32_t> tokens;
    Use use = Use::kContinue;
  };
  std::map<int64_t, S> sessions;

  // The best shared prefix and the sessions the rule allows to be returned for it: Best's (least
  // kContinue: a session whose whole log is shared first) or BestFork's (least kFork: any).
  std::pair<size_t, std::set<int64_t>> Best(const std::string& owner, const std::vector<int32_t>& q,
                                            Use least = Use::kContinue) const {
    size_t best = 0;
    for (const auto& [id, s] : sessions) {
      if (s.owner != owner || s.use < least) continue;
      size_t n = 0;
      while (n < s.tokens.size() && n < q.size() && s.tokens[n] == q[n]) n++;
      best = std::max(best, n);
    }
    std::set<int64_t> all, whole;
    if (best == 0) return {0, {}};
    for (const auto& [id, s] : sessions) {
      if (s.owner != owner || s.use < least) continue;
      size_t n = 0;
      while (n < s.tokens.size() && n < q.size() && s.tokens[n] == q[n]) n++;
      if (n != best) continue;
      all.insert(id);
      if (s.tokens.size() == n) whole.insert(id);
    }
    return {best, whole.empty() || least == Use::kFork ? all : whole};
  }
};

class Gen {
 public:
  explicit Gen(uint64_t seed) : rng_(seed) {}
  int Int(int n) { return static_cast<int>(rng_.Next() % static_cast<uint64_t>(n)); }
  // Few distinct token values, so that prefixes are shared and edges split often.
  std::vector<int32_t> Tokens(int max_len) {
    std::vector<int32_t> t(static_cast<size_t>(Int(max_len + 1)));
    for (auto& x : t) x = Int(3);
    return t;
  }
  // Mostly a prefix of a known log plus a few tokens: the shapes conversations take.
  std::vector<int32_t> Near(const Model& m, int max_len) {
    if (m.sessions.empty() || Int(4) == 0) return Tokens(max_len);
    auto it = m.sessions.begin();
    std::advance(it, Int(static_cast<int>(m.sessions.size())));
    const auto& src = it->second.tokens;
    std::vector<int32_t> t(src.begin(), src.begin() + Int(static_cast<int>(src.size()) + 1));
    auto more = Tokens(8);
    t.insert(t.end(), more.begin(), more.end());
    return t;
  }
  int64_t Pick(const Model& m) {
    auto it = m.sessions.begin();
    std::advance(it, Int(static_cast<int>(m.sessions.size())));
    return it->first;
  }

 private:
  Rng rng_;
};

// Mostly idle, as the service's sessions are.
Use RandomUse(Gen& g) {
  const int k = g.Int(8);
  return k < 5 ? Use::kContinue : k < 7 ? Use::kFork : Use::kNone;
}

void RunSeed(uint64_t seed) {
  Gen g(seed);
  PrefixIndex index;
  Model m;
  const std::string owners[] = {"", "alice", "bob"};
  int64_t next_id = 1;
  for (int step = 0; step < 400; step++) {
    const int op = g.Int(10);
    if (m.sessions.empty() || op <= 1) {  // insert
      const int64_t id = next_id++;
      Model::S s{owners[g.Int(3)], g.Near(m, 40), RandomUse(g)};
      index.Insert(id, s.owner, s.tokens, s.use);
      m.sessions[id] = s;
    } else if (op == 2) {  // remove
      const int64_t id = g.Pick(m);
      index.Remove(id);
      m.sessions.erase(id);
    } else if (op <= 4) {  // append
      const int64_t id = g.Pick(m);
      auto more = g.Tokens(12);
      index.Append(id, more);
      auto& t = m.sessions[id].tokens;
      t.insert(t.end(), more.begin(), more.end());
    } else if (op == 5) {  // truncate
      const int64_t id = g.Pick(m);
      auto& t = m.sessions[id].tokens;
      const size_t n = static_cast<size_t>(g.Int(static_cast<int>(t.size()) + 1));
      index.Truncate(id, n);
      t.resize(n);
    } else if (op == 6) {  // busy / idle
      const int64_t id = g.Pick(m);
      const Use use = RandomUse(g);
      index.SetUse(id, use);
      m.sessions[id].use = use;
    } else {  // query
      const std::string& owner = owners[g.Int(3)];
      const auto q = g.Near(m, 40);
      for (Use least : {Use::kContinue, Use::kFork}) {
        const auto [want, allowed] = m.Best(owner, q, least);
        const auto [id, lcp] = least == Use::kContinue ? index.Best(owner, q) : index.BestFork(owner, q);
        const std::string what = std::string(least == Use::kContinue ? "Best" : "BestFork") + " seed " +
                                 std::to_string(seed) + " step " + std::to_string(step);
        ASSERT_EQ(lcp, want) << what;
        if (want == 0) {
          ASSERT_EQ(id, -1) << what;
        } else {
          ASSERT_TRUE(allowed.count(id)) << what << ": session " << id;
        }
      }
    }
    index.CheckInvariants();
    ASSERT_EQ(index.size(), m.sessions.size());
    for (const auto& [id, s] : m.sessions) ASSERT_EQ(index.Length(id), s.tokens.size()) << "seed " << seed;
  }
}

TEST(PrefixIndex, MatchesABruteForceScanUnderRandomOperations) {
  for (uint64_t seed = 1; seed <= 300; seed++) {
    RunSeed(seed);
    if (HasFatalFailure()) return;
  }
}

TEST(PrefixIndex, PrefersASessionWhoseWholeLogIsTheSharedPrefix) {
  PrefixIndex index;
  const std::vector<int32_t> a = {1, 2, 3, 4}, b = {1, 2, 3, 4, 9, 9}, q = {1, 2, 3, 4, 5};
  index.Insert(7, "", b, Use::kContinue);
  index.Insert(8, "", a, Use::kContinue);
  EXPECT_EQ(index.Best("", q), (std::pair<int64_t, size_t>{8, 4}));  // continue 8 rather than fork 7
  index.SetUse(8, Use::kFork);
  EXPECT_EQ(index.Best("", q), (std::pair<int64_t, size_t>{7, 4}));  // a busy session is never continued
  EXPECT_EQ(index.Best("other", q), (std::pair<int64_t, size_t>{-1, 0}));  // nor another owner's
  EXPECT_EQ(index.Best("", std::vector<int32_t>{2, 1}), (std::pair<int64_t, size_t>{-1, 0}));
  index.Remove(7);
  EXPECT_EQ(index.Best("", q), (std::pair<int64_t, size_t>{-1, 0}));
  index.CheckInvariants();
}

// A busy session is forked (BestFork) where it shares more than any idle one, never continued
// (Best); one that cannot be forked yet (kNone) is matched by neither.
TEST(PrefixIndex, BestForkMatchesBusySessionsByTheirLog) {
  PrefixIndex index;
  const std::vector<int32_t> busy = {1, 2, 3, 4, 5, 6}, idle = {1, 2, 9}, q = {1, 2, 3, 4, 5, 6, 7};
  index.Insert(1, "", busy, Use::kFork);
  index.Insert(2, "", idle, Use::kContinue);
  EXPECT_EQ(index.Best("", q), (std::pair<int64_t, size_t>{2, 2}));
  EXPECT_EQ(index.BestFork("", q), (std::pair<int64_t, size_t>{1, 6}));
  EXPECT_EQ(index.BestFork("", std::vector<int32_t>{1, 2, 9, 9}), (std::pair<int64_t, size_t>{2, 3}));
  index.SetUse(1, Use::kNone);
  EXPECT_EQ(index.BestFork("", q), (std::pair<int64_t, size_t>{2, 2}));
  index.Insert(3, "", std::vector<int32_t>{1, 2, 3}, Use::kFork);  // inside 1's edge: a split
  EXPECT_EQ(index.BestFork("", q), (std::pair<int64_t, size_t>{3, 3}));
  index.CheckInvariants();
}

TEST(PrefixIndex, AppendingToALoneSessionGrowsItsLeafInPlace) {
  // The per-turn update of a conversation costs its new tokens: no node is added.
  PrefixIndex index;
  std::vector<int32_t> log = {5, 6, 7};
  index.Insert(1, "", log, Use::kContinue);
  index.Insert(2, "", std::vector<int32_t>{5, 6, 8}, Use::kContinue);  // a fork point at 2 tokens
  const size_t nodes = index.num_nodes();
  for (int turn = 0; turn < 100; turn++) {
    index.SetUse(1, Use::kFork);
    std::vector<int32_t> more(40, turn);
    index.Append(1, more);
    index.SetUse(1, Use::kContinue);
    log.insert(log.end(), more.begin(), more.end());
  }
  EXPECT_EQ(index.num_nodes(), nodes);
  EXPECT_EQ(index.Best("", log), (std::pair<int64_t, size_t>{1, log.size()}));
  index.Truncate(1, 2);  // back to the fork point: the leaf goes, the session sits on the branch node
  EXPECT_EQ(index.Length(1), 2u);
  EXPECT_EQ(index.Best("", log), (std::pair<int64_t, size_t>{1, 2}));
  index.CheckInvariants();
}

// The figure behind the index: a lookup costs the request's tokens, not sessions x tokens. 2,048
// sessions of one owner share a 256-token system prompt and then hold 1,024 tokens of their own;
// each query continues one of them. Prints the time per lookup of the index and of a scan (the
// rule the service had), and checks they agree.
TEST(PrefixIndex, LookupCostDoesNotGrowWithTheSessions) {
  constexpr int kSessions = 2048, kSystem = 256, kOwn = 1024;
  Gen g(7);
  PrefixIndex index;
  Model m;
  std::vector<int32_t> system(kSystem);
  for (auto& x : system) x = g.Int(32000);
  for (int s = 0; s < kSessions; s++) {
    std::vector<int32_t> t = system;
    for (int i = 0; i < kOwn; i++) t.push_back(g.Int(32000));
    index.Insert(s, "k", t, Use::kContinue);
    m.sessions[s] = Model::S{"k", std::move(t), Use::kContinue};
  }
  std::vector<std::vector<int32_t>> queries;
  for (int q = 0; q < 64; q++) {
    auto t = m.sessions[g.Int(kSessions)].tokens;
    for (int i = 0; i < 40; i++) t.push_back(g.Int(32000));
    queries.push_back(std::move(t));
  }
  using Clock = std::chrono::steady_clock;
  auto t0 = Clock::now();
  size_t sum_index = 0, sum_scan = 0;
  for (const auto& q : queries) sum_index += index.Best("k", q).second;
  auto t1 = Clock::now();
  for (const auto& q : queries) {  // the service's former scan, one pass over every session
    int64_t target = -1;
    size_t lcp = 0;
    for (const auto& [id, e] : m.sessions) {
      if (e.owner != "k" || e.use != Use::kContinue) continue;
      size_t n = 0;
      while (n < e.tokens.size() && n < q.size() && e.tokens[n] == q[n]) n++;
      if (n > lcp || (n == lcp && n > 0 && target >= 0 && e.tokens.size() == n)) {
        lcp = n;
        target = id;
      }
    }
    sum_scan += lcp;
  }
  auto t2 = Clock::now();
  EXPECT_EQ(sum_index, sum_scan);
  EXPECT_EQ(sum_index, queries.size() * (kSystem + kOwn));
  const double us_index = std::chrono::duration<double, std::micro>(t1 - t0).count() / queries.size();
  const double us_scan = std::chrono::duration<double, std::micro>(t2 - t1).count() / queries.size();
  std::printf("[ figures  ] %d sessions x %d tokens, query %zu tokens: index %.1f us, scan %.1f us per lookup\n",
              kSessions, kSystem + kOwn, queries[0].size(), us_index, us_scan);
}

}  // namespace
}  // namespace mnemo
