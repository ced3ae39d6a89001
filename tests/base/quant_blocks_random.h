// Random blocks of a ggml block type for decoder tests: every byte random except the f16 scale
// fields, which get a sane random value (either sign, magnitude 2^-10 .. 2^-2; no NaN/Inf).
// The expected decodes in tests/data/quant were made from these bytes (see PROVENANCE.md there),
// so this generator must not change.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "base/dtype.h"
#include "base/quant_blocks.h"
#include "base/rng.h"

namespace mnemo {

inline constexpr uint64_t kQuantTestSeed = 20261201;
// Blocks per type in the test data: 8 of the 32-element types, 4 of the 256-element ones.
inline int QuantTestBlocks(DType t) { return DTypeBlockElems(t) == kQKK ? 4 : 8; }

// Byte offsets of the f16 fields (d, and dmin or m where present) in one block of t.
inline std::vector<size_t> F16FieldOffsets(DType t) {
  switch (t) {
    case DType::Q8_0: return {offsetof(BlockQ8_0, d)};
    case DType::Q4_0: return {offsetof(BlockQ4_0, d)};
    case DType::Q4_1: return {offsetof(BlockQ4_1, d), offsetof(BlockQ4_1, m)};
    case DType::Q5_0: return {offsetof(BlockQ5_0, d)};
    case DType::Q5_1: return {offsetof(BlockQ5_1, d), offsetof(BlockQ5_1, m)};
    case DType::Q2_K: return {offsetof(BlockQ2_K, d), offsetof(BlockQ2_K, dmin)};
    case DType::Q3_K: return {offsetof(BlockQ3_K, d)};
    case DType::Q4_K: return {offsetof(BlockQ4_K, d), offsetof(BlockQ4_K, dmin)};
    case DType::Q5_K: return {offsetof(BlockQ5_K, d), offsetof(BlockQ5_K, dmin)};
    case DType::Q6_K: return {offsetof(BlockQ6_K, d)};
    case DType::IQ4_NL: return {offsetof(BlockIQ4_NL, d)};
    case DType::IQ4_XS: return {offsetof(BlockIQ4_XS, d)};
    default: return {};
  }
}

// nblocks random blocks of t ([nblocks * DTypeBlockBytes(t)] bytes), seeded by seed and the type.
inline std::vector<uint8_t> RandomBlocks(DType t, int nblocks, uint64_t seed) {
  Rng rng(seed * 31 + uint64_t(t));
  size_t bb = size_t(DTypeBlockBytes(t));
  std::vector<uint8_t> out(bb * size_t(nblocks));
  for (auto& byte : out) byte = uint8_t(rng.Next() >> 56);
  for (int i = 0; i < nblocks; i++) {
    for (size_t off : F16FieldOffsets(t)) {
      float mag = std::ldexp(1.0f + rng.Uniform(), -10 + int(rng.Next() % 8));
      uint16_t h = F32ToF16(rng.Next() & 1 ? -mag : mag);
      std::memcpy(out.data() + i * bb + off, &h, 2);
    }
  }
  return out;
}

}  // namespace mnemo
