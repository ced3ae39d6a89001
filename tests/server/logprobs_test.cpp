// logprobs / top_logprobs on the three APIs, and system_fingerprint (issue 12), against a real
// server on 127.0.0.1 (stories260K, f32 numerics). The reported logprobs are the model's raw
// distribution: checked against the model's own logits computed in this process (PromptLogits,
// the `mnemo logits` path), and shown not to move with temperature.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "format/model_file.h"
#include "model/model.h"
#include "model/prompt_logits.h"
#include "sampling/sampler.h"
#include "post_json.h"
#include "server_process.h"
#include "tokenizer/tokenizer.h"

namespace mnemo::testing {
namespace {

using Json = nlohmann::json;

std::string ModelPath() { return std::string(MNEMO_SHARED_DIR) + "/models/stories260K/stories260K.gguf"; }

// The bytes of an entry's `bytes` list.
std::string Bytes(const Json& entry) {
  std::string s;
  for (const Json& b : entry["bytes"]) s += static_cast<char>(b.get<int>());
  return s;
}

// The invariants every chat / Responses entry keeps: a logprob <= 0; `top` alternatives, most
// likely first, whose probabilities sum to at most 1; the chosen token at most as likely as the best.
void CheckEntry(const Json& e, size_t top) {
  ASSERT_TRUE(e["token"].is_string()) << e.dump();
  ASSERT_TRUE(e["logprob"].is_number()) << e.dump();
  EXPECT_LE(e["logprob"].get<double>(), 1e-6);
  EXPECT_EQ(Bytes(e), e["token"].get<std::string>());  // stories260K's pieces are ASCII
  ASSERT_EQ(e["top_logprobs"].size(), top) << e.dump();
  double mass = 0, prev = 0;
  for (size_t k = 0; k < top; k++) {
    const Json& a = e["top_logprobs"][k];
    const double lp = a["logprob"].get<double>();
    if (k > 0) {
      EXPECT_LE(lp, prev + 1e-7) << e.dump();
    }
    EXPECT_EQ(Bytes(a), a["token"].get<std::string>());
    EXPECT_FALSE(a.contains("top_logprobs"));
    prev = lp;
    mass += std::exp(lp);
  }
  EXPECT_LE(mass, 1.0 + 1e-5);
  if (top > 0) {
    EXPECT_LE(e["logprob"].get<double>(), e["top_logprobs"][0]["logprob"].get<double>() + 1e-6);
  }
}

// Two runs' entries agree: the same tokens, logprobs within float noise (a turn served from cached
// KV computes the same positions in another order).
void ExpectSameEntries(const Json& a, const Json& b) {
  ASSERT_EQ(a.size(), b.size()) << a.dump() << "\n" << b.dump();
  for (size_t i = 0; i < a.size(); i++) {
    EXPECT_EQ(a[i]["token"], b[i]["token"]) << i;
    EXPECT_EQ(a[i]["bytes"], b[i]["bytes"]) << i;
    EXPECT_NEAR(a[i]["logprob"].get<double>(), b[i]["logprob"].get<double>(), 1e-4) << i;
    ASSERT_EQ(a[i].contains("top_logprobs"), b[i].contains("top_logprobs")) << i;
    if (a[i].contains("top_logprobs")) ExpectSameEntries(a[i]["top_logprobs"], b[i]["top_logprobs"]);
  }
}

class Logprobs : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = new ServerProcess({"--precision", "f32", "--kv-dtype", "f32"});
    ASSERT_GT(server_->port(), 0) << server_->log();
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  Json Post(const std::string& path, const Json& body, int expect = 200) {
    return PostJson(server_->port(), path, body, expect);
  }
  static ServerProcess* server_;
};
ServerProcess* Logprobs::server_ = nullptr;

Json Chat(int max_tokens) {
  return {{"messages", Json::array({{{"role", "user"}, {"content", "Once upon a time"}}})},
          {"max_tokens", max_tokens}, {"temperature", 0}, {"logprobs", true}, {"top_logprobs", 3}};
}

TEST_F(Logprobs, CompletionsEqualTheModelsLogSoftmax) {
  // The model's greedy continuation with every position's log-softmax, computed here.
  auto file = ModelFile::Open(ModelPath());
  ASSERT_TRUE(file.ok());
  auto model = Model::Create(*file, ModelOptions{kernels::Precision::kF32});
  ASSERT_TRUE(model.ok());
  auto tok = Tokenizer::Create(file->vocab());
  ASSERT_TRUE(tok.ok());
  const std::string prompt = "Once upon a time, there was";
  std::vector<int32_t> seq = (*tok)->Encode(prompt, /*add_special=*/true);
  const int n = 8;
  std::vector<int32_t> ids;
  std::vector<std::vector<float>> ref;  // [n][vocab] log-softmax
  for (int i = 0; i < n; i++) {
    auto logits = PromptLogits(**model, seq, /*all_positions=*/false, DType::F32);
    ASSERT_TRUE(logits.ok());
    ref.push_back(LogSoftmax(*logits));
    int32_t best = -1;  // ignore_eos: the best token that does not end generation
    for (int32_t id = 0; id < static_cast<int32_t>(logits->size()); id++) {
      if (!(*tok)->IsEog(id) && (best < 0 || (*logits)[id] > (*logits)[best])) best = id;
    }
    ids.push_back(best);
    seq.push_back(best);
  }

  Json j = Post("/v1/completions", {{"prompt", prompt}, {"max_tokens", n}, {"temperature", 0}, {"ignore_eos", true},
                                    {"logprobs", 5}});
  ASSERT_TRUE(j.is_object());
  EXPECT_TRUE(j["system_fingerprint"].get<std::string>().starts_with("fp_"));
  const Json& lp = j["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), size_t(n)) << j.dump();
  std::string text;
  for (int i = 0; i < n; i++) {
    EXPECT_EQ(lp["tokens"][i], (*tok)->TokenToPiece(ids[i], true)) << i;
    EXPECT_NEAR(lp["token_logprobs"][i].get<double>(), ref[i][ids[i]], 1e-4) << i;
    EXPECT_EQ(lp["text_offset"][i].get<size_t>(), text.size());
    text += lp["tokens"][i].get<std::string>();
    ASSERT_EQ(lp["top_logprobs"][i].size(), 5u);
    double mass = 0;
    for (const auto& [piece, value] : lp["top_logprobs"][i].items()) {
      mass += std::exp(value.get<double>());
      // Each alternative's logprob is the model's for a token with that piece.
      bool found = false;
      for (int32_t t = 0; t < static_cast<int32_t>(ref[i].size()) && !found; t++) {
        found = (*tok)->TokenToPiece(t, true) == piece && std::abs(ref[i][t] - value.get<double>()) < 1e-4;
      }
      EXPECT_TRUE(found) << i << " " << piece;
    }
    EXPECT_LE(mass, 1.0 + 1e-5);
  }
  EXPECT_EQ(text, j["choices"][0]["text"]);
  // Without logprobs: null.
  Json plain = Post("/v1/completions", {{"prompt", prompt}, {"max_tokens", 2}});
  EXPECT_TRUE(plain["choices"][0]["logprobs"].is_null());
}

TEST_F(Logprobs, ChatReportsEveryTokenStreamedOrNot) {
  Json j = Post("/v1/chat/completions", Chat(12));
  ASSERT_TRUE(j.is_object());
  const Json& content = j["choices"][0]["logprobs"]["content"];
  EXPECT_TRUE(j["choices"][0]["logprobs"]["refusal"].is_null());
  ASSERT_FALSE(content.empty());
  std::string text;
  for (const Json& e : content) {
    CheckEntry(e, 3);
    // Greedy: the chosen token is the most likely one.
    EXPECT_EQ(e["token"], e["top_logprobs"][0]["token"]);
    EXPECT_NEAR(e["logprob"].get<double>(), e["top_logprobs"][0]["logprob"].get<double>(), 1e-6);
    text += e["token"].get<std::string>();
  }
  EXPECT_EQ(text, j["choices"][0]["message"]["content"]);
  const std::string fp = j["system_fingerprint"];
  EXPECT_TRUE(fp.starts_with("fp_")) << fp;

  // Streamed: each chunk carries the entries of its text; together the same as above.
  Json body = Chat(12);
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  Json events = Post("/v1/chat/completions", body);
  Json streamed = Json::array();
  for (const Json& ev : events) {
    EXPECT_EQ(ev["system_fingerprint"], fp);
    if (ev["choices"].empty()) continue;  // the usage chunk
    const Json& l = ev["choices"][0]["logprobs"];
    if (l.is_null()) continue;
    for (const Json& e : l["content"]) streamed.push_back(e);
  }
  ExpectSameEntries(streamed, content);

  // Without logprobs: null; top_logprobs without logprobs, or past 20, is refused.
  Json plain = Post("/v1/chat/completions", {{"messages", body["messages"]}, {"max_tokens", 2}});
  EXPECT_TRUE(plain["choices"][0]["logprobs"].is_null());
  Json bad = Post("/v1/chat/completions", {{"messages", body["messages"]}, {"top_logprobs", 2}}, 400);
  EXPECT_EQ(bad["error"]["param"], "top_logprobs");
  bad = Post("/v1/chat/completions", {{"messages", body["messages"]}, {"logprobs", true}, {"top_logprobs", 21}}, 400);
  EXPECT_EQ(bad["error"]["param"], "top_logprobs");
}

TEST_F(Logprobs, AreOfTheModelsDistributionWhateverTheSampling) {
  // The first generated position has the same context in every run: its alternatives' logprobs are
  // the model's, whatever the temperature, top_k, penalties or logit_bias that drew the token.
  Json greedy = Post("/v1/chat/completions", Chat(1));
  const Json& best = greedy["choices"][0]["logprobs"]["content"][0]["top_logprobs"];
  Json body = Chat(1);
  body["temperature"] = 1.7;
  body["top_k"] = 3;
  for (int seed = 1; seed <= 3; seed++) {
    body["seed"] = seed;
    Json hot = Post("/v1/chat/completions", body);
    const Json& e = hot["choices"][0]["logprobs"]["content"][0];
    CheckEntry(e, 3);
    ExpectSameEntries(e["top_logprobs"], best);
    // top_k 3 drew one of the three best; its logprob is that alternative's (not rescaled by T).
    bool among = false;
    for (const Json& a : e["top_logprobs"]) {
      if (a["token"] == e["token"]) among = std::abs(a["logprob"].get<double>() - e["logprob"].get<double>()) < 1e-4;
    }
    EXPECT_TRUE(among) << e.dump();
  }
  // Penalties and a bias that bans the best token change what is drawn, not the reported logprobs.
  auto file = ModelFile::Open(ModelPath());
  ASSERT_TRUE(file.ok());
  auto tok = Tokenizer::Create(file->vocab());
  ASSERT_TRUE(tok.ok());
  std::vector<int32_t> ids;  // the tokens whose piece is the best one's (a byte token may share it)
  for (int32_t id = 0; id < (*tok)->n_vocab(); id++) {
    if ((*tok)->TokenToPiece(id, true) == best[0]["token"].get<std::string>()) ids.push_back(id);
  }
  ASSERT_FALSE(ids.empty());
  Json biased = Chat(1);
  biased["presence_penalty"] = 2;
  biased["logit_bias"] = Json::object();
  for (int32_t id : ids) biased["logit_bias"][std::to_string(id)] = -100;
  Json j = Post("/v1/chat/completions", biased);
  const Json& e = j["choices"][0]["logprobs"]["content"][0];
  EXPECT_NE(e["token"], best[0]["token"]);
  ExpectSameEntries(e["top_logprobs"], best);
}

// best_of ranks a candidate that ended by what choosing to end cost: its end-of-generation token's
// logprob (the model's raw distribution; that token has no entry) counts with its tokens'. The
// candidates here are one token each, and some end at once: a logit_bias makes the end as likely
// to be drawn as the best token, without moving the raw logprobs that rank. An empty candidate is
// charged log p(end | prompt), computed here; before, it summed nothing (0) and ranked first.
TEST_F(Logprobs, CompletionsBestOfChargesTheEndOfGeneration) {
  auto file = ModelFile::Open(ModelPath());
  ASSERT_TRUE(file.ok());
  auto model = Model::Create(*file, ModelOptions{kernels::Precision::kF32});
  ASSERT_TRUE(model.ok());
  auto tok = Tokenizer::Create(file->vocab());
  ASSERT_TRUE(tok.ok());
  const std::string prompt = "Once upon a time";
  auto logits = PromptLogits(**model, (*tok)->Encode(prompt, /*add_special=*/true), /*all_positions=*/false, DType::F32);
  ASSERT_TRUE(logits.ok());
  const std::vector<float> ref = LogSoftmax(*logits);
  const int32_t eos = (*tok)->eos();
  ASSERT_TRUE(eos >= 0 && (*tok)->IsEog(eos));
  const int32_t top = static_cast<int32_t>(std::max_element(logits->begin(), logits->end()) - logits->begin());
  const double bias = std::clamp(double((*logits)[top] - (*logits)[eos]), -100.0, 100.0);

  constexpr int kCandidates = 8;
  Json body = {{"prompt", prompt}, {"max_tokens", 1}, {"temperature", 1}, {"logprobs", 0}, {"n", kCandidates},
               {"logit_bias", {{std::to_string(eos), bias}}}};
  // A seed whose candidates (n = 8 draws what best_of = 8 does) both end at once and do not.
  Json all;
  for (int seed = 1; seed <= 20 && all.is_null(); seed++) {
    body["seed"] = seed;
    Json j = Post("/v1/completions", body);
    ASSERT_EQ(j["choices"].size(), size_t(kCandidates)) << j.dump();
    int ended = 0;
    for (const Json& c : j["choices"]) ended += c["finish_reason"] == "stop";
    if (ended > 0 && ended < kCandidates) all = j;
  }
  ASSERT_FALSE(all.is_null()) << "no seed drew both kinds of candidates";
  std::vector<std::pair<double, int>> score;  // (what ranks, candidate)
  double best_token = -INFINITY;
  for (int i = 0; i < kCandidates; i++) {
    const Json& c = all["choices"][i];
    if (c["finish_reason"] == "stop") {
      EXPECT_EQ(c["text"], "");
      EXPECT_TRUE(c["logprobs"]["token_logprobs"].empty());
      score.emplace_back(ref[eos], i);
    } else {
      score.emplace_back(c["logprobs"]["token_logprobs"][0].get<double>(), i);
      best_token = std::max(best_token, score.back().first);
    }
  }
  ASSERT_LT(ref[eos], best_token - 1e-3);  // the end costs more than the likeliest token drawn
  std::stable_sort(score.begin(), score.end(), [](const auto& a, const auto& b) { return a.first > b.first; });

  body["n"] = 2;
  body["best_of"] = kCandidates;
  Json best = Post("/v1/completions", body);
  ASSERT_EQ(best["choices"].size(), 2u) << best.dump();
  EXPECT_NE(best["choices"][0]["finish_reason"], "stop") << best.dump();
  for (int k = 0; k < 2; k++) {
    const Json& want = all["choices"][score[k].second];
    EXPECT_EQ(best["choices"][k]["text"], want["text"]) << k << " " << all.dump();
    EXPECT_EQ(best["choices"][k]["finish_reason"], want["finish_reason"]) << k;
  }
}

TEST_F(Logprobs, ResponsesReportThemOnTheOutputText) {
  Json body = {{"input", "Lily and Tom"}, {"max_output_tokens", 10}, {"temperature", 0}, {"store", false},
               {"include", {"message.output_text.logprobs"}}, {"top_logprobs", 2}};
  Json j = Post("/v1/responses", body);
  ASSERT_TRUE(j.is_object());
  const Json& part = j["output"][0]["content"][0];
  ASSERT_TRUE(part["logprobs"].is_array()) << j.dump();
  std::string text;
  for (const Json& e : part["logprobs"]) {
    CheckEntry(e, 2);
    text += e["token"].get<std::string>();
  }
  EXPECT_EQ(text, part["text"]);
  body["stream"] = true;
  Json deltas = Json::array();
  Json done;
  for (const Json& ev : Post("/v1/responses", body)) {
    if (ev["type"] == "response.output_text.delta") {
      for (const Json& e : ev["logprobs"]) deltas.push_back(e);
    }
    if (ev["type"] == "response.output_text.done") done = ev["logprobs"];
  }
  ExpectSameEntries(deltas, part["logprobs"]);
  ExpectSameEntries(done, part["logprobs"]);
  // Not asked: no logprobs member on the part.
  Json plain = Post("/v1/responses", {{"input", "Lily"}, {"max_output_tokens", 2}, {"store", false}});
  EXPECT_FALSE(plain["output"][0]["content"][0].contains("logprobs"));
}

}  // namespace
}  // namespace mnemo::testing
