// Random weights of the ggml block types for kernel tests and benchmarks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "base/dtype.h"
#include "base/quant_blocks.h"
#include "base/rng.h"

namespace mnemo::kernels {

inline constexpr DType kQTypes[] = {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1,
                                    DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K,
                                    DType::Q6_K, DType::IQ4_NL, DType::IQ4_XS};

// Byte offsets of a block's f16 scale fields (d, then dmin / m where the type has one).
inline std::vector<size_t> F16Fields(DType t) {
  switch (t) {
    case DType::Q8_0: case DType::Q4_0: case DType::Q5_0: case DType::IQ4_NL: case DType::IQ4_XS:
      return {0};
    case DType::Q4_1: case DType::Q5_1: case DType::Q4_K: case DType::Q5_K: return {0, 2};
    case DType::Q2_K: return {offsetof(BlockQ2_K, d), offsetof(BlockQ2_K, dmin)};
    case DType::Q3_K: return {offsetof(BlockQ3_K, d)};
    case DType::Q6_K: return {offsetof(BlockQ6_K, d)};
    default: return {};
  }
}

// [out, in] random blocks of type t: every bit pattern of quants and sub-scales, f16 scales of
// either sign drawn from [0.002, 0.05) (finite, as a file would hold).
inline std::vector<uint8_t> RandomBlocks(DType t, int out, int in, Rng& rng) {
  const size_t blocks = size_t(out) * in / DTypeBlockElems(t);
  const int bb = DTypeBlockBytes(t);
  std::vector<uint8_t> raw(blocks * bb);
  for (uint8_t& b : raw) b = uint8_t(rng.Next() >> 24);
  for (size_t i = 0; i < blocks; i++) {
    for (size_t off : F16Fields(t)) {
      float v = float(0.002 + 0.048 * rng.Uniform());
      if (rng.Next() & 1) v = -v;
      const uint16_t h = F32ToF16(v);
      std::memcpy(&raw[i * bb + off], &h, 2);
    }
  }
  return raw;
}

}  // namespace mnemo::kernels
