// Decoders of ggml's block types. Each mirrors ggml's dequantize_row_* semantics: same element
// order, same float expression (products are (d * scale) * q, then minus (dmin * m)).
#include "base/quant.h"

#include <cstring>
#include <string>

#include "base/status.h"

namespace mnemo {

void DequantizeQ8_0(const BlockQ8_0* b, float* y, size_t nb) {
  for (size_t i = 0; i < nb; i++, y += kQK) {
    float d = F16ToF32(b[i].d);
    for (int j = 0; j < kQK; j++) y[j] = d * float(b[i].q[j]);
  }
}

void DequantizeQ4_0(const BlockQ4_0* b, float* y, size_t nb) {
  for (size_t i = 0; i < nb; i++, y += kQK) {
    float d = F16ToF32(b[i].d);
    for (int j = 0; j < kQK / 2; j++) {
      y[j] = d * float((b[i].qs[j] & 15) - 8);
      y[j + kQK / 2] = d * float((b[i].qs[j] >> 4) - 8);
    }
  }
}

void DequantizeQ4_1(const BlockQ4_1* b, float* y, size_t nb) {
  for (size_t i = 0; i < nb; i++, y += kQK) {
    float d = F16ToF32(b[i].d), m = F16ToF32(b[i].m);
    for (int j = 0; j < kQK / 2; j++) {
      y[j] = d * float(b[i].qs[j] & 15) + m;
      y[j + kQK / 2] = d * float(b[i].qs[j] >> 4) + m;
    }
  }
}

namespace {
// Q5_0 / Q5_1: the 5-bit values of one block (bit 4 of element j is bit j of qh).
void Unpack5(const uint8_t* qh4, const uint8_t* qs, int* q) {
  uint32_t qh;
  std::memcpy(&qh, qh4, 4);
  for (int j = 0; j < kQK / 2; j++) {
    q[j] = (qs[j] & 15) | int((qh >> j) & 1) << 4;
    q[j + kQK / 2] = (qs[j] >> 4) | int((qh >> (j + kQK / 2)) & 1) << 4;
  }
}
}  // namespace

void DequantizeQ5_0(const BlockQ5_0* b, float* y, size_t nb) {
  int q[kQK];
  for (size_t i = 0; i < nb; i++, y += kQK) {
    float d = F16ToF32(b[i].d);
    Unpack5(b[i].qh, b[i].qs, q);
    for (int j = 0; j < kQK; j++) y[j] = d * float(q[j] - 16);
  }
}

void DequantizeQ5_1(const BlockQ5_1* b, float* y, size_t nb) {
  int q[kQK];
  for (size_t i = 0; i < nb; i++, y += kQK) {
    float d = F16ToF32(b[i].d), m = F16ToF32(b[i].m);
    Unpack5(b[i].qh, b[i].qs, q);
    for (int j = 0; j < kQK; j++) y[j] = d * float(q[j]) + m;
  }
}

// Q2_K: qs holds 2 halves of 128 elements; within a half, byte l (0..31) carries element
// 32 * s + l of the half in bits 2s..2s+1 (s = 0..3). Sub-block k (16 elements) = half k / 8,
// shift (k % 8) / 2, bytes 16 * (k % 2) ..+16.
void DequantizeQ2_K(const BlockQ2_K* b, float* y, size_t nb) {
  for (size_t i = 0; i < nb; i++) {
    float d = F16ToF32(b[i].d), dmin = F16ToF32(b[i].dmin);
    for (int k = 0; k < kQKK / 16; k++, y += 16) {
      const uint8_t* q = b[i].qs + 32 * (k / 8) + 16 * (k % 2);
      int shift = 2 * ((k % 8) / 2);
      float dl = d * float(b[i].scales[k] & 15), ml = dmin * float(b[i].scales[k] >> 4);
      for (int l = 0; l < 16; l++) y[l] = dl * float((q[l] >> shift) & 3) - ml;
    }
  }
}

// Q3_K: as Q2_K for the low 2 bits; the third bit of element e (0..255) is bit e / 32 of
// hmask[e % 32]; a clear bit subtracts 4.
void DequantizeQ3_K(const BlockQ3_K* b, float* y, size_t nb) {
  for (size_t i = 0; i < nb; i++) {
    float d = F16ToF32(b[i].d);
    for (int k = 0; k < kQKK / 16; k++, y += 16) {
      const uint8_t* q = b[i].qs + 32 * (k / 8) + 16 * (k % 2);
      int shift = 2 * ((k % 8) / 2);
      int hbit = k / 2;  // element 16 * k + l sits in hmask bit (16k + l) / 32 = k / 2
      const uint8_t* hm = b[i].hmask + 16 * (k % 2);
      float dl = d * float(Q3KScale(k, b[i].scales));
      for (int l = 0; l < 16; l++) {
        int v = int((q[l] >> shift) & 3) - ((hm[l] >> hbit) & 1 ? 0 : 4);
        y[l] = dl * float(v);
      }
    }
  }
}

// Q4_K: 4 chunks of 64 elements; chunk c uses 32 bytes of qs, low nibbles for sub-block 2c,
// high nibbles for sub-block 2c + 1.
void DequantizeQ4_K(const BlockQ4_K* b, float* y, size_t nb) {
  for (size_t i = 0; i < nb; i++) {
    float d = F16ToF32(b[i].d), dmin = F16ToF32(b[i].dmin);
    for (int j = 0; j < kQKK / 32; j++, y += 32) {
      uint8_t sc, m;
      Q4KScaleMin(j, b[i].scales, &sc, &m);
      float dl = d * float(sc), ml = dmin * float(m);
      const uint8_t* q = b[i].qs + 32 * (j / 2);
      int shift = 4 * (j % 2);
      for (int l = 0; l < 32; l++) y[l] = dl * float((q[l] >> shift) & 15) - ml;
    }
  }
}

// Q5_K: as Q4_K plus bit j of qh[l] as the fifth bit of element l of sub-block j.
void DequantizeQ5_K(const BlockQ5_K* b, float* y, size_t nb) {
  for (size_t i = 0; i < nb; i++) {
    float d = F16ToF32(b[i].d), dmin = F16ToF32(b[i].dmin);
    for (int j = 0; j < kQKK / 32; j++, y += 32) {
      uint8_t sc, m;
      Q4KScaleMin(j, b[i].scales, &sc, &m);
      float dl = d * float(sc), ml = dmin * float(m);
      const uint8_t* q = b[i].qs + 32 * (j / 2);
      int shift = 4 * (j % 2);
      for (int l = 0; l < 32; l++) {
        int v = ((q[l] >> shift) & 15) | ((b[i].qh[l] >> j) & 1) << 4;
        y[l] = dl * float(v) - ml;
      }
    }
  }
}

// Q6_K: 2 halves of 128; in half h, element 32 * s + l (s = 0..3, l < 32) has its low nibble in
// ql[64h + l + 32 * (s % 2)] (low nibble for s < 2, high for s >= 2) and its top 2 bits in
// qh[32h + l] bits 2s..2s+1. Sub-block of 16: scales[8h + 2s + l / 16].
void DequantizeQ6_K(const BlockQ6_K* b, float* y, size_t nb) {
  for (size_t i = 0; i < nb; i++) {
    float d = F16ToF32(b[i].d);
    for (int h = 0; h < 2; h++) {
      const uint8_t* ql = b[i].ql + 64 * h;
      const uint8_t* qh = b[i].qh + 32 * h;
      const int8_t* sc = b[i].scales + 8 * h;
      for (int s = 0; s < 4; s++) {
        for (int l = 0; l < 32; l++) {
          int lo = (ql[l + 32 * (s % 2)] >> (4 * (s / 2))) & 15;
          int v = (lo | ((qh[l] >> (2 * s)) & 3) << 4) - 32;
          y[128 * h + 32 * s + l] = d * float(sc[2 * s + l / 16]) * float(v);
        }
      }
    }
    y += kQKK;
  }
}

void DequantizeIQ4_NL(const BlockIQ4_NL* b, float* y, size_t nb) {
  for (size_t i = 0; i < nb; i++, y += kQK) {
    float d = F16ToF32(b[i].d);
    for (int j = 0; j < kQK / 2; j++) {
      y[j] = d * float(kIq4nlValues[b[i].qs[j] & 15]);
      y[j + kQK / 2] = d * float(kIq4nlValues[b[i].qs[j] >> 4]);
    }
  }
}

void DequantizeIQ4_XS(const BlockIQ4_XS* b, float* y, size_t nb) {
  for (size_t i = 0; i < nb; i++) {
    float d = F16ToF32(b[i].d);
    for (int ib = 0; ib < kQKK / 32; ib++, y += 32) {
      float dl = d * float(Iq4XsScale(b[i], ib));
      const uint8_t* qs = b[i].qs + 16 * ib;
      for (int j = 0; j < 16; j++) {
        y[j] = dl * float(kIq4nlValues[qs[j] & 15]);
        y[j + 16] = dl * float(kIq4nlValues[qs[j] >> 4]);
      }
    }
  }
}

void DequantizeBlocks(DType t, const void* src, float* dst, size_t n) {
  size_t nb = n / size_t(DTypeBlockElems(t));
  switch (t) {
    case DType::Q8_0: return DequantizeQ8_0(static_cast<const BlockQ8_0*>(src), dst, nb);
    case DType::Q4_0: return DequantizeQ4_0(static_cast<const BlockQ4_0*>(src), dst, nb);
    case DType::Q4_1: return DequantizeQ4_1(static_cast<const BlockQ4_1*>(src), dst, nb);
    case DType::Q5_0: return DequantizeQ5_0(static_cast<const BlockQ5_0*>(src), dst, nb);
    case DType::Q5_1: return DequantizeQ5_1(static_cast<const BlockQ5_1*>(src), dst, nb);
    case DType::Q2_K: return DequantizeQ2_K(static_cast<const BlockQ2_K*>(src), dst, nb);
    case DType::Q3_K: return DequantizeQ3_K(static_cast<const BlockQ3_K*>(src), dst, nb);
    case DType::Q4_K: return DequantizeQ4_K(static_cast<const BlockQ4_K*>(src), dst, nb);
    case DType::Q5_K: return DequantizeQ5_K(static_cast<const BlockQ5_K*>(src), dst, nb);
    case DType::Q6_K: return DequantizeQ6_K(static_cast<const BlockQ6_K*>(src), dst, nb);
    case DType::IQ4_NL: return DequantizeIQ4_NL(static_cast<const BlockIQ4_NL*>(src), dst, nb);
    case DType::IQ4_XS: return DequantizeIQ4_XS(static_cast<const BlockIQ4_XS*>(src), dst, nb);
    case DType::F32: case DType::F16: case DType::BF16: break;
  }
  MNEMO_CHECK_MSG(false, std::string("DequantizeBlocks: not a block type: ") + DTypeName(t));
}

}  // namespace mnemo
