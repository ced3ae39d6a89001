// The decoder-only transformer forward pass on the CPU, for every architecture ModelConfig
// describes (llama, qwen2, qwen3, phi3, ...): a batch of sequences with ragged queries at arbitrary
// positions, KV read and written through block tables in a paged pool. Architecture differences
// are resolved once in Create (which weights exist, which rope, which activation); Forward runs the
// same named steps for all of them.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "base/status.h"
#include "format/model_file.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/ops.h"
#include "kv/kv_storage.h"
#include "model/batch.h"

namespace mnemo {

struct ModelOptions {
  kernels::Precision precision = kernels::Precision::kBF16;  // kF32 for the exact path
  // Positions per sequence the model serves (0: the file's context_length, as llama.cpp's -c 0).
  // Chooses phi3-style long rope factors when it exceeds the rope original context, as llama.cpp
  // does from its n_ctx_seq (which it pads up to a multiple of 256; every Phi-3 original context is
  // one, so the choice is the same).
  int n_ctx = 0;
};

// Several matrices applied to the same input whose outputs are concatenated per row:
// y: [n, sum out]. One Linear when the parts share a dtype (stacked once at load), else one per
// part (quantized files put attn_v / some ffn tensors at a higher type than their siblings).
class ConcatLinear {
 public:
  static ConcatLinear Create(std::initializer_list<const TensorRef*> parts, int in, kernels::Precision p);
  // x: [n, in] -> y: [n, out()]. scratch is grown as needed (used only with several parts).
  void Forward(const float* x, int n, float* y, std::vector<float>& scratch) const;
  int out() const { return out_; }

 private:
  std::vector<kernels::Linear> parts_;
  int out_ = 0;
};

// Optional outputs of one Forward step that read the model's internals (selective context's
// hidden-state and attention relevance, context/probe.h). Forward given none does exactly what it
// did without this struct: every tap is one branch on a null pointer per layer.
struct ForwardTaps {
  // Residual stream after block `hidden_layer` (0-based; -1: not wanted), every batch row:
  // hidden [n_tokens, dim]. Block n_layers - 1 gives the input of the final norm.
  int hidden_layer = -1;
  std::vector<float> hidden;
  // Attention mass of the query rows [attn_row_begin, n_q) of batch sequence `attn_seq` (-1: not
  // wanted) onto each key position: attn_mass[p] = sum over those rows and the query heads of the
  // softmax probability on p, divided by n_heads and by the number of layers in
  // [attn_layer_begin, attn_layer_end) (end -1: n_layers). Each row then contributes 1 in total:
  // sum_p attn_mass[p] = n_q - attn_row_begin. attn_mass: [n_ctx of that sequence]. Costs a second
  // pass over the visible keys per wanted row and head (q . k, the fused kernel never keeps its
  // probabilities), so O(rows * n_heads * n_ctx * head_dim) per layer.
  int attn_seq = -1;
  int attn_row_begin = 0;
  int attn_layer_begin = 0;
  int attn_layer_end = -1;
  std::vector<float> attn_mass;
  // Stop after block `stop_after_layer` (-1: run every block): later blocks and the head are
  // skipped, `logits` is left empty and later layers' KV is not written. For a probe that needs
  // only the first blocks (the cost falls to (stop_after_layer + 1) / n_layers of a pass).
  int stop_after_layer = -1;
};

class Model {
 public:
  // Prepares the weights of `file` (which must outlive the model: embeddings stay mmapped).
  static Result<std::unique_ptr<Model>> Create(const ModelFile& file, const ModelOptions& opts);

  const ModelConfig& config() const { return config_; }
  // The KV shape this model needs for a pool with element type `dtype`.
  KvShape kv_shape(DType dtype) const;

  // Runs one step: embeds batch.tokens, writes their K/V into `kv` at their positions through each
  // sequence's block table, and returns logits [batch.n_logit_rows(), vocab_size] in `logits`.
  // Every block a sequence's table names for positions < n_ctx must hold valid KV for positions not
  // written by this step. before_layer(l), if set, is called before layer l touches the KV pool
  // (the engine waits there for that layer's swap-ins). Not thread-safe (one engine thread); uses
  // NumThreads() threads inside. taps (may be null): extra outputs, see ForwardTaps; checked
  // (MNEMO_CHECK) against the batch.
  void Forward(const Batch& batch, KvStorage& kv, std::vector<float>& logits,
               const std::function<void(int)>& before_layer = {}, ForwardTaps* taps = nullptr);

  // Moves cached keys of layer `layer` by `delta` positions: k: [n_heads, head_dim] as stored
  // (already rotated for position p), rotated in place to position p + delta. Exact for every rope
  // this model runs (angles are linear in the position); see KeysReRotatable.
  void ReRotateKeys(int layer, float* k, int n_heads, int32_t delta) const;
  // False when a layer's rope cannot be moved exactly (callers then recompute instead).
  bool KeysReRotatable() const { return true; }

 private:
  struct Layer {
    std::vector<float> attn_norm;       // [dim]
    std::vector<float> qkv_bias;        // [q_dim + 2 kv_dim], or empty
    std::vector<float> q_norm, k_norm;  // [head_dim] each, or empty
    std::vector<float> attn_post_norm;  // [dim], or empty
    std::vector<float> ffn_norm;        // [dim]
    std::vector<float> ffn_post_norm;   // [dim], or empty
    std::vector<float> rope_factors;    // [rope dims / 2], or empty
    kernels::RopeParams rope;           // freq_factors points into rope_factors
    int sliding_window = 0;             // 0: global
    ConcatLinear wqkv;                  // [q_dim + 2 * kv_dim, dim]: Q, K and V rows
    kernels::Linear wo;                 // [dim, q_dim]
    ConcatLinear w_gate_up;             // [2 * ffn, dim]: gate rows then up rows
    kernels::Linear w_down;             // [dim, ffn]
  };
  struct Scratch {  // reused across steps; sized for the largest batch seen
    std::vector<float> x, h, qkv, q, k, v, att, proj, gate_up, act, sel, concat;
    std::vector<int32_t> logit_rows;
  };

  Model() = default;
  void Embed(const Batch& batch, float* x) const;
  void AttentionBlock(const Layer& layer, int l, const Batch& batch, KvStorage& kv, ForwardTaps* taps);
  // Adds layer l's attention probabilities of taps->attn_seq's wanted rows to taps->attn_mass
  // (q: this step's roped queries [n, n_heads, head_dim]; the step's K already written).
  void AttentionMass(const Layer& layer, const Batch& batch, const kernels::PagedKvLayer& kv, float scale,
                     ForwardTaps& taps) const;
  void FeedForwardBlock(const Layer& layer, int n);
  void Head(const Batch& batch, std::vector<float>& logits);

  ModelConfig config_;
  TensorRef tok_embd_;           // [vocab, dim] (mmapped)
  std::vector<float> out_norm_;  // [dim]
  kernels::Linear output_;       // [vocab, dim]
  std::vector<Layer> layers_;
  Scratch s_;
};

// Older name, kept while callers move over.
using LlamaModel = Model;

}  // namespace mnemo
