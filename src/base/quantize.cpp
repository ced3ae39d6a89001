// Quantisers of ggml's block types (decoders in quant.cpp).
//
// Method (the K-quant scheme as ggml describes it, our own code): each sub-block gets the scale
// (and min) that minimises a weighted squared error over a small set of candidate scales, each
// refitted by least squares; the sub-block scales are then quantised against one f16 super-scale,
// and the values are requantised with the scales actually stored. Weights: plain squared error
// for the legacy types; ggml's emphasis on large magnitudes for the K-quants and IQ4 (w = |x| for
// Q2_K, av + |x| for Q4_K/Q5_K, x^2 for Q3_K/Q6_K/IQ4), which favours the weights that matter most
// to the matmul. Costs: about 20 candidates x block size multiply-adds per block (~100-200 flops
// per element); callers parallelise over rows.
//
// Deterministic: plain scalar float code, rounding with nearbyint (ties to even) and built with
// -ffp-contract=off, so the same input gives the same bytes on every x86-64 machine.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "base/quant.h"
#include "base/quant_fit.h"
#include "base/status.h"

namespace mnemo {
namespace quant_fit {

// Symmetric fit x[i] ~= d * L[i], L in [-nmax, nmax - 1]. Candidate scales map the element of
// largest magnitude to -nmax + 0.1 * k (k = -9..9); d is refitted by weighted least squares for
// each and the best kept, then refined by re-rounding. Returns d (0 for an all-zero block).
float FitSymmetric(int n, int nmax, const float* x, const float* w, int8_t* L) {
  float amax = 0, max = 0;
  for (int i = 0; i < n; i++) {
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      max = x[i];
    }
  }
  std::fill(L, L + n, int8_t(0));
  if (amax < 1e-30f) return 0;
  int8_t tmp[kQKK];
  float best_score = -1, best_d = 0;
  auto eval = [&](float iscale) {
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
      int l = Clamp(Nearest(iscale * x[i]), -nmax, nmax - 1);
      tmp[i] = int8_t(l);
      sumlx += w[i] * x[i] * float(l);
      suml2 += w[i] * float(l * l);
    }
    // Weighted SSE at the fitted d is sum(w x^2) - sumlx^2 / suml2: maximise the second term.
    if (suml2 > 0 && sumlx * sumlx / suml2 > best_score) {
      best_score = sumlx * sumlx / suml2;
      best_d = sumlx / suml2;
      std::memcpy(L, tmp, size_t(n));
    }
  };
  for (int k = -9; k <= 9; k++) eval(-(float(nmax) + 0.1f * float(k)) / max);
  for (int it = 0; it < 2 && best_d != 0; it++) eval(1.0f / best_d);
  return best_d;
}

// Affine fit x[i] ~= d * L[i] + m, L in [0, nmax], d >= 0; with nonpos_min the offset m is kept
// <= 0 (the K-quants store -m as an unsigned 6-bit or 4-bit number). Candidate inverse scales
// (rmin + rdelta * k + nmax) / (max - min), k = 0..nstep; (d, m) refitted by weighted least
// squares for each. Returns d and writes m.
float FitAffine(int n, int nmax, const float* x, const float* w, uint8_t* L, float* m_out, bool nonpos_min,
                float rmin, float rdelta, int nstep) {
  float min = x[0], max = x[0];
  for (int i = 1; i < n; i++) {
    min = std::min(min, x[i]);
    max = std::max(max, x[i]);
  }
  if (nonpos_min && min > 0) min = 0;
  if (max <= min) {
    std::fill(L, L + n, uint8_t(0));
    *m_out = min;
    return 0;
  }
  uint8_t tmp[kQKK];
  float best_err = INFINITY, best_d = 0, best_m = min;
  auto err_of = [&](float d, float m) {
    float e = 0;
    for (int i = 0; i < n; i++) {
      float diff = d * float(tmp[i]) + m - x[i];
      e += w[i] * diff * diff;
    }
    return e;
  };
  auto keep = [&](float d, float m) {
    float e = err_of(d, m);
    if (e < best_err) {
      best_err = e;
      best_d = d;
      best_m = m;
      std::memcpy(L, tmp, size_t(n));
    }
  };
  // The plain min/max mapping first, so that a fit never does worse than it.
  float iscale0 = float(nmax) / (max - min);
  for (int i = 0; i < n; i++) tmp[i] = uint8_t(Clamp(Nearest(iscale0 * (x[i] - min)), 0, nmax));
  keep((max - min) / float(nmax), min);
  for (int k = 0; k <= nstep; k++) {
    float iscale = (rmin + rdelta * float(k) + float(nmax)) / (max - min);
    float sw = 0, swl = 0, swl2 = 0, swx = 0, swlx = 0;
    for (int i = 0; i < n; i++) {
      int l = Clamp(Nearest(iscale * (x[i] - min)), 0, nmax);
      tmp[i] = uint8_t(l);
      sw += w[i];
      swl += w[i] * float(l);
      swl2 += w[i] * float(l * l);
      swx += w[i] * x[i];
      swlx += w[i] * float(l) * x[i];
    }
    float det = sw * swl2 - swl * swl;
    if (!(det > 0)) continue;
    float d = (sw * swlx - swl * swx) / det;
    float m = (swl2 * swx - swl * swlx) / det;
    if (nonpos_min && m > 0) {
      m = 0;
      d = swlx / swl2;
    }
    if (d > 0) keep(d, m);
  }
  *m_out = best_m;
  return best_d;
}

// Index of the IQ4_NL grid value nearest to v (ties to the lower index): the number of
// neighbouring grid pairs (k, k + 1) whose upper value is strictly nearer. Below the pair that
// brackets v every pair counts, above it none, so this equals comparing the bracketing pair alone
// (the same float subtractions, so the same bytes); counted without branches because a binary
// search mispredicts on random data and FitIq4 calls this ~30 times per element (IQ4 quantisation
// took 5x the time of the other types).
int NearestIq4(float v) {
  int k = 0;
  for (int j = 0; j < 15; j++) k += int(v - float(kIq4nlValues[j]) > float(kIq4nlValues[j + 1]) - v);
  return k;
}

// Non-linear fit x[i] ~= d * kIq4nlValues[idx[i]]. Candidates map the element of largest
// magnitude near either end of the grid (-127 or 113) with offsets -7..7, each refitted by least
// squares, the best refined by reassignment. Returns d.
float FitIq4(int n, const float* x, const float* w, uint8_t* idx) {
  float amax = 0, max = 0;
  for (int i = 0; i < n; i++) {
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      max = x[i];
    }
  }
  std::fill(idx, idx + n, uint8_t(8));  // grid value 1: with d = 0 every element decodes to 0
  if (amax < 1e-30f) return 0;
  uint8_t tmp[kQKK];
  float best_score = -1, best_d = 0;
  auto eval = [&](float id) {
    float sumqx = 0, sumq2 = 0;
    for (int i = 0; i < n; i++) {
      int k = NearestIq4(id * x[i]);
      tmp[i] = uint8_t(k);
      float q = float(kIq4nlValues[k]);
      sumqx += w[i] * x[i] * q;
      sumq2 += w[i] * q * q;
    }
    if (sumq2 > 0 && sumqx * sumqx / sumq2 > best_score) {
      best_score = sumqx * sumqx / sumq2;
      best_d = sumqx / sumq2;
      std::memcpy(idx, tmp, size_t(n));
    }
  };
  for (int k = -7; k <= 7; k++) {
    eval((float(kIq4nlValues[0]) + float(k)) / max);
    eval((float(kIq4nlValues[15]) + float(k)) / max);
  }
  for (int it = 0; it < 2 && best_d != 0; it++) eval(1.0f / best_d);
  return best_d;
}

}  // namespace quant_fit

namespace {
using namespace quant_fit;

void SetF16(uint16_t* dst, float v) { *dst = F32ToF16(v); }

// ---- legacy 32-element types ----

// Q8_0 as llama.cpp: d = max|x| / 127, q = round(x / d) (half away from zero).
void QuantizeQ8_0(const float* x, BlockQ8_0* b, size_t nb) {
  for (size_t i = 0; i < nb; i++, x += kQK) {
    float amax = 0;
    for (int j = 0; j < kQK; j++) amax = std::fmax(amax, std::fabs(x[j]));
    float d = amax / 127.0f;
    float id = d != 0 ? 1.0f / d : 0.0f;
    b[i].d = F32ToF16(d);
    for (int j = 0; j < kQK; j++) b[i].q[j] = int8_t(std::lround(x[j] * id));
  }
}

// Symmetric legacy types: fit, store d as f16, requantise with the stored d.
// [kQK] values out in q (offset by nmax, so 0..2*nmax-1).
void LegacySymmetric(const float* x, int nmax, uint16_t* d_out, int* q) {
  static const float kOnes[kQK] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                                   1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
  int8_t L[kQK];
  float d = FitSymmetric(kQK, nmax, x, kOnes, L);
  SetF16(d_out, d);
  float ds = F16ToF32(*d_out);
  float id = ds != 0 ? 1.0f / ds : 0.0f;
  for (int j = 0; j < kQK; j++) q[j] = Clamp(Nearest(x[j] * id), -nmax, nmax - 1) + nmax;
}

void LegacyAffine(const float* x, int nmax, uint16_t* d_out, uint16_t* m_out, int* q) {
  static const float kOnes[kQK] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                                   1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
  uint8_t L[kQK];
  float m;
  float d = FitAffine(kQK, nmax, x, kOnes, L, &m, false, -1.0f, 0.1f, 20);
  SetF16(d_out, d);
  SetF16(m_out, m);
  float ds = F16ToF32(*d_out), ms = F16ToF32(*m_out);
  float id = ds != 0 ? 1.0f / ds : 0.0f;
  for (int j = 0; j < kQK; j++) q[j] = Clamp(Nearest((x[j] - ms) * id), 0, nmax);
}

void PackNibbles(const int* q, uint8_t* qs) {
  for (int j = 0; j < kQK / 2; j++) qs[j] = uint8_t((q[j] & 15) | (q[j + kQK / 2] & 15) << 4);
}

void PackHighBits(const int* q, uint8_t* qh4) {
  uint32_t qh = 0;
  for (int j = 0; j < kQK; j++) qh |= uint32_t((q[j] >> 4) & 1) << j;
  std::memcpy(qh4, &qh, 4);
}

void QuantizeQ4_0(const float* x, BlockQ4_0* b, size_t nb) {
  int q[kQK];
  for (size_t i = 0; i < nb; i++, x += kQK) {
    LegacySymmetric(x, 8, &b[i].d, q);
    PackNibbles(q, b[i].qs);
  }
}

void QuantizeQ4_1(const float* x, BlockQ4_1* b, size_t nb) {
  int q[kQK];
  for (size_t i = 0; i < nb; i++, x += kQK) {
    LegacyAffine(x, 15, &b[i].d, &b[i].m, q);
    PackNibbles(q, b[i].qs);
  }
}

void QuantizeQ5_0(const float* x, BlockQ5_0* b, size_t nb) {
  int q[kQK];
  for (size_t i = 0; i < nb; i++, x += kQK) {
    LegacySymmetric(x, 16, &b[i].d, q);
    PackNibbles(q, b[i].qs);
    PackHighBits(q, b[i].qh);
  }
}

void QuantizeQ5_1(const float* x, BlockQ5_1* b, size_t nb) {
  int q[kQK];
  for (size_t i = 0; i < nb; i++, x += kQK) {
    LegacyAffine(x, 31, &b[i].d, &b[i].m, q);
    PackNibbles(q, b[i].qs);
    PackHighBits(q, b[i].qh);
  }
}

void QuantizeIQ4_NL(const float* x, BlockIQ4_NL* b, size_t nb) {
  float w[kQK];
  uint8_t idx[kQK];
  for (size_t i = 0; i < nb; i++, x += kQK) {
    for (int j = 0; j < kQK; j++) w[j] = x[j] * x[j];
    SetF16(&b[i].d, FitIq4(kQK, x, w, idx));
    float d = F16ToF32(b[i].d);
    float id = d != 0 ? 1.0f / d : 0.0f;
    for (int j = 0; j < kQK; j++) idx[j] = uint8_t(NearestIq4(x[j] * id));
    for (int j = 0; j < kQK / 2; j++) b[i].qs[j] = uint8_t(idx[j] | idx[j + kQK / 2] << 4);
  }
}

}  // namespace

void QuantizeBlocks(DType t, const float* src, void* dst, size_t n) {
  size_t nb = n / size_t(DTypeBlockElems(t));
  switch (t) {
    case DType::Q8_0: return QuantizeQ8_0(src, static_cast<BlockQ8_0*>(dst), nb);
    case DType::Q4_0: return QuantizeQ4_0(src, static_cast<BlockQ4_0*>(dst), nb);
    case DType::Q4_1: return QuantizeQ4_1(src, static_cast<BlockQ4_1*>(dst), nb);
    case DType::Q5_0: return QuantizeQ5_0(src, static_cast<BlockQ5_0*>(dst), nb);
    case DType::Q5_1: return QuantizeQ5_1(src, static_cast<BlockQ5_1*>(dst), nb);
    case DType::Q2_K: return QuantizeQ2_K(src, static_cast<BlockQ2_K*>(dst), nb);
    case DType::Q3_K: return QuantizeQ3_K(src, static_cast<BlockQ3_K*>(dst), nb);
    case DType::Q4_K: return QuantizeQ4_K(src, static_cast<BlockQ4_K*>(dst), nb);
    case DType::Q5_K: return QuantizeQ5_K(src, static_cast<BlockQ5_K*>(dst), nb);
    case DType::Q6_K: return QuantizeQ6_K(src, static_cast<BlockQ6_K*>(dst), nb);
    case DType::IQ4_NL: return QuantizeIQ4_NL(src, static_cast<BlockIQ4_NL*>(dst), nb);
    case DType::IQ4_XS: return QuantizeIQ4_XS(src, static_cast<BlockIQ4_XS*>(dst), nb);
    case DType::F32: case DType::F16: case DType::BF16: break;
  }
  MNEMO_CHECK_MSG(false, std::string("QuantizeBlocks: not a block type: ") + DTypeName(t));
}

}  // namespace mnemo
