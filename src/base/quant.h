// Scalar decoders and quantisers of ggml's block types (layouts in base/quant_blocks.h). These are
// the reference the fast kernels are tested against; ToF32 / FromF32 (base/dtype.h) dispatch here.
//
// Decoders follow ggml's dequantize semantics exactly, including the order of float operations
// (e.g. Q4_K: (d * sc) * q - (dmin * m)), so that decoded values equal llama.cpp's bit for bit.
// quant.cpp is built with -ffp-contract=off so that no multiply-add is fused.
//
// Quantisers are deterministic (same input, same bytes on every machine) and minimise squared
// error per (sub-)block; they need not be bit-identical to llama-quantize.
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/dtype.h"
#include "base/quant_blocks.h"

namespace mnemo {

// Q4_K / Q5_K: the 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes.
// Bytes 0-3: low 6 bits of scales 0-3 (top 2 bits: high bits of scales 4-7); bytes 4-7 the
// same for the mins; bytes 8-11: low nibble = low 4 bits of scale 4-7, high nibble of min 4-7.
inline void Q4KScaleMin(int j, const uint8_t* q, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = uint8_t((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *m = uint8_t((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// Q3_K: the signed scale (-32..31) of sub-block i (0..15) from the 12 packed bytes.
// Low 4 bits: nibble (i / 8) of byte i % 8; high 2 bits: bits 2 * (i / 4) of byte 8 + i % 4.
inline int Q3KScale(int i, const uint8_t* s) {
  int lo = i < 8 ? (s[i] & 15) : (s[i - 8] >> 4);
  int hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
  return (lo | hi << 4) - 32;
}

// IQ4_XS: the signed scale (-32..31) of sub-block ib (0..7).
inline int Iq4XsScale(const BlockIQ4_XS& b, int ib) {
  int lo = (b.scales_l[ib / 2] >> (4 * (ib % 2))) & 15;
  int hi = (b.scales_h >> (2 * ib)) & 3;
  return (lo | hi << 4) - 32;
}

// Decoders: nb blocks at b to nb * block_elems floats at y.
void DequantizeQ8_0(const BlockQ8_0* b, float* y, size_t nb);
void DequantizeQ4_0(const BlockQ4_0* b, float* y, size_t nb);
void DequantizeQ4_1(const BlockQ4_1* b, float* y, size_t nb);
void DequantizeQ5_0(const BlockQ5_0* b, float* y, size_t nb);
void DequantizeQ5_1(const BlockQ5_1* b, float* y, size_t nb);
void DequantizeQ2_K(const BlockQ2_K* b, float* y, size_t nb);
void DequantizeQ3_K(const BlockQ3_K* b, float* y, size_t nb);
void DequantizeQ4_K(const BlockQ4_K* b, float* y, size_t nb);
void DequantizeQ5_K(const BlockQ5_K* b, float* y, size_t nb);
void DequantizeQ6_K(const BlockQ6_K* b, float* y, size_t nb);
void DequantizeIQ4_NL(const BlockIQ4_NL* b, float* y, size_t nb);
void DequantizeIQ4_XS(const BlockIQ4_XS* b, float* y, size_t nb);

// Any block type: n elements (a multiple of DTypeBlockElems(t)). CHECK-fails for F32/F16/BF16.
void DequantizeBlocks(DType t, const void* src, float* dst, size_t n);
// Any block type: n elements (a multiple of DTypeBlockElems(t)) quantised to blocks at dst.
void QuantizeBlocks(DType t, const float* src, void* dst, size_t n);

}  // namespace mnemo
