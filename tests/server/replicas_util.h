// What the replica tests share (issue 14): `mnemo serve` replicas on one PostgreSQL database over
// real HTTP (stories260K), the store read from outside, and a long streamed turn on a thread of its
// own. replicas_test.cpp: failover and freshness; replicas_lock_test.cpp: turn locks and change
// notices.
#pragma once

#include <gtest/gtest.h>
#include <httplib.h>

#include <libpq-fe.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "store/store.h"

#include "../store/pg_server.h"
#include "server_process.h"

namespace mnemo::testing {


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

inline Json Turn(const std::string& input) {
  return {{"model", "m"}, {"input", input}, {"max_output_tokens", 12}, {"temperature", 0}};
}

inline std::string Text(const Json& response) {
  for (const Json& item : response["output"]) {
    if (item.value("type", "") != "message") continue;
    for (const Json& part : item["content"]) return part.value("text", "");
  }
  return "";
}

inline int Cached(const Json& response) { return response["usage"]["input_tokens_details"].value("cached_tokens", -1); }

// mnemo_session_syncs_total{result="<result>"} in the replica's /metrics (0 when absent).
inline int64_t Syncs(httplib::Client& c, const std::string& result) {
  auto r = c.Get("/metrics");
  if (!r || r->status != 200) return -1;
  const std::string key = "mnemo_session_syncs_total{result=\"" + result + "\"} ";
  const size_t at = r->body.find(key);
  return at == std::string::npos ? 0 : std::stoll(r->body.substr(at + key.size()));
}

// A metric's value in the replica's /metrics (the line "<name> <value>"; 0 when absent).
inline double Metric(httplib::Client& c, const std::string& name) {
  auto r = c.Get("/metrics");
  if (!r || r->status != 200) return -1;
  const std::string key = "\n" + name + " ";
  const size_t at = r->body.find(key);
  return at == std::string::npos ? 0 : std::stod(r->body.substr(at + key.size()));
}
// Replicas on the fixture's PostgreSQL server; each test gets a database of its own (db_).
class Replicas : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    pg_ = testing_util::PgServer::Shared(&why);
    if (!pg_) GTEST_SKIP() << why;
    db_ = pg_->NewDatabase();
    ASSERT_FALSE(db_.empty());
  }
  // r1 on a_, then r2 continuing it on b_, which loads the session and holds a copy of it; r2, or
  // null (and a test failure).
  Json ContinueOnB() {
    Json r1 = a_->Post("/v1/responses", Turn("Tell me a story about a cat."));
    if (!r1.is_object()) return Json();
    Json t2 = Turn("What did the cat eat?");
    t2["previous_response_id"] = r1["id"];
    return b_->Post("/v1/responses", t2);
  }
  // Replicas a_ and b_ on db_, each started with `flags` after --db (most tests' set-up). A fatal
  // failure when one does not start: call it in ASSERT_NO_FATAL_FAILURE.
  void StartTwo(const std::vector<std::string>& flags = {}) {
    std::vector<std::string> f = {"--db", db_};
    f.insert(f.end(), flags.begin(), flags.end());
    a_ = std::make_unique<Replica>(f);
    b_ = std::make_unique<Replica>(f);
    ASSERT_GT(a_->proc.port(), 0) << a_->proc.log();
    ASSERT_GT(b_->proc.port(), 0) << b_->proc.log();
  }
  testing_util::PgServer* pg_ = nullptr;
  std::string db_;
  std::unique_ptr<Replica> a_, b_;
};


// A single integer from the database (the test reads the store from outside).
inline int64_t PgInt(const std::string& url, const std::string& sql) {
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


inline const std::vector<std::string> kExact = {"--precision", "f32", "--kv-dtype", "f32", "--kv-disk-mb", "0"};

inline std::unique_ptr<Replica> ExactReplica(const std::string& db, std::vector<std::string> more = {}) {
  std::vector<std::string> f = {"--db", db};
  f.insert(f.end(), kExact.begin(), kExact.end());
  f.insert(f.end(), more.begin(), more.end());
  return std::make_unique<Replica>(f);
}

// A chat completion (temperature 0) of `messages` as API key `key` ("" without auth); the reply is
// appended to messages. The parsed body, or null (and a test failure).
inline Json Chat(Replica& r, Json& messages, const std::string& key = "", int max_tokens = 12) {
  httplib::Headers h;
  if (!key.empty()) h.emplace("Authorization", "Bearer " + key);
  const Json body = {{"model", "m"}, {"messages", messages}, {"max_tokens", max_tokens}, {"temperature", 0}};
  auto res = r.c.Post("/v1/chat/completions", h, body.dump(), "application/json");
  EXPECT_TRUE(res && res->status == 200) << (res ? res->body : "no response") << "\n" << r.proc.log();
  if (!res || res->status != 200) return Json();
  Json out = Json::parse(res->body);
  messages.push_back({{"role", "assistant"}, {"content", out["choices"][0]["message"]["content"]}});
  return out;
}

inline std::string ChatText(const Json& r) { return r.is_object() ? r["choices"][0]["message"].value("content", "") : ""; }

inline const char* const kUserTurns[] = {"Tell me a story about a cat.", "What did the cat eat?", "Where did it go next?",
                                  "And then?"};

// Three turns of one conversation on `r` (a system prompt first); returns the history with replies.
inline Json ThreeTurns(Replica& r, const std::string& key = "") {
  Json messages = Json::array({{{"role", "system"}, {"content", "You are a storyteller for children."}}});
  for (int t = 0; t < 3; ++t) {
    messages.push_back({{"role", "user"}, {"content", kUserTurns[t]}});
    if (!Chat(r, messages, key).is_object()) return Json();
  }
  return messages;
}

inline std::vector<int64_t> SessionIds(const std::string& db) {
  auto store = Store::Open(db);
  std::vector<int64_t> ids;
  if (!store.ok()) return ids;
  (void)(*store)->ForEachSession([&](StoredSession&& s) {
    ids.push_back(s.id);
    return Status::Ok();
  });
  return ids;
}

inline StoredSession LoadStored(const std::string& db, int64_t id) {
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
// Advisory locks granted in the database of url (the turn locks replicas hold).
inline int64_t AdvisoryLocks(const std::string& url) {
  return PgInt(url,
               "SELECT count(*) FROM pg_locks WHERE locktype='advisory' AND granted AND "
               "database=(SELECT oid FROM pg_database WHERE datname=current_database())");
}

// Replicas whose long turns fit (2048 positions, stories260K's context) and whose continuations wait for them as long as
// a loaded machine may need (the wait bound follows --max-queue-ms).
inline const std::vector<std::string> kLongTurn = {"--precision", "f32", "--kv-dtype", "f32", "--kv-disk-mb", "0",
                                                   "--max-context", "2048", "--kv-t0-mb", "64", "--max-queue-ms", "60000"};
inline std::unique_ptr<Replica> LongTurnReplica(const std::string& db) {
  std::vector<std::string> f = {"--db", db};
  f.insert(f.end(), kLongTurn.begin(), kLongTurn.end());
  return std::make_unique<Replica>(f);
}

// A Responses turn of `tokens` tokens (ignore_eos, streamed): continuing response `after` (an id),
// or with the fields `after` holds (a conversation).
inline Json LongTurnBody(const Json& after, int tokens) {
  Json body = Turn("And then what happened?");
  if (after.is_string()) body["previous_response_id"] = after;
  else body.update(after);
  body["max_output_tokens"] = tokens;
  body["ignore_eos"] = true;
  body["stream"] = true;
  return body;
}

// A long streamed request on r, on a thread of its own: POST `body` to `path` (by default a
// Responses turn, LongTurnBody); it generates once the stream holds `generating`.
class LongTurn {
 public:
  LongTurn(Replica& r, const Json& after, int tokens) : LongTurn(r, "/v1/responses", LongTurnBody(after, tokens)) {}
  LongTurn(Replica& r, std::string path, Json body, std::string generating = "response.output_text.delta")
      : generating_(std::move(generating)) {
    thread_ = std::thread([this, port = r.proc.port(), path = std::move(path), body = std::move(body)] {
      httplib::Client c("127.0.0.1", port);
      c.set_read_timeout(120, 0);
      httplib::Request req;
      req.method = "POST";
      req.path = path;
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
                        [&] { return done_ || body_.find(generating_) != std::string::npos; }) &&
           !done_;
  }
  // Waits for the end of the stream; its HTTP status (-1: no answer).
  int Join() {
    thread_.join();
    return status_;
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
  const std::string generating_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::string body_;
  int status_ = 0;
  bool done_ = false;
  std::chrono::steady_clock::time_point ended_;
};

// The tokens of the stored session holding response `id`, up to its end.
inline std::vector<int32_t> StoredLog(const std::string& db, const std::string& id) {
  auto store = Store::Open(db);
  if (!store.ok()) return {};
  auto r = (*store)->GetResponse(id, "");
  if (!r.ok() || !r->has_value() || !(*r)->session_id) return {};
  auto s = (*store)->LoadSession(*(*r)->session_id);
  if (!s.ok()) return {};
  s->tokens.resize(std::min<size_t>(s->tokens.size(), (*r)->end_token));
  return s->tokens;
}

// The texts of a conversation's items, oldest first, as replica r lists them.
inline std::vector<std::string> ItemTexts(Replica& r, const std::string& conversation) {
  Json items = r.Get("/v1/conversations/" + conversation + "/items?order=asc&limit=100");
  std::vector<std::string> texts;
  if (!items.is_object()) return texts;
  for (const Json& it : items["data"]) {
    for (const Json& part : it["content"]) texts.push_back(part.value("text", ""));
  }
  return texts;
}

}  // namespace mnemo::testing
