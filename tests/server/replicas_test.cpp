// Two `mnemo serve` replicas on one PostgreSQL database (issue 14), stories260K over real HTTP:
// failover and freshness. A conversation and a previous_response_id chain started on one replica
// continue on the other, which rebuilds the KV from the stored text (nothing cached there) and
// extends the same chain; the routing key a front sends (X-Mnemo-Affinity) is in every id of the
// chain; a copy that another replica extended or cut is brought in step; a stateless chat history
// finds its stored session by the prefix index; and at temperature 0 the continued turn says what
// it says on a single replica. (Turn locks and change notices: replicas_lock_test.cpp.)
#include <gtest/gtest.h>
#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <thread>

#include "format/make_model.h"
#include "store/store.h"

#include "../store/test_util.h"
#include "replicas_util.h"

namespace mnemo::testing {
namespace {

TEST_F(Replicas, ChainStartedOnOneContinuesOnTheOther) {
  ASSERT_NO_FATAL_FAILURE(StartTwo());
  Replica &a = *a_, &b = *b_;

  // The key a front chose (sanitised: only [A-Za-z0-9], at most 16) goes into the first id ...
  Json r1 = a.Post("/v1/responses", Turn("Tell me a story about a cat."), "k9-Z!");
  ASSERT_TRUE(r1.is_object());
  const std::regex keyed("resp_k9Z_[0-9a-f]{32}");
  EXPECT_TRUE(std::regex_match(r1["id"].get<std::string>(), keyed)) << r1["id"];
  // ... and along the chain, whichever replica mints it (no header on later turns).
  Json prev2 = Turn("What did the cat eat?");
  prev2["previous_response_id"] = r1["id"];
  Json r2 = b.Post("/v1/responses", prev2);
  ASSERT_TRUE(r2.is_object());
  EXPECT_TRUE(std::regex_match(r2["id"].get<std::string>(), keyed)) << r2["id"];
  EXPECT_EQ(Cached(r2), 0) << "b holds no KV of this conversation: it recomputes it";
  Json prev3 = Turn("Where did it go next?");
  prev3["previous_response_id"] = r2["id"];
  Json r3 = a.Post("/v1/responses", prev3);
  ASSERT_TRUE(r3.is_object());
  EXPECT_TRUE(std::regex_match(r3["id"].get<std::string>(), keyed)) << r3["id"];

  // The chain is intact from either replica.
  Json got = b.Get("/v1/responses/" + r3["id"].get<std::string>());
  EXPECT_EQ(got["previous_response_id"], r2["id"]);
  got = a.Get("/v1/responses/" + r2["id"].get<std::string>());
  EXPECT_EQ(got["previous_response_id"], r1["id"]);
  EXPECT_EQ(Text(got), Text(r2));

  // Temperature 0: the turn b continued from the stored text says what a says when it serves the
  // whole chain itself (its KV cached).
  Json s1 = a.Post("/v1/responses", Turn("Tell me a story about a cat."));
  Json s2 = Turn("What did the cat eat?");
  s2["previous_response_id"] = s1["id"];
  Json same = a.Post("/v1/responses", s2);
  EXPECT_EQ(Text(s1), Text(r1));
  EXPECT_EQ(Text(same), Text(r2));
  EXPECT_GT(Cached(same), 0);
  // A chain minted without a key keeps plain ids.
  EXPECT_TRUE(std::regex_match(s1["id"].get<std::string>(), std::regex("resp_[0-9a-f]{32}"))) << s1["id"];
}

TEST_F(Replicas, ConversationStartedOnOneContinuesOnTheOther) {
  ASSERT_NO_FATAL_FAILURE(StartTwo());
  Replica &a = *a_, &b = *b_;

  Json conv = a.Post("/v1/conversations", Json::object(), "shard7");
  ASSERT_TRUE(conv.is_object());
  const std::string cid = conv["id"];
  EXPECT_TRUE(std::regex_match(cid, std::regex("conv_shard7_[0-9a-f]{32}"))) << cid;
  const std::regex keyed("resp_shard7_[0-9a-f]{32}");

  Json t1 = Turn("Tell me a story about a dog.");
  t1["conversation"] = cid;
  Json r1 = a.Post("/v1/responses", t1);
  ASSERT_TRUE(r1.is_object());
  EXPECT_TRUE(std::regex_match(r1["id"].get<std::string>(), keyed)) << r1["id"];
  Json t2 = Turn("What was the dog's name?");
  t2["conversation"] = cid;
  Json r2 = b.Post("/v1/responses", t2);
  ASSERT_TRUE(r2.is_object());
  EXPECT_TRUE(std::regex_match(r2["id"].get<std::string>(), keyed)) << r2["id"];
  EXPECT_EQ(Cached(r2), 0);
  Json t3 = Turn("And then?");
  t3["conversation"] = cid;
  Json r3 = a.Post("/v1/responses", t3);
  ASSERT_TRUE(r3.is_object());

  // Every turn's text, in order, whichever replica lists it.
  for (Replica* r : {&a, &b}) {
    const std::vector<std::string> texts = ItemTexts(*r, cid);
    ASSERT_EQ(texts.size(), 6u);
    EXPECT_EQ(texts[0], "Tell me a story about a dog.");
    EXPECT_EQ(texts[1], Text(r1));
    EXPECT_EQ(texts[2], "What was the dog's name?");
    EXPECT_EQ(texts[3], Text(r2));
    EXPECT_EQ(texts[4], "And then?");
    EXPECT_EQ(texts[5], Text(r3));
  }
}

// A turn retried on the other replica (as HAProxy redispatches it when the first replica died after
// its commit) is answered from the store, from the record the first replica committed with it.
TEST_F(Replicas, RequestIdRetriedOnTheOtherReplicaIsAnsweredFromTheStore) {
  ASSERT_NO_FATAL_FAILURE(StartTwo());
  Replica &a = *a_, &b = *b_;
  Json conv = a.Post("/v1/conversations", Json::object());
  ASSERT_TRUE(conv.is_object());
  Json turn = Turn("Tell me a story about a dog.");
  turn["conversation"] = conv["id"];
  const httplib::Headers h = {{"X-Mnemo-Request-Id", "front-retry-1"}};
  auto first = a.c.Post("/v1/responses", h, turn.dump(), "application/json");
  ASSERT_TRUE(first && first->status == 200) << (first ? first->body : "no response");
  auto retry = b.c.Post("/v1/responses", h, turn.dump(), "application/json");
  ASSERT_TRUE(retry && retry->status == 200) << (retry ? retry->body : "no response");
  EXPECT_EQ(retry->get_header_value("X-Mnemo-Deduplicated"), "true");
  EXPECT_EQ(Json::parse(retry->body), Json::parse(first->body));
  Json items = b.Get("/v1/conversations/" + conv["id"].get<std::string>() + "/items");
  EXPECT_EQ(items["data"].size(), 2u) << items.dump();
}

// A replica started on another model (another vocabulary or chat template) against the shared store must not touch
// the sessions the running replicas serve: it refuses to start, and they are all still there.
TEST_F(Replicas, ReplicaOfAnotherModelLeavesTheSessionsAlone) {
  Replica a(db_);
  ASSERT_GT(a.proc.port(), 0) << a.proc.log();
  Json r1 = a.Post("/v1/responses", Turn("Tell me a story about a cat."));
  ASSERT_TRUE(r1.is_object());
  const int64_t sessions = PgInt(db_, "SELECT count(*) FROM sessions");
  const int64_t tokens = PgInt(db_, "SELECT coalesce(sum(n_tokens), 0) FROM sessions");
  const int64_t identity = PgInt(db_, "SELECT value FROM mnemo_meta WHERE key='token_identity'");
  ASSERT_GT(sessions, 0);

  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("mnemo-other-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  MakeModelOptions o;
  o.preset = "tiny";
  o.seed = 5;
  o.dtype = DType::F32;
  // The same vocabulary with another chat template: token logs that mean other text.
  o.vocab_path = std::string(MNEMO_SHARED_DIR) + "/models/stories260K/stories260K.gguf";
  o.chat_template = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}[assistant] ";
  o.output_path = (dir / "other.gguf").string();
  ASSERT_TRUE(MakeModel(o).ok());
  {
    ServerProcess other({"--db", db_}, o.output_path);
    EXPECT_EQ(other.port(), 0) << "a replica of another model started on the shared store";
    EXPECT_NE(other.log().find("another vocabulary or chat template"), std::string::npos) << other.log();
  }
  std::filesystem::remove_all(dir);
  EXPECT_EQ(PgInt(db_, "SELECT count(*) FROM sessions"), sessions);
  EXPECT_EQ(PgInt(db_, "SELECT coalesce(sum(n_tokens), 0) FROM sessions"), tokens);
  EXPECT_EQ(PgInt(db_, "SELECT value FROM mnemo_meta WHERE key='token_identity'"), identity);
  // And the conversation continues on the replica of the store's model.
  Json t2 = Turn("What did the cat eat?");
  t2["previous_response_id"] = r1["id"];
  EXPECT_TRUE(a.Post("/v1/responses", t2).is_object());
}

// The database refusing connections (a restart, an outage): requests that need it get a 503 in
// OpenAI's error shape, naming neither host nor database, and succeed again once it is back.
TEST_F(Replicas, UnreachableDatabaseIsA503ThenRecovers) {
  Replica a(db_);
  ASSERT_GT(a.proc.port(), 0) << a.proc.log();
  ASSERT_TRUE(a.Post("/v1/conversations", Json::object()).is_object());
  const std::string name = db_.substr(db_.rfind('/') + 1);
  ASSERT_TRUE(pg_->Sql("ALTER DATABASE " + name + " WITH ALLOW_CONNECTIONS false"));
  ASSERT_TRUE(pg_->TerminateConnections(name));
  auto r = a.c.Post("/v1/conversations", "{}", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503) << r->body;
  Json e = Json::parse(r->body, nullptr, false);
  ASSERT_TRUE(e.is_object() && e.contains("error")) << r->body;
  EXPECT_EQ(e["error"]["type"], "server_error");
  EXPECT_EQ(e["error"]["code"], "unavailable");
  EXPECT_EQ(r->body.find(name), std::string::npos) << r->body;
  EXPECT_EQ(r->body.find("127.0.0.1"), std::string::npos) << r->body;
  ASSERT_TRUE(pg_->Sql("ALTER DATABASE " + name + " WITH ALLOW_CONNECTIONS true"));
  EXPECT_TRUE(a.Post("/v1/conversations", Json::object()).is_object());
  Json r1 = a.Post("/v1/responses", Turn("Hello there."));
  EXPECT_TRUE(r1.is_object());
}

// Freshness (issue 14): a conversation continued on replica b, which appended turns to the session
// a holds, comes back to a. a's copy is a prefix of the stored log: a appends the missing tokens
// (prefilled with the turn) and keeps the KV of what it had, instead of committing on a stale copy
// (which lost the store's compare-and-set and failed the turn). At temperature 0 on the exact path
// the turns say what one replica serving the whole conversation says.
TEST_F(Replicas, ConversationBackOnTheFirstReplicaCatchesUp) {
  const std::vector<std::string> exact = {"--precision", "f32", "--kv-dtype", "f32", "--kv-disk-mb", "0"};
  auto replica = [&](const std::string& db) {
    std::vector<std::string> f = {"--db", db};
    f.insert(f.end(), exact.begin(), exact.end());
    return std::make_unique<Replica>(f);
  };
  auto a = replica(db_);
  ASSERT_GT(a->proc.port(), 0) << a->proc.log();
  Json r1 = a->Post("/v1/responses", Turn("Tell me a story about a cat."));
  ASSERT_TRUE(r1.is_object());
  auto b = replica(db_);  // started after r1: it may hold r1's session as well
  ASSERT_GT(b->proc.port(), 0) << b->proc.log();
  Json t2 = Turn("What did the cat eat?");
  t2["previous_response_id"] = r1["id"];
  Json r2 = b->Post("/v1/responses", t2);
  ASSERT_TRUE(r2.is_object());
  Json t3 = Turn("Where did it go next?");
  t3["previous_response_id"] = r2["id"];
  auto back = a->c.Post("/v1/responses", t3.dump(), "application/json");
  ASSERT_TRUE(back);
  ASSERT_EQ(back->status, 200) << back->body << "\n" << a->proc.log();
  Json r3 = Json::parse(back->body);
  // a kept the KV of the turn it served (the prefix), and computed b's turn with the new one.
  const int r1_tokens = r1["usage"]["input_tokens"].get<int>() + r1["usage"]["output_tokens"].get<int>();
  EXPECT_GE(Cached(r3), r1_tokens - 32) << r3["usage"].dump();
  std::printf("[ replicas ] back on a: %d of %d input tokens cached (a's copy held %d)\n", Cached(r3),
              r3["usage"]["input_tokens"].get<int>(), r1_tokens);
  EXPECT_LT(Cached(r3), r3["usage"]["input_tokens"].get<int>());
  EXPECT_EQ(Syncs(a->c, "delta"), 1);
  EXPECT_EQ(Syncs(b->c, "loaded"), 1);

  // One replica on its own database serving the same conversation says the same.
  const std::string solo_db = pg_->NewDatabase();
  ASSERT_FALSE(solo_db.empty());
  auto solo = replica(solo_db);
  ASSERT_GT(solo->proc.port(), 0) << solo->proc.log();
  Json s1 = solo->Post("/v1/responses", Turn("Tell me a story about a cat."));
  Json s2 = Turn("What did the cat eat?");
  s2["previous_response_id"] = s1["id"];
  s2 = solo->Post("/v1/responses", s2);
  Json s3 = Turn("Where did it go next?");
  s3["previous_response_id"] = s2["id"];
  s3 = solo->Post("/v1/responses", s3);
  EXPECT_EQ(Text(s1), Text(r1));
  EXPECT_EQ(Text(s2), Text(r2));
  EXPECT_EQ(Text(s3), Text(r3));
}

// A replica on a shared store loads no session at start (other replicas hold them); a request
// naming one (previous_response_id) loads that one, and only it.
TEST_F(Replicas, SessionsLoadWhenARequestNamesThem) {
  std::vector<std::string> ids;
  {
    Replica a(db_);
    ASSERT_GT(a.proc.port(), 0) << a.proc.log();
    for (const char* topic : {"a cat.", "a dog.", "a bird."}) {
      Json r = a.Post("/v1/responses", Turn(std::string("Tell me a story about ") + topic));
      ASSERT_TRUE(r.is_object());
      ids.push_back(r["id"]);
    }
  }
  ASSERT_EQ(PgInt(db_, "SELECT count(*) FROM sessions"), 3);
  Replica c(db_);
  ASSERT_GT(c.proc.port(), 0) << c.proc.log();
  EXPECT_EQ(c.Get("/v1/sessions")["data"].size(), 0u) << c.proc.log();
  Json t = Turn("What happened next?");
  t["previous_response_id"] = ids[1];
  Json r = c.Post("/v1/responses", t);
  ASSERT_TRUE(r.is_object());
  Json held = c.Get("/v1/sessions")["data"];
  ASSERT_EQ(held.size(), 1u) << held.dump();
  EXPECT_EQ(Syncs(c.c, "loaded"), 1);
  EXPECT_EQ(held[0]["tokens"].get<int>(), r["usage"]["input_tokens"].get<int>() + r["usage"]["output_tokens"].get<int>())
      << "the loaded session, continued in place";
}

void DivergedCopyIsRebuilt(const std::string& db_, const std::vector<std::string>& flags) {
  Replica a(flags);
  ASSERT_GT(a.proc.port(), 0) << a.proc.log();
  Json r1 = a.Post("/v1/responses", Turn("Tell me a story about a cat."));
  ASSERT_TRUE(r1.is_object());
  auto store = Store::Open(db_);
  ASSERT_TRUE(store.ok()) << store.error().message;
  auto got = (*store)->GetResponse(r1["id"], "");
  ASSERT_TRUE(got.ok() && got->has_value() && (*got)->session_id);
  const int64_t sid = *(*got)->session_id;
  auto s = (*store)->LoadSession(sid);
  ASSERT_TRUE(s.ok()) << s.error().message;
  ASSERT_EQ(s->turns.size(), 1u);
  const int64_t k = s->turns[0].prompt_end + 1, n = static_cast<int64_t>(s->tokens.size());
  ASSERT_LT(k, n);
  std::vector<int32_t> other(s->tokens.begin() + k, s->tokens.end());
  other[0] = other[0] == 5 ? 6 : 5;
  ASSERT_TRUE((*store)->TruncateSession(sid, k).ok());
  ASSERT_TRUE((*store)->AppendTurn(sid, k, k, other, true).ok());

  Json t2 = Turn("What did the cat eat?");
  t2["previous_response_id"] = r1["id"];
  Json r2 = a.Post("/v1/responses", t2);
  ASSERT_TRUE(r2.is_object());
  Replica fresh(flags);
  ASSERT_GT(fresh.proc.port(), 0) << fresh.proc.log();
  Json f2 = fresh.Post("/v1/responses", t2);
  ASSERT_TRUE(f2.is_object());
  EXPECT_EQ(Text(r2), Text(f2));
  auto log_of = [&](const Json& r) {
    auto resp = (*store)->GetResponse(r["id"], "");
    EXPECT_TRUE(resp.ok() && resp->has_value() && (*resp)->session_id) << r.dump();
    if (!resp.ok() || !resp->has_value() || !(*resp)->session_id) return std::vector<int32_t>();
    auto l = (*store)->LoadSession(*(*resp)->session_id);
    EXPECT_TRUE(l.ok());
    if (!l.ok()) return std::vector<int32_t>();
    l->tokens.resize(std::min<size_t>(l->tokens.size(), (*resp)->end_token));
    return l->tokens;
  };
  // Rebuilt by the probe before the turn, or dropped already when the other writer's notice came
  // first (LISTEN/NOTIFY; the turn then loads the stored log).
  EXPECT_EQ(Syncs(a.c, "rebuilt") + Metric(a.c, "mnemo_session_notices_total{action=\"dropped\"}"), 1);
  const std::vector<int32_t> stored = log_of(r2);
  EXPECT_EQ(stored, log_of(f2)) << a.proc.log();
  // The other writer's tokens are where it put them, in its session.
  auto after = (*store)->LoadSession(sid);
  ASSERT_TRUE(after.ok());
  ASSERT_GE(after->tokens.size(), static_cast<size_t>(n));
  EXPECT_EQ(after->tokens[k], other[0]);
}

// Another writer cut the session a holds and regrew it to the same length with other tokens (as a
// replica editing the conversation's last reply would): a's copy has diverged. a rebuilds it from
// the store before the next turn, so the stored log of that turn is the history as stored, as a
// fresh replica serving the same request stores it; the old code appended to its own copy and
// the commit passed (same length), storing a turn computed on tokens the store does not hold.
// Twice: through the fast path that continues the previous response's window (the probe in
// StartWindowed), and with --render-whole through the whole-history plan (the probe in
// StartRendered).
TEST_F(Replicas, DivergedCopyIsRebuiltFromTheStore) {
  for (const bool whole : {false, true}) {
    SCOPED_TRACE(whole ? "--render-whole" : "windows");
    const std::string db = whole ? pg_->NewDatabase() : db_;
    std::vector<std::string> flags = {"--db", db, "--precision", "f32", "--kv-dtype", "f32", "--kv-disk-mb", "0"};
    if (whole) flags.push_back("--render-whole");
    DivergedCopyIsRebuilt(db, flags);
  }
}

TEST_F(Replicas, ChatHistoryResentToAnotherReplicaContinuesItsSession) {
  ASSERT_NO_FATAL_FAILURE(StartTwo(kExact));
  auto &a = a_, &b = b_;
  Json history = ThreeTurns(*a);
  ASSERT_TRUE(history.is_array());
  const std::vector<int64_t> before = SessionIds(db_);
  ASSERT_EQ(before.size(), 1u);
  const size_t stored_tokens = LoadStored(db_, before[0]).tokens.size();

  history.push_back({{"role", "user"}, {"content", kUserTurns[3]}});
  Json r4 = Chat(*b, history);
  ASSERT_TRUE(r4.is_object());
  EXPECT_EQ(SessionIds(db_), before) << b->proc.log();
  EXPECT_EQ(Syncs(b->c, "loaded"), 1);
  const StoredSession s = LoadStored(db_, before[0]);
  EXPECT_EQ(s.turns.size(), 4u);
  EXPECT_EQ(s.tokens.size(), static_cast<size_t>(r4["usage"]["prompt_tokens"].get<int>() +
                                                 r4["usage"]["completion_tokens"].get<int>()));
  EXPECT_GT(s.tokens.size(), stored_tokens);
  // And back on a: its copy grew on b (a delta), the conversation still one session.
  history.push_back({{"role", "user"}, {"content", "Was it happy?"}});
  Json r5 = Chat(*a, history);
  ASSERT_TRUE(r5.is_object());
  EXPECT_EQ(SessionIds(db_), before);
  EXPECT_EQ(Syncs(a->c, "delta"), 1);

  const std::string solo_db = pg_->NewDatabase();
  ASSERT_FALSE(solo_db.empty());
  auto solo = ExactReplica(solo_db);
  ASSERT_GT(solo->proc.port(), 0) << solo->proc.log();
  Json same = ThreeTurns(*solo);
  ASSERT_TRUE(same.is_array());
  EXPECT_EQ(same, Json(std::vector<Json>(history.begin(), history.begin() + 7)));
  same.push_back({{"role", "user"}, {"content", kUserTurns[3]}});
  EXPECT_EQ(ChatText(Chat(*solo, same)), ChatText(r4));
  same.push_back({{"role", "user"}, {"content", "Was it happy?"}});
  EXPECT_EQ(ChatText(Chat(*solo, same)), ChatText(r5));
}

// The same with a history shorter than a chunk (a first turn of a few words: its stored log is
// under 32 tokens): b finds a's session by the mark at its length. The old code marked full chunks
// only: b found nothing and started a second session holding the whole history.
TEST_F(Replicas, ShortChatHistoryResentToAnotherReplicaContinuesItsSession) {
  ASSERT_NO_FATAL_FAILURE(StartTwo(kExact));
  auto &a = a_, &b = b_;
  Json history = Json::array({{{"role", "user"}, {"content", "Hi."}}});
  ASSERT_TRUE(Chat(*a, history, "", 3).is_object());
  const std::vector<int64_t> before = SessionIds(db_);
  ASSERT_EQ(before.size(), 1u);
  const size_t stored_tokens = LoadStored(db_, before[0]).tokens.size();
  ASSERT_LT(stored_tokens, static_cast<size_t>(kPrefixChunk));
  history.push_back({{"role", "user"}, {"content", "Tell me a story."}});
  Json r2 = Chat(*b, history);
  ASSERT_TRUE(r2.is_object());
  EXPECT_EQ(SessionIds(db_), before) << b->proc.log();
  EXPECT_EQ(Syncs(b->c, "loaded"), 1);
  const StoredSession s = LoadStored(db_, before[0]);
  EXPECT_EQ(s.turns.size(), 2u);
  EXPECT_EQ(s.tokens.size(), static_cast<size_t>(r2["usage"]["prompt_tokens"].get<int>() +
                                                 r2["usage"]["completion_tokens"].get<int>()));
}

// Owners: b finds a's session for the API key that made it, never for another key sending the
// identical history (that one starts its own session).
TEST_F(Replicas, ChatHistoryOfAnotherOwnerDoesNotMatch) {
  std::vector<std::string> flags = kExact;
  flags.insert(flags.end(), {"--api-key", "k1", "--api-key", "k2"});
  ASSERT_NO_FATAL_FAILURE(StartTwo(flags));
  auto &a = a_, &b = b_;
  Json history = ThreeTurns(*a, "k1");
  ASSERT_TRUE(history.is_array());
  const std::vector<int64_t> k1_session = SessionIds(db_);
  ASSERT_EQ(k1_session.size(), 1u);
  const size_t k1_tokens = LoadStored(db_, k1_session[0]).tokens.size();
  history.push_back({{"role", "user"}, {"content", kUserTurns[3]}});

  Json other = history;
  Json r2 = Chat(*b, other, "k2");
  ASSERT_TRUE(r2.is_object());
  EXPECT_EQ(Syncs(b->c, "loaded"), 0);
  EXPECT_EQ(r2["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  std::vector<int64_t> ids = SessionIds(db_);
  ASSERT_EQ(ids.size(), 2u);
  EXPECT_EQ(LoadStored(db_, k1_session[0]).tokens.size(), k1_tokens) << "k2's turn touched k1's session";
  EXPECT_NE(LoadStored(db_, ids[0]).owner, LoadStored(db_, ids[1]).owner);

  Json mine = history;
  Json r1 = Chat(*b, mine, "k1");
  ASSERT_TRUE(r1.is_object());
  EXPECT_EQ(Syncs(b->c, "loaded"), 1);
  EXPECT_EQ(SessionIds(db_).size(), 2u) << "k1's history did not continue k1's session";
  EXPECT_GT(LoadStored(db_, k1_session[0]).tokens.size(), k1_tokens);
  EXPECT_EQ(ChatText(r1), ChatText(r2));  // the same history says the same, whoever sends it
}

// A history that leaves the stored log part-way (the client edited its third question) matches
// only what they share: b loads the session and forks it there, as a single replica holding it
// would; the stored conversation is left as it was, and the fork holds its turns up to the edit.
TEST_F(Replicas, DivergedChatHistoryMatchesOnlyItsCommonPrefix) {
  ASSERT_NO_FATAL_FAILURE(StartTwo(kExact));
  auto &a = a_, &b = b_;
  Json history = ThreeTurns(*a);
  ASSERT_TRUE(history.is_array());
  ASSERT_EQ(SessionIds(db_).size(), 1u);
  const StoredSession original = LoadStored(db_, SessionIds(db_)[0]);

  Json edited(std::vector<Json>(history.begin(), history.begin() + 5));  // system, u1, a1, u2, a2
  edited.push_back({{"role", "user"}, {"content", "Why was the cat sad?"}});
  Json r = Chat(*b, edited);
  ASSERT_TRUE(r.is_object());
  EXPECT_EQ(Syncs(b->c, "loaded"), 1);
  const std::vector<int64_t> ids = SessionIds(db_);
  ASSERT_EQ(ids.size(), 2u);
  const StoredSession after = LoadStored(db_, ids[0]);
  EXPECT_EQ(after.tokens, original.tokens);
  EXPECT_EQ(after.cuts, original.cuts);
  const StoredSession fork = LoadStored(db_, ids[1]);
  size_t common = 0;
  while (common < fork.tokens.size() && common < original.tokens.size() &&
         fork.tokens[common] == original.tokens[common]) {
    common++;
  }
  // Shared: the first two turns (and the template's head of the third); the fork keeps their
  // turns, where a session started afresh holds the whole history as one turn.
  EXPECT_GE(common, static_cast<size_t>(original.turns[1].end));
  EXPECT_LT(common, static_cast<size_t>(original.turns[2].prompt_end));
  EXPECT_GE(fork.turns.size(), 3u);
  EXPECT_EQ(fork.turns[1].end, original.turns[1].end);

  const std::string solo_db = pg_->NewDatabase();
  ASSERT_FALSE(solo_db.empty());
  auto solo = ExactReplica(solo_db);
  ASSERT_GT(solo->proc.port(), 0) << solo->proc.log();
  Json same = ThreeTurns(*solo);
  ASSERT_TRUE(same.is_array());
  Json same_edited(std::vector<Json>(same.begin(), same.begin() + 5));
  same_edited.push_back({{"role", "user"}, {"content", "Why was the cat sad?"}});
  EXPECT_EQ(ChatText(Chat(*solo, same_edited)), ChatText(r));
}

// Measured, not run by default (docs/benchmarks.md, issue 14): MNEMO_BENCH_SESSIONS=2000 stores
// that many sessions (two turns of MNEMO_BENCH_TURN tokens, default 200) in PostgreSQL and in a
// SQLite file, then times a
// replica's start on each (to the line naming its address: model load included) and one turn that
// names a stored session; and times the freshness probe (Store::GetSessionVersion) on PostgreSQL.
TEST_F(Replicas, BenchStartWithManyStoredSessions) {
  const char* env = std::getenv("MNEMO_BENCH_SESSIONS");
  if (!env) GTEST_SKIP() << "set MNEMO_BENCH_SESSIONS=2000 to measure";
  const int n = std::atoi(env);
  const int turn_tokens = std::getenv("MNEMO_BENCH_TURN") ? std::atoi(std::getenv("MNEMO_BENCH_TURN")) : 200;
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("mnemo-bench-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string sqlite = (dir / "s.db").string();
  for (const std::string& spec : {db_, sqlite}) {
    auto store = Store::Open(spec, testing_util::WithDurability(Durability::kNormal));
    ASSERT_TRUE(store.ok()) << store.error().message;
    std::vector<int32_t> turn(turn_tokens);
    const auto t0 = std::chrono::steady_clock::now();
    for (int id = 1; id <= n; ++id) {
      for (int t = 0; t < 2; ++t) {
        for (int i = 0; i < turn_tokens; ++i) turn[i] = 1 + (id * 7 + t * turn_tokens + i) % 500;
        TurnCommit c;
        c.session_id = id;
        c.create_session = t == 0;
        c.begin = t * turn_tokens;
        c.prompt_end = t * turn_tokens + turn_tokens / 2;
        c.tokens = turn;
        ASSERT_TRUE((*store)->CommitTurn(c).ok());
      }
    }
    std::printf("[ bench    ] %s: %d sessions stored in %.1f s\n", spec == db_ ? "PostgreSQL" : "SQLite", n,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  for (const std::string& spec : {db_, sqlite}) {
    std::vector<double> starts;
    long rss_kb = 0;  // the last run's resident set once it serves
    for (int run = 0; run < 3; ++run) {
      const auto t0 = std::chrono::steady_clock::now();
      ServerProcess p({"--db", spec, "--kv-disk-mb", "0", "--max-context", std::to_string(4 * turn_tokens)});
      starts.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      ASSERT_GT(p.port(), 0) << p.log();
      std::ifstream status("/proc/" + std::to_string(p.pid()) + "/status");
      for (std::string line; std::getline(status, line);) {
        if (line.rfind("VmRSS:", 0) == 0) rss_kb = std::atol(line.c_str() + 6);
      }
    }
    std::sort(starts.begin(), starts.end());
    std::printf("[ bench    ] %s, %d stored sessions of %d tokens: start %.3f s (median of 3; min %.3f, max %.3f), "
                "RSS %.0f MB\n",
                spec == db_ ? "PostgreSQL" : "SQLite", n, 2 * turn_tokens, starts[1], starts[0], starts[2],
                rss_kb / 1024.0);
  }
  auto store = Store::Open(db_);
  ASSERT_TRUE(store.ok());
  std::vector<double> probe_ms;
  for (int i = 0; i < 2000; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    auto v = (*store)->GetSessionVersion(1 + (i * 7919) % n);
    probe_ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    ASSERT_TRUE(v.ok() && v->has_value());
  }
  std::sort(probe_ms.begin(), probe_ms.end());
  std::printf("[ bench    ] GetSessionVersion on PostgreSQL (127.0.0.1), %zu probes: p50 %.3f ms, p99 %.3f ms\n",
              probe_ms.size(), probe_ms[probe_ms.size() / 2], probe_ms[probe_ms.size() * 99 / 100]);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace mnemo::testing
