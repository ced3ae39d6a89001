// What the PostgreSQL store adds to the common suite (which runs on both backends): the
// compare-and-set between two store objects on one database, cluster-wide session ids, schema
// creation by replicas starting together, and reconnecting after dropped connections.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <thread>

#include "store/pg_conn.h"
#include "store/store.h"
#include "test_util.h"

namespace mnemo {
namespace {

using testing_util::MakeResponse;
using testing_util::PgServer;

class PgStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    server_ = PgServer::Shared(&why);
    if (!server_) GTEST_SKIP() << why;
    url_ = server_->NewDatabase();
    ASSERT_FALSE(url_.empty());
  }
  std::unique_ptr<Store> Open() {
    auto s = Store::Open(url_);
    EXPECT_TRUE(s.ok()) << (s.ok() ? "" : s.error().message);
    return s.ok() ? std::move(*s) : nullptr;
  }
  std::string DbName() const { return url_.substr(url_.rfind('/') + 1); }
  PgServer* server_ = nullptr;
  std::string url_;
};

TurnCommit Turn(int64_t session, int64_t begin, const std::vector<int32_t>& tokens, const std::string& resp) {
  TurnCommit c;
  c.session_id = session;
  c.begin = begin;
  c.prompt_end = begin + 1;
  c.tokens = tokens;
  c.response = MakeResponse(resp);
  return c;
}

// Two replicas' stores on one database: the second to append at the same position loses with
// kAborted and nothing of its turn (not its response) is stored.
TEST_F(PgStoreTest, CompareAndSetRejectsTheSecondAppend) {
  auto a = Open(), b = Open();
  ASSERT_TRUE(a && b);
  EXPECT_TRUE(a->shared());
  ASSERT_TRUE(a->CreateSession(1, "").ok());
  std::vector<int32_t> t1 = {1, 2, 3}, t2 = {4, 5}, t3 = {6, 7, 8};
  ASSERT_TRUE(a->CommitTurn(Turn(1, 0, t1, "resp_a1")).ok());
  // Both saw 3 tokens; a commits first.
  ASSERT_TRUE(a->CommitTurn(Turn(1, 3, t2, "resp_a2")).ok());
  auto lost = b->CommitTurn(Turn(1, 3, t3, "resp_b2"));
  ASSERT_FALSE(lost.ok());
  EXPECT_EQ(lost.error().code, StatusCode::kAborted) << lost.error().message;
  auto gone = b->GetResponse("resp_b2", "");
  ASSERT_TRUE(gone.ok());
  EXPECT_FALSE(gone->has_value());
  auto s = b->LoadSession(1);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->tokens, (std::vector<int32_t>{1, 2, 3, 4, 5}));
  // A truncating commit checks the length it expected before cutting.
  TurnCommit cut = Turn(1, 2, t3, "resp_b3");
  cut.truncate_to = 2;
  cut.expected_length = 3;  // stale: the session has 5
  auto stale = b->CommitTurn(cut);
  ASSERT_FALSE(stale.ok());
  EXPECT_EQ(stale.error().code, StatusCode::kAborted);
  cut.expected_length = 5;
  ASSERT_TRUE(b->CommitTurn(cut).ok());
  s = a->LoadSession(1);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->tokens, (std::vector<int32_t>{1, 2, 6, 7, 8}));
}

// Many rounds of two threads (two stores) committing at the same position at once: exactly one
// wins each round, and the log is exactly the winners' turns.
TEST_F(PgStoreTest, RacingCommitsHaveExactlyOneWinner) {
  auto a = Open(), b = Open();
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(a->CreateSession(7, "").ok());
  std::vector<int32_t> expect;
  const int kRounds = 40;
  for (int round = 0; round < kRounds; ++round) {
    const int64_t begin = static_cast<int64_t>(expect.size());
    std::vector<int32_t> ta = {round * 2}, tb = {round * 2 + 1};
    std::atomic<int> go{0};
    Result<std::vector<std::string>> ra = MakeError("unset"), rb = MakeError("unset");
    std::thread x([&] {
      go++;
      while (go < 2) {}
      ra = a->CommitTurn(Turn(7, begin, ta, "resp_a" + std::to_string(round)));
    });
    std::thread y([&] {
      go++;
      while (go < 2) {}
      rb = b->CommitTurn(Turn(7, begin, tb, "resp_b" + std::to_string(round)));
    });
    x.join();
    y.join();
    ASSERT_NE(ra.ok(), rb.ok()) << "round " << round;
    const auto& loser = ra.ok() ? rb : ra;
    EXPECT_EQ(loser.error().code, StatusCode::kAborted) << loser.error().message;
    expect.push_back(ra.ok() ? ta[0] : tb[0]);
  }
  auto s = a->LoadSession(7);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->tokens, expect);
  EXPECT_EQ(static_cast<int>(s->turns.size()), kRounds);
}

// Session ids from two stores never collide, and stay above ids created explicitly.
TEST_F(PgStoreTest, SessionIdsAreClusterWide) {
  auto a = Open(), b = Open();
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(a->CreateSession(100, "").ok());
  std::set<int64_t> seen;
  for (int i = 0; i < 40; ++i) {  // several blocks of ids per store
    for (Store* s : {a.get(), b.get()}) {
      auto id = s->NewSessionId();
      ASSERT_TRUE(id.ok()) << id.error().message;
      EXPECT_GT(*id, 100);
      EXPECT_TRUE(seen.insert(*id).second) << "id " << *id << " handed out twice";
    }
  }
  // An id drawn by one store and created by the other is taken: never drawn again.
  auto next = b->NewSessionId();
  ASSERT_TRUE(next.ok());
  ASSERT_TRUE(a->CreateSession(*next, "").ok());
  EXPECT_FALSE(b->CreateSession(*next, "").ok());
}

// Replicas starting together create the schema once.
TEST_F(PgStoreTest, ConcurrentOpensMigrateOnce) {
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&] {
      auto s = Store::Open(url_);
      if (s.ok()) ok++;
      else ADD_FAILURE() << s.error().message;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 4);
}

// Every connection dropped (a restart, a network fault): the next calls reconnect and succeed.
TEST_F(PgStoreTest, DroppedConnectionsReconnect) {
  auto a = Open();
  ASSERT_TRUE(a);
  ASSERT_TRUE(a->CreateSession(1, "").ok());
  ASSERT_TRUE(a->PutResponse(MakeResponse("resp_1")).ok());
  ASSERT_TRUE(server_->TerminateConnections(DbName()));
  auto r = a->GetResponse("resp_1", "");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_TRUE(r->has_value());
  ASSERT_TRUE(server_->TerminateConnections(DbName()));
  EXPECT_TRUE(a->AppendTurn(1, 0, 1, std::vector<int32_t>{1, 2}, true).ok());
}

// The statements every turn runs are prepared once per connection (pg::Stmt): the server holds
// one by its name; one the server dropped (DISCARD ALL, as a connection pooler may send) is
// prepared again, and so is every one after a reconnect (a new server session holds none).
TEST_F(PgStoreTest, PreparedStatementsArePreparedAgainWhenTheServerForgotThem) {
  auto c = pg::Conn::Open(url_, 5, "");
  ASSERT_TRUE(c.ok()) << c.error().message;
  pg::Conn& conn = **c;
  const pg::Stmt plus_one{"test_plus_one", "SELECT $1::int + 1"};
  auto held = [&] {
    auto n = conn.QueryInt("SELECT count(*) FROM pg_prepared_statements WHERE name='test_plus_one'");
    return n.ok() ? n->value_or(-1) : -1;
  };
  auto run = [&](int v) {
    auto r = conn.QueryInt(plus_one, {v});
    return r.ok() && r->has_value() ? **r : -1;
  };
  for (int i = 0; i < 3; i++) EXPECT_EQ(run(i), i + 1);
  EXPECT_EQ(held(), 1);
  ASSERT_TRUE(conn.Script("DISCARD ALL").ok());
  EXPECT_EQ(held(), 0);
  EXPECT_EQ(run(41), 42);
  EXPECT_EQ(held(), 1);
  ASSERT_TRUE(server_->TerminateConnections(DbName()));
  EXPECT_EQ(run(1), -1);  // the connection is gone
  ASSERT_TRUE(conn.broken());
  ASSERT_TRUE(conn.Reconnect().ok());
  EXPECT_EQ(held(), 0);
  EXPECT_EQ(run(1), 2);
  EXPECT_EQ(held(), 1);
}

// No server: an Error with kUnavailable, not a crash or a hang past the connect timeout.
TEST_F(PgStoreTest, UnreachableServerIsUnavailable) {
  StoreOptions o;
  o.pg_connect_timeout_s = 2;
  auto s = Store::Open("postgresql://mnemo@127.0.0.1:1/none", o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code, StatusCode::kUnavailable) << s.error().message;
  auto bad = Store::Open("postgresql://[broken", o);
  EXPECT_FALSE(bad.ok());
}

// A schema written by a newer mnemo is refused.
TEST_F(PgStoreTest, NewerSchemaIsRefused) {
  ASSERT_TRUE(Open());
  ASSERT_TRUE(testing_util::PgExec(url_, "INSERT INTO mnemo_schema_version VALUES (99, 0)"));
  auto newer = Store::Open(url_);
  ASSERT_FALSE(newer.ok());
  EXPECT_NE(newer.error().message.find("newer"), std::string::npos) << newer.error().message;
}

// A store of version 2 (before request-id records, cut counts and the prefix index) is upgraded at open, its data kept.
TEST_F(PgStoreTest, VersionTwoUpgrades) {
  auto s = Open();
  ASSERT_TRUE(s);
  ASSERT_TRUE(s->CreateSession(5, "").ok());
  s.reset();
  ASSERT_TRUE(testing_util::PgExec(url_, "DROP TABLE request_records"));
  ASSERT_TRUE(testing_util::PgExec(url_, "DROP TABLE session_prefixes"));
  ASSERT_TRUE(testing_util::PgExec(url_, "ALTER TABLE sessions DROP COLUMN cuts"));
  ASSERT_TRUE(testing_util::PgExec(url_, "DELETE FROM mnemo_schema_version WHERE version > 2"));
  s = Open();
  ASSERT_TRUE(s);
  EXPECT_TRUE(s->LoadSession(5).ok());
  auto v = s->GetSessionVersion(5);  // v3 -> v4: sessions count their cuts from 0
  ASSERT_TRUE(v.ok() && v->has_value());
  EXPECT_EQ((*v)->cuts, 0);
  auto none = s->GetRequest("", "r");
  ASSERT_TRUE(none.ok()) << none.error().message;
  EXPECT_FALSE(none->has_value());
}

// ---- several replicas at once (issue 14): the turn lock and change notices ----

// Waits up to 10 s for pred.
template <class Pred>
bool WaitFor(Pred pred) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

// One holder at a time, across stores and within one (advisory locks nest per connection: the
// store refuses a second take itself); released by UnlockTurn, and by the server when the
// holder's connection drops (a replica killed mid-turn).
TEST_F(PgStoreTest, TurnLockIsExclusiveAndDiesWithItsConnection) {
  auto a = Open(), b = Open();
  ASSERT_TRUE(a && b);
  auto held = [](Store& s, int64_t id) {
    auto r = s.TryLockTurn(id);
    EXPECT_TRUE(r.ok()) << r.error().message;
    return r.ok() && *r;
  };
  EXPECT_TRUE(held(*a, 7));
  EXPECT_FALSE(held(*b, 7));
  EXPECT_FALSE(held(*a, 7)) << "a second turn of the same process got the lock";
  EXPECT_TRUE(held(*b, 8)) << "another session's lock";
  EXPECT_TRUE(held(*a, 7 + (int64_t{1} << 32))) << "ids that differ in their high half share a lock";
  a->UnlockTurn(7);
  EXPECT_TRUE(held(*b, 7));
  // b's connections dropped (its process killed, the network): the server releases its locks.
  b.reset();
  EXPECT_TRUE(WaitFor([&] { return held(*a, 7); }));
  a->UnlockTurn(7);
  auto c = Open();
  ASSERT_TRUE(c);
  EXPECT_TRUE(held(*c, 9));
  ASSERT_TRUE(server_->TerminateConnections(DbName()));
  EXPECT_TRUE(WaitFor([&] { return held(*a, 9); })) << "a terminated connection kept its lock";
  EXPECT_TRUE(held(*c, 10)) << "the lock connection reconnects";
}

struct Changes {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<SessionChange> got;  // the sessions' changes
  int resyncs = 0;                 // SessionChange::resync: the listener began listening
  std::function<void(const SessionChange&)> Fn() {
    return [this](const SessionChange& c) {
      std::lock_guard lock(mu);
      if (c.resync) resyncs++;
      else got.push_back(c);
      cv.notify_all();
    };
  }
  int Resyncs() {
    std::lock_guard lock(mu);
    return resyncs;
  }
  bool WaitCount(size_t n) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, std::chrono::seconds(10), [&] { return got.size() >= n; });
  }
  size_t size() {
    std::lock_guard lock(mu);
    return got.size();
  }
};

// A commit, a truncation and a deletion on one store reach the other's watcher with the version
// they left, in order; never the writer's own watcher; a creation tells no one. Each time a
// listener begins listening (at start, again after its connection dropped) its watcher is told
// (a resync: what was sent meanwhile is lost).
TEST_F(PgStoreTest, ChangesReachTheOtherStores) {
  auto a = Open(), b = Open();
  ASSERT_TRUE(a && b);
  Changes at_a, at_b;
  a->Watch(at_a.Fn());
  b->Watch(at_b.Fn());
  ASSERT_TRUE(WaitFor([&] { return a->Watching() && b->Watching(); }));
  EXPECT_EQ(at_a.Resyncs(), 1);
  EXPECT_EQ(at_b.Resyncs(), 1);
  std::vector<int32_t> t1 = {1, 2, 3}, t2 = {4, 5};
  TurnCommit first = Turn(1, 0, t1, "resp_1");
  first.create_session = true;
  ASSERT_TRUE(a->CommitTurn(first).ok());
  ASSERT_TRUE(a->CommitTurn(Turn(1, 3, t2, "resp_2")).ok());
  ASSERT_TRUE(a->TruncateSession(1, 4).ok());
  ASSERT_TRUE(a->DeleteSession(1).ok());
  ASSERT_TRUE(at_b.WaitCount(3));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ASSERT_EQ(at_b.size(), 3u);
  EXPECT_EQ(at_b.got[0].id, 1);
  ASSERT_TRUE(at_b.got[0].version);
  EXPECT_EQ(at_b.got[0].version->n_tokens, 5);
  EXPECT_EQ(at_b.got[0].version->cuts, 0);
  ASSERT_TRUE(at_b.got[1].version);
  EXPECT_EQ(at_b.got[1].version->n_tokens, 4);
  EXPECT_EQ(at_b.got[1].version->cuts, 1);
  EXPECT_FALSE(at_b.got[2].version) << "deleted";
  EXPECT_NEAR(at_b.got[2].sent_at, UnixNow(), 10);
  EXPECT_EQ(at_a.size(), 0u) << "a heard its own changes";
  // A rolled-back write tells nothing: the compare-and-set loser.
  ASSERT_TRUE(b->CreateSession(2, "").ok());
  ASSERT_FALSE(a->CommitTurn(Turn(2, 5, t2, "resp_3")).ok());
  // After Watch(nullptr) no more calls; the listener survives its connection's loss.
  b->Watch(nullptr);
  ASSERT_TRUE(server_->TerminateConnections(DbName()));
  ASSERT_TRUE(WaitFor([&] { return a->Watching(); }));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // a's listener reconnects
  ASSERT_TRUE(WaitFor([&] { return a->Watching(); }));
  ASSERT_TRUE(b->AppendTurn(2, 0, 0, t1, true).ok());
  EXPECT_TRUE(at_a.WaitCount(1)) << "no notice after the listener's connection was terminated";
  ASSERT_EQ(at_a.size(), 1u);
  ASSERT_TRUE(at_a.got[0].version);
  EXPECT_EQ(at_a.got[0].version->n_tokens, 3) << "the rolled-back commit was told";
  EXPECT_EQ(at_a.Resyncs(), 2) << "a's listener listened again untold";
  EXPECT_EQ(at_b.size(), 3u);
}

// Measured, not run by default (docs/benchmarks.md, issue 14): MNEMO_BENCH_NOTIFY=200 commits
// that many turns on one store and times each from just before CommitTurn to the other store's
// watcher call (NOTIFY delivery latency, the commit included: PostgreSQL sends the notice as the
// transaction commits, often before CommitTurn has returned), and CommitTurn itself.
TEST_F(PgStoreTest, BenchNotifyLatency) {
  const char* env = std::getenv("MNEMO_BENCH_NOTIFY");
  if (!env) GTEST_SKIP() << "set MNEMO_BENCH_NOTIFY=200 to measure";
  const int n = std::atoi(env);
  auto a = Open(), b = Open();
  ASSERT_TRUE(a && b);
  std::mutex mu;
  std::condition_variable cv;
  std::chrono::steady_clock::time_point heard;
  int64_t heard_n = -1;
  b->Watch([&](const SessionChange& c) {
    std::lock_guard lock(mu);
    heard = std::chrono::steady_clock::now();
    heard_n = c.version ? c.version->n_tokens : -1;
    cv.notify_all();
  });
  ASSERT_TRUE(WaitFor([&] { return b->Watching(); }));
  ASSERT_TRUE(a->CreateSession(1, "").ok());
  std::vector<int32_t> turn(64, 3);
  std::vector<double> notify_ms, commit_ms;
  for (int i = 0; i < n; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_TRUE(a->CommitTurn(Turn(1, int64_t{64} * i, turn, "resp_" + std::to_string(i))).ok());
    const auto t1 = std::chrono::steady_clock::now();
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(5), [&] { return heard_n == int64_t{64} * (i + 1); }));
    notify_ms.push_back(std::chrono::duration<double, std::milli>(heard - t0).count());
    commit_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  std::sort(notify_ms.begin(), notify_ms.end());
  std::sort(commit_ms.begin(), commit_ms.end());
  std::printf("[ bench    ] NOTIFY on PostgreSQL (127.0.0.1), %d commits: from CommitTurn's call to the other "
              "store's watcher p50 %.3f ms, p99 %.3f ms; CommitTurn p50 %.3f ms, p99 %.3f ms\n",
              n, notify_ms[n / 2], notify_ms[n * 99 / 100], commit_ms[n / 2], commit_ms[n * 99 / 100]);
}

}  // namespace
}  // namespace mnemo
