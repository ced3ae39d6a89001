// Two `mnemo serve` replicas on one PostgreSQL database (issue 14), stories260K over real HTTP:
// a conversation and a previous_response_id chain started on one replica continue on the other,
// which rebuilds the KV from the stored text (nothing cached there) and extends the same chain;
// the routing key a front sends (X-Mnemo-Affinity) is in every id of the chain; and at
// temperature 0 the continued turn says what it says on a single replica.
#include <gtest/gtest.h>
#include <httplib.h>

#include <libpq-fe.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <mutex>
#include <regex>
#include <string>
#include <thread>

#include "format/make_model.h"
#include "store/store.h"

#include "../store/pg_server.h"
#include "../store/test_util.h"
#include "server_process.h"

namespace mnemo::testing {
namespace {

using Json = nlohmann::json;

struct Replica {
  explicit Replica(const std::string& db) : Replica(std::vector<std::string>{"--db", db}) {}
  explicit Replica(const std::vector<std::string>& flags) : proc(flags), c("127.0.0.1", proc.port()) {
    c.set_read_timeout(120, 0);
    c.set_connection_timeout(5, 0);
  }
  // POST; the parsed body when the status is 200, else null (and a test failure).
  Json Post(const std::string& path, const Json& body, const std::string& affinity = "") {
    httplib::Headers h;
    if (!affinity.empty()) h.emplace("X-Mnemo-Affinity", affinity);
    auto r = c.Post(path.c_str(), h, body.dump(), "application/json");
    EXPECT_TRUE(r && r->status == 200) << path << ": " << (r ? r->body : "no response") << "\n" << proc.log();
    return r && r->status == 200 ? Json::parse(r->body) : Json();
  }
  Json Get(const std::string& path) {
    auto r = c.Get(path.c_str());
    EXPECT_TRUE(r && r->status == 200) << path << ": " << (r ? r->body : "no response");
    return r && r->status == 200 ? Json::parse(r->body) : Json();
  }
  ServerProcess proc;
  httplib::Client c;
};

Json Turn(const std::string& input) {
  return {{"model", "m"}, {"input", input}, {"max_output_tokens", 12}, {"temperature", 0}};
}

std::string Text(const Json& response) {
  for (const Json& item : response["output"]) {
    if (item.value("type", "") != "message") continue;
    for (const Json& part : item["content"]) return part.value("text", "");
  }
  return "";
}

int Cached(const Json& response) { return response["usage"]["input_tokens_details"].value("cached_tokens", -1); }

// mnemo_session_syncs_total{result="<result>"} in the replica's /metrics (0 when absent).
int64_t Syncs(httplib::Client& c, const std::string& result) {
  auto r = c.Get("/metrics");
  if (!r || r->status != 200) return -1;
  const std::string key = "mnemo_session_syncs_total{result=\"" + result + "\"} ";
  const size_t at = r->body.find(key);
  return at == std::string::npos ? 0 : std::stoll(r->body.substr(at + key.size()));
}

// A metric's value in the replica's /metrics (the line "<name> <value>"; 0 when absent).
double Metric(httplib::Client& c, const std::string& name) {
  auto r = c.Get("/metrics");
  if (!r || r->status != 200) return -1;
  const std::string key = "\n" + name + " ";
  const size_t at = r->body.find(key);
  return at == std::string::npos ? 0 : std::stod(r->body.substr(at + key.size()));
}

class Replicas : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    pg_ = testing_util::PgServer::Shared(&why);
    if (!pg_) GTEST_SKIP() << why;
    db_ = pg_->NewDatabase();
    ASSERT_FALSE(db_.empty());
  }
  testing_util::PgServer* pg_ = nullptr;
  std::string db_;
};

TEST_F(Replicas, ChainStartedOnOneContinuesOnTheOther) {
  Replica a(db_);
  Replica b(db_);
  ASSERT_GT(a.proc.port(), 0) << a.proc.log();
  ASSERT_GT(b.proc.port(), 0) << b.proc.log();

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
  Replica a(db_);
  Replica b(db_);
  ASSERT_GT(a.proc.port(), 0) << a.proc.log();
  ASSERT_GT(b.proc.port(), 0) << b.proc.log();

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
    Json items = r->Get("/v1/conversations/" + cid + "/items?order=asc&limit=100");
    ASSERT_TRUE(items.is_object());
    std::vector<std::string> texts;
    for (const Json& it : items["data"]) {
      for (const Json& part : it["content"]) texts.push_back(part.value("text", ""));
    }
    ASSERT_EQ(texts.size(), 6u) << items.dump();
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
  Replica a(db_);
  Replica b(db_);
  ASSERT_GT(a.proc.port(), 0) << a.proc.log();
  ASSERT_GT(b.proc.port(), 0) << b.proc.log();
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

// A single integer from the database (the test reads the store from outside).
int64_t PgInt(const std::string& url, const std::string& sql) {
  PGconn* c = PQconnectdb(url.c_str());
  int64_t v = -1;
  if (PQstatus(c) == CONNECTION_OK) {
    PGresult* r = PQexec(c, sql.c_str());
    if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1) v = std::stoll(PQgetvalue(r, 0, 0));
    PQclear(r);
  }
  PQfinish(c);
  return v;
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


// ---- stateless chat after a failover: the stored prefix index (issue 14) ----

const std::vector<std::string> kExact = {"--precision", "f32", "--kv-dtype", "f32", "--kv-disk-mb", "0"};

std::unique_ptr<Replica> ExactReplica(const std::string& db, std::vector<std::string> more = {}) {
  std::vector<std::string> f = {"--db", db};
  f.insert(f.end(), kExact.begin(), kExact.end());
  f.insert(f.end(), more.begin(), more.end());
  return std::make_unique<Replica>(f);
}

// A chat completion (temperature 0) of `messages` as API key `key` ("" without auth); the reply is
// appended to messages. The parsed body, or null (and a test failure).
Json Chat(Replica& r, Json& messages, const std::string& key = "") {
  httplib::Headers h;
  if (!key.empty()) h.emplace("Authorization", "Bearer " + key);
  const Json body = {{"model", "m"}, {"messages", messages}, {"max_tokens", 12}, {"temperature", 0}};
  auto res = r.c.Post("/v1/chat/completions", h, body.dump(), "application/json");
  EXPECT_TRUE(res && res->status == 200) << (res ? res->body : "no response") << "\n" << r.proc.log();
  if (!res || res->status != 200) return Json();
  Json out = Json::parse(res->body);
  messages.push_back({{"role", "assistant"}, {"content", out["choices"][0]["message"]["content"]}});
  return out;
}

std::string ChatText(const Json& r) { return r.is_object() ? r["choices"][0]["message"].value("content", "") : ""; }

const char* const kUserTurns[] = {"Tell me a story about a cat.", "What did the cat eat?", "Where did it go next?",
                                  "And then?"};

// Three turns of one conversation on `r` (a system prompt first); returns the history with replies.
Json ThreeTurns(Replica& r, const std::string& key = "") {
  Json messages = Json::array({{{"role", "system"}, {"content", "You are a storyteller for children."}}});
  for (int t = 0; t < 3; ++t) {
    messages.push_back({{"role", "user"}, {"content", kUserTurns[t]}});
    if (!Chat(r, messages, key).is_object()) return Json();
  }
  return messages;
}

std::vector<int64_t> SessionIds(const std::string& db) {
  auto store = Store::Open(db);
  std::vector<int64_t> ids;
  if (!store.ok()) return ids;
  (void)(*store)->ForEachSession([&](StoredSession&& s) {
    ids.push_back(s.id);
    return Status::Ok();
  });
  return ids;
}

StoredSession LoadStored(const std::string& db, int64_t id) {
  auto store = Store::Open(db);
  EXPECT_TRUE(store.ok());
  if (!store.ok()) return {};
  auto s = (*store)->LoadSession(id);
  EXPECT_TRUE(s.ok());
  return s.ok() ? *s : StoredSession{};
}

// A chat client resends its whole history; the turn after three on replica a lands on replica b
// (a failover, or a front that routed it elsewhere). b holds no session of it, and the history
// names none: b finds a's stored session by the prefix index, loads it and continues it, so the
// store still holds one session for the conversation. The old code started a new one there (the
// whole history as its first turn, a second session). At temperature 0 on the exact path the
// reply is what one replica serving the whole conversation says.
TEST_F(Replicas, ChatHistoryResentToAnotherReplicaContinuesItsSession) {
  auto a = ExactReplica(db_);
  auto b = ExactReplica(db_);
  ASSERT_GT(a->proc.port(), 0) << a->proc.log();
  ASSERT_GT(b->proc.port(), 0) << b->proc.log();
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

// Owners: b finds a's session for the API key that made it, never for another key sending the
// identical history (that one starts its own session).
TEST_F(Replicas, ChatHistoryOfAnotherOwnerDoesNotMatch) {
  auto a = ExactReplica(db_, {"--api-key", "k1", "--api-key", "k2"});
  auto b = ExactReplica(db_, {"--api-key", "k1", "--api-key", "k2"});
  ASSERT_GT(a->proc.port(), 0) << a->proc.log();
  ASSERT_GT(b->proc.port(), 0) << b->proc.log();
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
  auto a = ExactReplica(db_);
  auto b = ExactReplica(db_);
  ASSERT_GT(a->proc.port(), 0) << a->proc.log();
  ASSERT_GT(b->proc.port(), 0) << b->proc.log();
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

// ---- a turn's lock and change notices (issue 14) ----

// Advisory locks granted in the database of url (the turn locks replicas hold).
int64_t AdvisoryLocks(const std::string& url) {
  return PgInt(url,
               "SELECT count(*) FROM pg_locks WHERE locktype='advisory' AND granted AND "
               "database=(SELECT oid FROM pg_database WHERE datname=current_database())");
}

// Replicas whose long turns fit (2048 positions, stories260K's context) and whose continuations wait for them as long as
// a loaded machine may need (the wait bound follows --max-queue-ms).
std::unique_ptr<Replica> LongTurnReplica(const std::string& db) {
  return ExactReplica(db, {"--max-context", "2048", "--kv-t0-mb", "64", "--max-queue-ms", "60000"});
}

// A long turn (ignore_eos, `tokens` tokens) on r, streamed on a thread of its own: continuing
// response `after` (an id), or with the fields `after` holds (a conversation).
class LongTurn {
 public:
  LongTurn(Replica& r, const Json& after, int tokens) {
    thread_ = std::thread([this, port = r.proc.port(), after, tokens] {
      httplib::Client c("127.0.0.1", port);
      c.set_read_timeout(120, 0);
      Json body = Turn("And then what happened?");
      if (after.is_string()) body["previous_response_id"] = after;
      else body.update(after);
      body["max_output_tokens"] = tokens;
      body["ignore_eos"] = true;
      body["stream"] = true;
      httplib::Request req;
      req.method = "POST";
      req.path = "/v1/responses";
      req.body = body.dump();
      req.set_header("Content-Type", "application/json");
      req.content_receiver = [this](const char* d, size_t n, uint64_t, uint64_t) {
        std::lock_guard lock(mu_);
        body_.append(d, n);
        cv_.notify_all();
        return true;
      };
      auto res = c.send(req);
      std::lock_guard lock(mu_);
      status_ = res ? res->status : -1;
      done_ = true;
      ended_ = std::chrono::steady_clock::now();
      cv_.notify_all();
    });
  }
  ~LongTurn() {
    if (thread_.joinable()) thread_.join();
  }
  // Waits (at most 30 s) until the turn generates: its first text delta arrived.
  bool WaitGenerating() {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(30),
                        [&] { return done_ || body_.find("response.output_text.delta") != std::string::npos; }) &&
           !done_;
  }
  // Waits for the end of the stream; the stored response (status "incomplete": it ran to
  // max_output_tokens), or null when it failed.
  Json Finish() {
    thread_.join();
    const std::string tag = "event: response.incomplete\ndata: ";
    const size_t at = body_.find(tag);
    if (status_ != 200 || at == std::string::npos) return Json();
    const size_t from = at + tag.size();
    return Json::parse(body_.substr(from, body_.find('\n', from) - from))["response"];
  }
  std::string body() {
    std::lock_guard lock(mu_);
    return body_;
  }
  std::chrono::steady_clock::time_point ended() const { return ended_; }

 private:
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::string body_;
  int status_ = 0;
  bool done_ = false;
  std::chrono::steady_clock::time_point ended_;
};

// The tokens of the stored session holding response `id`, up to its end.
std::vector<int32_t> StoredLog(const std::string& db, const std::string& id) {
  auto store = Store::Open(db);
  if (!store.ok()) return {};
  auto r = (*store)->GetResponse(id, "");
  if (!r.ok() || !r->has_value() || !(*r)->session_id) return {};
  auto s = (*store)->LoadSession(*(*r)->session_id);
  if (!s.ok()) return {};
  s->tokens.resize(std::min<size_t>(s->tokens.size(), (*r)->end_token));
  return s->tokens;
}

// Two clients continue one conversation in sequence, one on replica a (a long turn), the other on
// replica b while a's turn still runs (a failover, a client ignoring affinity). b waits for a's
// turn lock, then continues from what the store holds: both turns succeed, each with its own
// history. The old code ran b's turn at once on the log a was extending, and the second commit
// lost the compare-and-set: a's long turn ended in a 409 error event after all its work.
TEST_F(Replicas, ContinuationWaitsForTheTurnRunningOnTheOtherReplica) {
  auto a = LongTurnReplica(db_);
  auto b = LongTurnReplica(db_);
  ASSERT_GT(a->proc.port(), 0) << a->proc.log();
  ASSERT_GT(b->proc.port(), 0) << b->proc.log();
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

// The same with the Conversations API, where the turns continue one another: a conversation is
// append-only. b waits for a's turn lock, then reads the conversation again and continues after
// a's turn: both turns are in its items in commit order, and b's reply was computed with a's turn
// in its context. The old code read the items before waiting and forked b's turn from the history
// without a's turn (its input had r1's tokens only), though its items were listed after a's.
TEST_F(Replicas, ConversationTurnWaitsForTheTurnRunningOnTheOtherReplica) {
  auto a = LongTurnReplica(db_);
  auto b = LongTurnReplica(db_);
  ASSERT_GT(a->proc.port(), 0) << a->proc.log();
  ASSERT_GT(b->proc.port(), 0) << b->proc.log();
  Json conv = a->Post("/v1/conversations", Json::object());
  ASSERT_TRUE(conv.is_object());
  const std::string cid = conv["id"];
  Json t1 = Turn("Tell me a story about a cat.");
  t1["conversation"] = cid;
  Json r1 = a->Post("/v1/responses", t1);
  ASSERT_TRUE(r1.is_object());

  LongTurn running(*a, Json{{"conversation", cid}}, 1800);
  ASSERT_TRUE(running.WaitGenerating()) << running.body() << a->proc.log();
  Json t2 = Turn("What did the cat eat?");
  t2["conversation"] = cid;
  auto res = b->c.Post("/v1/responses", t2.dump(), "application/json");
  const auto t_b = std::chrono::steady_clock::now();
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200) << res->body << "\n" << b->proc.log();
  Json long_turn = running.Finish();
  ASSERT_TRUE(long_turn.is_object()) << "a's turn failed: " << running.body().substr(running.body().rfind("event:"))
                                     << "\n" << a->proc.log();
  EXPECT_EQ(Metric(b->c, "mnemo_turn_locks_total{result=\"waited\"}"), 1);
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
  const std::vector<int32_t> a_log = StoredLog(db_, long_turn["id"]), b_log = StoredLog(db_, r2["id"]);
  ASSERT_GT(a_log.size(), 1800u);
  ASSERT_GT(b_log.size(), a_log.size());
  const size_t common = std::mismatch(a_log.begin(), a_log.end(), b_log.begin()).first - a_log.begin();
  std::printf("[ replicas ] b's log %zu tokens, a's %zu, common prefix %zu\n", b_log.size(), a_log.size(), common);

  // The items, whichever replica lists them: r1's turn, a's, b's, in that order.
  for (Replica* r : {a.get(), b.get()}) {
    Json items = r->Get("/v1/conversations/" + cid + "/items?order=asc&limit=100");
    ASSERT_TRUE(items.is_object());
    std::vector<std::string> texts;
    for (const Json& it : items["data"]) {
      for (const Json& part : it["content"]) texts.push_back(part.value("text", ""));
    }
    ASSERT_EQ(texts.size(), 6u) << items.dump();
    EXPECT_EQ(texts[0], "Tell me a story about a cat.");
    EXPECT_EQ(texts[1], Text(r1));
    EXPECT_EQ(texts[2], "And then what happened?");
    EXPECT_EQ(texts[3], Text(long_turn));
    EXPECT_EQ(texts[4], "What did the cat eat?");
    EXPECT_EQ(texts[5], Text(r2));
  }
  EXPECT_EQ(AdvisoryLocks(db_), 0) << "a turn lock outlived its turn";
}

// n > 1 choices continuing a stored session: the prompt is committed first, then choice 0 appends
// to the session and the others to forks of it. The prompt's turn lock is held until the last
// choice commits, so a continuation of the prompt reaching replica b in between waits for the
// choices. The old code released it with the prompt's commit: b appended its turn to the session
// at once, and choice 0's commit lost the compare-and-set after all its work (an error in a's
// stream).
TEST_F(Replicas, ChoicesHoldTheTurnLockUntilTheLastCommits) {
  auto a = LongTurnReplica(db_);
  auto b = LongTurnReplica(db_);
  ASSERT_GT(a->proc.port(), 0) << a->proc.log();
  ASSERT_GT(b->proc.port(), 0) << b->proc.log();
  Json history = Json::array({{{"role", "system"}, {"content", "You are a storyteller for children."}},
                              {{"role", "user"}, {"content", kUserTurns[0]}}});
  ASSERT_TRUE(Chat(*a, history).is_object());
  history.push_back({{"role", "user"}, {"content", kUserTurns[1]}});

  // On a: two choices of 1,800 tokens each, streamed.
  std::mutex mu;
  std::condition_variable cv;
  std::string got;
  int status = 0;
  bool done = false;
  std::thread running([&, port = a->proc.port()] {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(120, 0);
    const Json body = {{"model", "m"}, {"messages", history}, {"n", 2}, {"max_tokens", 1800},
                       {"ignore_eos", true}, {"temperature", 0}, {"stream", true}};
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/chat/completions";
    req.body = body.dump();
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
      std::lock_guard lock(mu);
      got.append(d, n);
      cv.notify_all();
      return true;
    };
    auto res = c.send(req);
    std::lock_guard lock(mu);
    status = res ? res->status : -1;
    done = true;
    cv.notify_all();
  });
  bool generating = false;
  {
    std::unique_lock lock(mu);
    generating = cv.wait_for(lock, std::chrono::seconds(30),
                             [&] { return done || got.find("\"content\"") != std::string::npos; }) && !done;
  }
  if (!generating) {
    running.join();
    FAIL() << "a's choices did not start: " << got << a->proc.log();
  }
  // On b: the prompt continued with a reply of the client's own (the session as a's prompt left it).
  Json next = history;
  next.push_back({{"role", "assistant"}, {"content", "Once upon a time"}});
  next.push_back({{"role", "user"}, {"content", kUserTurns[2]}});
  Json rb = Chat(*b, next);
  running.join();
  EXPECT_TRUE(rb.is_object());
  EXPECT_EQ(status, 200);
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
  auto a = LongTurnReplica(db_);
  auto b = LongTurnReplica(db_);
  ASSERT_GT(a->proc.port(), 0) << a->proc.log();
  ASSERT_GT(b->proc.port(), 0) << b->proc.log();
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
  auto a = ExactReplica(db_);
  auto b = ExactReplica(db_);
  ASSERT_GT(a->proc.port(), 0) << a->proc.log();
  ASSERT_GT(b->proc.port(), 0) << b->proc.log();
  Json r1 = a->Post("/v1/responses", Turn("Tell me a story about a cat."));
  ASSERT_TRUE(r1.is_object());
  Json t2 = Turn("What did the cat eat?");
  t2["previous_response_id"] = r1["id"];
  Json r2 = b->Post("/v1/responses", t2);  // b loads the session and continues it
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
