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

namespace mnemo::testing {
namespace {

// [rows, cols] of a weight as F32.
std::vector<float> F32(const TensorRef& t) {
  std::vector<float> v(size_t(t.rows) * t.cols);
  ToF32(t.dtype, t.data, v.data(), v.size());
  return v;
}

// y = RmsNorm(x) * w for one row of n, in double.
std::vector<double> RmsRow(const float* x, const std::vector<float>& w, int n, float eps) {
  double ss = 0;
  for (int i = 0; i < n; i++) ss += double(x[i]) * x[i];
  const double inv = 1.0 / std::sqrt(ss / n + eps);
  std::vector<double> y(n);
  for (int i = 0; i < n; i++) y[i] = x[i] * inv * w[i];
  return y;
}

// W [out, in] times a row.
std::vector<float> MatRow(const std::vector<float>& w, int out, int in, const std::vector<double>& x) {
  std::vector<float> y(out);
  for (int o = 0; o < out; o++) {
    double s = 0;
    for (int i = 0; i < in; i++) s += double(w[size_t(o) * in + i]) * x[i];
    y[o] = float(s);
  }
  return y;
}

// The taps (ForwardTaps) read what the pass computes without changing it: the logits with taps are
// the logits without, the attention mass of layer 1 equals a scalar recomputation from layer 0's
// tapped output and the file's weights, the last layer's hidden state gives the logits through
// the file's final norm and classifier, and a pass stopped early taps the same hidden state.
TEST(ForwardTaps, HiddenStateAndAttentionMassMatchAScalarRecomputation) {
  Loaded l = Load("models/stories260K/stories260K.gguf", "", kernels::Precision::kF32);
  Model& m = *l.model;
  const ModelConfig& c = m.config();
  auto tokens = StoryTokens();
  const int n = 70, q_from = 60;
  tokens.resize(n);
  auto run = [&](ForwardTaps* taps, std::vector<float>& logits) {
    KvStorage kv(m.kv_shape(DType::F32), 4);
    Batch b;
    std::vector<int32_t> pos(n);
    std::iota(pos.begin(), pos.end(), 0);
    b.Add(tokens.data(), pos.data(), n, true);
    b.seqs[0].block_table = {2, 0, 3};  // scattered on purpose
    b.seqs[0].n_ctx = n;
    m.Forward(b, kv, logits, {}, taps);
  };
  std::vector<float> plain, tapped, last_logits, stopped_logits;
  run(nullptr, plain);
  ForwardTaps t;
  t.hidden_layer = 0;
  t.attn_seq = 0;
  t.attn_row_begin = q_from;
  t.attn_layer_begin = 1;
  t.attn_layer_end = 2;
  run(&t, tapped);
  EXPECT_EQ(plain, tapped);  // bit for bit
  ASSERT_EQ(t.hidden.size(), size_t(n) * c.dim);
  ASSERT_EQ(t.attn_mass.size(), size_t(n));
  double total = 0;
  for (float a : t.attn_mass) total += a;
  EXPECT_NEAR(total, n - q_from, 1e-4);  // each question row contributes 1

  // Layer 1's attention probabilities from layer 0's output, in double.
  const LayerWeights& lw = l.file->weights().layers[1];
  ASSERT_TRUE(lw.wq.present() && lw.wk.present());
  const std::vector<float> wq = F32(lw.wq), wk = F32(lw.wk), norm = F32(lw.attn_norm);
  const int hd = c.head_dim;
  std::vector<std::vector<float>> q(n), k(n);  // [n][q_dim], [n][kv_dim], roped
  for (int p = 0; p < n; p++) {
    auto h = RmsRow(t.hidden.data() + size_t(p) * c.dim, norm, c.dim, c.rms_eps);
    q[p] = MatRow(wq, c.q_dim(), c.dim, h);
    k[p] = MatRow(wk, c.kv_dim(), c.dim, h);
    kernels::Rope(q[p].data(), &p, 1, c.n_heads, hd, c.rope_dims, c.rope_theta);
    kernels::Rope(k[p].data(), &p, 1, c.n_kv_heads, hd, c.rope_dims, c.rope_theta);
  }
  std::vector<double> want(n, 0.0);
  for (int r = q_from; r < n; r++) {
    for (int h = 0; h < c.n_heads; h++) {
      const int g = h / (c.n_heads / c.n_kv_heads);
      std::vector<double> s(r + 1);
      double mx = -1e300, sum = 0;
      for (int p = 0; p <= r; p++) {
        double d = 0;
        for (int i = 0; i < hd; i++) d += double(q[r][h * hd + i]) * k[p][g * hd + i];
        s[p] = d / std::sqrt(double(hd));
        mx = std::max(mx, s[p]);
      }
      for (int p = 0; p <= r; p++) sum += s[p] = std::exp(s[p] - mx);
      for (int p = 0; p <= r; p++) want[p] += s[p] / sum / c.n_heads;
    }
  }
  double worst = 0;
  for (int p = 0; p < n; p++) worst = std::max(worst, std::fabs(want[p] - t.attn_mass[p]));
  EXPECT_LE(worst, 1e-4);

  // The last block's output through the final norm and the classifier gives the logits.
  ForwardTaps last;
  last.hidden_layer = c.n_layers - 1;
  run(&last, last_logits);
  const std::vector<float> out_norm = F32(l.file->weights().output_norm), out = F32(l.file->weights().output);
  double worst_logit = 0;
  for (int p : {0, 33, n - 1}) {
    auto h = RmsRow(last.hidden.data() + size_t(p) * c.dim, out_norm, c.dim, c.rms_eps);
    auto y = MatRow(out, c.vocab_size, c.dim, h);
    for (int v = 0; v < c.vocab_size; v++) {
      worst_logit = std::max(worst_logit, double(std::fabs(y[v] - plain[size_t(p) * c.vocab_size + v])));
    }
  }
  EXPECT_LE(worst_logit, 1e-3);

  // Stopped after block 0: no logits, the same hidden state.
  ForwardTaps stopped;
  stopped.hidden_layer = 0;
  stopped.stop_after_layer = 0;
  run(&stopped, stopped_logits);
  EXPECT_TRUE(stopped_logits.empty());
  EXPECT_EQ(stopped.hidden, t.hidden);
}

}  // namespace
}  // namespace mnemo::testing
