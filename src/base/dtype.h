// Element types of weights and KV, and scalar conversions between them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace mnemo {

// Weight and KV element types. The block types (Q*, IQ*) are ggml's, laid out as in
// base/quant_blocks.h; a row of them is a whole number of blocks (DTypeBlockElems).
enum class DType : uint8_t {
  F32, F16, BF16, Q8_0,
  Q4_0, Q4_1, Q5_0, Q5_1,          // legacy 32-element blocks
  Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,    // K-quants, 256-element super-blocks
  IQ4_NL, IQ4_XS,                  // non-linear 4-bit (32 and 256 elements)
};
inline constexpr DType kAllDTypes[] = {DType::F32,  DType::F16,  DType::BF16, DType::Q8_0,   DType::Q4_0,
                                       DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q2_K,   DType::Q3_K,
                                       DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_NL, DType::IQ4_XS};

// Q8_0: blocks of 32 weights, one f16 scale then 32 int8 (34 bytes), value = d * q[i].
constexpr int kQ8Block = 32;
struct BlockQ8_0 {
  uint16_t d;      // f16 scale
  int8_t q[kQ8Block];
};
static_assert(sizeof(BlockQ8_0) == 34);

const char* DTypeName(DType t);
bool ParseDType(std::string_view name, DType* out);
// Elements per block: 1 for F32/F16/BF16, 32 or 256 for the block types.
int DTypeBlockElems(DType t);
// Bytes per block (per element for F32/F16/BF16).
int DTypeBlockBytes(DType t);
inline bool IsBlockType(DType t) { return DTypeBlockElems(t) > 1; }
// Bytes taken by n elements (n must be a multiple of DTypeBlockElems(t)).
size_t DTypeBytes(DType t, size_t n);

inline float Bf16ToF32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// Round to nearest even; NaN stays NaN.
inline uint16_t F32ToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffff) > 0x7f800000) return uint16_t((u >> 16) | 0x40);
  u += 0x7fff + ((u >> 16) & 1);
  return uint16_t(u >> 16);
}
float F16ToF32(uint16_t h);
uint16_t F32ToF16(float f);

// Converts n elements of type t at src to f32 at dst (n a multiple of DTypeBlockElems(t)); block
// types decode exactly as ggml does (base/quant.h).
void ToF32(DType t, const void* src, float* dst, size_t n);
// Converts n f32 values to type t (n a multiple of DTypeBlockElems(t)). Q8_0 quantises as llama.cpp
// does (d = max|x| / 127); the other block types search scales (base/quant.h), deterministically.
void FromF32(DType t, const float* src, void* dst, size_t n);

}  // namespace mnemo
