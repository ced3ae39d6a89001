// The prefix index (issue 14): every write that changes a session's log keeps its marks, so that
// FindPrefix names the owner's session sharing a request's longest run of full chunks; and a store
// written before the index is marked when it is opened.
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <numeric>

#include "store/store.h"
#include "test_util.h"

namespace mnemo {
namespace {

std::unique_ptr<Store> MustOpen(const std::string& path) {
  auto s = Store::Open(path);
  EXPECT_TRUE(s.ok()) << (s.ok() ? "" : s.error().message);
  return s.ok() ? std::move(*s) : nullptr;
}

std::vector<int32_t> Range(int32_t from, int32_t n) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), from);
  return v;
}

std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

class StorePrefixes : public ::testing::TestWithParam<testing_util::Backend> {
 protected:
  void SetUp() override {
    if (!home_.unavailable().empty()) GTEST_SKIP() << home_.unavailable();
  }
  std::string Spec(const std::string& name) { return home_.Spec(name); }
  bool postgres() const { return GetParam() == testing_util::Backend::kPostgres; }
  // Runs raw SQL on the store's database (from outside the store).
  bool Sql(const std::string& spec, const std::string& sql) {
    if (postgres()) return testing_util::PgExec(spec, sql);
    sqlite3* db = nullptr;
    bool ok = sqlite3_open(spec.c_str(), &db) == SQLITE_OK &&
              sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr) == SQLITE_OK;
    sqlite3_close(db);
    return ok;
  }
  testing_util::StoreHome home_{GetParam()};
};

// {session, tokens matched, session length}, or {-1, 0, 0}.
std::tuple<int64_t, int64_t, int64_t> Find(Store& s, const std::string& owner, std::span<const int32_t> request) {
  auto m = s.FindPrefix(owner, PrefixHashes(PrefixSeed(owner), request), ShortPrefixHashes(PrefixSeed(owner), request));
  EXPECT_TRUE(m.ok()) << m.error().message;
  if (!m.ok() || !m->has_value()) return {-1, 0, 0};
  return {(*m)->session_id, (*m)->n_tokens, (*m)->session_tokens};
}

using Match = std::tuple<int64_t, int64_t, int64_t>;

TEST_P(StorePrefixes, TurnsAreMarkedAtFullChunks) {
  auto store = MustOpen(Spec("p.db"));
  ASSERT_TRUE(store);
  const std::vector<int32_t> log = Range(100, 150);  // turns of 50, 40 and 60 tokens
  ASSERT_TRUE(store->CreateSession(1, "alice").ok());
  ASSERT_TRUE(store->AppendTurn(1, 0, 30, std::span(log).first(50), true).ok());
  EXPECT_EQ(Find(*store, "alice", log), Match(1, 32, 50));  // what one turn marked
  ASSERT_TRUE(store->AppendTurn(1, 50, 70, std::span(log).subspan(50, 40), true).ok());
  ASSERT_TRUE(store->AppendTurn(1, 90, 120, std::span(log).subspan(90), true).ok());

  // The whole log and more (the next turn's request): every full chunk of the log.
  EXPECT_EQ(Find(*store, "alice", Concat(log, Range(7, 40))), Match(1, 128, 150));
  EXPECT_EQ(Find(*store, "alice", std::span(log).first(100)), Match(1, 96, 150));
  // A history that leaves the log at 70 shares its first two chunks only.
  std::vector<int32_t> diverged = log;
  diverged[70] = 5;
  EXPECT_EQ(Find(*store, "alice", diverged), Match(1, 64, 150));
  diverged[3] = 5;
  EXPECT_EQ(Find(*store, "alice", diverged), Match(-1, 0, 0));
  EXPECT_EQ(Find(*store, "alice", std::span(log).first(31)), Match(-1, 0, 0));  // no full chunk
  // Another owner's identical history matches nothing, even with alice's marks.
  EXPECT_EQ(Find(*store, "bob", log), Match(-1, 0, 0));
  auto stolen = store->FindPrefix("bob", PrefixHashes(PrefixSeed("alice"), log), {});
  ASSERT_TRUE(stolen.ok());
  EXPECT_FALSE(stolen->has_value());
  // Sessions matching as far: the highest id.
  ASSERT_TRUE(store->CreateSession(2, "alice").ok());
  ASSERT_TRUE(store->AppendTurn(2, 0, 10, std::span(log).first(70), true).ok());
  EXPECT_EQ(Find(*store, "alice", std::span(log).first(70)), Match(2, 64, 70));
  EXPECT_EQ(Find(*store, "alice", log), Match(1, 128, 150));
  ASSERT_TRUE(store->DeleteSession(1).ok());
  EXPECT_EQ(Find(*store, "alice", log), Match(2, 64, 70));
}

TEST_P(StorePrefixes, CutsForksAndCommitsKeepTheMarks) {
  auto store = MustOpen(Spec("p.db"));
  ASSERT_TRUE(store);
  const std::vector<int32_t> log = Range(1, 130);
  ASSERT_TRUE(store->CreateSession(1, "o").ok());
  ASSERT_TRUE(store->AppendTurn(1, 0, 60, log, true).ok());
  // A cut drops the marks past it; the log regrown with other tokens is marked as it now is.
  ASSERT_TRUE(store->TruncateSession(1, 70).ok());
  EXPECT_EQ(Find(*store, "o", log), Match(1, 64, 70));
  const std::vector<int32_t> other = Concat(std::vector<int32_t>(log.begin(), log.begin() + 70), Range(900, 60));
  ASSERT_TRUE(store->AppendTurn(1, 70, 70, std::span(other).subspan(70), true).ok());
  EXPECT_EQ(Find(*store, "o", log), Match(1, 64, 130));
  EXPECT_EQ(Find(*store, "o", other), Match(1, 128, 130));

  // A fork holds the marks within it; another owner's fork has its own chain.
  ASSERT_TRUE(store->ForkSession(1, 2, 100, "o").ok());
  EXPECT_EQ(Find(*store, "o", std::span(other).first(100)), Match(2, 96, 100));
  ASSERT_TRUE(store->ForkSession(1, 3, 100, "p").ok());
  EXPECT_EQ(Find(*store, "p", other), Match(3, 96, 100));

  // The commit of a turn that cuts the log (an edited reply) and appends, in one transaction; and
  // a commit that fails leaves no mark.
  TurnCommit c;
  c.session_id = 2;
  c.truncate_to = 40;
  c.begin = 40;
  c.prompt_end = 50;
  const std::vector<int32_t> edit = Concat(std::vector<int32_t>(other.begin(), other.begin() + 40), Range(300, 60));
  c.tokens = std::span(edit).subspan(40);
  c.expected_length = 100;
  ASSERT_TRUE(store->CommitTurn(c).ok());
  EXPECT_EQ(Find(*store, "o", edit), Match(2, 96, 100));
  EXPECT_EQ(Find(*store, "o", other), Match(1, 128, 130));  // session 2 now shares only 32
  TurnCommit bad;
  bad.session_id = 4;
  bad.create_session = true;
  bad.owner = "q";
  bad.begin = 0;
  bad.prompt_end = 64;
  bad.tokens = std::span(log).first(64);
  bad.response = testing_util::MakeResponse("resp_x");
  bad.conversation = ConversationUpdate{"conv_missing", {}};  // fails the transaction
  EXPECT_FALSE(store->CommitTurn(bad).ok());
  EXPECT_EQ(Find(*store, "q", log), Match(-1, 0, 0));
}

// A log shorter than a chunk is marked at its length, so a short history finds its session (the
// old code marked full chunks only: nothing); the full marks still chain from the seed past such
// marks, cuts drop them and forks copy them.
TEST_P(StorePrefixes, ShortLogsAreMarkedAtTheirLength) {
  auto store = MustOpen(Spec("p.db"));
  ASSERT_TRUE(store);
  const std::vector<int32_t> log = Range(100, 80);  // turns of 12, 8 and 60 tokens
  ASSERT_TRUE(store->CreateSession(1, "alice").ok());
  ASSERT_TRUE(store->AppendTurn(1, 0, 5, std::span(log).first(12), true).ok());
  const std::vector<int32_t> first(log.begin(), log.begin() + 12);
  EXPECT_EQ(Find(*store, "alice", Concat(first, Range(7, 10))), Match(1, 12, 12));  // the next turn's request
  EXPECT_EQ(Find(*store, "alice", Concat(first, Range(7, 40))), Match(1, 12, 12));  // longer than a chunk
  EXPECT_EQ(Find(*store, "alice", std::span(log).first(11)), Match(-1, 0, 0));
  EXPECT_EQ(Find(*store, "bob", Concat(first, Range(7, 10))), Match(-1, 0, 0));
  ASSERT_TRUE(store->AppendTurn(1, 12, 15, std::span(log).subspan(12, 8), true).ok());
  EXPECT_EQ(Find(*store, "alice", Concat(std::vector<int32_t>(log.begin(), log.begin() + 20), Range(7, 3))),
            Match(1, 20, 20));
  ASSERT_TRUE(store->AppendTurn(1, 20, 30, std::span(log).subspan(20), true).ok());
  EXPECT_EQ(Find(*store, "alice", log), Match(1, 64, 80));  // chained from the seed
  EXPECT_EQ(Find(*store, "alice", Concat(std::vector<int32_t>(log.begin(), log.begin() + 25), Range(900, 9))),
            Match(1, 20, 80));
  ASSERT_TRUE(store->TruncateSession(1, 15).ok());
  EXPECT_EQ(Find(*store, "alice", log), Match(1, 12, 15));
  ASSERT_TRUE(store->ForkSession(1, 2, 14, "alice").ok());
  EXPECT_EQ(Find(*store, "alice", Concat(std::vector<int32_t>(log.begin(), log.begin() + 14), Range(900, 3))),
            Match(2, 14, 14));
  ASSERT_TRUE(store->ForkSession(1, 3, 12, "alice").ok());  // at a short mark it copies
  EXPECT_EQ(Find(*store, "alice", Concat(first, Range(7, 10))), Match(3, 12, 12));
  // Regrown past a chunk from the short log, the full marks chain from the seed.
  ASSERT_TRUE(store->AppendTurn(3, 12, 12, std::span(log).subspan(12, 40), true).ok());
  EXPECT_EQ(Find(*store, "alice", log), Match(3, 32, 52));
}

// A store written before the index (schema 4) is marked at open: its sessions are found.
TEST_P(StorePrefixes, VersionFourStoresAreMarkedAtOpen) {
  const std::string spec = Spec("v4.db");
  const std::vector<int32_t> log = Range(10, 100);
  {
    auto store = MustOpen(spec);
    ASSERT_TRUE(store);
    ASSERT_TRUE(store->CreateSession(1, "o").ok());
    ASSERT_TRUE(store->AppendTurn(1, 0, 20, std::span(log).first(45), true).ok());
    ASSERT_TRUE(store->AppendTurn(1, 45, 50, std::span(log).subspan(45), true).ok());
    ASSERT_TRUE(store->CreateSession(2, "o").ok());  // empty: nothing to mark
  }
  const std::string version_table = postgres() ? "mnemo_schema_version" : "schema_version";
  ASSERT_TRUE(Sql(spec, "DROP TABLE session_prefixes; DELETE FROM " + version_table + " WHERE version > 4"));
  auto store = MustOpen(spec);
  ASSERT_TRUE(store);
  EXPECT_EQ(Find(*store, "o", log), Match(1, 96, 100));
  ASSERT_TRUE(store->AppendTurn(1, 100, 100, Range(500, 30), true).ok());
  EXPECT_EQ(Find(*store, "o", Concat(log, Range(500, 30))), Match(1, 128, 130));
}

// Measured, not run by default (docs/benchmarks.md §11b): MNEMO_BENCH_PREFIX=1 commits
// conversations of 8 turns of 200 tokens (a response row each, as a server's commit) to a fresh
// store and times every CommitTurn, then times FindPrefix for a history resent after the last
// turn (1,600 tokens + 200: 56 hashes) and for one sharing only a first turn.
TEST_P(StorePrefixes, BenchCommitAndLookup) {
  if (!std::getenv("MNEMO_BENCH_PREFIX")) GTEST_SKIP() << "set MNEMO_BENCH_PREFIX=1 to measure";
  const int kSessions = std::getenv("MNEMO_BENCH_SESSIONS") ? std::atoi(std::getenv("MNEMO_BENCH_SESSIONS")) : 500;
  const int kTurns = 8, kTurn = 200;
  auto store = MustOpen(Spec("bench.db"));
  ASSERT_TRUE(store);
  auto log_of = [&](int id) {  // every conversation begins with the same 64-token system prompt
    std::vector<int32_t> v(kTurns * kTurn);
    for (int i = 0; i < static_cast<int>(v.size()); ++i) v[i] = i < 64 ? i : 1 + (id * 7919 + i * 31) % 30000;
    return v;
  };
  std::vector<double> commit_ms;
  for (int id = 1; id <= kSessions; ++id) {
    const std::vector<int32_t> log = log_of(id);
    for (int t = 0; t < kTurns; ++t) {
      TurnCommit c;
      c.session_id = id;
      c.create_session = t == 0;
      c.owner = "owner";
      c.begin = t * kTurn;
      c.prompt_end = c.begin + kTurn / 2;
      c.tokens = std::span(log).subspan(c.begin, kTurn);
      c.expected_length = t == 0 ? std::nullopt : std::optional<int64_t>(c.begin);
      c.response = testing_util::MakeResponse(NewId("resp_"), "owner");
      const auto t0 = std::chrono::steady_clock::now();
      ASSERT_TRUE(store->CommitTurn(c).ok());
      commit_ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  auto report = [](const char* what, std::vector<double> ms) {
    std::sort(ms.begin(), ms.end());
    std::printf("[ bench    ] %s: %zu, p50 %.3f ms, p99 %.3f ms\n", what, ms.size(), ms[ms.size() / 2],
                ms[ms.size() * 99 / 100]);
  };
  report(postgres() ? "PostgreSQL CommitTurn (200 tokens, with marks)" : "SQLite CommitTurn (200 tokens, with marks)",
         commit_ms);
  for (const bool whole : {true, false}) {
    std::vector<double> ms;
    for (int i = 0; i < 1000; ++i) {
      const int id = 1 + (i * 7919) % kSessions;
      std::vector<int32_t> request = log_of(id);
      if (!whole) request.resize(kTurn + 10);
      request.insert(request.end(), kTurn, 3);  // the new turn
      const auto t0 = std::chrono::steady_clock::now();
      auto m = store->FindPrefix("owner", PrefixHashes(PrefixSeed("owner"), request), {});
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      ASSERT_TRUE(m.ok() && m->has_value());
      ASSERT_EQ((*m)->n_tokens, whole ? kTurns * kTurn : (kTurn + 10) / 32 * 32);
    }
    report(whole ? "FindPrefix, a whole history resent (56 hashes)" : "FindPrefix, a first turn shared (12 hashes)", ms);
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, StorePrefixes,
                         ::testing::Values(testing_util::Backend::kSqlite, testing_util::Backend::kPostgres),
                         testing_util::BackendName);

}  // namespace
}  // namespace mnemo
