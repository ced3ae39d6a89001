// A real HAProxy 2.6 running deploy/haproxy.cfg in front of two `mnemo serve` replicas on one
// PostgreSQL database (issue 14), stories260K over real HTTP on 127.0.0.1:
//   - the turns of a conversation stay on one replica (Responses chains, conversations, chat
//     completions resending their history), as HAProxy's X-Mnemo-Served-By header says;
//   - a replica killed with SIGKILL mid-conversation: the next turn, sent at once (the replica not
//     yet marked down), succeeds on the other replica through HAProxy's L7 retry and redispatch,
//     with the whole history (the same text and input tokens as the chain replayed on one replica);
//   - /ready failing (a replica draining after SIGTERM) takes the replica out of rotation while it
//     still serves.
// Skips (with the reason) without haproxy or the PostgreSQL binaries.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/prctl.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../store/pg_server.h"
#include "server_process.h"

namespace mnemo::testing {
namespace {

using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// HAProxy on deploy/haproxy.cfg, one `server rI 127.0.0.1:PORT` line appended per replica, its
// front on a free port. It dies with the test process (PR_SET_PDEATHSIG).
class Front {
 public:
  Front(const std::vector<int>& replica_ports, std::string* why) {
    if (access(MNEMO_HAPROXY, X_OK) != 0) {
      *why = std::string("haproxy not found (") + MNEMO_HAPROXY + "): apt-get install haproxy";
      return;
    }
    dir_ = std::filesystem::temp_directory_path() / ("mnemo_haproxy_" + std::to_string(getpid()) + "_" +
                                                      std::to_string(replica_ports[0]));
    std::filesystem::create_directories(dir_);
    std::ifstream in(std::string(MNEMO_SOURCE_DIR) + "/deploy/haproxy.cfg");
    std::stringstream cfg;
    cfg << in.rdbuf();
    for (size_t i = 0; i < replica_ports.size(); ++i) {
      cfg << "    server r" << i << " 127.0.0.1:" << replica_ports[i] << "\n";
    }
    const std::string cfg_path = (dir_ / "haproxy.cfg").string(), log_path = (dir_ / "haproxy.log").string();
    std::ofstream(cfg_path) << cfg.str();
    log_path_ = log_path;
    for (int attempt = 0; attempt < 3 && port_ == 0; ++attempt) {  // a port taken meanwhile: another
      const int port = testing_util::FreeLoopbackPort();
      pid_ = fork();
      if (pid_ == 0) {
        int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
          dup2(fd, STDOUT_FILENO);
          dup2(fd, STDERR_FILENO);
        }
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        setenv("MNEMO_FRONT", ("127.0.0.1:" + std::to_string(port)).c_str(), 1);
        execl(MNEMO_HAPROXY, "haproxy", "-db", "-f", cfg_path.c_str(), static_cast<char*>(nullptr));
        _exit(127);
      }
      const auto deadline = Clock::now() + std::chrono::seconds(5);
      while (Clock::now() < deadline) {
        httplib::Client c("127.0.0.1", port);
        c.set_connection_timeout(0, 200000);
        if (auto r = c.Get("/ready"); r && r->status == 200) {
          port_ = port;
          break;
        }
        int st = 0;
        if (waitpid(pid_, &st, WNOHANG) == pid_) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      if (port_ == 0) Kill();
    }
    if (port_ == 0) *why = "haproxy did not start: " + Log();
  }
  ~Front() {
    Kill();
    std::error_code ec;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
  }
  int port() const { return port_; }
  std::string Log() const {
    std::ifstream f(log_path_);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }

 private:
  void Kill() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    int st = 0;
    waitpid(pid_, &st, 0);
    pid_ = -1;
  }
  std::filesystem::path dir_;
  std::string log_path_;
  pid_t pid_ = -1;
  int port_ = 0;
};

struct Answer {
  int status = 0;
  std::string served_by;  // the replica HAProxy sent it to: "r0", "r1"
  Json body;
};

Answer Post(int port, const std::string& path, const Json& body) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(60, 0);
  auto r = c.Post(path.c_str(), body.dump(), "application/json");
  if (!r) return {};
  return {r->status, r->get_header_value("X-Mnemo-Served-By"), Json::parse(r->body, nullptr, false)};
}

Json Turn(const std::string& input, const Json& previous = nullptr) {
  Json t = {{"model", "m"}, {"input", input}, {"max_output_tokens", 12}, {"temperature", 0}};
  if (!previous.is_null()) t["previous_response_id"] = previous;
  return t;
}

std::string Text(const Json& response) {
  for (const Json& item : response["output"]) {
    if (item.value("type", "") != "message") continue;
    for (const Json& part : item["content"]) return part.value("text", "");
  }
  return "";
}

const std::vector<std::string> kInputs = {"Tell me a story about a cat.", "What did the cat eat?",
                                          "Where did it go next?", "And then what happened?"};

class Haproxy : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    pg_ = testing_util::PgServer::Shared(&why);
    if (!pg_) GTEST_SKIP() << why;
    if (access(MNEMO_HAPROXY, X_OK) != 0) GTEST_SKIP() << "haproxy not found (" << MNEMO_HAPROXY << ")";
    db_ = pg_->NewDatabase();
    ASSERT_FALSE(db_.empty());
  }
  testing_util::PgServer* pg_ = nullptr;
  std::string db_;
};

TEST_F(Haproxy, ConversationsStayOnOneReplicaAndSurviveItsLoss) {
  std::vector<std::unique_ptr<ServerProcess>> replicas;
  for (int i = 0; i < 2; ++i) replicas.push_back(std::make_unique<ServerProcess>(std::vector<std::string>{"--db", db_}));
  for (auto& r : replicas) ASSERT_GT(r->port(), 0) << r->log();
  std::string why;
  Front front({replicas[0]->port(), replicas[1]->port()}, &why);
  ASSERT_GT(front.port(), 0) << why;

  // A Responses chain: HAProxy gives the first turn a fresh key (X-Mnemo-Affinity), mnemo mints it
  // into the ids, and the later turns (naming those ids) hash to the same replica.
  std::vector<Json> chain;
  std::string home;
  for (int t = 0; t < 3; ++t) {
    Answer a = Post(front.port(), "/v1/responses", Turn(kInputs[t], t ? chain.back()["id"] : Json()));
    ASSERT_EQ(a.status, 200) << a.body.dump() << front.Log();
    if (t == 0) home = a.served_by;
    EXPECT_EQ(a.served_by, home) << "turn " << t;
    EXPECT_TRUE(std::regex_match(a.body["id"].get<std::string>(), std::regex("resp_[0-9a-f]{12}_[0-9a-f]{32}")))
        << a.body["id"];
    chain.push_back(a.body);
  }
  ASSERT_TRUE(home == "r0" || home == "r1") << home;

  // A conversation: created with a fresh key, its turns follow it.
  Answer conv = Post(front.port(), "/v1/conversations", Json::object());
  ASSERT_EQ(conv.status, 200) << conv.body.dump();
  for (int t = 0; t < 3; ++t) {
    Json turn = Turn(kInputs[t]);
    turn["conversation"] = conv.body["id"];
    Answer a = Post(front.port(), "/v1/responses", turn);
    ASSERT_EQ(a.status, 200) << a.body.dump();
    EXPECT_EQ(a.served_by, conv.served_by) << "conversation turn " << t;
  }

  // Chat completions resend the history: the head of the history is the key.
  Json messages = Json::array({{{"role", "system"}, {"content", "You tell short stories."}}});
  std::string chat_home;
  for (int t = 0; t < 3; ++t) {
    messages.push_back({{"role", "user"}, {"content", kInputs[t]}});
    Answer a = Post(front.port(), "/v1/chat/completions",
                    {{"model", "m"}, {"messages", messages}, {"max_tokens", 12}, {"temperature", 0}});
    ASSERT_EQ(a.status, 200) << a.body.dump();
    if (t == 0) chat_home = a.served_by;
    EXPECT_EQ(a.served_by, chat_home) << "chat turn " << t;
    messages.push_back({{"role", "assistant"}, {"content", a.body["choices"][0]["message"]["content"]}});
  }

  // The chain's replica dies; the next turn goes out at once, before any health check can notice:
  // HAProxy's connection fails, it retries on the other replica, which rebuilds the conversation
  // from the store.
  const int victim = home == "r0" ? 0 : 1, survivor = 1 - victim;
  replicas[victim]->Stop(SIGKILL);
  const auto t0 = Clock::now();
  Answer next = Post(front.port(), "/v1/responses", Turn(kInputs[3], chain.back()["id"]));
  const double failover_s = std::chrono::duration<double>(Clock::now() - t0).count();
  ASSERT_EQ(next.status, 200) << next.body.dump() << front.Log();
  EXPECT_EQ(next.served_by, "r" + std::to_string(survivor));
  EXPECT_EQ(next.body["previous_response_id"], chain.back()["id"]);
  EXPECT_LT(failover_s, 5.0);

  // No lost turn: the survivor, replaying the whole chain itself, says the same at temperature 0
  // from the same number of input tokens.
  Json replay;
  for (int t = 0; t < 4; ++t) {
    Answer a = Post(replicas[survivor]->port(), "/v1/responses", Turn(kInputs[t], t ? replay["id"] : Json()));
    ASSERT_EQ(a.status, 200) << a.body.dump();
    replay = a.body;
    if (t < 3) EXPECT_EQ(Text(replay), Text(chain[t])) << "turn " << t;
  }
  EXPECT_EQ(Text(next.body), Text(replay));
  EXPECT_EQ(next.body["usage"]["input_tokens"], replay["usage"]["input_tokens"]);
  // And the chain is whole in the store, read through the front.
  httplib::Client c("127.0.0.1", front.port());
  std::string id = next.body["id"];
  for (int t = 3; t >= 1; --t) {
    auto r = c.Get(("/v1/responses/" + id).c_str());
    ASSERT_TRUE(r && r->status == 200) << (r ? r->body : "no answer");
    id = Json::parse(r->body)["previous_response_id"];
    EXPECT_EQ(id, chain[t - 1]["id"]);
  }
}

TEST_F(Haproxy, ReadinessFailingTakesAReplicaOut) {
  std::vector<std::unique_ptr<ServerProcess>> replicas;
  for (int i = 0; i < 2; ++i) {
    replicas.push_back(std::make_unique<ServerProcess>(std::vector<std::string>{"--db", db_, "--drain-s", "30"}));
  }
  for (auto& r : replicas) ASSERT_GT(r->port(), 0) << r->log();
  std::string why;
  Front front({replicas[0]->port(), replicas[1]->port()}, &why);
  ASSERT_GT(front.port(), 0) << why;

  Answer first = Post(front.port(), "/v1/responses", Turn(kInputs[0]));
  ASSERT_EQ(first.status, 200) << first.body.dump();
  const int victim = first.served_by == "r0" ? 0 : 1, survivor = 1 - victim;
  // SIGTERM with --drain-s: /ready answers 503, everything else is still served.
  kill(replicas[victim]->pid(), SIGTERM);
  httplib::Client direct("127.0.0.1", replicas[victim]->port());
  auto deadline = Clock::now() + std::chrono::seconds(2);
  int ready = 0;
  while (Clock::now() < deadline && ready != 503) {
    auto r = direct.Get("/ready");
    ready = r ? r->status : 0;
    if (ready != 503) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(ready, 503);

  // Every turn succeeds; within a few health checks they move to the other replica, and stay.
  const auto t0 = Clock::now();
  deadline = t0 + std::chrono::seconds(5);
  Json last = first.body;
  std::string served;
  int t = 1;
  while (Clock::now() < deadline && served != "r" + std::to_string(survivor)) {
    Answer a = Post(front.port(), "/v1/responses", Turn(kInputs[t % 4], last["id"]));
    ASSERT_EQ(a.status, 200) << a.body.dump() << front.Log();
    served = a.served_by;
    last = a.body;
    ++t;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const double moved_s = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_EQ(served, "r" + std::to_string(survivor)) << front.Log();
  EXPECT_LT(moved_s, 4.0);  // 2 failed checks 250 ms apart, plus the turns' own time
  for (int k = 0; k < 2; ++k) {
    Answer a = Post(front.port(), "/v1/responses", Turn(kInputs[(t + k) % 4], last["id"]));
    ASSERT_EQ(a.status, 200) << a.body.dump();
    EXPECT_EQ(a.served_by, "r" + std::to_string(survivor));
    last = a.body;
  }
  // The draining replica was still serving meanwhile.
  auto h = direct.Get("/health");
  EXPECT_TRUE(h && h->status == 200);
  std::printf("moved to the other replica %.2f s after /ready failed\n", moved_s);
  // The survivor starts its drain with SIGINT; the destructors' SIGTERM (a distinct signal, so the
  // two cannot merge into one pending signal) then ends both drains at once.
  kill(replicas[survivor]->pid(), SIGINT);
}

}  // namespace
}  // namespace mnemo::testing
