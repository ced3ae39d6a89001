// The Llama-family forward pass on the CPU: a batch of sequences with ragged queries at arbitrary
// positions, KV read and written through block tables in a paged pool.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "base/status.h"
#include "format/model_file.h"
#include "kernels/cpu/linear.h"
#include "kv/kv_storage.h"
#include "model/batch.h"

namespace mnemo {

struct ModelOptions {
  kernels::Precision precision = kernels::Precision::kBF16;  // kF32 for the exact path
};

class LlamaModel {
 public:
  // Prepares the weights of `file` (which must outlive the model: embeddings stay mmapped).
  static Result<std::unique_ptr<LlamaModel>> Create(const ModelFile& file, const ModelOptions& opts);

  const LlamaConfig& config() const { return config_; }
  // The KV shape this model needs for a pool with element type `dtype`.
  KvShape kv_shape(DType dtype) const;

  // Runs one step: embeds batch.tokens, writes their K/V into `kv` at their positions through each
  // sequence's block table, and returns logits [batch.n_logit_rows(), vocab_size] in `logits`.
  // Every block a sequence's table names for positions < n_ctx must hold valid KV for positions not
  // written by this step. before_layer(l), if set, is called before layer l touches the KV pool
  // (the engine waits there for that layer's swap-ins). Not thread-safe (one engine thread); uses
  // NumThreads() threads inside.
  void Forward(const Batch& batch, KvStorage& kv, std::vector<float>& logits,
               const std::function<void(int)>& before_layer = {});

 private:
  struct Layer {
    std::vector<float> attn_norm;  // [dim]
    std::vector<float> ffn_norm;   // [dim]
    kernels::Linear wqkv;          // [q_dim + 2 * kv_dim, dim]: Q, K and V rows fused
    kernels::Linear wo;            // [dim, q_dim]
    kernels::Linear w_gate_up;     // [2 * ffn, dim]: gate rows then up rows
    kernels::Linear w_down;        // [dim, ffn]
  };
  struct Scratch {  // reused across steps; sized for the largest batch seen
    std::vector<float> x, h, qkv, q, k, v, att, proj, gate_up, act, sel;
    std::vector<int32_t> logit_rows;
  };

  LlamaModel() = default;
  void Embed(const Batch& batch, float* x) const;
  void Attention(const Layer& layer, int l, const Batch& batch, KvStorage& kv);
  void FeedForward(const Layer& layer, int n);

  LlamaConfig config_;
  TensorRef tok_embd_;           // [vocab, dim] (mmapped)
  std::vector<float> out_norm_;  // [dim]
  kernels::Linear output_;       // [vocab, dim]
  std::vector<Layer> layers_;
  Scratch s_;
};

}  // namespace mnemo
