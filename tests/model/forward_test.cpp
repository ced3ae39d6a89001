// Properties of the paged forward pass: the logits of a sequence do not depend on how its prompt is
// chunked, where its blocks live, what else shares the batch, or whether a dropped prefix is
// recomputed in the same step as new tokens.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "kernels/cpu/ops.h"
#include "test_util.h"

namespace mnemo::testing {
namespace {

using kernels::Precision;

// A 200-token real stream: the reference greedy story.
std::vector<int32_t> StoryTokens() {
  auto refs = ReadJsonl(SharedPath("reference/stories260K_greedy.jsonl"));
  std::vector<int32_t> t = refs[1]["prompt_token_ids"].get<std::vector<int32_t>>();
  for (int id : refs[1]["generated_token_ids"]) t.push_back(id);
  t.resize(200);
  return t;
}

double MaxDiff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); i++) d = std::max(d, double(std::fabs(a[i] - b[i])));
  return d;
}

// Logits of every position, feeding the stream in chunks of the given sizes (cycled).
std::vector<float> RunChunked(Model& m, DType kv_dtype, const std::vector<int32_t>& tokens,
                              std::vector<int> chunks, bool scattered) {
  KvStorage kv(m.kv_shape(kv_dtype), 16);
  Blocks blocks(16, scattered, 5);
  Seq s;
  std::vector<float> all;
  int from = 0;
  for (size_t c = 0; from < int(tokens.size()); c++) {
    int to = std::min<int>(tokens.size(), from + chunks[c % chunks.size()]);
    auto l = Step(m, kv, blocks, s, tokens, from, to);
    all.insert(all.end(), l.begin(), l.end());
    from = to;
  }
  return all;
}

class ForwardTest : public ::testing::TestWithParam<std::tuple<Precision, DType>> {};

TEST_P(ForwardTest, ChunkingDoesNotChangeLogits) {
  auto [precision, kv_dtype] = GetParam();
  Loaded l = Load("models/stories260K/stories260K.gguf", "", precision);
  auto tokens = StoryTokens();
  const double tol = precision == Precision::kF32 && kv_dtype == DType::F32 ? 1e-4 : 0.15;
  auto whole = RunChunked(*l.model, kv_dtype, tokens, {int(tokens.size())}, false);
  EXPECT_LE(MaxDiff(whole, RunChunked(*l.model, kv_dtype, tokens, {1}, false)), tol);
  EXPECT_LE(MaxDiff(whole, RunChunked(*l.model, kv_dtype, tokens, {5, 1, 37, 64, 3}, false)), tol);
}

TEST_P(ForwardTest, ScatteredBlocksGiveTheSameLogits) {
  auto [precision, kv_dtype] = GetParam();
  Loaded l = Load("models/stories260K/stories260K.gguf", "", precision);
  auto tokens = StoryTokens();
  auto contiguous = RunChunked(*l.model, kv_dtype, tokens, {40, 1}, false);
  auto scattered = RunChunked(*l.model, kv_dtype, tokens, {40, 1}, true);
  EXPECT_EQ(MaxDiff(contiguous, scattered), 0.0);
}

TEST_P(ForwardTest, SharingTheBatchDoesNotChangeLogits) {
  auto [precision, kv_dtype] = GetParam();
  Loaded l = Load("models/stories260K/stories260K.gguf", "", precision);
  const int vocab = l.model->config().vocab_size;
  auto tokens = StoryTokens();
  const double tol = precision == Precision::kF32 ? 1e-4 : 0.15;
  // Alone: prefill 0..99, then 100..119 as one step.
  KvStorage kv(l.model->kv_shape(kv_dtype), 32);
  Blocks blocks(32, true, 9);
  Seq a;
  Step(*l.model, kv, blocks, a, tokens, 0, 100);
  auto alone = Step(*l.model, kv, blocks, a, tokens, 100, 120);
  // Together: a second copy of A (its own blocks) steps 100..119 beside B (prefill of 60 other
  // tokens) and C (one decode token), all in one batch.
  Seq a2, b, c;
  Step(*l.model, kv, blocks, a2, tokens, 0, 100);
  std::vector<int32_t> other(tokens.rbegin(), tokens.rend());
  Step(*l.model, kv, blocks, c, other, 0, 30);
  Batch batch;
  std::vector<int32_t> pos_b(60), pos_a(20), pos_c{30};
  for (int i = 0; i < 60; i++) pos_b[i] = i;
  for (int i = 0; i < 20; i++) pos_a[i] = 100 + i;
  int ib = batch.Add(other.data(), pos_b.data(), 60, false);
  int ia = batch.Add(tokens.data() + 100, pos_a.data(), 20, true);
  int ic = batch.Add(other.data() + 30, pos_c.data(), 1, false);
  b.n_ctx = 60;
  blocks.Grow(b, 60);
  a2.n_ctx = 120;
  blocks.Grow(a2, 120);
  c.n_ctx = 31;
  blocks.Grow(c, 31);
  batch.seqs[ib].block_table = b.table;
  batch.seqs[ib].n_ctx = b.n_ctx;
  batch.seqs[ia].block_table = a2.table;
  batch.seqs[ia].n_ctx = a2.n_ctx;
  batch.seqs[ic].block_table = c.table;
  batch.seqs[ic].n_ctx = c.n_ctx;
  std::vector<float> logits;
  l.model->Forward(batch, kv, logits);
  ASSERT_EQ(logits.size(), size_t(22) * vocab);
  std::vector<float> together(logits.begin() + vocab, logits.begin() + 21 * vocab);
  EXPECT_LE(MaxDiff(alone, together), tol);
}

// A sequence whose leading block was dropped (its KV is garbage) but whose middle block is cached:
// the next step recomputes positions 0..31 together with new tokens 64..79 and must give the
// logits of an uninterrupted run.
TEST_P(ForwardTest, DroppedPrefixIsRecomputedInTheSameStep) {
  auto [precision, kv_dtype] = GetParam();
  Loaded l = Load("models/stories260K/stories260K.gguf", "", precision);
  const int vocab = l.model->config().vocab_size;
  auto tokens = StoryTokens();
  const double tol = precision == Precision::kF32 && kv_dtype == DType::F32 ? 1e-4 : 0.15;
  KvStorage kv(l.model->kv_shape(kv_dtype), 8);
  Blocks blocks(8, false, 0);
  Seq s;
  auto reference = Step(*l.model, kv, blocks, s, tokens, 0, 80);  // blocks 0, 1, 2
  // Drop block 0: fill it with garbage, then recompute 0..31 and 64..79 in one step.
  for (int layer = 0; layer < l.model->config().n_layers; layer++) {
    std::memset(kv.block(layer, s.table[0]), 0x7f, kv.shape().LayerBlockBytes());
  }
  Batch b;
  std::vector<int32_t> toks, pos;
  for (int p = 0; p < 32; p++) toks.push_back(tokens[p]), pos.push_back(p);
  for (int p = 64; p < 80; p++) toks.push_back(tokens[p]), pos.push_back(p);
  int i = b.Add(toks.data(), pos.data(), int(toks.size()), true);
  b.seqs[i].block_table = s.table;
  b.seqs[i].n_ctx = 80;
  std::vector<float> logits;
  l.model->Forward(b, kv, logits);
  double d = 0;
  for (size_t r = 0; r < pos.size(); r++) {
    for (int v = 0; v < vocab; v++) {
      d = std::max(d, double(std::fabs(logits[r * vocab + v] - reference[size_t(pos[r]) * vocab + v])));
    }
  }
  EXPECT_LE(d, tol);
}

INSTANTIATE_TEST_SUITE_P(Paths, ForwardTest,
                         ::testing::Values(std::make_tuple(Precision::kF32, DType::F32),
                                           std::make_tuple(Precision::kBF16, DType::BF16),
                                           std::make_tuple(Precision::kBF16, DType::F16)));

}  // namespace
}  // namespace mnemo::testing

namespace mnemo::testing {
namespace {

// Selective context's reuse mode moves cached keys from position p to p' by rotating them by
// p' - p. In layer 0 a key depends only on its token and position, so a key computed at p and
// re-rotated must equal the key computed at p' (fp32 tolerance).
TEST(Rerotation, KeysRerotatedFromPToPPrimeEqualKeysComputedAtPPrime) {
  Loaded l = Load("models/stories260K/stories260K.gguf", "", kernels::Precision::kF32);
  const ModelConfig& c = l.model->config();
  auto tokens = StoryTokens();
  tokens.resize(40);
  const int shift = 37;
  KvStorage a(l.model->kv_shape(DType::F32), 8), b(l.model->kv_shape(DType::F32), 8);
  Blocks ba(8, false, 0), bb(8, true, 3);
  Seq sa, sb;
  Step(*l.model, a, ba, sa, tokens, 0, 40);
  std::vector<int32_t> shifted(shift, 300);  // filler, then the same tokens at positions shift..
  shifted.insert(shifted.end(), tokens.begin(), tokens.end());
  Step(*l.model, b, bb, sb, shifted, 0, int(shifted.size()));
  const int hd = c.head_dim;
  double worst = 0;
  for (int p = 0; p < 40; p++) {
    const int q = p + shift;
    for (int h = 0; h < c.n_kv_heads; h++) {
      const float* ka = static_cast<const float*>(a.block(0, sa.table[p / 32])) + (size_t(h) * 32 + p % 32) * hd;
      const float* kb = static_cast<const float*>(b.block(0, sb.table[q / 32])) + (size_t(h) * 32 + q % 32) * hd;
      std::vector<float> k(ka, ka + hd);
      int32_t delta = shift;
      kernels::Rope(k.data(), &delta, 1, 1, hd, c.rope_dims, c.rope_theta);
      for (int i = 0; i < hd; i++) worst = std::max(worst, double(std::fabs(k[i] - kb[i])));
    }
  }
  EXPECT_LE(worst, 1e-5);
}

}  // namespace
}  // namespace mnemo::testing
