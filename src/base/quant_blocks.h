// Block layouts of ggml's quantised tensor types, as GGUF files store them (a fact of the format,
// byte for byte). A row of `in` weights of a block type is in / block_elems blocks. Scales are f16
// (uint16_t bits). Values: see each struct; the decoders are in quant.cpp (ToF32 in dtype.h).
#pragma once

#include <cstdint>

namespace mnemo {

constexpr int kQK = 32;    // elements per block of the legacy types (Q4_0 .. Q8_0, IQ4_NL)
constexpr int kQKK = 256;  // elements per super-block of the K-quants and IQ4_XS

// x[j] = d * ((qs[j] & 15) - 8), x[j + 16] = d * ((qs[j] >> 4) - 8), j < 16.
struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockQ4_0) == 18);

// x[j] = d * (qs[j] & 15) + m, x[j + 16] = d * (qs[j] >> 4) + m.
struct BlockQ4_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockQ4_1) == 20);

// 5-bit: low nibble as Q4_0, bit 4 of element j from bit j of qh (little-endian uint32);
// x = d * (q - 16).
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockQ5_0) == 22);

// As Q5_0 with x = d * q + m.
struct BlockQ5_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockQ5_1) == 24);

// Q8_0 is BlockQ8_0 in dtype.h (x = d * q).

// 2-bit K-quant: 16 sub-blocks of 16; scales[i] low nibble = scale, high nibble = min;
// x = d * sc * q - dmin * m.
struct BlockQ2_K {
  uint8_t scales[kQKK / 16];
  uint8_t qs[kQKK / 4];
  uint16_t d;
  uint16_t dmin;
};
static_assert(sizeof(BlockQ2_K) == 84);

// 3-bit K-quant: 16 sub-blocks of 16, 6-bit signed scales packed in 12 bytes; high bit in hmask
// (set = no subtraction of 4); x = d * (sc - 32) * (q - (hbit ? 0 : 4)).
struct BlockQ3_K {
  uint8_t hmask[kQKK / 8];
  uint8_t qs[kQKK / 4];
  uint8_t scales[12];
  uint16_t d;
};
static_assert(sizeof(BlockQ3_K) == 110);

// 4-bit K-quant: 8 sub-blocks of 32 with 6-bit scale and min packed in 12 bytes;
// x = d * sc * q - dmin * m.
struct BlockQ4_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qs[kQKK / 2];
};
static_assert(sizeof(BlockQ4_K) == 144);

// 5-bit K-quant: as Q4_K with a fifth bit per element in qh.
struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qh[kQKK / 8];
  uint8_t qs[kQKK / 2];
};
static_assert(sizeof(BlockQ5_K) == 176);

// 6-bit K-quant: 16 sub-blocks of 16 with int8 scales; x = d * sc * (q - 32).
struct BlockQ6_K {
  uint8_t ql[kQKK / 2];
  uint8_t qh[kQKK / 4];
  int8_t scales[kQKK / 16];
  uint16_t d;
};
static_assert(sizeof(BlockQ6_K) == 210);

// Non-linear 4-bit: x = d * kIq4nlValues[nibble] (nibble order as Q4_0).
struct BlockIQ4_NL {
  uint16_t d;
  uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockIQ4_NL) == 18);

// IQ4_NL values in super-blocks of 256: 8 sub-blocks of 32 with 6-bit scales (low 4 bits in
// scales_l nibbles, high 2 bits in scales_h); x = d * (ls - 32) * kIq4nlValues[nibble].
struct BlockIQ4_XS {
  uint16_t d;
  uint16_t scales_h;
  uint8_t scales_l[kQKK / 64];
  uint8_t qs[kQKK / 2];
};
static_assert(sizeof(BlockIQ4_XS) == 136);

inline constexpr int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};

}  // namespace mnemo
