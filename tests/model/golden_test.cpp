// End-to-end golden tests against llama2.c's fp32 reference outputs for stories260K.
#include <gtest/gtest.h>

#include <cmath>

#include "test_util.h"

namespace mnemo::testing {
namespace {

struct Source {
  const char* model;
  const char* tokenizer;
};
const Source kGguf{"models/stories260K/stories260K.gguf", ""};
const Source kBin{"models/stories260K/stories260K.bin", "models/stories260K/tok512.bin"};

void CheckLogits(const Source& src) {
  Loaded l = Load(src.model, src.tokenizer, kernels::Precision::kF32);
  const int vocab = l.model->config().vocab_size;
  ASSERT_EQ(vocab, 512);
  for (const auto& ref : ReadJsonl(SharedPath("reference/stories260K_logits.jsonl"))) {
    std::vector<int32_t> ids = ref["input_token_ids"].get<std::vector<int32_t>>();
    KvStorage kv(l.model->kv_shape(DType::F32), 4);
    Blocks blocks(4, false, 0);
    Seq s;
    std::vector<float> logits = Step(*l.model, kv, blocks, s, ids, 0, int(ids.size()));
    double max_diff = 0;
    for (size_t p = 0; p < ids.size(); p++) {
      const auto& row = ref["logits"][p];
      for (int v = 0; v < vocab; v++) {
        float want = static_cast<float>(row[v].get<double>());
        max_diff = std::max(max_diff, double(std::fabs(logits[p * vocab + v] - want)));
      }
    }
    EXPECT_LE(max_diff, 1e-4) << ref["prompt"];
  }
}

void CheckGreedy(const Source& src) {
  Loaded l = Load(src.model, src.tokenizer, kernels::Precision::kF32);
  const int vocab = l.model->config().vocab_size;
  int checked = 0;
  for (const auto& ref : ReadJsonl(SharedPath("reference/stories260K_greedy.jsonl"))) {
    std::vector<int32_t> tokens = ref["prompt_token_ids"].get<std::vector<int32_t>>();
    auto want = ref["generated_token_ids"].get<std::vector<int32_t>>();
    auto margin = ref["top1_top2_margin_f64"].get<std::vector<double>>();
    const int steps = ref["steps"].get<int>();
    KvStorage kv(l.model->kv_shape(DType::F32), steps / kBlockTokens + 1);
    Blocks blocks(steps / kBlockTokens + 1, true, 11);
    Seq s;
    // Prompt in one prefill, then one token per step, as a server would.
    std::vector<float> logits = Step(*l.model, kv, blocks, s, tokens, 0, int(tokens.size()));
    const float* last = logits.data() + (tokens.size() - 1) * vocab;
    for (size_t i = 0; i < want.size(); i++) {
      if (margin[i] < 1e-4) break;  // a near tie: fp32 summation order may flip it
      int got = ArgMax(last, vocab);
      ASSERT_EQ(got, want[i]) << ref["prompt"] << " token " << i;
      checked++;
      if (got == 1 || int(tokens.size()) >= steps) break;
      tokens.push_back(got);
      logits = Step(*l.model, kv, blocks, s, tokens, int(tokens.size()) - 1, int(tokens.size()));
      last = logits.data();
    }
  }
  EXPECT_GT(checked, 1500);
}

TEST(Golden, LogitsFromGguf) { CheckLogits(kGguf); }
TEST(Golden, LogitsFromLlama2cBin) { CheckLogits(kBin); }
TEST(Golden, GreedyFromGguf) { CheckGreedy(kGguf); }
TEST(Golden, GreedyFromLlama2cBin) { CheckGreedy(kBin); }

}  // namespace
}  // namespace mnemo::testing
