// Internal to src/kernels/cpu: y = x W^T through oneDNN matmul primitives, created once per shape
// and kept in a process-wide cache (primitive creation costs ~0.5 ms; execution is thread-safe).
#pragma once

#include <cstdint>

#include "kernels/cpu/gemv.h"

namespace mnemo::kernels::detail {

// Whether oneDNN has a bf16 matmul for this CPU (oneDNN 2.6 needs AVX-512; on an AVX2-only CPU
// creating the primitive throws). Probed once; thread-safe.
bool DnnlBf16Supported();

// w: BA16a64b2a bf16 weights (gemv.h) of shape s; x: [m, s.in_pad] bf16 (zero padded columns);
// y: [m, s.out] f32. m >= 1. Requires DnnlBf16Supported().
void DnnlMatmulBf16(const uint16_t* w, const Bf16Blocked& s, const uint16_t* x, int m, float* y);

// w: row-major [out, in] f32; x: [m, in] f32; y: [m, out] f32.
void DnnlMatmulF32(const float* w, int out, int in, const float* x, int m, float* y);

}  // namespace mnemo::kernels::detail
