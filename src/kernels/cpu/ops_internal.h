// Internal to src/kernels/cpu: AVX-512 versions of the ops.h kernels (ops_avx512.cpp; call only
// when KernelFeatures().avx512f) and AVX2 ones (ops_avx2.cpp; only when UseAvx2Kernels).
#pragma once

#include <cstddef>

namespace mnemo::kernels::detail {

void RmsNormAvx512(const float* x, const float* w, int n, int dim, float eps, float* y);
void SwiGluAvx512(const float* gate_up, int n, int ffn, float* out);
void AddInPlaceAvx512(float* y, const float* x, size_t n);
void RmsNormAvx2(const float* x, const float* w, int n, int dim, float eps, float* y);
void SwiGluAvx2(const float* gate_up, int n, int ffn, float* out);
void AddInPlaceAvx2(float* y, const float* x, size_t n);

}  // namespace mnemo::kernels::detail
