// n > 1 choices on chat completions and completions (issue 12), against a real server on 127.0.0.1
// (stories260K): the prompt is computed once and forked per choice, each choice samples its own
// stream, usage counts the prompt once, streams interleave choices by index, and a follow-up that
// resends the history with any one choice's reply continues that choice's session. Completions'
// best_of returns the most likely of its candidates, echo prefixes the prompt, suffix is refused.
#include <gtest/gtest.h>
#include <httplib.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "post_json.h"
#include "server_process.h"

namespace mnemo::testing {
namespace {

using Json = nlohmann::json;

class Choices : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = std::make_unique<ServerProcess>(std::vector<std::string>{});
    ASSERT_GT(server_->port(), 0) << server_->log();
  }
  Json Post(const std::string& path, const Json& body, int expect = 200) {
    return PostJson(server_->port(), path, body, expect);
  }
  Json Get(const std::string& path) {
    httplib::Client c("127.0.0.1", server_->port());
    auto r = c.Get(path.c_str());
    return r ? Json::parse(r->body, nullptr, false) : Json();
  }
  // A counter's value in /metrics (its line "name value"; 0 when absent).
  long Counter(const std::string& name) {
    httplib::Client c("127.0.0.1", server_->port());
    auto r = c.Get("/metrics");
    const std::string key = "\n" + name + " ";
    const size_t p = r ? r->body.find(key) : std::string::npos;
    return p == std::string::npos ? 0 : std::stol(r->body.substr(p + key.size()));
  }
  // Context tokens whose KV was computed (new or recomputed) over all finished turns.
  long Computed() {
    return Counter("mnemo_context_tokens_total{source=\"new\"}") +
           Counter("mnemo_context_tokens_total{source=\"recomputed\"}");
  }
  std::unique_ptr<ServerProcess> server_;
};

const Json kMessages = Json::array({{{"role", "system"}, {"content", "You tell short stories about animals."}},
                                    {{"role", "user"}, {"content", "Once upon a time, a little fox"}}});

TEST_F(Choices, ChatForksThePromptOncePerChoice) {
  const long before = Computed();
  const long prompt_before = Counter("mnemo_prompt_tokens_total");
  Json body = {{"messages", kMessages}, {"n", 3}, {"max_tokens", 16}, {"temperature", 1}, {"seed", 11},
               {"logprobs", true}};
  Json j = Post("/v1/chat/completions", body);
  ASSERT_TRUE(j.is_object());
  ASSERT_EQ(j["choices"].size(), 3u) << j.dump();
  std::set<std::string> texts;
  size_t entries = 0;
  for (int i = 0; i < 3; i++) {
    const Json& c = j["choices"][i];
    EXPECT_EQ(c["index"], i);
    texts.insert(c["message"]["content"].get<std::string>());
    entries += c["logprobs"]["content"].size();
  }
  EXPECT_GE(texts.size(), 2u) << j.dump();  // each choice draws its own stream
  // The prompt counted once; the completion tokens of all choices (each may end with its EOS).
  const Json& u = j["usage"];
  const long prompt = u["prompt_tokens"];
  EXPECT_GE(u["completion_tokens"].get<size_t>(), entries);
  EXPECT_LE(u["completion_tokens"].get<size_t>(), entries + 3);
  EXPECT_EQ(u["total_tokens"].get<long>(), prompt + u["completion_tokens"].get<long>());
  // Computed once: the prompt's positions plus at most one re-fed position per choice (3 prompts
  // computed separately would be 3x).
  const long computed = Computed() - before;
  EXPECT_GE(computed, prompt);
  EXPECT_LE(computed, prompt + 3) << server_->log();
  // The metrics count the prompt once too (each choice counted it again).
  EXPECT_EQ(Counter("mnemo_prompt_tokens_total") - prompt_before, prompt);
  // Three sessions, each holding the prompt and its own reply.
  Json sessions = Get("/v1/sessions");
  EXPECT_EQ(sessions["data"].size(), 3u) << sessions.dump();
  // A seed reproduces every choice.
  Json again = Post("/v1/chat/completions", body);
  for (int i = 0; i < 3; i++) EXPECT_EQ(again["choices"][i]["message"], j["choices"][i]["message"]);

  // A follow-up with any choice's reply continues that choice's session: its prompt and reply are
  // cached (nothing but the new message is computed), and no session is added.
  for (int i = 0; i < 3; i++) {
    Json msgs = kMessages;
    msgs.push_back({{"role", "assistant"}, {"content", j["choices"][i]["message"]["content"]}});
    msgs.push_back({{"role", "user"}, {"content", "And then?"}});
    const size_t reply = j["choices"][i]["logprobs"]["content"].size();
    Json f = Post("/v1/chat/completions", {{"messages", msgs}, {"max_tokens", 4}});
    ASSERT_TRUE(f.is_object());
    // (A reply cut by max_tokens ends with a token never fed: that one is computed now.)
    EXPECT_GE(f["usage"]["prompt_tokens_details"]["cached_tokens"].get<size_t>(), prompt + reply - 1) << i << " " << f.dump();
    EXPECT_EQ(f["usage"]["mnemo_tokens_by_source"]["recomputed"], 0) << i;
  }
  EXPECT_EQ(Get("/v1/sessions")["data"].size(), 6u);  // three per request; the follow-ups added none
}

TEST_F(Choices, ChatStreamsInterleaveChoicesByIndex) {
  Json body = {{"messages", kMessages}, {"n", 2}, {"max_tokens", 12}, {"temperature", 1}, {"seed", 5}};
  Json whole = Post("/v1/chat/completions", body);
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  Json events = Post("/v1/chat/completions", body);
  std::map<int, std::string> text;
  std::map<int, int> roles, finishes;
  Json usage;
  for (const Json& ev : events) {
    EXPECT_TRUE(ev["system_fingerprint"].get<std::string>().starts_with("fp_"));
    if (ev.contains("usage") && !ev["usage"].is_null()) usage = ev["usage"];
    for (const Json& c : ev["choices"]) {
      const int i = c["index"];
      if (c["delta"].contains("role")) roles[i]++;
      if (c["delta"].contains("content")) text[i] += c["delta"]["content"].get<std::string>();
      if (!c["finish_reason"].is_null()) finishes[i]++;
    }
  }
  ASSERT_EQ(text.size(), 2u);
  for (int i = 0; i < 2; i++) {
    EXPECT_EQ(roles[i], 1);
    EXPECT_EQ(finishes[i], 1);
    EXPECT_EQ(text[i], whole["choices"][i]["message"]["content"]) << i;
  }
  EXPECT_EQ(usage["prompt_tokens"], whole["usage"]["prompt_tokens"]);
  EXPECT_EQ(usage["completion_tokens"], whole["usage"]["completion_tokens"]);
}

TEST_F(Choices, CompletionsAndBounds) {
  Json body = {{"prompt", "Once upon a time"}, {"n", 2}, {"max_tokens", 8}, {"temperature", 1}, {"seed", 3},
               {"logprobs", 1}};
  Json j = Post("/v1/completions", body);
  ASSERT_EQ(j["choices"].size(), 2u) << j.dump();
  for (int i = 0; i < 2; i++) {
    EXPECT_EQ(j["choices"][i]["index"], i);
    std::string joined;
    for (const Json& t : j["choices"][i]["logprobs"]["tokens"]) joined += t.get<std::string>();
    EXPECT_EQ(joined, j["choices"][i]["text"]);
  }
  body["stream"] = true;
  std::map<int, std::string> text;
  for (const Json& ev : Post("/v1/completions", body)) {
    for (const Json& c : ev["choices"]) text[c["index"]] += c["text"].get<std::string>();
  }
  for (int i = 0; i < 2; i++) EXPECT_EQ(text[i], j["choices"][i]["text"]) << i;

  // n is 1 to 8 on both APIs; Responses have no n.
  for (int n : {0, 9}) {
    Json e = Post("/v1/chat/completions", {{"messages", kMessages}, {"n", n}}, 400);
    EXPECT_EQ(e["error"]["param"], "n");
    e = Post("/v1/completions", {{"prompt", "x"}, {"n", n}}, 400);
    EXPECT_EQ(e["error"]["param"], "n");
  }
  Post("/v1/responses", {{"input", "x"}, {"n", 2}}, 400);
  // n = 1 stays the plain path: one session, one choice.
  Json one = Post("/v1/chat/completions", {{"messages", kMessages}, {"n", 1}, {"max_tokens", 2}});
  EXPECT_EQ(one["choices"].size(), 1u);
}

// The sum of a completions choice's token logprobs (what best_of ranks by).
double Cumulative(const Json& choice) {
  double sum = 0;
  for (const Json& lp : choice["logprobs"]["token_logprobs"]) sum += lp.get<double>();
  return sum;
}

TEST_F(Choices, CompletionsBestOfReturnsTheMostLikelyCandidates) {
  // The four candidates: n = 4 with the same seed draws them (choice i's stream is the seed's i-th).
  Json body = {{"prompt", "Once upon a time"}, {"n", 4}, {"max_tokens", 10}, {"temperature", 1.2}, {"seed", 21},
               {"logprobs", 0}};
  Json all = Post("/v1/completions", body);
  ASSERT_EQ(all["choices"].size(), 4u) << all.dump();
  std::vector<std::pair<double, std::string>> ranked;
  for (const Json& c : all["choices"]) ranked.emplace_back(Cumulative(c), c["text"]);
  std::stable_sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  const size_t sessions = Get("/v1/sessions")["data"].size();

  body["n"] = 2;
  body["best_of"] = 4;
  const long prompt_before = Counter("mnemo_prompt_tokens_total");
  Json best = Post("/v1/completions", body);
  EXPECT_EQ(Counter("mnemo_prompt_tokens_total") - prompt_before, best["usage"]["prompt_tokens"].get<long>());
  ASSERT_EQ(best["choices"].size(), 2u) << best.dump();
  for (int k = 0; k < 2; k++) {
    const Json& c = best["choices"][k];
    EXPECT_EQ(c["index"], k);
    EXPECT_EQ(c["text"], ranked[k].second) << k << " " << all.dump();
    EXPECT_NEAR(Cumulative(c), ranked[k].first, 1e-3) << k;
  }
  // Usage counts every candidate's tokens and the prompt once.
  EXPECT_EQ(best["usage"]["completion_tokens"], all["usage"]["completion_tokens"]);
  EXPECT_EQ(best["usage"]["prompt_tokens"], all["usage"]["prompt_tokens"]);
  // The candidates not returned leave no session; the returned ones continue.
  EXPECT_EQ(Get("/v1/sessions")["data"].size(), sessions + 2);
  Json next = Post("/v1/completions", {{"prompt", "Once upon a time" + best["choices"][0]["text"].get<std::string>()},
                                       {"max_tokens", 2}});
  EXPECT_EQ(next["choices"].size(), 1u);

  // Without logprobs asked, none are reported (they are still what ranks).
  body.erase("logprobs");
  Json quiet = Post("/v1/completions", body);
  for (int k = 0; k < 2; k++) {
    EXPECT_TRUE(quiet["choices"][k]["logprobs"].is_null());
    EXPECT_EQ(quiet["choices"][k]["text"], ranked[k].second) << k;
  }
  // Bounds as OpenAI: n <= best_of <= 8, and a stream cannot hold back candidates.
  for (const Json& bad : {Json{{"n", 3}, {"best_of", 2}}, Json{{"best_of", 9}}, Json{{"best_of", 0}},
                          Json{{"best_of", 3}, {"stream", true}}}) {
    Json b = {{"prompt", "x"}, {"max_tokens", 1}};
    b.update(bad);
    Json e = Post("/v1/completions", b, 400);
    EXPECT_EQ(e["error"]["param"], "best_of") << bad.dump();
    EXPECT_EQ(e["error"]["type"], "invalid_request_error");
  }
  Json same = Post("/v1/completions", {{"prompt", "x"}, {"max_tokens", 2}, {"n", 2}, {"best_of", 2}, {"stream", true}});
  EXPECT_FALSE(same.empty());
}

TEST_F(Choices, CompletionsEchoThePrompt) {
  const std::string prompt = "Once upon a time";
  Json body = {{"prompt", prompt}, {"n", 2}, {"max_tokens", 8}, {"temperature", 1}, {"seed", 4}};
  Json plain = Post("/v1/completions", body);
  body["echo"] = true;
  Json echoed = Post("/v1/completions", body);
  ASSERT_EQ(echoed["choices"].size(), 2u) << echoed.dump();
  for (int i = 0; i < 2; i++) {
    EXPECT_EQ(echoed["choices"][i]["text"], prompt + plain["choices"][i]["text"].get<std::string>()) << i;
  }
  EXPECT_EQ(echoed["usage"]["completion_tokens"], plain["usage"]["completion_tokens"]);
  // Streamed: each choice's first chunk is the prompt.
  body["stream"] = true;
  std::map<int, std::string> text;
  for (const Json& ev : Post("/v1/completions", body)) {
    for (const Json& c : ev["choices"]) {
      const int i = c["index"];
      if (!text.contains(i)) {
        EXPECT_EQ(c["text"], prompt) << ev.dump();
      }
      text[i] += c["text"].get<std::string>();
    }
  }
  ASSERT_EQ(text.size(), 2u);
  for (int i = 0; i < 2; i++) EXPECT_EQ(text[i], echoed["choices"][i]["text"]) << i;
  // One choice, streamed: the prompt still comes first.
  Json one = Post("/v1/completions", {{"prompt", prompt}, {"max_tokens", 3}, {"echo", true}, {"stream", true}});
  ASSERT_FALSE(one.empty());
  EXPECT_EQ(one[0]["choices"][0]["text"], prompt);

  // Prompt logprobs are not computed: echo with logprobs is refused, not answered with made-up numbers.
  Json e = Post("/v1/completions", {{"prompt", prompt}, {"echo", true}, {"logprobs", 0}}, 400);
  EXPECT_EQ(e["error"]["param"], "logprobs");
  EXPECT_EQ(e["error"]["type"], "invalid_request_error");
  Post("/v1/completions", {{"prompt", prompt}, {"echo", true}, {"logprobs", nullptr}, {"max_tokens", 1}});
}

TEST_F(Choices, CompletionsRefuseASuffix) {
  Json e = Post("/v1/completions", {{"prompt", "x"}, {"suffix", " the end."}}, 400);
  EXPECT_EQ(e["error"]["param"], "suffix");
  EXPECT_EQ(e["error"]["message"], "suffix is not supported by this model");
  EXPECT_EQ(e["error"]["type"], "invalid_request_error");
  // Nothing to insert: the same as no suffix.
  Post("/v1/completions", {{"prompt", "x"}, {"suffix", ""}, {"max_tokens", 1}});
  Post("/v1/completions", {{"prompt", "x"}, {"suffix", nullptr}, {"max_tokens", 1}});
}

}  // namespace
}  // namespace mnemo::testing
