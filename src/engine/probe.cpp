// Engine::Probe: a model pass over a token sequence in private KV, for scorers that read hidden
// states or attention (selective context). Nothing of it touches sessions or the cache.
#include <algorithm>
#include <chrono>
#include <numeric>

#include "base/block.h"
#include "engine/engine.h"

namespace mnemo {

Result<ProbeResult> Engine::Probe(const ProbeRequest& req) {
  const ModelConfig& c = model_.config();
  const int n = static_cast<int>(req.tokens.size());
  if (n < 1 || n > max_context_) {
    return MakeError(StatusCode::kInvalidArgument, "probe: %d tokens (1 to %d)", n, max_context_);
  }
  for (int32_t id : req.tokens) {
    if (id < 0 || id >= c.vocab_size) return MakeError(StatusCode::kInvalidArgument, "probe: token id %d is outside the vocabulary", id);
  }
  if (req.hidden_layer < -1 || req.hidden_layer >= c.n_layers) {
    return MakeError(StatusCode::kInvalidArgument, "probe: hidden layer %d (the model has %d)", req.hidden_layer, c.n_layers);
  }
  for (const auto& [b, e] : req.pool_spans) {
    if (b < 0 || b > e || e > n) return MakeError(StatusCode::kInvalidArgument, "probe: span [%d, %d) outside [0, %d)", b, e, n);
  }
  const int attn_end = req.attn_layer_end < 0 ? c.n_layers : req.attn_layer_end;
  const bool attn = req.attn_from >= 0;
  if (attn && (req.attn_from >= n || req.attn_layer_begin < 0 || req.attn_layer_begin >= attn_end || attn_end > c.n_layers)) {
    return MakeError(StatusCode::kInvalidArgument, "probe: question rows from %d of %d, layers [%d, %d) of %d",
                     req.attn_from, n, req.attn_layer_begin, attn_end, c.n_layers);
  }
  // The pass stops after the last block anything needs.
  const int last = std::max(req.hidden_layer, attn ? attn_end - 1 : -1);
  if (last < 0) return MakeError(StatusCode::kInvalidArgument, "probe: asks for no hidden state and no attention");

  Result<ProbeResult> out = Stopped();
  Call([&] {
    const auto t0 = std::chrono::steady_clock::now();
    const int n_blocks = BlocksFor(n);
    if (!probe_kv_ || probe_kv_->n_blocks() < n_blocks) {
      probe_kv_ = std::make_unique<KvStorage>(model_.kv_shape(DType::F32), n_blocks);
    }
    std::vector<int32_t> table(n_blocks);  // [n_blocks] private blocks in order
    std::iota(table.begin(), table.end(), 0);
    std::vector<int32_t> pos(n);  // [n] positions 0..n-1
    std::iota(pos.begin(), pos.end(), 0);
    ProbeResult r;
    r.layers_run = last + 1;
    std::vector<std::vector<double>> sums(req.pool_spans.size(), std::vector<double>(c.dim, 0.0));  // [spans][dim]
    // Chunks of at most max_batch_tokens rows; the question rows (attention) in one last chunk.
    const int q_begin = attn ? req.attn_from : n;
    std::vector<std::pair<int, int>> chunks;
    for (int b = 0; b < q_begin; b += config_.max_batch_tokens) chunks.push_back({b, std::min(q_begin, b + config_.max_batch_tokens)});
    if (q_begin < n) chunks.push_back({q_begin, n});
    std::vector<float> logits;
    for (const auto& [b, e] : chunks) {
      Batch batch;
      const int s = batch.Add(req.tokens.data() + b, pos.data() + b, e - b, false);
      batch.seqs[s].block_table = table;
      batch.seqs[s].n_ctx = e;
      batch.seqs[s].logits = false;
      ForwardTaps taps;
      taps.stop_after_layer = last;
      taps.hidden_layer = req.hidden_layer;
      if (attn && b == q_begin) {
        taps.attn_seq = s;
        taps.attn_layer_begin = req.attn_layer_begin;
        taps.attn_layer_end = attn_end;
      }
      model_.Forward(batch, *probe_kv_, logits, {}, &taps);
      for (size_t k = 0; k < req.pool_spans.size() && req.hidden_layer >= 0; k++) {
        const int lo = std::max(b, req.pool_spans[k].first), hi = std::min(e, req.pool_spans[k].second);
        for (int row = lo; row < hi; row++) {
          const float* h = taps.hidden.data() + size_t(row - b) * c.dim;  // [dim]
          for (int d = 0; d < c.dim; d++) sums[k][d] += h[d];
        }
      }
      if (taps.attn_seq >= 0) r.attn_mass = std::move(taps.attn_mass);
    }
    for (size_t k = 0; k < req.pool_spans.size() && req.hidden_layer >= 0; k++) {
      const int len = req.pool_spans[k].second - req.pool_spans[k].first;
      std::vector<float> v(c.dim, 0.0f);
      for (int d = 0; d < c.dim && len > 0; d++) v[d] = static_cast<float>(sums[k][d] / len);
      r.pooled.push_back(std::move(v));
    }
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    out = std::move(r);
  });
  return out;
}

}  // namespace mnemo
