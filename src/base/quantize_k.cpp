// Quantisers of the K-quants and IQ4_XS (256-element super-blocks). Each: fit every sub-block
// (quant_fit.h), quantise the sub-block scales (and mins) against f16 super-scales, then
// requantise the values with the scales as stored, so that the decode error is what was fitted.
#include <cmath>
#include <cstring>

#include "base/quant_fit.h"

namespace mnemo {

using namespace quant_fit;

namespace {

// Unsigned sub-block scales s[j] >= 0 to integers 0..qmax against one super-scale
// (max / qmax). Returns the super-scale.
float QuantizeScalesU(const float* s, int n, int qmax, int* q) {
  float max = 0;
  for (int j = 0; j < n; j++) max = std::max(max, s[j]);
  float inv = max > 0 ? float(qmax) / max : 0.0f;
  for (int j = 0; j < n; j++) q[j] = Clamp(Nearest(inv * s[j]), 0, qmax);
  return max / float(qmax);
}

// Signed sub-block scales to integers -qneg..qneg-1: the scale of largest magnitude maps to
// -qneg (one more level on the negative side). Returns the super-scale.
float QuantizeScalesS(const float* s, int n, int qneg, int* q) {
  float amax = 0, max = 0;
  for (int j = 0; j < n; j++) {
    if (std::fabs(s[j]) > amax) {
      amax = std::fabs(s[j]);
      max = s[j];
    }
  }
  if (amax == 0) {
    for (int j = 0; j < n; j++) q[j] = 0;
    return 0;
  }
  float iscale = -float(qneg) / max;
  for (int j = 0; j < n; j++) q[j] = Clamp(Nearest(iscale * s[j]), -qneg, qneg - 1);
  return 1.0f / iscale;
}

// Values of one affine sub-block with stored step dl and offset ml: x = dl * L - ml.
void RequantAffine(const float* x, int n, float dl, float ml, int nmax, uint8_t* L) {
  if (dl == 0) {
    std::memset(L, 0, size_t(n));
    return;
  }
  for (int i = 0; i < n; i++) L[i] = uint8_t(Clamp(Nearest((x[i] + ml) / dl), 0, nmax));
}

// The 2-bit fields of Q2_K / Q3_K: element 128h + 32s + l in bits 2s of byte 32h + l.
void Pack2Bit(const uint8_t* L, uint8_t* qs) {
  std::memset(qs, 0, kQKK / 4);
  for (int e = 0; e < kQKK; e++) qs[32 * (e / 128) + e % 32] |= uint8_t((L[e] & 3) << (2 * ((e % 128) / 32)));
}

// Q4_K / Q5_K scale and min bytes (the inverse of Q4KScaleMin).
void PackScaleMin(const int* sc, const int* m, uint8_t* s) {
  std::memset(s, 0, 12);
  for (int j = 0; j < 8; j++) {
    if (j < 4) {
      s[j] |= uint8_t(sc[j]);
      s[j + 4] |= uint8_t(m[j]);
    } else {
      s[j + 4] = uint8_t((sc[j] & 15) | (m[j] & 15) << 4);
      s[j - 4] |= uint8_t((sc[j] >> 4) << 6);
      s[j] |= uint8_t((m[j] >> 4) << 6);
    }
  }
}

// Q4_K (nmax 15) and Q5_K (nmax 31): 8 sub-blocks of 32, weights av + |x| (av the sub-block's
// RMS). Writes d, dmin, the 12 scale bytes and the levels L[256].
void FitQ45K(const float* x, int nmax, float rmin, int nstep, uint16_t* d, uint16_t* dmin, uint8_t* scales,
             uint8_t* L) {
  float sc[8], mn[8], w[32];
  for (int j = 0; j < 8; j++) {
    const float* xs = x + 32 * j;
    float sum2 = 0;
    for (int l = 0; l < 32; l++) sum2 += xs[l] * xs[l];
    float av = std::sqrt(sum2 / 32);
    for (int l = 0; l < 32; l++) w[l] = av + std::fabs(xs[l]);
    float m;
    sc[j] = FitAffine(32, nmax, xs, w, L + 32 * j, &m, true, rmin, 0.1f, nstep);
    mn[j] = -m;
  }
  int qs[8], qm[8];
  *d = F32ToF16(QuantizeScalesU(sc, 8, 63, qs));
  *dmin = F32ToF16(QuantizeScalesU(mn, 8, 63, qm));
  PackScaleMin(qs, qm, scales);
  float D = F16ToF32(*d), Dmin = F16ToF32(*dmin);
  for (int j = 0; j < 8; j++) {
    uint8_t s, m;
    Q4KScaleMin(j, scales, &s, &m);
    RequantAffine(x + 32 * j, 32, D * float(s), Dmin * float(m), nmax, L + 32 * j);
  }
}

}  // namespace

void QuantizeQ2_K(const float* x, BlockQ2_K* b, size_t nb) {
  for (size_t i = 0; i < nb; i++, x += kQKK) {
    float sc[16], mn[16], w[16];
    uint8_t L[kQKK];
    for (int j = 0; j < 16; j++) {
      for (int l = 0; l < 16; l++) w[l] = std::fabs(x[16 * j + l]);
      float m;
      sc[j] = FitAffine(16, 3, x + 16 * j, w, L + 16 * j, &m, true, -0.5f, 0.1f, 15);
      mn[j] = -m;
    }
    int qs[16], qm[16];
    b[i].d = F32ToF16(QuantizeScalesU(sc, 16, 15, qs));
    b[i].dmin = F32ToF16(QuantizeScalesU(mn, 16, 15, qm));
    float D = F16ToF32(b[i].d), Dmin = F16ToF32(b[i].dmin);
    for (int j = 0; j < 16; j++) {
      b[i].scales[j] = uint8_t(qs[j] | qm[j] << 4);
      RequantAffine(x + 16 * j, 16, D * float(qs[j]), Dmin * float(qm[j]), 3, L + 16 * j);
    }
    Pack2Bit(L, b[i].qs);
  }
}

void QuantizeQ3_K(const float* x, BlockQ3_K* b, size_t nb) {
  for (size_t i = 0; i < nb; i++, x += kQKK) {
    float sc[16], w[16];
    int8_t Ls[16];
    for (int j = 0; j < 16; j++) {
      for (int l = 0; l < 16; l++) w[l] = x[16 * j + l] * x[16 * j + l];
      sc[j] = FitSymmetric(16, 4, x + 16 * j, w, Ls);
    }
    int q[16];
    b[i].d = F32ToF16(QuantizeScalesS(sc, 16, 32, q));
    std::memset(b[i].scales, 0, 12);
    for (int j = 0; j < 16; j++) {
      int v = q[j] + 32;  // 0..63
      b[i].scales[j % 8] |= uint8_t((v & 15) << (4 * (j / 8)));
      b[i].scales[8 + j % 4] |= uint8_t((v >> 4) << (2 * (j / 4)));
    }
    float D = F16ToF32(b[i].d);
    uint8_t L[kQKK];
    std::memset(b[i].hmask, 0, sizeof(b[i].hmask));
    for (int j = 0; j < 16; j++) {
      float dl = D * float(Q3KScale(j, b[i].scales));
      for (int l = 0; l < 16; l++) {
        int e = 16 * j + l;
        int v = dl != 0 ? Clamp(Nearest(x[e] / dl), -4, 3) + 4 : 4;  // 0..7; 4 decodes to 0
        if (v >= 4) {
          b[i].hmask[e % 32] |= uint8_t(1 << (e / 32));
          v -= 4;
        }
        L[e] = uint8_t(v);
      }
    }
    Pack2Bit(L, b[i].qs);
  }
}

void QuantizeQ4_K(const float* x, BlockQ4_K* b, size_t nb) {
  for (size_t i = 0; i < nb; i++, x += kQKK) {
    uint8_t L[kQKK];
    FitQ45K(x, 15, -1.0f, 20, &b[i].d, &b[i].dmin, b[i].scales, L);
    for (int c = 0; c < 4; c++)
      for (int l = 0; l < 32; l++) b[i].qs[32 * c + l] = uint8_t(L[64 * c + l] | L[64 * c + 32 + l] << 4);
  }
}

void QuantizeQ5_K(const float* x, BlockQ5_K* b, size_t nb) {
  for (size_t i = 0; i < nb; i++, x += kQKK) {
    uint8_t L[kQKK];
    FitQ45K(x, 31, -0.5f, 15, &b[i].d, &b[i].dmin, b[i].scales, L);
    std::memset(b[i].qh, 0, sizeof(b[i].qh));
    for (int c = 0; c < 4; c++) {
      for (int l = 0; l < 32; l++) {
        int lo = L[64 * c + l], hi = L[64 * c + 32 + l];
        b[i].qs[32 * c + l] = uint8_t((lo & 15) | (hi & 15) << 4);
        b[i].qh[l] |= uint8_t(((lo >> 4) & 1) << (2 * c) | ((hi >> 4) & 1) << (2 * c + 1));
      }
    }
  }
}

void QuantizeQ6_K(const float* x, BlockQ6_K* b, size_t nb) {
  for (size_t i = 0; i < nb; i++, x += kQKK) {
    float sc[16], w[16];
    int8_t Ls[16];
    for (int j = 0; j < 16; j++) {
      for (int l = 0; l < 16; l++) w[l] = x[16 * j + l] * x[16 * j + l];
      sc[j] = FitSymmetric(16, 32, x + 16 * j, w, Ls);
    }
    int q[16];
    b[i].d = F32ToF16(QuantizeScalesS(sc, 16, 128, q));
    for (int j = 0; j < 16; j++) b[i].scales[j] = int8_t(q[j]);
    float D = F16ToF32(b[i].d);
    uint8_t L[kQKK];  // 0..63, decoded as L - 32
    for (int j = 0; j < 16; j++) {
      float dl = D * float(b[i].scales[j]);
      for (int l = 0; l < 16; l++) L[16 * j + l] = uint8_t(dl != 0 ? Clamp(Nearest(x[16 * j + l] / dl), -32, 31) + 32 : 32);
    }
    std::memset(b[i].ql, 0, sizeof(b[i].ql));
    std::memset(b[i].qh, 0, sizeof(b[i].qh));
    for (int h = 0; h < 2; h++) {
      for (int s = 0; s < 4; s++) {
        for (int l = 0; l < 32; l++) {
          int v = L[128 * h + 32 * s + l];
          b[i].ql[64 * h + l + 32 * (s % 2)] |= uint8_t((v & 15) << (4 * (s / 2)));
          b[i].qh[32 * h + l] |= uint8_t((v >> 4) << (2 * s));
        }
      }
    }
  }
}

void QuantizeIQ4_XS(const float* x, BlockIQ4_XS* b, size_t nb) {
  for (size_t i = 0; i < nb; i++, x += kQKK) {
    float sc[8], w[32];
    uint8_t idx[32];
    for (int ib = 0; ib < 8; ib++) {
      for (int l = 0; l < 32; l++) w[l] = x[32 * ib + l] * x[32 * ib + l];
      sc[ib] = FitIq4(32, x + 32 * ib, w, idx);
    }
    int q[8];
    b[i].d = F32ToF16(QuantizeScalesS(sc, 8, 32, q));
    b[i].scales_h = 0;
    std::memset(b[i].scales_l, 0, sizeof(b[i].scales_l));
    for (int ib = 0; ib < 8; ib++) {
      int v = q[ib] + 32;
      b[i].scales_l[ib / 2] |= uint8_t((v & 15) << (4 * (ib % 2)));
      b[i].scales_h = uint16_t(b[i].scales_h | (v >> 4) << (2 * ib));
    }
    float D = F16ToF32(b[i].d);
    for (int ib = 0; ib < 8; ib++) {
      float dl = D * float(Iq4XsScale(b[i], ib));
      for (int l = 0; l < 32; l++) idx[l] = uint8_t(dl != 0 ? NearestIq4(x[32 * ib + l] / dl) : 8);
      for (int l = 0; l < 16; l++) b[i].qs[16 * ib + l] = uint8_t(idx[l] | idx[l + 16] << 4);
    }
  }
}

}  // namespace mnemo
