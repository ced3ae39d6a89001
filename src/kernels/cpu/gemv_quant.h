// Internal to src/kernels/cpu: the weight-streaming kernels for ggml's block types other than
// Q8_0 (Q4_0 .. IQ4_XS), behind Linear's fast path. One kernel serves decode (GEMV) and prefill
// (GEMM): weights stay compact in memory and are expanded to int8 in registers, per 16 outputs x
// 32 inputs, right before vpdpbusd; activations are quantised to int8 per 32-block.
//
// Arithmetic. Every type is written, per 16-element half h of a 32-block, as
//   w = s_h * u + off_h,   u an unsigned integer in [0, 255] (the type's quant, shifted),
// with s_h, off_h f32 from the file's f16 scales and integer sub-scales (both exact in f32: an
// f16 times an integer below 2^8 fits f32's 24-bit mantissa). With the activations quantised as
// x ~ dx * q (q in [-127, 127], dx per 32-block) the dot of one 32-block is exactly
//   dx * (s_0 * sum_{k<16} u q + s_1 * sum_{k>=16} u q) + off_0 * dx * sum_{k<16} q + ...
// i.e. the result equals the double-precision dot of the decoded weights (ToF32) with the
// quantised activations, up to f32 rounding. u is unsigned so that vpdpbusd (u8 x s8) takes it
// as is; the offset terms use the activations' per-16 sums, computed once per Forward.
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/dtype.h"

namespace mnemo::kernels::detail {

constexpr int kQPanelOut = 16;  // outputs per panel (one zmm of f32 / int32 lanes)

// How a type is stored after packing. Per panel (16 outputs) and per group of `group` inputs
// one record:
//   f16 hdr0[16]                     d (every type)
//   f16 hdr1[16]                     if has_hdr1: dmin (K-quants) or m (Q4_1, Q5_1)
//   then per 32-input sub-block of the group:
//     uint8 sub[sub_bytes]           integer sub-scales of the 16 outputs (layout per type)
//     uint8 nib[256]  if nib         4-bit codes: byte i of the m-th 64 bytes holds the codes of
//                                    VNNI position i in input quads m (low nibble) and m + 4
//     uint8 two[128]  if two         2-bit codes: byte i of the m-th 64 bytes, bits 2r..2r+1,
//                                    holds VNNI position i of input quad 4m + r
//     uint64 hbit[8]  if hbit        one bit per VNNI position, bit i of word r for quad r
// where "VNNI position i of input quad r" is output i / 4, input 4r + i % 4 of the sub-block:
// the operand layout of vpdpbusd with four broadcast activations. Records are stored
// [out_pad / 16][in / group]; padded outputs have zero scales and codes.
struct QFormat {
  int group = 32;         // inputs per record: 32 (legacy types) or 256 (K-quants, IQ4_XS)
  bool has_hdr1 = false;  // a second f16 per output per group
  int sub_bytes = 0;      // sub-scale bytes per 32-sub-block (0, 16 or 32)
  bool nib = false, two = false, hbit = false;
  constexpr int SubBlockBytes() const {
    return sub_bytes + (nib ? 256 : 0) + (two ? 128 : 0) + (hbit ? 64 : 0);
  }
  constexpr int HeaderBytes() const { return has_hdr1 ? 64 : 32; }
  constexpr int RecordBytes() const { return HeaderBytes() + group / 32 * SubBlockBytes(); }
};

// The stored code c of a weight splits into the planes from the low bits up: nib = c & 15 (if
// nib), then two bits (if two), then one bit (if hbit). u = c, except for IQ4_NL / IQ4_XS where
// c is an index and u = kIq4nlValues[c] + 128. Sub-scales (sub[16 * k + output]):
//   Q4_K, Q5_K: k = 0 scale, k = 1 min (6-bit, unsigned)
//   Q6_K, Q3_K: k = half, int8 scale (Q3_K: already minus 32)
//   Q2_K:       k = half, the file's byte (scale | min << 4)
//   IQ4_XS:     k = 0, int8 scale (ls - 32)
constexpr QFormat QFormatOf(DType t) {
  switch (t) {
    case DType::Q4_0: case DType::IQ4_NL: return {32, false, 0, true, false, false};
    case DType::Q4_1: return {32, true, 0, true, false, false};
    case DType::Q5_0: return {32, false, 0, true, false, true};
    case DType::Q5_1: return {32, true, 0, true, false, true};
    case DType::Q2_K: return {256, true, 32, false, true, false};
    case DType::Q3_K: return {256, false, 32, false, true, true};
    case DType::Q4_K: return {256, true, 32, true, false, false};
    case DType::Q5_K: return {256, true, 32, true, false, true};
    case DType::Q6_K: return {256, false, 32, true, true, false};
    case DType::IQ4_XS: return {256, false, 16, true, false, false};
    default: return {0, false, 0, false, false, false};
  }
}
// True for the types these kernels take (every block type but Q8_0, which has its own).
constexpr bool HasQFormat(DType t) { return QFormatOf(t).group != 0; }

struct QPacked {
  DType type = DType::Q4_K;
  QFormat f;
  int out = 0;      // logical output rows
  int in = 0;       // inputs, a multiple of f.group
  int out_pad = 0;  // out rounded up to 16
  size_t Bytes() const { return size_t(out_pad / kQPanelOut) * (in / f.group) * f.RecordBytes(); }
};
QPacked QShape(DType t, int out, int in);  // t must satisfy HasQFormat
// src: row-major [out, in] of type s.type (the file's blocks) -> dst [s.Bytes()].
void PackQ(const void* src, const QPacked& s, uint8_t* dst);

// Activations of n rows quantised per 32-block: q = round-to-even(x * 127 / max|x|) (int8),
// dx = max|x| / 127; per block also the sums of q over its two 16-element halves, as integers
// and times dx (the offset terms), and dx times the sum over the whole block.
struct QActBlock {
  float dx;
  float dxs[2];      // dx * qsum[h]
  float dxs32;       // dx * (qsum[0] + qsum[1])
  int32_t qsum[2];   // sum of q over elements [16h, 16h + 16)
};
struct QActs {
  const int8_t* q;         // [n, in]
  const QActBlock* b;      // [n, in / 32]
};
// x: [n, in] f32 -> q [n, in], b [n, in / 32]; in a multiple of 32.
void QuantizeActS8Ref(const float* x, int n, int in, int8_t* q, QActBlock* b);
void QuantizeActS8Avx512(const float* x, int n, int in, int8_t* q, QActBlock* b);
void QuantizeActS8Avx2(const float* x, int n, int in, int8_t* q, QActBlock* b);

// y[j, o] = sum_k w[o, k] x[j, k] over the quantised activations, for j < n and o in [o0, o1)
// (o0 a multiple of 16); y has row stride ldy.
void GemvQRef(const uint8_t* w, const QPacked& s, const QActs& x, int n, int o0, int o1, float* y,
              int ldy);
// Needs AVX512-BW and AVX512-VNNI.
void GemvQAvx512(const uint8_t* w, const QPacked& s, const QActs& x, int n, int o0, int o1,
                 float* y, int ldy);
// Needs AVX2 (vpmaddubsw: the codes are at most 6 bits, or signed for IQ4_*, so no pair saturates).
void GemvQAvx2(const uint8_t* w, const QPacked& s, const QActs& x, int n, int o0, int o1, float* y,
               int ldy);

}  // namespace mnemo::kernels::detail
