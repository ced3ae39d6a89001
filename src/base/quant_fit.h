// Scale searches shared by the quantisers (quantize.cpp, quantize_k.cpp); internal to base/.
// Each minimises a weighted squared error sum(w[i] * (x[i] - decoded[i])^2) over a sub-block of
// n <= 256 values. Costs: ~20 candidate scales x n multiply-adds.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "base/quant.h"

namespace mnemo {

// K-quants and IQ4_XS, one function per type (quantize_k.cpp): nb blocks from nb * 256 floats.
void QuantizeQ2_K(const float* x, BlockQ2_K* b, size_t nb);
void QuantizeQ3_K(const float* x, BlockQ3_K* b, size_t nb);
void QuantizeQ4_K(const float* x, BlockQ4_K* b, size_t nb);
void QuantizeQ5_K(const float* x, BlockQ5_K* b, size_t nb);
void QuantizeQ6_K(const float* x, BlockQ6_K* b, size_t nb);
void QuantizeIQ4_XS(const float* x, BlockIQ4_XS* b, size_t nb);

namespace quant_fit {

// Round to nearest, ties to even (the default FP mode): deterministic.
inline int Nearest(float v) { return int(std::nearbyint(v)); }
inline int Clamp(int v, int lo, int hi) { return std::min(hi, std::max(lo, v)); }

// x[i] ~= d * L[i], L in [-nmax, nmax - 1]. Returns d (0 for an all-zero block; may be negative).
float FitSymmetric(int n, int nmax, const float* x, const float* w, int8_t* L);
// x[i] ~= d * L[i] + m, L in [0, nmax], d >= 0; nonpos_min keeps m <= 0. Candidate inverse
// scales (rmin + rdelta * k + nmax) / (max - min), k = 0..nstep. Returns d, writes m.
float FitAffine(int n, int nmax, const float* x, const float* w, uint8_t* L, float* m_out, bool nonpos_min,
                float rmin, float rdelta, int nstep);
// Index of the IQ4_NL grid value nearest to v.
int NearestIq4(float v);
// x[i] ~= d * kIq4nlValues[idx[i]]. Returns d (may be negative).
float FitIq4(int n, const float* x, const float* w, uint8_t* idx);

}  // namespace quant_fit
}  // namespace mnemo
