// The runtime description of a decoder-only transformer: one struct for every supported
// architecture. Architecture differences are feature fields (flags, per-layer values) read once at
// load time; the forward pass tests features, never the architecture name.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "base/status.h"

namespace mnemo {

// GGUF general.architecture values mnemo runs.
enum class Arch { kLlama, kQwen2, kQwen3, kPhi3, kGemma2, kGemma3 };
const char* ArchName(Arch a);                         // the GGUF spelling: "llama", "qwen2", ...
std::optional<Arch> ArchFromName(const std::string& s);

// Which dimensions of a head RoPE rotates together.
enum class RopeStyle {
  kAdjacent,  // pairs (2i, 2i + 1): GGUF `llama` (ggml's "norm" mode), llama2.c
  kNeox,      // pairs (i, i + rope_dims / 2): qwen2, qwen3, phi3, gemma (ggml's "neox" mode)
};
const char* RopeStyleName(RopeStyle s);

// The rotary embedding of one layer. Pair i of a token at position p is rotated by
//   angle = p * freq_scale * theta^(-2i / dims) / freq_factors[i]
// and both its elements are then multiplied by attn_factor. The angle is linear in p, so a cached
// key can be moved by a position delta exactly (rotate by the delta with attn_factor 1).
struct RopeConfig {
  RopeStyle style = RopeStyle::kAdjacent;
  int dims = 0;                      // leading dims of each head that are rotated (even, <= head_dim)
  float theta = 10000.f;             // base frequency
  float freq_scale = 1.f;            // linear position scaling: 1 / rope.scaling.factor
  float attn_factor = 1.f;           // magnitude multiplier of rotated dims (phi3 longrope's mscale)
  std::vector<float> freq_factors;   // [dims / 2] per-pair frequency divisors, or empty (all 1):
                                     // llama3's rope_freqs.weight, phi3's rope_factors_short/long
};

enum class FfnActivation {
  kSilu,      // SwiGLU: silu(gate) * up
  kGeluTanh,  // GeGLU with the tanh approximation of GELU (gemma)
};

// Per-layer values (architectures that interleave layer kinds, e.g. gemma's sliding-window layers).
struct LayerConfig {
  int sliding_window = 0;  // a query at p sees keys at positions > p - sliding_window; 0: all (global)
  RopeConfig rope;         // this layer's rotary embedding
};

struct ModelConfig {
  Arch arch = Arch::kLlama;      // general.architecture (informational: behaviour is in the fields below)
  int dim = 0;                   // embedding width (model dimension)
  int n_layers = 0;              // transformer blocks
  int n_heads = 0;               // query heads
  int n_kv_heads = 0;            // key/value heads (grouped-query attention when < n_heads)
  int head_dim = 0;              // width of one head (q, k and v); need not be dim / n_heads
  int ffn_dim = 0;               // hidden width of the gated feed-forward
  int vocab_size = 0;            // tokens (rows of the embedding and of the output matrix)
  int rope_dims = 0;             // RoPE dims of the global layers (= layers[l].rope.dims)
  float rope_theta = 10000.f;    // RoPE base of the global layers
  float rms_eps = 1e-5f;         // RMSNorm epsilon
  int context_length = 0;        // trained context, in tokens
  bool tied_output = false;      // the output matrix is the token embedding (no separate tensor)

  // Features (defaults: plain Llama).
  RopeStyle rope_style = RopeStyle::kAdjacent;  // pairing of rotated dims, all layers
  bool qkv_bias = false;         // Q, K and V projections have biases (qwen2)
  bool qk_norm = false;          // per-head RMSNorm of Q and K before RoPE (qwen3, gemma3)
  bool post_norms = false;       // RMSNorm of the attention and FFN outputs before each residual add (gemma2/3)
  FfnActivation ffn_act = FfnActivation::kSilu;
  float embed_scale = 1.f;       // token embeddings are multiplied by this (gemma: sqrt(dim))
  float attn_scale = 0.f;        // scale of q.k; 0: 1 / sqrt(head_dim)
  float attn_softcap = 0.f;      // attention logits s -> c * tanh(s / c); 0: none (gemma2)
  float final_softcap = 0.f;     // output logits likewise; 0: none (gemma2)

  // Rotary scaling as the file states it; layers[l].rope is derived from it at load time.
  std::vector<float> rope_factors_long;  // [rope_dims / 2] phi3 longrope factors for contexts past
  int rope_orig_context = 0;             // rope.scaling.original_context_length (0: context_length)

  std::vector<LayerConfig> layers;  // [n_layers]; filled by the loader (FillUniformLayers for the plain case)

  int q_dim() const { return n_heads * head_dim; }    // width of the query projection
  int kv_dim() const { return n_kv_heads * head_dim; } // width of the key (and value) projection
  bool has_sliding_window() const;                     // some layer has a window
};

// Sets every layers[l] to a global layer with rope {rope_style, rope_dims, rope_theta}; keeps any
// freq_factors / freq_scale / attn_factor given in `rope_extra` (its style/dims/theta are ignored).
void FillUniformLayers(ModelConfig& c, const RopeConfig& rope_extra = {});

// Checks the config's consistency (shapes, layer vector, rope dims). Loaders call it.
Status ValidateConfig(const ModelConfig& c);

// Older name, kept while callers move over.
using LlamaConfig = ModelConfig;

}  // namespace mnemo
