#include "model/model.h"

#include <cmath>
#include <cstring>

#include "base/block.h"

#include "kernels/cpu/activation.h"
#include "kernels/cpu/attention.h"

namespace mnemo {
namespace {

std::vector<float> ToF32Vector(const TensorRef& t) {
  if (!t.present()) return {};
  std::vector<float> v(size_t(t.rows) * t.cols);
  ToF32(t.dtype, t.data, v.data(), v.size());
  return v;
}

template <class T>
T* Grow(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

kernels::RopeParams ToKernelRope(const RopeConfig& r) {
  kernels::RopeParams p;
  p.pairs = r.style == RopeStyle::kNeox ? kernels::RopePairs::kNeox : kernels::RopePairs::kAdjacent;
  p.dims = r.dims;
  p.theta = r.theta;
  p.freq_scale = r.freq_scale;
  p.attn_factor = r.attn_factor;
  return p;
}

}  // namespace

// ---- ConcatLinear ----

ConcatLinear ConcatLinear::Create(std::initializer_list<const TensorRef*> parts, int in, kernels::Precision p) {
  ConcatLinear c;
  bool same = true;
  for (const TensorRef* t : parts) {
    same = same && t->dtype == (*parts.begin())->dtype;
    c.out_ += int(t->rows);
  }
  if (same) {
    // Stacked in a temporary; Linear copies it into its own layout.
    std::vector<uint8_t> stacked;
    for (const TensorRef* t : parts) {
      const auto* b = static_cast<const uint8_t*>(t->data);
      stacked.insert(stacked.end(), b, b + t->bytes());
    }
    c.parts_.push_back(kernels::Linear::Create((*parts.begin())->dtype, stacked.data(), c.out_, in, p));
  } else {
    for (const TensorRef* t : parts) c.parts_.push_back(kernels::Linear::Create(t->dtype, t->data, int(t->rows), in, p));
  }
  return c;
}

void ConcatLinear::Forward(const float* x, int n, float* y, std::vector<float>& scratch) const {
  if (parts_.size() == 1) return parts_[0].Forward(x, n, y);
  int col = 0;
  for (const kernels::Linear& part : parts_) {
    const int w = part.out();
    float* tmp = Grow(scratch, size_t(n) * w);  // [n, w]
    part.Forward(x, n, tmp);
    for (int t = 0; t < n; t++) std::memcpy(y + size_t(t) * out_ + col, tmp + size_t(t) * w, sizeof(float) * w);
    col += w;
  }
}

// ---- Model ----

Result<std::unique_ptr<Model>> Model::Create(const ModelFile& file, const ModelOptions& opts) {
  std::unique_ptr<Model> m(new Model());
  m->config_ = file.config();
  const ModelConfig& c = m->config_;
  const ModelWeights& w = file.weights();
  const int orig_ctx = c.rope_orig_context > 0 ? c.rope_orig_context : c.context_length;
  const int n_ctx = opts.n_ctx > 0 ? opts.n_ctx : c.context_length;
  const bool long_rope = !c.rope_factors_long.empty() && n_ctx > orig_ctx;
  m->tok_embd_ = w.tok_embd;
  m->out_norm_ = ToF32Vector(w.output_norm);
  m->output_ = kernels::Linear::Create(w.output.dtype, w.output.data, c.vocab_size, c.dim, opts.precision);
  for (int l = 0; l < c.n_layers; l++) {
    const LayerWeights& lw = w.layers[l];
    const LayerConfig& lc = c.layers[l];
    Layer L;
    L.attn_norm = ToF32Vector(lw.attn_norm);
    L.ffn_norm = ToF32Vector(lw.ffn_norm);
    L.attn_post_norm = ToF32Vector(lw.attn_post_norm);
    L.ffn_post_norm = ToF32Vector(lw.ffn_post_norm);
    L.q_norm = ToF32Vector(lw.q_norm);
    L.k_norm = ToF32Vector(lw.k_norm);
    if (lw.bq.present()) {
      L.qkv_bias = ToF32Vector(lw.bq);
      for (const TensorRef* b : {&lw.bk, &lw.bv}) {
        std::vector<float> v = ToF32Vector(*b);
        L.qkv_bias.insert(L.qkv_bias.end(), v.begin(), v.end());
      }
    }
    L.rope = ToKernelRope(lc.rope);
    L.rope_factors = long_rope ? c.rope_factors_long : lc.rope.freq_factors;
    L.sliding_window = lc.sliding_window;
    if (lw.wqkv.present()) {
      L.wqkv = ConcatLinear::Create({&lw.wqkv}, c.dim, opts.precision);
    } else {
      L.wqkv = ConcatLinear::Create({&lw.wq, &lw.wk, &lw.wv}, c.dim, opts.precision);
    }
    L.wo = kernels::Linear::Create(lw.wo.dtype, lw.wo.data, c.dim, c.q_dim(), opts.precision);
    if (lw.gate.present()) {
      L.w_gate_up = ConcatLinear::Create({&lw.gate, &lw.up}, c.dim, opts.precision);
    } else {
      L.w_gate_up = ConcatLinear::Create({&lw.up}, c.dim, opts.precision);
    }
    L.w_down = kernels::Linear::Create(lw.down.dtype, lw.down.data, c.dim, c.ffn_dim, opts.precision);
    m->layers_.push_back(std::move(L));
  }
  for (Layer& L : m->layers_) L.rope.freq_factors = L.rope_factors.empty() ? nullptr : L.rope_factors.data();
  return m;
}

KvShape Model::kv_shape(DType dtype) const {
  return KvShape{config_.n_layers, config_.n_kv_heads, config_.head_dim, dtype};
}

void Model::ReRotateKeys(int layer, float* k, int n_heads, int32_t delta) const {
  kernels::RopeParams p = layers_[layer].rope;
  p.attn_factor = 1.f;  // the stored key already carries it once
  kernels::Rope(k, &delta, 1, n_heads, config_.head_dim, p);
}

void Model::Embed(const Batch& batch, float* x) const {
  const int dim = config_.dim;
  const size_t row_bytes = DTypeBytes(tok_embd_.dtype, dim);
  for (int t = 0; t < batch.n_tokens(); t++) {
    const auto* row = static_cast<const uint8_t*>(tok_embd_.data) + row_bytes * batch.tokens[t];
    ToF32(tok_embd_.dtype, row, x + size_t(t) * dim, dim);
  }
  if (config_.embed_scale != 1.f) {
    for (size_t i = 0; i < size_t(batch.n_tokens()) * dim; i++) x[i] *= config_.embed_scale;
  }
}

void Model::AttentionBlock(const Layer& L, int l, const Batch& batch, KvStorage& kv, ForwardTaps* taps) {
  const ModelConfig& c = config_;
  const int n = batch.n_tokens();
  const int q_dim = c.q_dim(), kv_dim = c.kv_dim(), qkv_dim = q_dim + 2 * kv_dim;
  float* x = s_.x.data();                          // [n, dim] residual stream
  float* h = s_.h.data();                          // [n, dim]
  float* qkv = Grow(s_.qkv, size_t(n) * qkv_dim);  // [n, q_dim + 2 kv_dim]
  float* q = Grow(s_.q, size_t(n) * q_dim);        // [n, n_heads, head_dim]
  float* k = Grow(s_.k, size_t(n) * kv_dim);       // [n, n_kv_heads, head_dim]
  float* v = Grow(s_.v, size_t(n) * kv_dim);       // [n, n_kv_heads, head_dim]
  float* att = Grow(s_.att, size_t(n) * q_dim);    // [n, n_heads, head_dim]
  float* proj = Grow(s_.proj, size_t(n) * c.dim);  // [n, dim]
  const int32_t* pos = batch.positions.data();

  // norm
  kernels::RmsNorm(x, L.attn_norm.data(), n, c.dim, c.rms_eps, h);
  // qkv projection (+ biases), split into heads
  L.wqkv.Forward(h, n, qkv, s_.concat);
  if (!L.qkv_bias.empty()) kernels::AddBias(qkv, L.qkv_bias.data(), n, qkv_dim);
  for (int t = 0; t < n; t++) {
    const float* row = qkv + size_t(t) * qkv_dim;
    std::memcpy(q + size_t(t) * q_dim, row, sizeof(float) * q_dim);
    std::memcpy(k + size_t(t) * kv_dim, row + q_dim, sizeof(float) * kv_dim);
    std::memcpy(v + size_t(t) * kv_dim, row + q_dim + kv_dim, sizeof(float) * kv_dim);
  }
  // per-head Q/K norm
  if (!L.q_norm.empty()) {
    kernels::RmsNorm(q, L.q_norm.data(), n * c.n_heads, c.head_dim, c.rms_eps, q);
    kernels::RmsNorm(k, L.k_norm.data(), n * c.n_kv_heads, c.head_dim, c.rms_eps, k);
  }
  // rope
  kernels::Rope(q, pos, n, c.n_heads, c.head_dim, L.rope);
  kernels::Rope(k, pos, n, c.n_kv_heads, c.head_dim, L.rope);
  // attention over the paged KV (this step's K/V written first)
  kernels::PagedKvLayer layer{kv.layer(l), kv.shape().dtype, c.n_kv_heads, c.head_dim};
  std::vector<kernels::AttnSeq> seqs;
  seqs.reserve(batch.seqs.size());
  for (const BatchSeq& s : batch.seqs) {
    kernels::KvWrite(layer, s.block_table.data(), pos + s.q_begin, s.n_q, k + size_t(s.q_begin) * kv_dim,
                     v + size_t(s.q_begin) * kv_dim);
    seqs.push_back({s.block_table.data(), s.n_ctx, s.q_begin, s.n_q});
  }
  const float scale = c.attn_scale > 0 ? c.attn_scale : 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  kernels::AttnOptions opt;
  opt.window = L.sliding_window;
  opt.softcap = c.attn_softcap;
  kernels::PagedAttention(q, pos, seqs.data(), static_cast<int>(seqs.size()), layer, c.n_heads, scale, att, opt);
  if (taps && taps->attn_seq >= 0 && l >= taps->attn_layer_begin &&
      l < (taps->attn_layer_end < 0 ? c.n_layers : taps->attn_layer_end)) {
    AttentionMass(L, batch, layer, scale, *taps);
  }
  // output projection, post-norm, residual
  L.wo.Forward(att, n, proj);
  if (!L.attn_post_norm.empty()) kernels::RmsNorm(proj, L.attn_post_norm.data(), n, c.dim, c.rms_eps, proj);
  kernels::AddInPlace(x, proj, size_t(n) * c.dim);
}

void Model::AttentionMass(const Layer& L, const Batch& batch, const kernels::PagedKvLayer& kv, float scale,
                          ForwardTaps& taps) const {
  const ModelConfig& c = config_;
  const BatchSeq& s = batch.seqs[taps.attn_seq];
  const int hd = c.head_dim, group = c.n_heads / c.n_kv_heads;
  const int layer_end = taps.attn_layer_end < 0 ? c.n_layers : taps.attn_layer_end;
  const float share = 1.0f / (static_cast<float>(c.n_heads) * (layer_end - taps.attn_layer_begin));
  // This sequence's keys as F32, gathered once through its block table: [n_kv_heads, n_ctx, head_dim].
  std::vector<float> keys(size_t(c.n_kv_heads) * s.n_ctx * hd);
  const size_t elem = DTypeBytes(kv.dtype, 1);
  for (int p = 0; p < s.n_ctx; p++) {
    const int32_t block = s.block_table[p / kBlockTokens];
    for (int g = 0; g < c.n_kv_heads; g++) {
      // Pool layout [n_blocks, 2 (K, V), n_kv_heads, kBlockTokens, head_dim]: K is plane 0.
      const size_t off = ((size_t(block) * 2 * c.n_kv_heads + g) * kBlockTokens + p % kBlockTokens) * hd;
      ToF32(kv.dtype, static_cast<const uint8_t*>(kv.base) + off * elem, keys.data() + (size_t(g) * s.n_ctx + p) * hd, hd);
    }
  }
  std::vector<float> prob(s.n_ctx);  // [n_ctx] one row's scores, then probabilities
  for (int r = taps.attn_row_begin; r < s.n_q; r++) {
    const int row = s.q_begin + r;
    const int p_max = std::min(batch.positions[row], s.n_ctx - 1);
    const int p_min = L.sliding_window > 0 ? std::max(0, batch.positions[row] - L.sliding_window + 1) : 0;
    if (p_max < p_min) continue;
    for (int h = 0; h < c.n_heads; h++) {
      const float* qh = s_.q.data() + (size_t(row) * c.n_heads + h) * hd;
      const float* kh = keys.data() + size_t(h / group) * s.n_ctx * hd;
      float mx = -INFINITY;
      for (int p = p_min; p <= p_max; p++) {
        float dot = 0;
        for (int d = 0; d < hd; d++) dot += qh[d] * kh[size_t(p) * hd + d];
        dot *= scale;
        if (c.attn_softcap > 0) dot = c.attn_softcap * std::tanh(dot / c.attn_softcap);
        prob[p] = dot;
        mx = std::max(mx, dot);
      }
      double sum = 0;
      for (int p = p_min; p <= p_max; p++) sum += prob[p] = std::exp(prob[p] - mx);
      const float w = share / static_cast<float>(sum);
      for (int p = p_min; p <= p_max; p++) taps.attn_mass[p] += prob[p] * w;
    }
  }
}

void Model::FeedForwardBlock(const Layer& L, int n) {
  const ModelConfig& c = config_;
  float* x = s_.x.data();                                        // [n, dim] residual stream
  float* h = s_.h.data();                                        // [n, dim]
  float* gate_up = Grow(s_.gate_up, size_t(n) * 2 * c.ffn_dim);  // [n, 2 ffn]: gate | up
  float* act = Grow(s_.act, size_t(n) * c.ffn_dim);              // [n, ffn]
  float* proj = Grow(s_.proj, size_t(n) * c.dim);                // [n, dim]
  // norm
  kernels::RmsNorm(x, L.ffn_norm.data(), n, c.dim, c.rms_eps, h);
  // gate and up projections, gated activation, down projection
  L.w_gate_up.Forward(h, n, gate_up, s_.concat);
  switch (c.ffn_act) {
    case FfnActivation::kSilu: kernels::SwiGlu(gate_up, n, c.ffn_dim, act); break;
    case FfnActivation::kGeluTanh: kernels::GeluTanhGated(gate_up, n, c.ffn_dim, act); break;
  }
  L.w_down.Forward(act, n, proj);
  // post-norm, residual
  if (!L.ffn_post_norm.empty()) kernels::RmsNorm(proj, L.ffn_post_norm.data(), n, c.dim, c.rms_eps, proj);
  kernels::AddInPlace(x, proj, size_t(n) * c.dim);
}

// Final norm and classifier only for the rows whose logits are wanted.
void Model::Head(const Batch& batch, std::vector<float>& logits) {
  const ModelConfig& c = config_;
  s_.logit_rows.clear();
  for (const BatchSeq& s : batch.seqs) {
    if (!s.all_logits && !s.logits) continue;
    for (int i = s.all_logits ? 0 : s.n_q - 1; i < s.n_q; i++) s_.logit_rows.push_back(s.q_begin + i);
  }
  const int rows = static_cast<int>(s_.logit_rows.size());
  logits.resize(size_t(rows) * c.vocab_size);
  if (rows == 0) return;
  float* sel = Grow(s_.sel, size_t(rows) * c.dim);  // [rows, dim]
  for (int r = 0; r < rows; r++) {
    std::memcpy(sel + size_t(r) * c.dim, s_.x.data() + size_t(s_.logit_rows[r]) * c.dim, sizeof(float) * c.dim);
  }
  kernels::RmsNorm(sel, out_norm_.data(), rows, c.dim, c.rms_eps, sel);
  output_.Forward(sel, rows, logits.data());
  if (c.final_softcap > 0) kernels::SoftCapInPlace(logits.data(), logits.size(), c.final_softcap);
}

void Model::Forward(const Batch& batch, KvStorage& kv, std::vector<float>& logits,
                    const std::function<void(int)>& before_layer, ForwardTaps* taps) {
  const ModelConfig& c = config_;
  const int n = batch.n_tokens();
  MNEMO_CHECK(n > 0);
  MNEMO_CHECK(kv.shape().n_layers == c.n_layers && kv.shape().n_kv_heads == c.n_kv_heads &&
              kv.shape().head_dim == c.head_dim);
  Grow(s_.x, size_t(n) * c.dim);  // [n, dim] residual stream
  Grow(s_.h, size_t(n) * c.dim);  // [n, dim] normed input of a sublayer
  Embed(batch, s_.x.data());
  int last = c.n_layers - 1;
  if (taps) {
    MNEMO_CHECK(taps->hidden_layer < c.n_layers && taps->stop_after_layer < c.n_layers);
    if (taps->stop_after_layer >= 0) last = taps->stop_after_layer;
    MNEMO_CHECK(taps->hidden_layer <= last);
    if (taps->attn_seq >= 0) {
      MNEMO_CHECK(taps->attn_seq < static_cast<int>(batch.seqs.size()));
      const BatchSeq& s = batch.seqs[taps->attn_seq];
      const int end = taps->attn_layer_end < 0 ? c.n_layers : taps->attn_layer_end;
      MNEMO_CHECK(taps->attn_row_begin >= 0 && taps->attn_row_begin <= s.n_q);
      MNEMO_CHECK(taps->attn_layer_begin >= 0 && taps->attn_layer_begin < end && end <= last + 1);
      taps->attn_mass.assign(s.n_ctx, 0.0f);
    }
  }
  for (int l = 0; l <= last; l++) {
    if (before_layer) before_layer(l);
    AttentionBlock(layers_[l], l, batch, kv, taps);
    FeedForwardBlock(layers_[l], n);
    if (taps && taps->hidden_layer == l) taps->hidden.assign(s_.x.begin(), s_.x.begin() + size_t(n) * c.dim);
  }
  if (last < c.n_layers - 1) {
    logits.clear();
    return;
  }
  Head(batch, logits);
}

}  // namespace mnemo
