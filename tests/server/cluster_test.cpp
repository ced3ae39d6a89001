// scripts/cluster.sh (issue 14): `up` starts PostgreSQL, two stories260K replicas and HAProxy on
// 127.0.0.1; a two-turn conversation goes through the front (both turns on one replica, the chain
// intact); `down` stops every process it started.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
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
};

TEST_F(Cluster, UpServesAConversationThroughTheFrontAndDownStopsEverything) {
  const int port = testing_util::FreeLoopbackPort();
  ASSERT_EQ(Run("up --replicas 2 --model " + std::string(MNEMO_SHARED_DIR) +
                "/models/stories260K/stories260K.gguf --port " + std::to_string(port) + " --dir " + dir_.string() +
                " --no-fsync -- --max-context 512 --kv-t0-mb 16"),
            0);
  ASSERT_EQ(ReadLine(dir_ / "front.url"), "http://127.0.0.1:" + std::to_string(port));
  std::vector<pid_t> pids;
  for (const char* f : {"replica-0.pid", "replica-1.pid", "haproxy.pid"}) {
    pids.push_back(std::stoi(ReadLine(dir_ / f)));
    EXPECT_TRUE(Alive(pids.back())) << f;
  }
  pids.push_back(std::stoi(ReadLine(dir_ / "pg" / "data" / "postmaster.pid")));
  EXPECT_TRUE(Alive(pids.back())) << "postgres";

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
  EXPECT_GT(Json::parse(r2->body)["usage"]["input_tokens_details"]["cached_tokens"].get<int>(), 0)
      << "the second turn reached the replica holding the conversation's KV";

  ASSERT_EQ(Run("down --dir " + dir_.string()), 0);
  EXPECT_FALSE(fs::exists(dir_ / "front.url"));
  for (pid_t p : pids) EXPECT_FALSE(Alive(p)) << "pid " << p << " still runs after down";
}

}  // namespace
}  // namespace mnemo::testing
