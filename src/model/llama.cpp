#include "model/llama.h"

#include <cmath>
#include <cstring>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/ops.h"

namespace mnemo {
namespace {

std::vector<float> ToF32Vector(const TensorRef& t) {
  std::vector<float> v(size_t(t.rows) * t.cols);
  ToF32(t.dtype, t.data, v.data(), v.size());
  return v;
}

// Rows of several same-dtype matrices with the same column count, stacked: [sum rows, cols].
std::vector<uint8_t> StackRows(std::initializer_list<const TensorRef*> parts) {
  std::vector<uint8_t> out;
  for (const TensorRef* t : parts) {
    size_t n = DTypeBytes(t->dtype, size_t(t->rows) * t->cols);
    const auto* p = static_cast<const uint8_t*>(t->data);
    out.insert(out.end(), p, p + n);
  }
  return out;
}

template <class T>
T* Grow(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

}  // namespace

Result<std::unique_ptr<LlamaModel>> LlamaModel::Create(const ModelFile& file, const ModelOptions& opts) {
  std::unique_ptr<LlamaModel> m(new LlamaModel());
  m->config_ = file.config();
  const LlamaConfig& c = m->config_;
  const LlamaWeights& w = file.weights();
  const int q_dim = c.n_heads * c.head_dim, kv_dim = c.n_kv_heads * c.head_dim;
  m->tok_embd_ = w.tok_embd;
  m->out_norm_ = ToF32Vector(w.output_norm);
  m->output_ = kernels::Linear::Create(w.output.dtype, w.output.data, c.vocab_size, c.dim, opts.precision);
  for (int l = 0; l < c.n_layers; l++) {
    const auto& lw = w.layers[l];
    if (lw.wq.dtype != lw.wk.dtype || lw.wq.dtype != lw.wv.dtype || lw.gate.dtype != lw.up.dtype) {
      return MakeError("layer %d: Q/K/V or gate/up weights have different types; not supported", l);
    }
    Layer L;
    L.attn_norm = ToF32Vector(lw.attn_norm);
    L.ffn_norm = ToF32Vector(lw.ffn_norm);
    // Fused matrices are stacked in a temporary; Linear copies them into its own layout.
    auto qkv = StackRows({&lw.wq, &lw.wk, &lw.wv});
    L.wqkv = kernels::Linear::Create(lw.wq.dtype, qkv.data(), q_dim + 2 * kv_dim, c.dim, opts.precision);
    L.wo = kernels::Linear::Create(lw.wo.dtype, lw.wo.data, c.dim, q_dim, opts.precision);
    auto gate_up = StackRows({&lw.gate, &lw.up});
    L.w_gate_up = kernels::Linear::Create(lw.gate.dtype, gate_up.data(), 2 * c.ffn_dim, c.dim, opts.precision);
    L.w_down = kernels::Linear::Create(lw.down.dtype, lw.down.data, c.dim, c.ffn_dim, opts.precision);
    m->layers_.push_back(std::move(L));
  }
  return m;
}

KvShape LlamaModel::kv_shape(DType dtype) const {
  return KvShape{config_.n_layers, config_.n_kv_heads, config_.head_dim, dtype};
}

void LlamaModel::Embed(const Batch& batch, float* x) const {
  const int dim = config_.dim;
  const size_t row_bytes = DTypeBytes(tok_embd_.dtype, dim);
  for (int t = 0; t < batch.n_tokens(); t++) {
    const auto* row = static_cast<const uint8_t*>(tok_embd_.data) + row_bytes * batch.tokens[t];
    ToF32(tok_embd_.dtype, row, x + size_t(t) * dim, dim);
  }
}

void LlamaModel::Attention(const Layer& L, int l, const Batch& batch, KvStorage& kv) {
  const LlamaConfig& c = config_;
  const int n = batch.n_tokens();
  const int q_dim = c.n_heads * c.head_dim, kv_dim = c.n_kv_heads * c.head_dim;
  const int qkv_dim = q_dim + 2 * kv_dim;
  float* h = s_.h.data();      // [n, dim]
  float* qkv = Grow(s_.qkv, size_t(n) * qkv_dim);  // [n, q_dim + 2 kv_dim]
  float* q = Grow(s_.q, size_t(n) * q_dim);        // [n, n_heads, head_dim]
  float* k = Grow(s_.k, size_t(n) * kv_dim);       // [n, n_kv_heads, head_dim]
  float* v = Grow(s_.v, size_t(n) * kv_dim);       // [n, n_kv_heads, head_dim]
  float* att = Grow(s_.att, size_t(n) * q_dim);    // [n, n_heads, head_dim]
  float* proj = Grow(s_.proj, size_t(n) * c.dim);  // [n, dim]

  kernels::RmsNorm(s_.x.data(), L.attn_norm.data(), n, c.dim, c.rms_eps, h);
  L.wqkv.Forward(h, n, qkv);
  for (int t = 0; t < n; t++) {
    const float* row = qkv + size_t(t) * qkv_dim;
    std::memcpy(q + size_t(t) * q_dim, row, sizeof(float) * q_dim);
    std::memcpy(k + size_t(t) * kv_dim, row + q_dim, sizeof(float) * kv_dim);
    std::memcpy(v + size_t(t) * kv_dim, row + q_dim + kv_dim, sizeof(float) * kv_dim);
  }
  const int32_t* pos = batch.positions.data();
  kernels::Rope(q, pos, n, c.n_heads, c.head_dim, c.rope_dims, c.rope_theta);
  kernels::Rope(k, pos, n, c.n_kv_heads, c.head_dim, c.rope_dims, c.rope_theta);

  kernels::PagedKvLayer layer{kv.layer(l), kv.shape().dtype, c.n_kv_heads, c.head_dim};
  std::vector<kernels::AttnSeq> seqs;
  seqs.reserve(batch.seqs.size());
  for (const BatchSeq& s : batch.seqs) {
    kernels::KvWrite(layer, s.block_table.data(), pos + s.q_begin, s.n_q,
                     k + size_t(s.q_begin) * kv_dim, v + size_t(s.q_begin) * kv_dim);
    seqs.push_back({s.block_table.data(), s.n_ctx, s.q_begin, s.n_q});
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  kernels::PagedAttention(q, pos, seqs.data(), static_cast<int>(seqs.size()), layer, c.n_heads, scale, att);
  L.wo.Forward(att, n, proj);
  kernels::AddInPlace(s_.x.data(), proj, size_t(n) * c.dim);
}

void LlamaModel::FeedForward(const Layer& L, int n) {
  const LlamaConfig& c = config_;
  float* h = s_.h.data();                                     // [n, dim]
  float* gate_up = Grow(s_.gate_up, size_t(n) * 2 * c.ffn_dim);  // [n, 2 ffn]
  float* act = Grow(s_.act, size_t(n) * c.ffn_dim);             // [n, ffn]
  float* proj = Grow(s_.proj, size_t(n) * c.dim);               // [n, dim]
  kernels::RmsNorm(s_.x.data(), L.ffn_norm.data(), n, c.dim, c.rms_eps, h);
  L.w_gate_up.Forward(h, n, gate_up);
  kernels::SwiGlu(gate_up, n, c.ffn_dim, act);
  L.w_down.Forward(act, n, proj);
  kernels::AddInPlace(s_.x.data(), proj, size_t(n) * c.dim);
}

void LlamaModel::Forward(const Batch& batch, KvStorage& kv, std::vector<float>& logits,
                         const std::function<void(int)>& before_layer) {
  const LlamaConfig& c = config_;
  const int n = batch.n_tokens();
  MNEMO_CHECK(n > 0);
  MNEMO_CHECK(kv.shape().n_layers == c.n_layers && kv.shape().n_kv_heads == c.n_kv_heads &&
              kv.shape().head_dim == c.head_dim);
  Grow(s_.x, size_t(n) * c.dim);  // [n, dim] residual stream
  Grow(s_.h, size_t(n) * c.dim);  // [n, dim] normed input of a sublayer
  Embed(batch, s_.x.data());
  for (int l = 0; l < c.n_layers; l++) {
    if (before_layer) before_layer(l);
    Attention(layers_[l], l, batch, kv);
    FeedForward(layers_[l], n);
  }
  // Final norm and classifier only for the rows whose logits are wanted.
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
}

}  // namespace mnemo
