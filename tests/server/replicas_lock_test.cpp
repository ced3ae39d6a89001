// Two `mnemo serve` replicas on one PostgreSQL database (issue 14), stories260K over real HTTP:
// a session's turn lock (a continuation reaching another replica waits for the running turn's
// commit, or gets 409 past the bound; a killed replica holds none) and the change notices
// (LISTEN/NOTIFY) that mark another replica's copy stale or drop it. (Failover and freshness:
// replicas_test.cpp.)
#include <gtest/gtest.h>
#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "store/store.h"

#include "replicas_util.h"

namespace mnemo::testing {
namespace {

// Two clients continue one conversation in sequence, one on replica a (a long turn), the other on
// replica b while a's turn still runs (a failover, a client ignoring affinity). b waits for a's
// turn lock, then continues from what the store holds: both turns succeed, each with its own
// history. The old code ran b's turn at once on the log a was extending, and the second commit
// lost the compare-and-set: a's long turn ended in a 409 error event after all its work.
TEST_F(Replicas, ContinuationWaitsForTheTurnRunningOnTheOtherReplica) {
  ASSERT_NO_FATAL_FAILURE(StartTwo(kLongTurn));
  auto &a = a_, &b = b_;
  Json r1 = a->Post("/v1/responses", Turn("Tell me a story about a cat."));
  ASSERT_TRUE(r1.is_object());
  const std::vector<int32_t> log1 = StoredLog(db_, r1["id"]);
  ASSERT_FALSE(log1.empty());

  LongTurn running(*a, r1["id"], 1800);
  ASSERT_TRUE(running.WaitGenerating()) << running.body() << a->proc.log();
  Json t2 = Turn("What did the cat eat?");
  t2["previous_response_id"] = r1["id"];
  const auto t0 = std::chrono::steady_clock::now();
  auto res = b->c.Post("/v1/responses", t2.dump(), "application/json");
  const auto t1 = std::chrono::steady_clock::now();
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200) << res->body << "\n" << b->proc.log();
  Json long_turn = running.Finish();
  ASSERT_TRUE(long_turn.is_object()) << "a's turn failed: " << running.body().substr(running.body().rfind("event:"))
                                     << "\n" << a->proc.log();
  EXPECT_EQ(Metric(b->c, "mnemo_turn_locks_total{result=\"waited\"}"), 1);
  EXPECT_LE(running.ended(), t1) << "b answered before a's turn ended";
  const double waited = Metric(b->c, "mnemo_turn_lock_wait_seconds_sum");
  std::printf("[ replicas ] b's continuation waited %.3f s for a's turn lock; answered %.3f s after it was sent, "
              "%.3f s after a's turn ended\n",
              waited, std::chrono::duration<double>(t1 - t0).count(),
              std::chrono::duration<double>(t1 - running.ended()).count());
  if (res->status != 200) return;
  Json r2 = Json::parse(res->body);

  // Each turn's stored log is its own history: r1's log, then its turn (b's a fork of r1's end).
  const std::vector<int32_t> a_log = StoredLog(db_, long_turn["id"]), b_log = StoredLog(db_, r2["id"]);
  ASSERT_GT(a_log.size(), log1.size() + 1800);
  ASSERT_GT(b_log.size(), log1.size());
  EXPECT_TRUE(std::equal(log1.begin(), log1.end(), a_log.begin()));
  EXPECT_TRUE(std::equal(log1.begin(), log1.end(), b_log.begin()));
  EXPECT_EQ(b_log.size(), static_cast<size_t>(r2["usage"]["input_tokens"].get<int>() +
                                              r2["usage"]["output_tokens"].get<int>()));
  Json got = a->Get("/v1/responses/" + r2["id"].get<std::string>());
  EXPECT_EQ(got["previous_response_id"], r1["id"]);
  EXPECT_EQ(AdvisoryLocks(db_), 0) << "a turn lock outlived its turn";
}

// A long turn of conversation cid on replica a and, while it runs, another on replica b (b may be
// a: two requests of one replica). b waits for a's turn lock, then reads the conversation again
// and continues after a's turn: both turns are in its items in commit order, after `earlier` (the
// texts it held before), and b's reply was computed with a's turn in its context. db: the store,
// read from outside.
void SecondTurnContinuesTheRunningOne(Replica& a, Replica& b, const std::string& db, const std::string& cid,
                                      const std::vector<std::string>& earlier) {
  const double waited_before = Metric(b.c, "mnemo_turn_locks_total{result=\"waited\"}");
  LongTurn running(a, Json{{"conversation", cid}}, 1800);
  ASSERT_TRUE(running.WaitGenerating()) << running.body() << a.proc.log();
  Json t2 = Turn("What did the cat eat?");
  t2["conversation"] = cid;
  auto res = b.c.Post("/v1/responses", t2.dump(), "application/json");
  const auto t_b = std::chrono::steady_clock::now();
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200) << res->body << "\n" << b.proc.log();
  Json long_turn = running.Finish();
  ASSERT_TRUE(long_turn.is_object()) << "a's turn failed: " << running.body().substr(running.body().rfind("event:"))
                                     << "\n" << a.proc.log();
  EXPECT_EQ(Metric(b.c, "mnemo_turn_locks_total{result=\"waited\"}"), waited_before + 1);
  EXPECT_LE(running.ended(), t_b) << "b answered before a's turn ended";
  if (res->status != 200) return;
  Json r2 = Json::parse(res->body);

  // b's context held a's whole turn: its input counts a's input and output, and more.
  const int a_total = long_turn["usage"]["input_tokens"].get<int>() + long_turn["usage"]["output_tokens"].get<int>();
  std::printf("[ replicas ] b's conversation turn: %d input tokens (a's turn ended at %d), %d cached\n",
              r2["usage"]["input_tokens"].get<int>(), a_total, Cached(r2));
  EXPECT_GT(r2["usage"]["input_tokens"].get<int>(), a_total) << r2["usage"].dump();
  // b's stored log holds a's turn. (It forks a's log inside a's reply: a reply generated past its
  // end-of-text tokens, ignore_eos, does not encode back to the tokens generated.)
  const std::vector<int32_t> a_log = StoredLog(db, long_turn["id"]), b_log = StoredLog(db, r2["id"]);
  ASSERT_GT(a_log.size(), 1800u);
  ASSERT_GT(b_log.size(), a_log.size());
  const size_t common = std::mismatch(a_log.begin(), a_log.end(), b_log.begin()).first - a_log.begin();
  std::printf("[ replicas ] b's log %zu tokens, a's %zu, common prefix %zu\n", b_log.size(), a_log.size(), common);

  // The items, whichever replica lists them: the earlier ones, a's turn, b's, in that order.
  std::vector<std::string> want = earlier;
  want.insert(want.end(), {"And then what happened?", Text(long_turn), "What did the cat eat?", Text(r2)});
  for (Replica* r : {&a, &b}) EXPECT_EQ(ItemTexts(*r, cid), want);
}

// The same with the Conversations API, where the turns continue one another: a conversation is
// append-only. The old code read the items before waiting and forked b's turn from the history
// without a's turn (its input had r1's tokens only), though its items were listed after a's.
TEST_F(Replicas, ConversationTurnWaitsForTheTurnRunningOnTheOtherReplica) {
  ASSERT_NO_FATAL_FAILURE(StartTwo(kLongTurn));
  const std::string cid = a_->Post("/v1/conversations", Json::object()).value("id", "");
  ASSERT_FALSE(cid.empty());
  Json t1 = Turn("Tell me a story about a cat.");
  t1["conversation"] = cid;
  Json r1 = a_->Post("/v1/responses", t1);
  ASSERT_TRUE(r1.is_object());
  SecondTurnContinuesTheRunningOne(*a_, *b_, db_, cid, {"Tell me a story about a cat.", Text(r1)});
  EXPECT_EQ(AdvisoryLocks(db_), 0) << "a turn lock outlived its turn";
}

// Two first turns of a conversation that has no session yet, on two replicas: the second waits for
// the conversation's own lock and continues after the first. The old code took no lock before a
// conversation had a session: both turns started it, each from an empty history, and the second's
// items were listed after the first's though its reply never saw them.
TEST_F(Replicas, FirstTurnsOfAConversationOnTwoReplicasTakeTurns) {
  ASSERT_NO_FATAL_FAILURE(StartTwo(kLongTurn));
  const std::string cid = a_->Post("/v1/conversations", Json::object()).value("id", "");
  ASSERT_FALSE(cid.empty());
  SecondTurnContinuesTheRunningOne(*a_, *b_, db_, cid, {});
  EXPECT_EQ(AdvisoryLocks(db_), 0) << "a turn lock outlived its turn";
}

// The same with both first turns on one replica (two requests).
TEST_F(Replicas, FirstTurnsOfAConversationOnOneReplicaTakeTurns) {
  auto a = LongTurnReplica(db_);
  ASSERT_GT(a->proc.port(), 0) << a->proc.log();
  const std::string cid = a->Post("/v1/conversations", Json::object()).value("id", "");
  ASSERT_FALSE(cid.empty());
  SecondTurnContinuesTheRunningOne(*a, *a, db_, cid, {});
  EXPECT_EQ(AdvisoryLocks(db_), 0) << "a turn lock outlived its turn";
}

// SQLite, one process: a conversation's turns take the same lock in memory. Two first turns of a
// conversation at once, and two later turns of another (it has a session then): each second turn
// waits and continues after the first. The old code took no lock without a shared store: the
// second turn started afresh, or forked the history it found (the running turn's not in it).
TEST(SqliteTurnLock, ConversationTurnsInOneProcessTakeTurns) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("mnemo-lock-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string db = (dir / "s.db").string();
  {
    std::vector<std::string> flags = {"--db", db};
    flags.insert(flags.end(), kLongTurn.begin(), kLongTurn.end());
    Replica a(flags);
    ASSERT_GT(a.proc.port(), 0) << a.proc.log();
    const std::string first = a.Post("/v1/conversations", Json::object()).value("id", "");
    const std::string later = a.Post("/v1/conversations", Json::object()).value("id", "");
    ASSERT_FALSE(first.empty() || later.empty());
    {
      SCOPED_TRACE("first turns");
      SecondTurnContinuesTheRunningOne(a, a, db, first, {});
    }
    Json t1 = Turn("Tell me a story about a cat.");
    t1["conversation"] = later;
    Json r1 = a.Post("/v1/responses", t1);
    ASSERT_TRUE(r1.is_object());
    SCOPED_TRACE("later turns");
    SecondTurnContinuesTheRunningOne(a, a, db, later, {"Tell me a story about a cat.", Text(r1)});
  }
  std::filesystem::remove_all(dir);
}

// n > 1 choices continuing a stored session: the prompt is committed first, then choice 0 appends
// to the session and the others to forks of it. The prompt's turn lock is held until the last
// choice commits, so a continuation of the prompt reaching replica b in between waits for the
// choices. The old code released it with the prompt's commit: b appended its turn to the session
// at once, and choice 0's commit lost the compare-and-set after all its work (an error in a's
// stream).
TEST_F(Replicas, ChoicesHoldTheTurnLockUntilTheLastCommits) {
  ASSERT_NO_FATAL_FAILURE(StartTwo(kLongTurn));
  auto &a = a_, &b = b_;
  Json history = Json::array({{{"role", "system"}, {"content", "You are a storyteller for children."}},
                              {{"role", "user"}, {"content", kUserTurns[0]}}});
  ASSERT_TRUE(Chat(*a, history).is_object());
  history.push_back({{"role", "user"}, {"content", kUserTurns[1]}});

  // On a: two choices of 1,800 tokens each, streamed.
  LongTurn running(*a, "/v1/chat/completions",
                   {{"model", "m"}, {"messages", history}, {"n", 2}, {"max_tokens", 1800}, {"ignore_eos", true},
                    {"temperature", 0}, {"stream", true}},
                   "\"content\"");
  ASSERT_TRUE(running.WaitGenerating()) << "a's choices did not start: " << running.body() << a->proc.log();
  // On b: the prompt continued with a reply of the client's own (the session as a's prompt left it).
  Json next = history;
  next.push_back({{"role", "assistant"}, {"content", "Once upon a time"}});
  next.push_back({{"role", "user"}, {"content", kUserTurns[2]}});
  Json rb = Chat(*b, next);
  EXPECT_EQ(running.Join(), 200);
  EXPECT_TRUE(rb.is_object());
  const std::string got = running.body();
  EXPECT_EQ(got.find("\"error\""), std::string::npos) << got.substr(got.rfind("data:", got.size() - 20)) << a->proc.log();
  size_t lengths = 0;
  for (size_t at = got.find("\"finish_reason\":\"length\""); at != std::string::npos;
       at = got.find("\"finish_reason\":\"length\"", at + 1)) {
    lengths++;
  }
  EXPECT_EQ(lengths, 2u) << "both choices ran to max_tokens";
  std::printf("[ replicas ] b's turn lock during a's choices: waited %.0f, free %.0f\n",
              Metric(b->c, "mnemo_turn_locks_total{result=\"waited\"}"),
              Metric(b->c, "mnemo_turn_locks_total{result=\"free\"}"));
  EXPECT_EQ(Metric(b->c, "mnemo_turn_locks_total{result=\"waited\"}"), 1);
  EXPECT_EQ(AdvisoryLocks(db_), 0) << "a turn lock outlived its turn";
}

// A continuation whose wait for the other replica's turn runs out (the bound follows
// --max-queue-ms) is refused with 409 session_conflict in OpenAI's error shape, before any work;
// the running turn is not disturbed.
TEST_F(Replicas, ContinuationPastTheWaitBoundIsA409) {
  auto a = LongTurnReplica(db_);
  auto b = ExactReplica(db_, {"--max-queue-ms", "300"});
  ASSERT_GT(a->proc.port(), 0) << a->proc.log();
  ASSERT_GT(b->proc.port(), 0) << b->proc.log();
  Json r1 = a->Post("/v1/responses", Turn("Tell me a story about a cat."));
  ASSERT_TRUE(r1.is_object());
  LongTurn running(*a, r1["id"], 1800);
  ASSERT_TRUE(running.WaitGenerating()) << running.body() << a->proc.log();
  Json t2 = Turn("What did the cat eat?");
  t2["previous_response_id"] = r1["id"];
  auto res = b->c.Post("/v1/responses", t2.dump(), "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 409) << res->body;
  Json e = Json::parse(res->body, nullptr, false);
  ASSERT_TRUE(e.is_object() && e.contains("error")) << res->body;
  EXPECT_EQ(e["error"]["type"], "invalid_request_error");
  EXPECT_EQ(e["error"]["code"], "session_conflict");
  EXPECT_NE(e["error"]["message"].get<std::string>().find("another replica"), std::string::npos) << res->body;
  EXPECT_EQ(Metric(b->c, "mnemo_turn_locks_total{result=\"timeout\"}"), 1);
  EXPECT_TRUE(running.Finish().is_object()) << running.body().substr(running.body().rfind("event:"));
  EXPECT_EQ(PgInt(db_, "SELECT count(*) FROM responses"), 2) << "b stored a turn";
}

// A replica killed (SIGKILL) in the middle of a turn held the session's turn lock; PostgreSQL
// releases it with the dead replica's connection, so the conversation continues on b at once
// instead of waiting out the bound.
TEST_F(Replicas, ReplicaKilledMidTurnReleasesItsLock) {
  ASSERT_NO_FATAL_FAILURE(StartTwo(kLongTurn));
  auto &a = a_, &b = b_;
  Json r1 = a->Post("/v1/responses", Turn("Tell me a story about a cat."));
  ASSERT_TRUE(r1.is_object());
  {
    LongTurn running(*a, r1["id"], 1800);
    ASSERT_TRUE(running.WaitGenerating()) << running.body() << a->proc.log();
    EXPECT_EQ(AdvisoryLocks(db_), 1) << "a holds no turn lock while its turn runs";
    a->proc.Stop(SIGKILL);
  }
  Json t2 = Turn("What did the cat eat?");
  t2["previous_response_id"] = r1["id"];
  const auto t0 = std::chrono::steady_clock::now();
  Json r2 = b->Post("/v1/responses", t2);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(r2.is_object());
  EXPECT_LT(took, 5.0) << "b waited for a dead replica's lock";
  EXPECT_EQ(Metric(b->c, "mnemo_turn_locks_total{result=\"timeout\"}"), 0);
  std::printf("[ replicas ] after a's kill b continued in %.3f s (lock %s)\n", took,
              Metric(b->c, "mnemo_turn_locks_total{result=\"waited\"}") > 0 ? "waited for" : "free");
  EXPECT_EQ(AdvisoryLocks(db_), 0);
  const std::vector<int32_t> log1 = StoredLog(db_, r1["id"]), log2 = StoredLog(db_, r2["id"]);
  ASSERT_GT(log2.size(), log1.size());
  EXPECT_TRUE(std::equal(log1.begin(), log1.end(), log2.begin()));
}

// A commit on replica a tells replica b, which holds a copy of the session (LISTEN/NOTIFY): b marks
// its copy stale before any request reaches it (no probe of b's), and the next turn on b appends
// the stored turns to it. A truncation by another writer makes b drop its copy.
TEST_F(Replicas, CommitOnOneReplicaMarksTheOthersCopyStale) {
  ASSERT_NO_FATAL_FAILURE(StartTwo(kExact));
  auto &a = a_, &b = b_;
  Json r2 = ContinueOnB();
  ASSERT_TRUE(r2.is_object());
  ASSERT_EQ(b->Get("/v1/sessions")["data"].size(), 1u);
  auto probes = [&](Replica& r) {
    double n = 0;
    for (const char* k : {"fresh", "stale", "loaded", "delta", "rebuilt", "absent"}) n += Syncs(r.c, k);
    return n;
  };
  const double b_probes = probes(*b);
  EXPECT_EQ(Metric(b->c, "mnemo_session_notices_total{action=\"stale\"}"), 0);

  Json t3 = Turn("Where did it go next?");
  t3["previous_response_id"] = r2["id"];
  Json r3 = a->Post("/v1/responses", t3);  // a appends b's turn, then commits its own: b is told
  ASSERT_TRUE(r3.is_object());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (Metric(b->c, "mnemo_session_notices_total{action=\"stale\"}") < 1 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(Metric(b->c, "mnemo_session_notices_total{action=\"stale\"}"), 1) << b->proc.log();
  EXPECT_EQ(probes(*b), b_probes) << "b probed the store";
  std::printf("[ replicas ] notice latency on b: %.3f ms\n",
              1e3 * Metric(b->c, "mnemo_session_notice_latency_seconds_sum"));

  Json t4 = Turn("Was it happy?");
  t4["previous_response_id"] = r3["id"];
  Json r4 = b->Post("/v1/responses", t4);
  ASSERT_TRUE(r4.is_object());
  EXPECT_EQ(Syncs(b->c, "delta"), 1) << "b's stale copy was not extended";
  EXPECT_GT(Cached(r4), 0) << "b's copy was not kept";

  // Another writer cuts the log (an edit): b, holding it at r4's end, drops its copy.
  auto store = Store::Open(db_);
  ASSERT_TRUE(store.ok());
  auto resp = (*store)->GetResponse(r4["id"], "");
  ASSERT_TRUE(resp.ok() && resp->has_value() && (*resp)->session_id);
  ASSERT_TRUE((*store)->TruncateSession(*(*resp)->session_id, 10).ok());
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (b->Get("/v1/sessions")["data"].size() > 0 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(b->Get("/v1/sessions")["data"].size(), 0u) << "b kept a copy the store cut";
  EXPECT_EQ(Metric(b->c, "mnemo_session_notices_total{action=\"dropped\"}"), 1);
}

// Notices sent while a replica's listener is disconnected are lost (NOTIFY keeps nothing for a
// listener that is gone): when it listens again, the replica marks every copy it holds to be
// checked against the store on its next turn, and says so. Here b's listener is cut off (and kept
// off) while another writer appends to the session b holds; b's next turn on it brings the copy in
// step. The old code logged only "listening again" and took the copies for fresh.
TEST_F(Replicas, NoticesLostWhileNotListeningMarkEveryCopyStale) {
  ASSERT_NO_FATAL_FAILURE(StartTwo(kExact));
  auto& b = b_;
  Json r2 = ContinueOnB();
  ASSERT_TRUE(r2.is_object());
  auto store = Store::Open(db_);  // the other writer, connected before the outage
  ASSERT_TRUE(store.ok()) << store.error().message;
  auto resp = (*store)->GetResponse(r2["id"], "");
  ASSERT_TRUE(resp.ok() && resp->has_value() && (*resp)->session_id);
  const int64_t sid = *(*resp)->session_id;
  const int64_t n = (*resp)->end_token;

  const std::string name = db_.substr(db_.rfind('/') + 1);
  ASSERT_TRUE(pg_->Sql("ALTER DATABASE " + name + " WITH ALLOW_CONNECTIONS false"));
  ASSERT_TRUE(pg_->Sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname='" + name +
                       "' AND query LIKE 'LISTEN%'"));
  auto wait_log = [&](const std::string& what) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (b->proc.log().find(what) == std::string::npos && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return b->proc.log().find(what) != std::string::npos;
  };
  ASSERT_TRUE(wait_log("connection lost")) << b->proc.log();
  const std::vector<int32_t> more = {5, 6, 7};
  ASSERT_TRUE((*store)->AppendTurn(sid, n, n, more, true).ok());  // its notice reaches no one
  ASSERT_TRUE(pg_->Sql("ALTER DATABASE " + name + " WITH ALLOW_CONNECTIONS true"));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (Metric(b->c, "mnemo_store_listens_total") < 2 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(Metric(b->c, "mnemo_store_listens_total"), 2) << b->proc.log();  // at start, then again
  EXPECT_EQ(Metric(b->c, "mnemo_session_resync_marks_total"), 1) << b->proc.log();
  EXPECT_NE(b->proc.log().find("marked to be checked against the store"), std::string::npos);
  EXPECT_EQ(Metric(b->c, "mnemo_session_notices_total{action=\"stale\"}"), 0) << "a notice reached b";

  // b's next turn on the session finds the store's turn (a delta) and continues after it.
  Json t3 = Turn("Where did it go next?");
  t3["previous_response_id"] = r2["id"];
  Json r3 = b->Post("/v1/responses", t3);
  ASSERT_TRUE(r3.is_object());
  EXPECT_EQ(Syncs(b->c, "delta"), 1) << b->proc.log();
}

}  // namespace
}  // namespace mnemo::testing
