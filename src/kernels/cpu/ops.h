// Elementwise and row-wise CPU kernels. All buffers are f32 and row-major unless stated.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mnemo::kernels {

// y[i, :] = x[i, :] / sqrt(mean(x[i, :]^2) + eps) * w. x, y: [n, dim]; w: [dim]. y may alias x.
void RmsNorm(const float* x, const float* w, int n, int dim, float eps, float* y);

// Which two dims of a head form rotary pair i.
enum class RopePairs {
  kAdjacent,  // (2i, 2i + 1): llama2.c, GGUF `llama` (ggml's "norm" mode)
  kNeox,      // (i, i + dims / 2): qwen2/3, phi3, gemma (ggml's "neox" mode)
};

// One rotary embedding. Pair i (0 <= i < dims / 2) of a token at position p is rotated by
//   angle = p * freq_scale * theta^(-2i / dims) / freq_factors[i]
// and then multiplied by attn_factor; dims >= `dims` are untouched. The angle is linear in p:
// rotating by p then by d (attn_factor 1) equals rotating by p + d.
struct RopeParams {
  RopePairs pairs = RopePairs::kAdjacent;
  int dims = 0;                          // rotated dims per head (even, <= head_dim)
  float theta = 10000.f;                 // base frequency
  float freq_scale = 1.f;                // linear position scaling
  float attn_factor = 1.f;               // multiplier of the rotated values
  const float* freq_factors = nullptr;   // [dims / 2] frequency divisors, or nullptr (all 1)
};

// Rotates x: [n, n_heads, head_dim] in place, token t at pos[t]. pos may be negative (re-rotation
// by a delta). Cost: one cos/sin per (token, pair), shared by the heads.
void Rope(float* x, const int32_t* pos, int n, int n_heads, int head_dim, const RopeParams& p);

// Adjacent pairs with plain frequencies (the llama2.c case).
void Rope(float* x, const int32_t* pos, int n, int n_heads, int head_dim, int rope_dims, float theta);

// x[i, :] += b; x: [n, dim], b: [dim].
void AddBias(float* x, const float* b, int n, int dim);

// out[i] = silu(gate[i]) * up[i]; gate_up: [n, 2 * ffn] holding [gate | up] per row; out: [n, ffn].
void SwiGlu(const float* gate_up, int n, int ffn, float* out);

// y[i] += x[i]
void AddInPlace(float* y, const float* x, size_t n);

}  // namespace mnemo::kernels
