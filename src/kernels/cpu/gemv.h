// Internal to src/kernels/cpu: weight layouts and the row-range kernels behind Linear.
// Each kernel exists as a portable version (gemv_ref.cpp), an AVX-512 version (gemv_avx512.cpp,
// compiled with AVX-512 flags) and an AVX2 + FMA + F16C one (gemv_avx2.cpp); call the SIMD ones
// only when GetCpuFeatures() says so.
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/dtype.h"

namespace mnemo::kernels::detail {

// --- bf16 weights: oneDNN's BA16a64b2a layout of W^T [in, out] ----------------------------------
// The matrix is cut into tiles of 64 outputs x 32 inputs; tiles are stored [out / 64][in / 32]
// (both padded with zeros), and inside a tile element (k, o) sits at ((k / 2) * 64 + o) * 2 + k % 2.
// One 64-byte row of a tile is then 16 outputs x 2 consecutive inputs: exactly the operand of
// vdpbf16ps with a broadcast pair of activations, and oneDNN's brgemm reads the same bytes.
constexpr int kBf16TileOut = 64;
constexpr int kBf16TileIn = 32;
constexpr int kBf16TileElems = kBf16TileOut * kBf16TileIn;
struct Bf16Blocked {
  int out = 0;      // logical output rows
  int in = 0;       // logical inputs
  int out_pad = 0;  // out rounded up to 64
  int in_pad = 0;   // in rounded up to 32
};
Bf16Blocked Bf16Shape(int out, int in);
// Packs rows [0, out) of a row-major [out, in] matrix of any dtype t (decoded with ToF32) into dst
// ([out_pad * in_pad] bf16, zero padded).
void PackBf16Blocked(DType t, const void* src, const Bf16Blocked& s, uint16_t* dst);

// y[j, o] = sum_k x[j, k] w[o, k] for j < n, o in [o0, o1) (o0 a multiple of 64).
// x: [n, in_pad] bf16 (zero padded); y: row stride ldy floats.
void GemvBf16Ref(const uint16_t* w, const Bf16Blocked& s, const uint16_t* x, int n, int o0, int o1,
                 float* y, int ldy);
void GemvBf16Avx512(const uint16_t* w, const Bf16Blocked& s, const uint16_t* x, int n, int o0,
                    int o1, float* y, int ldy);
// The same for AVX-512F CPUs without AVX512-BF16 (bf16 widened by shifts, f32 FMAs).
void GemvBf16Avx512NoBf16(const uint16_t* w, const Bf16Blocked& s, const uint16_t* x, int n,
                          int o0, int o1, float* y, int ldy);
void GemvBf16Avx2(const uint16_t* w, const Bf16Blocked& s, const uint16_t* x, int n, int o0, int o1,
                  float* y, int ldy);

// --- q8_0 weights, repacked for VNNI -------------------------------------------------------------
// Panels of 16 outputs; per panel and per 32-input block one 576-byte record:
//   int8 q[8][16][4]  (input quad, output, input within quad): the operand of vpdpbusd
//   f16  d[16]        (per-output scale)
//   int16 c[16]       (-sum of the 32 quants: 128 * c corrects for activations stored + 128)
// Panels are [out_pad / 16][in / 32] records; padded outputs have zero quants and scales.
constexpr int kQ8PanelOut = 16;
constexpr int kQ8RecordBytes = 576;
struct Q8Packed {
  int out = 0;      // logical output rows
  int in = 0;       // inputs, a multiple of 32
  int out_pad = 0;  // out rounded up to 16
};
// src: row-major [out, in / 32] BlockQ8_0 -> dst [out_pad / 16 * in / 32 * 576] bytes.
void PackQ8(const BlockQ8_0* src, const Q8Packed& s, uint8_t* dst);

// Activations quantised per 32-block: xq = round(x / d) + 128 as uint8, d = max|x| / 127.
// x: [n, in] f32 -> xq: [n, in] uint8, xd: [n, in / 32] f32.
void QuantizeActQ8Ref(const float* x, int n, int in, uint8_t* xq, float* xd);
void QuantizeActQ8Avx512(const float* x, int n, int in, uint8_t* xq, float* xd);
void QuantizeActQ8Avx2(const float* x, int n, int in, uint8_t* xq, float* xd);

// y[j, o] = sum_blocks d_w * d_x * (sum_k xq*q - 128 sum_k q), o in [o0, o1) (o0 a multiple of 16).
void GemvQ8Ref(const uint8_t* w, const Q8Packed& s, const uint8_t* xq, const float* xd, int n,
               int o0, int o1, float* y, int ldy);
void GemvQ8Avx512(const uint8_t* w, const Q8Packed& s, const uint8_t* xq, const float* xd, int n,
                  int o0, int o1, float* y, int ldy);
void GemvQ8Avx2(const uint8_t* w, const Q8Packed& s, const uint8_t* xq, const float* xd, int n, int o0,
                int o1, float* y, int ldy);

// --- f32 weights, plain row-major [out, in] -------------------------------------------------------
// y[j, o] = sum_k x[j, k] w[o, k], o in [o0, o1). x: [n, in]; y: row stride ldy.
void GemvF32Ref(const float* w, int in, const float* x, int n, int o0, int o1, float* y, int ldy);
void GemvF32Avx512(const float* w, int in, const float* x, int n, int o0, int o1, float* y,
                   int ldy);
void GemvF32Avx2(const float* w, int in, const float* x, int n, int o0, int o1, float* y, int ldy);

// --- conversions ---------------------------------------------------------------------------------
// dst[i] = bf16(src[i]), round to nearest even.
void F32ToBf16Ref(const float* src, uint16_t* dst, size_t n);
void F32ToBf16Avx512(const float* src, uint16_t* dst, size_t n);
void F32ToBf16Avx2(const float* src, uint16_t* dst, size_t n);

}  // namespace mnemo::kernels::detail
