// Concurrent continuations of one conversation (issue 12), over real HTTP with stories260K:
// requests continuing the same history at the same time (an agent framework's parallel calls)
// each find that history in the cache. One of them continues the conversation's session; the
// others fork what it had committed before that turn (Engine::ForkSession of a session with a turn
// running), so every one reports the history as cached, where before only one did (cached tokens
// 37, 0, 0, 0). Their greedy outputs equal those of a server that recomputes every turn
// (--cache off) answering the same requests one at a time: nothing of the running turn reaches a
// fork. With a store: the forks are stored (as forks of a session whose turn was running) and
// continue like any conversation. Both APIs: stateless chat (the history resent) and Responses
// (one previous_response_id named by several requests).
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "post_json.h"
#include "server_process.h"

namespace mnemo::testing {
namespace {

using Json = nlohmann::json;

constexpr int kConcurrent = 4;
const char* const kQuestions[kConcurrent] = {"What did the cat eat?", "Where did the cat go?",
                                             "Who was the cat's friend?", "How did the story end?"};

std::string TempDb(const char* name) {
  auto p = std::filesystem::temp_directory_path() /
           (std::string("mnemo-concurrent-") + name + "-" + std::to_string(getpid()) + ".db");
  std::filesystem::remove(p);
  std::filesystem::remove_all(p.string() + ".kv");
  return p.string();
}

// Greedy and long enough (no end of generation) that the concurrent turns overlap.
Json Greedy(Json body, int max_tokens, bool responses) {
  body["temperature"] = 0;
  body["ignore_eos"] = true;
  body[responses ? "max_output_tokens" : "max_tokens"] = max_tokens;
  return body;
}

// Posts the bodies to `path` all at once (one thread each, released together) and returns the
// answers in order.
std::vector<Json> PostAtOnce(int port, const std::string& path, const std::vector<Json>& bodies) {
  std::vector<Json> out(bodies.size());
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (size_t i = 0; i < bodies.size(); i++) {
    threads.emplace_back([&, i] {
      ready++;
      while (ready.load() < static_cast<int>(bodies.size())) std::this_thread::yield();
      out[i] = PostJson(port, path, bodies[i]);
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

int Cached(const Json& r, bool responses) {
  const Json& u = r["usage"];
  return responses ? u["input_tokens_details"]["cached_tokens"].get<int>()
                   : u["prompt_tokens_details"]["cached_tokens"].get<int>();
}

class ConcurrentTurns : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::vector<std::string> exact = {"--precision", "f32", "--kv-dtype", "f32"};
    std::vector<std::string> with_db = exact;
    with_db.insert(with_db.end(), {"--db", TempDb("cached")});
    cached_ = std::make_unique<ServerProcess>(with_db);
    std::vector<std::string> off = exact;
    off.insert(off.end(), {"--cache", "off"});
    fresh_ = std::make_unique<ServerProcess>(off);
    ASSERT_GT(cached_->port(), 0) << cached_->log();
    ASSERT_GT(fresh_->port(), 0) << fresh_->log();
  }
  std::unique_ptr<ServerProcess> cached_, fresh_;
};

TEST_F(ConcurrentTurns, ChatContinuationsAtOnceAllReuseTheHistory) {
  const Json first = Json::array({{{"role", "system"}, {"content", "You are a storyteller."}},
                                  {{"role", "user"}, {"content", "Tell me a story about a cat."}}});
  Json r1 = PostJson(cached_->port(), "/v1/chat/completions", Greedy({{"messages", first}}, 24, false));
  Json f1 = PostJson(fresh_->port(), "/v1/chat/completions", Greedy({{"messages", first}}, 24, false));
  ASSERT_TRUE(r1.is_object() && f1.is_object());
  const std::string reply = r1["choices"][0]["message"]["content"];
  ASSERT_EQ(reply, f1["choices"][0]["message"]["content"]);
  const int history = r1["usage"]["prompt_tokens"].get<int>() + r1["usage"]["completion_tokens"].get<int>();

  std::vector<Json> bodies;
  for (const char* q : kQuestions) {
    Json msgs = first;
    msgs.push_back({{"role", "assistant"}, {"content", reply}});
    msgs.push_back({{"role", "user"}, {"content", q}});
    bodies.push_back(Greedy({{"messages", msgs}}, 160, false));
  }
  const std::vector<Json> out = PostAtOnce(cached_->port(), "/v1/chat/completions", bodies);
  int with_cache = 0;
  std::printf("[ figures  ] %d continuations at once, history %d tokens: cached tokens", kConcurrent, history);
  for (const Json& r : out) std::printf(" %d", r.is_object() ? Cached(r, false) : -1);
  std::printf("\n");
  for (int k = 0; k < kConcurrent; k++) {
    ASSERT_TRUE(out[k].is_object()) << k;
    const int cached = Cached(out[k], false);
    with_cache += cached > 0;
    // The history's prompt and reply, but for the reply's last token (never fed: no KV yet).
    EXPECT_GE(cached, history - 1) << "request " << k << ": " << out[k]["usage"].dump();
  }
  EXPECT_EQ(with_cache, kConcurrent);

  // The same requests one at a time on a server that recomputes everything: the same answers.
  for (int k = 0; k < kConcurrent; k++) {
    Json f = PostJson(fresh_->port(), "/v1/chat/completions", bodies[k]);
    ASSERT_TRUE(f.is_object()) << k;
    EXPECT_EQ(Cached(f, false), 0) << k;
    EXPECT_EQ(out[k]["usage"]["prompt_tokens"], f["usage"]["prompt_tokens"]) << k;
    EXPECT_EQ(out[k]["choices"][0]["message"]["content"], f["choices"][0]["message"]["content"]) << "request " << k;
  }

  // Each conversation, the forks' included, was stored and goes on from its own session: the
  // next turn finds its whole context cached.
  for (int k = 0; k < kConcurrent; k++) {
    Json msgs = bodies[k]["messages"];
    msgs.push_back({{"role", "assistant"}, {"content", out[k]["choices"][0]["message"]["content"]}});
    msgs.push_back({{"role", "user"}, {"content", "And then?"}});
    Json next = PostJson(cached_->port(), "/v1/chat/completions", Greedy({{"messages", msgs}}, 4, false));
    ASSERT_TRUE(next.is_object()) << k;
    const int before = out[k]["usage"]["prompt_tokens"].get<int>() + out[k]["usage"]["completion_tokens"].get<int>();
    EXPECT_GE(Cached(next, false), before - 1) << "conversation " << k << ": " << next["usage"].dump();
  }
}

TEST_F(ConcurrentTurns, ResponsesNamingOnePreviousResponseAtOnceAllReuseIt) {
  const Json first = {{"input", "Tell me a story about a cat."}, {"instructions", "You are a storyteller."}};
  Json r1 = PostJson(cached_->port(), "/v1/responses", Greedy(first, 24, true));
  Json f1 = PostJson(fresh_->port(), "/v1/responses", Greedy(first, 24, true));
  ASSERT_TRUE(r1.is_object() && f1.is_object());
  ASSERT_EQ(r1["output_text"], f1["output_text"]);
  const int history = r1["usage"]["input_tokens"].get<int>() + r1["usage"]["output_tokens"].get<int>();

  std::vector<Json> bodies, fresh_bodies;
  for (const char* q : kQuestions) {
    Json b = Greedy({{"input", q}, {"instructions", "You are a storyteller."}}, 160, true);
    b["previous_response_id"] = r1["id"];
    bodies.push_back(b);
    b["previous_response_id"] = f1["id"];
    fresh_bodies.push_back(b);
  }
  const std::vector<Json> out = PostAtOnce(cached_->port(), "/v1/responses", bodies);
  for (int k = 0; k < kConcurrent; k++) {
    ASSERT_TRUE(out[k].is_object()) << k;
    EXPECT_GE(Cached(out[k], true), history - 1) << "request " << k << ": " << out[k]["usage"].dump();
  }
  for (int k = 0; k < kConcurrent; k++) {
    Json f = PostJson(fresh_->port(), "/v1/responses", fresh_bodies[k]);
    ASSERT_TRUE(f.is_object()) << k;
    EXPECT_EQ(out[k]["usage"]["input_tokens"], f["usage"]["input_tokens"]) << k;
    EXPECT_EQ(out[k]["output_text"], f["output_text"]) << "request " << k;
  }
}

}  // namespace
}  // namespace mnemo::testing
