// scripts/cluster.sh (issue 14): `up` starts PostgreSQL, Redis, two stories260K replicas and HAProxy
// on 127.0.0.1; a two-turn conversation goes through the front (both turns on one replica, the chain
// intact, its KV put to Redis); `down` stops every process it started.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "../store/pg_server.h"

namespace mnemo::testing {
namespace {

using Json = nlohmann::json;
namespace fs = std::filesystem;

std::string ReadLine(const fs::path& p) {
  std::ifstream f(p);
  std::string s;
  std::getline(f, s);
  return s;
}

// The ports of the replicas: the `server rI 127.0.0.1:PORT` lines cluster.sh adds to DIR/haproxy.cfg.
std::vector<int> ReplicaPorts(const fs::path& cfg) {
  std::ifstream f(cfg);
  std::vector<int> ports;
  const std::regex server(R"(^\s*server r\d+ 127\.0\.0\.1:(\d+))");
  std::smatch m;
  for (std::string line; std::getline(f, line);) {
    if (std::regex_search(line, m, server)) ports.push_back(std::stoi(m[1]));
  }
  return ports;
}

// Remote KV chunks stored by the replica on `port` (its /metrics); -1 when it reports none.
double RemotePuts(int port) {
  httplib::Client c("127.0.0.1", port);
  auto r = c.Get("/metrics");
  std::smatch m;
  static const std::regex puts(R"(\nmnemo_remote_kv_puts_total\{result="stored"\} ([0-9.e+-]+))");
  return r && r->status == 200 && std::regex_search(r->body, m, puts) ? std::stod(m[1]) : -1;
}

// The process runs (a zombie, whose cmdline is empty, does not).
bool Alive(pid_t pid) {
  return pid > 0 && kill(pid, 0) == 0 && !ReadLine("/proc/" + std::to_string(pid) + "/cmdline").empty();
}

class Cluster : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* pg = std::getenv("MNEMO_PG_BIN");
    const std::string bin = pg && *pg ? pg : "/usr/lib/postgresql/15/bin";
    if (access((bin + "/initdb").c_str(), X_OK) != 0) GTEST_SKIP() << "PostgreSQL binaries not found in " << bin;
    if (access(MNEMO_HAPROXY, X_OK) != 0) GTEST_SKIP() << "haproxy not found (" << MNEMO_HAPROXY << ")";
    dir_ = fs::temp_directory_path() / ("mnemo-cluster-" + std::to_string(getpid()));
    fs::remove_all(dir_);
    // Without redis-server the cluster runs without the shared KV tier (and its checks are skipped).
    const char* redis = std::getenv("MNEMO_REDIS_SERVER");
    has_redis_ = redis && *redis ? access(redis, X_OK) == 0 : std::system("command -v redis-server >/dev/null") == 0;
  }
  void TearDown() override {
    if (!dir_.empty() && fs::exists(dir_ / "front.url")) Run("down --dir " + dir_.string());  // a failed test's cluster
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  int Run(const std::string& args) {
    const std::string cmd = std::string("MNEMO_BIN=") + MNEMO_BINARY_DIR + "/apps/mnemo HAPROXY_BIN=" + MNEMO_HAPROXY +
                            " MNEMO_CLUSTER_WAIT_S=30 " + MNEMO_SOURCE_DIR + "/scripts/cluster.sh " + args;
    const int rc = std::system(cmd.c_str());
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  }
  fs::path dir_;
  bool has_redis_ = false;
};

TEST_F(Cluster, UpServesAConversationThroughTheFrontAndDownStopsEverything) {
  const int port = testing_util::FreeLoopbackPort();
  ASSERT_EQ(Run("up --replicas 2 --model " + std::string(MNEMO_SHARED_DIR) +
                "/models/stories260K/stories260K.gguf --port " + std::to_string(port) + " --dir " + dir_.string() +
                " --no-fsync" + (has_redis_ ? "" : " --no-redis") + " -- --max-context 512 --kv-t0-mb 16"),
            0);
  ASSERT_EQ(ReadLine(dir_ / "front.url"), "http://127.0.0.1:" + std::to_string(port));
  std::vector<pid_t> pids;
  for (const char* f : {"replica-0.pid", "replica-1.pid", "haproxy.pid"}) {
    pids.push_back(std::stoi(ReadLine(dir_ / f)));
    EXPECT_TRUE(Alive(pids.back())) << f;
  }
  pids.push_back(std::stoi(ReadLine(dir_ / "pg" / "data" / "postmaster.pid")));
  EXPECT_TRUE(Alive(pids.back())) << "postgres";
  if (has_redis_) {
    pids.push_back(std::stoi(ReadLine(dir_ / "redis.pid")));
    EXPECT_TRUE(Alive(pids.back())) << "redis-server";
    EXPECT_EQ(ReadLine(dir_ / "redis.url").rfind("redis://127.0.0.1:", 0), 0u);
  }

  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(30, 0);
  Json t1 = {{"input", "Tell me a story about a cat."}, {"max_output_tokens", 8}};
  auto r1 = c.Post("/v1/responses", t1.dump(), "application/json");
  ASSERT_TRUE(r1 && r1->status == 200) << (r1 ? r1->body : "no response");
  Json t2 = {{"input", "What did the cat eat?"}, {"max_output_tokens", 8},
             {"previous_response_id", Json::parse(r1->body)["id"]}};
  auto r2 = c.Post("/v1/responses", t2.dump(), "application/json");
  ASSERT_TRUE(r2 && r2->status == 200) << (r2 ? r2->body : "no response");
  EXPECT_EQ(Json::parse(r2->body)["previous_response_id"], Json::parse(r1->body)["id"]);
  EXPECT_EQ(r2->get_header_value("X-Mnemo-Served-By"), r1->get_header_value("X-Mnemo-Served-By"));
  // cluster.sh names each replica as its HAProxy server line (--replica-id rI).
  EXPECT_EQ(r1->get_header_value("X-Mnemo-Replica"), r1->get_header_value("X-Mnemo-Served-By"));
  EXPECT_GT(Json::parse(r2->body)["usage"]["input_tokens_details"]["cached_tokens"].get<int>(), 0)
      << "the second turn reached the replica holding the conversation's KV";
  if (has_redis_) {
    // The replicas use Redis: the conversation's full chunks are put soon after its turns end.
    ASSERT_GT(Json::parse(r2->body)["usage"]["total_tokens"].get<int>(), 32) << "no full chunk to put";
    const std::vector<int> ports = ReplicaPorts(dir_ / "haproxy.cfg");
    ASSERT_EQ(ports.size(), 2u);
    double puts = 0;
    for (int i = 0; i < 100 && puts <= 0; i++) {
      if (i > 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      puts = 0;
      for (int p : ports) puts += std::max(0.0, RemotePuts(p));
    }
    EXPECT_GT(puts, 0) << "no replica put KV to Redis";
  }

  ASSERT_EQ(Run("down --dir " + dir_.string()), 0);
  EXPECT_FALSE(fs::exists(dir_ / "front.url"));
  for (pid_t p : pids) EXPECT_FALSE(Alive(p)) << "pid " << p << " still runs after down";
}

}  // namespace
}  // namespace mnemo::testing
