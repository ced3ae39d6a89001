// Element types of weights and KV, and scalar conversions between them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace mnemo {

enum class DType : uint8_t { F32, F16, BF16, Q8_0 };

// Q8_0: blocks of 32 weights, one f16 scale then 32 int8 (34 bytes), value = d * q[i].
constexpr int kQ8Block = 32;
struct BlockQ8_0 {
  uint16_t d;      // f16 scale
  int8_t q[kQ8Block];
};
static_assert(sizeof(BlockQ8_0) == 34);

const char* DTypeName(DType t);
bool ParseDType(std::string_view name, DType* out);
// Bytes taken by n elements (n must be a multiple of 32 for Q8_0).
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

// Converts n elements of type t at src to f32 at dst (n a multiple of 32 for Q8_0).
void ToF32(DType t, const void* src, float* dst, size_t n);
// Converts n f32 values to type t (Q8_0 quantises per block of 32 as llama.cpp does: d = max|x| / 127).
void FromF32(DType t, const float* src, void* dst, size_t n);

}  // namespace mnemo
