// Internal to src/kernels/cpu: AVX-512 versions of the activation.h kernels
// (activation_avx512.cpp; call only when KernelFeatures().avx512f) and AVX2 ones
// (activation_avx2.cpp; only when UseAvx2Kernels).
#pragma once

#include <cstddef>

namespace mnemo::kernels::detail {

void GeluTanhGatedAvx512(const float* gate_up, int n, int ffn, float* out);
void SoftCapAvx512(float* x, size_t n, float cap);
void GeluTanhGatedAvx2(const float* gate_up, int n, int ffn, float* out);
void SoftCapAvx2(float* x, size_t n, float cap);

}  // namespace mnemo::kernels::detail
