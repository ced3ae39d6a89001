// Elementwise and row-wise CPU kernels. All buffers are f32 and row-major unless stated.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mnemo::kernels {

// y[i, :] = x[i, :] / sqrt(mean(x[i, :]^2) + eps) * w. x, y: [n, dim]; w: [dim]. y may alias x.
void RmsNorm(const float* x, const float* w, int n, int dim, float eps, float* y);

// Rotary embedding, adjacent pairs (x[2i], x[2i+1]) of each head, as llama2.c and GGUF `llama`:
// angle = pos[t] * theta^(-2i / rope_dims) for 2i < rope_dims; dims >= rope_dims are untouched.
// x: [n, n_heads, head_dim], rotated in place. pos may be negative (re-rotation by a delta:
// rotating by p then by d equals rotating by p + d).
void Rope(float* x, const int32_t* pos, int n, int n_heads, int head_dim, int rope_dims, float theta);

// out[i] = silu(gate[i]) * up[i]; gate_up: [n, 2 * ffn] holding [gate | up] per row; out: [n, ffn].
void SwiGlu(const float* gate_up, int n, int ffn, float* out);

// y[i] += x[i]
void AddInPlace(float* y, const float* x, size_t n);

}  // namespace mnemo::kernels
