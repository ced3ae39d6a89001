#include "base/dtype.h"

#include <cmath>

#include "base/quant.h"
#include "base/quant_blocks.h"
#include "base/status.h"

namespace mnemo {

const char* DTypeName(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::F16: return "f16";
    case DType::BF16: return "bf16";
    case DType::Q8_0: return "q8_0";
    case DType::Q4_0: return "q4_0";
    case DType::Q4_1: return "q4_1";
    case DType::Q5_0: return "q5_0";
    case DType::Q5_1: return "q5_1";
    case DType::Q2_K: return "q2_K";
    case DType::Q3_K: return "q3_K";
    case DType::Q4_K: return "q4_K";
    case DType::Q5_K: return "q5_K";
    case DType::Q6_K: return "q6_K";
    case DType::IQ4_NL: return "iq4_nl";
    case DType::IQ4_XS: return "iq4_xs";
  }
  return "?";
}

bool ParseDType(std::string_view name, DType* out) {
  for (DType t : kAllDTypes) {
    if (name == DTypeName(t)) {
      *out = t;
      return true;
    }
  }
  return false;
}

int DTypeBlockElems(DType t) {
  switch (t) {
    case DType::F32: case DType::F16: case DType::BF16: return 1;
    case DType::Q8_0: case DType::Q4_0: case DType::Q4_1: case DType::Q5_0: case DType::Q5_1:
    case DType::IQ4_NL: return kQK;
    case DType::Q2_K: case DType::Q3_K: case DType::Q4_K: case DType::Q5_K: case DType::Q6_K:
    case DType::IQ4_XS: return kQKK;
  }
  return 0;
}

int DTypeBlockBytes(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::F16: case DType::BF16: return 2;
    case DType::Q8_0: return sizeof(BlockQ8_0);
    case DType::Q4_0: return sizeof(BlockQ4_0);
    case DType::Q4_1: return sizeof(BlockQ4_1);
    case DType::Q5_0: return sizeof(BlockQ5_0);
    case DType::Q5_1: return sizeof(BlockQ5_1);
    case DType::Q2_K: return sizeof(BlockQ2_K);
    case DType::Q3_K: return sizeof(BlockQ3_K);
    case DType::Q4_K: return sizeof(BlockQ4_K);
    case DType::Q5_K: return sizeof(BlockQ5_K);
    case DType::Q6_K: return sizeof(BlockQ6_K);
    case DType::IQ4_NL: return sizeof(BlockIQ4_NL);
    case DType::IQ4_XS: return sizeof(BlockIQ4_XS);
  }
  return 0;
}

size_t DTypeBytes(DType t, size_t n) { return n / DTypeBlockElems(t) * DTypeBlockBytes(t); }

float F16ToF32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        e++;
        mant <<= 1;
      } while ((mant & 0x400) == 0);
      u = sign | uint32_t(127 - 15 - e) << 23 | (mant & 0x3ff) << 13;
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000 | mant << 13;
  } else {
    u = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t F32ToF16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000;
  uint32_t absu = u & 0x7fffffff;
  if (absu > 0x7f800000) return uint16_t(sign | 0x7e00);  // NaN
  if (absu >= 0x477ff000) return uint16_t(sign | 0x7c00);  // overflow to inf (incl. rounding)
  if (absu < 0x38800000) {                                 // subnormal or zero in f16
    if (absu < 0x33000000) return uint16_t(sign);
    // f16 subnormal: value = r * 2^-24; f32 value = m * 2^(e - 150), so r = m >> (126 - e).
    uint32_t e = absu >> 23;
    uint32_t m = (absu & 0x7fffff) | 0x800000;
    uint32_t drop = 126 - e;  // 14..24
    uint32_t r = m >> drop;
    uint32_t rem = m & ((1u << drop) - 1);
    uint32_t half = 1u << (drop - 1);
    if (rem > half || (rem == half && (r & 1))) r++;
    return uint16_t(sign | r);
  }
  uint32_t r = absu + 0xfff + ((absu >> 13) & 1);  // round to nearest even at bit 13
  r -= (127 - 15) << 23;
  return uint16_t(sign | (r >> 13));
}

void ToF32(DType t, const void* src, float* dst, size_t n) {
  switch (t) {
    case DType::F32:
      std::memcpy(dst, src, 4 * n);
      return;
    case DType::F16: {
      auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; i++) dst[i] = F16ToF32(s[i]);
      return;
    }
    case DType::BF16: {
      auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; i++) dst[i] = Bf16ToF32(s[i]);
      return;
    }
    default:
      MNEMO_CHECK_MSG(n % size_t(DTypeBlockElems(t)) == 0,
                      std::string("ToF32: element count not a whole number of blocks of ") + DTypeName(t));
      DequantizeBlocks(t, src, dst, n);
      return;
  }
}

void FromF32(DType t, const float* src, void* dst, size_t n) {
  switch (t) {
    case DType::F32:
      std::memcpy(dst, src, 4 * n);
      return;
    case DType::F16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; i++) d[i] = F32ToF16(src[i]);
      return;
    }
    case DType::BF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; i++) d[i] = F32ToBf16(src[i]);
      return;
    }
    default:
      MNEMO_CHECK_MSG(n % size_t(DTypeBlockElems(t)) == 0,
                      std::string("FromF32: element count not a whole number of blocks of ") + DTypeName(t));
      QuantizeBlocks(t, src, dst, n);
      return;
  }
}

}  // namespace mnemo
