// Activations beyond SwiGLU (ops.h): the GELU-tanh gated FFN and the tanh soft-cap (Gemma 2/3).
// Portable and AVX-512 paths chosen at run time (dispatch.h), both tested.
#pragma once

#include <cstddef>

namespace mnemo::kernels {

// GELU, tanh approximation (the formula of ggml's ggml_gelu_f32):
// gelu(x) = 0.5 x (1 + tanh(sqrt(2 / pi) x (1 + 0.044715 x^2))).
float GeluTanh(float x);

// out[i] = gelu(gate[i]) * up[i] (GeGLU); gate_up: [n, 2 * ffn] holding [gate | up] per row, as
// SwiGlu; out: [n, ffn]. Computed in f32 (ggml's CPU backend rounds gate and gelu(gate) to f16
// through a table; the difference is ~5e-4 relative per element). Parallel over rows.
void GeluTanhGated(const float* gate_up, int n, int ffn, float* out);

// x[i] = cap * tanh(x[i] / cap) for cap > 0 (attention and final-logit soft-capping). n floats.
void SoftCapInPlace(float* x, size_t n, float cap);

}  // namespace mnemo::kernels
