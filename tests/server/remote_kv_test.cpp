// The remote KV tier (--kv-remote, Redis) over real HTTP on stories260K: a replica that holds none
// of a conversation's KV (a fresh process, no disk tier) continues it from the chunks another
// replica left in Redis, recomputing less than it would without Redis, with the same output at
// temperature 0; and with Redis killed, the same continuations still come out right (recomputed).
#include <gtest/gtest.h>
#include <httplib.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "../kv/redis_server.h"
#include "server_process.h"

namespace mnemo::testing {
namespace {

using Json = nlohmann::json;
using testing_util::RedisServer;

// The database the tests below use on the shared server (other tests keep to database 0).
constexpr int kDb = 7;

// A replica on the store at `db` (SQLite, no disk tier: nothing of its KV survives it), exact
// arithmetic, with the remote tier at `redis` when given.
std::vector<std::string> Flags(const std::string& db, const std::string& redis) {
  std::vector<std::string> f = {"--db", db, "--kv-disk-mb", "0", "--precision", "f32", "--kv-dtype", "f32"};
  if (!redis.empty()) f.insert(f.end(), {"--kv-remote", redis, "--kv-remote-fetch", "always"});
  return f;
}

struct Replica {
  explicit Replica(std::vector<std::string> flags) : proc(std::move(flags)), c("127.0.0.1", proc.port()) {
    c.set_read_timeout(60, 0);
    c.set_connection_timeout(5, 0);
  }
  // A Responses turn at temperature 0; the parsed response, or null (and a test failure).
  Json Turn(const std::string& input, const std::string& previous = "") {
    Json body = {{"model", "m"}, {"input", input}, {"max_output_tokens", 24}, {"temperature", 0}};
    if (!previous.empty()) body["previous_response_id"] = previous;
    auto r = c.Post("/v1/responses", body.dump(), "application/json");
    EXPECT_TRUE(r && r->status == 200) << (r ? r->body : "no response") << "\n" << proc.log();
    return r && r->status == 200 ? Json::parse(r->body) : Json();
  }
  // A counter or gauge from /metrics (the first line starting with `name`); -1 when absent.
  double Metric(const std::string& name) {
    auto r = c.Get("/metrics");
    if (!r || r->status != 200) return -1;
    std::smatch m;
    const std::regex re("\n" + std::regex_replace(name, std::regex(R"([{}"])"), R"(\$&)") + " ([0-9.e+-]+)");
    return std::regex_search(r->body, m, re) ? std::stod(m[1]) : -1;
  }
  ServerProcess proc;
  httplib::Client c;
};

std::string Text(const Json& response) {
  for (const Json& item : response["output"]) {
    if (item.value("type", "") != "message") continue;
    for (const Json& part : item["content"]) return part.value("text", "");
  }
  return "";
}

// A first message long enough for several full chunks (stories260K's vocabulary is small).
const char* kOpening =
    "Once upon a time there was a little girl named Lily who lived in a small house near the big "
    "forest with her mother, her father and her dog Max. Every morning Lily and Max walked to the "
    "old tree by the river to look at the birds, and every evening they came home to eat soup.";

class RemoteKv : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("mnemo_remote_kv_" + std::to_string(getpid()) + "_" +
                                                     ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Db() const { return (dir_ / "store.db").string(); }
  std::filesystem::path dir_;
};

// On the ctest fixture's shared redis-server, database kDb emptied first (url: that database).
class RemoteKvShared : public RemoteKv {
 protected:
  void SetUp() override {
    RemoteKv::SetUp();
    std::string why;
    RedisServer* redis = RedisServer::Shared(&why);
    if (!redis) GTEST_SKIP() << why;
    url = redis->url() + "/" + std::to_string(kDb);
    ASSERT_EQ(RedisServer::RunAt(url, {"FLUSHDB"}), "OK");
  }
  std::string url;
};

TEST_F(RemoteKvShared, FreshReplicaContinuesFromRedisWithTheSameOutput) {

  // Replica A serves two turns, then stops: its KV reaches Redis (at the latest, at shutdown).
  std::string r1, a2;
  {
    Replica a(Flags(Db(), url));
    ASSERT_GT(a.proc.port(), 0) << a.proc.log();
    const Json t1 = a.Turn(kOpening);
    r1 = t1.value("id", "");
    ASSERT_FALSE(r1.empty());
    a2 = Text(a.Turn("What did Lily see by the river?", r1));
    ASSERT_FALSE(a2.empty());
    ASSERT_TRUE(a.proc.StopWithin(SIGTERM, 20)) << a.proc.log();
  }
  ASSERT_NE(RedisServer::RunAt(url, {"DBSIZE"}), "0") << "nothing reached Redis";

  // Replica B: a new process on the same store, no disk tier. It continues the same branch.
  double with_redis_recomputed = 0, hits = 0;
  {
    Replica b(Flags(Db(), url));
    ASSERT_GT(b.proc.port(), 0) << b.proc.log();
    const Json t = b.Turn("What did Lily see by the river?", r1);
    EXPECT_EQ(Text(t), a2) << "the continuation from Redis differs from A's";
    hits = b.Metric("mnemo_remote_kv_hits_total");
    with_redis_recomputed = b.Metric("mnemo_context_tokens_total{source=\"recomputed\"}");
    EXPECT_GT(b.Metric("mnemo_context_tokens_total{source=\"remote\"}"), 0);
    EXPECT_GT(t["usage"]["input_tokens_details"].value("cached_tokens", 0), 0);
  }
  EXPECT_GT(hits, 0) << "B fetched nothing from Redis";

  // The same without Redis: everything B had fetched is recomputed.
  {
    Replica c(Flags(Db(), ""));
    ASSERT_GT(c.proc.port(), 0) << c.proc.log();
    EXPECT_EQ(Text(c.Turn("What did Lily see by the river?", r1)), a2);
    const double without = c.Metric("mnemo_context_tokens_total{source=\"recomputed\"}");
    EXPECT_GT(without, 0);
    EXPECT_LT(with_redis_recomputed, without) << "Redis saved no recomputation";
    EXPECT_LE(with_redis_recomputed + 32 * hits, without);
  }
}

// Write-behind: a replica killed with SIGKILL (no shutdown, its KV never left T0) has put the full
// chunks of the turns it finished, so a fresh replica on the same Redis continues the conversation
// from them, with the same output, instead of recomputing its history.
TEST_F(RemoteKvShared, KilledReplicasFinishedTurnsAreInRedis) {

  std::string r1, a2;
  int history = 0;  // tokens of the branch B continues (A's first turn, prompt and reply)
  {
    Replica a(Flags(Db(), url));
    ASSERT_GT(a.proc.port(), 0) << a.proc.log();
    const Json t1 = a.Turn(kOpening);
    r1 = t1.value("id", "");
    ASSERT_FALSE(r1.empty());
    history = t1["usage"].value("total_tokens", 0);
    a2 = Text(a.Turn("What did Lily see by the river?", r1));
    ASSERT_FALSE(a2.empty());
    // The puts follow the turns, not the shutdown: wait (bounded) for the first turn's full chunks.
    const double want = (history - 1) / 32;
    ASSERT_GE(want, 2) << "the opening is too short for this test";
    for (int i = 0; i < 100 && a.Metric("mnemo_remote_kv_puts_total{result=\"stored\"}") < want; i++) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    a.proc.Stop(SIGKILL);
  }

  Replica b(Flags(Db(), url));
  ASSERT_GT(b.proc.port(), 0) << b.proc.log();
  const Json t = b.Turn("What did Lily see by the river?", r1);
  EXPECT_EQ(Text(t), a2) << "the continuation from Redis differs from A's";
  // Every full chunk of the history but the last position's (fed again for its logits).
  const int from_redis = (history - 1) / 32 * 32;
  EXPECT_GE(b.Metric("mnemo_context_tokens_total{source=\"remote\"}"), from_redis);
  EXPECT_GE(t["usage"]["input_tokens_details"].value("cached_tokens", 0), from_redis);
}

TEST_F(RemoteKv, RedisKilledMidRunOutputsStayCorrect) {
  std::string why;
  auto redis = RedisServer::Private(&why);
  if (!redis) GTEST_SKIP() << why;
  std::string r1, r2, a2, a3;
  {
    Replica a(Flags(Db(), redis->url()));
    ASSERT_GT(a.proc.port(), 0) << a.proc.log();
    r1 = a.Turn(kOpening).value("id", "");
    ASSERT_FALSE(r1.empty());
    const Json t2 = a.Turn("Where did they walk?", r1);
    r2 = t2.value("id", "");
    a2 = Text(t2);
    redis->Kill();  // mid-run: the next turn and the shutdown flush find it gone
    a3 = Text(a.Turn("And what did they eat?", r2));
    ASSERT_FALSE(a3.empty());
    ASSERT_TRUE(a.proc.StopWithin(SIGTERM, 20)) << "the shutdown waits on a dead Redis" << a.proc.log();
  }
  // A fresh replica with Redis still dead rebuilds by recomputing: same outputs, no client errors.
  Replica b(Flags(Db(), redis->url()));
  ASSERT_GT(b.proc.port(), 0) << b.proc.log();
  EXPECT_EQ(Text(b.Turn("Where did they walk?", r1)), a2);
  EXPECT_EQ(Text(b.Turn("And what did they eat?", r2)), a3);
  EXPECT_EQ(b.Metric("mnemo_remote_kv_up"), 0);
  EXPECT_EQ(b.Metric("mnemo_remote_kv_hits_total"), 0);
  EXPECT_GT(b.Metric("mnemo_context_tokens_total{source=\"recomputed\"}"), 0);
  ASSERT_TRUE(b.proc.StopWithin(SIGTERM, 20));
  const std::string log = b.proc.log();
  size_t warnings = 0;
  for (size_t p = 0, e; p < log.size(); p = e + 1) {
    e = log.find('\n', p);
    if (e == std::string::npos) e = log.size();
    const std::string line = log.substr(p, e - p);
    warnings += line.find("remote KV tier") != std::string::npos && line.find("unavailable") != std::string::npos;
  }
  EXPECT_EQ(warnings, 1u) << "Redis down is logged once\n" << log;
}

}  // namespace
}  // namespace mnemo::testing
