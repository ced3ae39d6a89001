// Block decoders against llama.cpp's gguf-py decoders (tests/data/quant, see PROVENANCE.md there).
#include "base/quant.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "quant_blocks_random.h"

namespace mnemo {
namespace {

std::vector<float> ReadF32(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<float> v(bytes.size() / 4);
  std::memcpy(v.data(), bytes.data(), v.size() * 4);
  return v;
}

TEST(QuantDecode, EqualsGgufPyExactly) {
  int checked = 0;
  for (DType t : kAllDTypes) {
    if (!IsBlockType(t)) continue;
    SCOPED_TRACE(DTypeName(t));
    int nb = QuantTestBlocks(t);
    std::vector<uint8_t> blocks = RandomBlocks(t, nb, kQuantTestSeed);
    std::vector<float> want = ReadF32(std::string(MNEMO_QUANT_DATA_DIR) + "/" + DTypeName(t) + ".f32");
    size_t n = size_t(nb) * size_t(DTypeBlockElems(t));
    ASSERT_EQ(want.size(), n);
    std::vector<float> got(n);
    ToF32(t, blocks.data(), got.data(), n);
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
      // Bitwise: -0.0f must stay -0.0f as well.
      uint32_t a, b;
      std::memcpy(&a, &got[i], 4);
      std::memcpy(&b, &want[i], 4);
      if (a != b && bad++ < 5) ADD_FAILURE() << "element " << i << ": " << got[i] << " != " << want[i];
    }
    EXPECT_EQ(bad, 0);
    checked++;
  }
  EXPECT_EQ(checked, 12);
}

// Layout facts spelled out on hand-built blocks, so that a failure names the field at fault.
TEST(QuantDecode, Q4KScaleMinUnpacksSixBitFields) {
  uint8_t s[12] = {};
  s[1] = 0x3f;  // scale 1 = 63
  s[6] = 0x05;  // min 2 = 5
  s[9] = 0xA7;  // scale 5 low nibble 7, min 5 low nibble 10
  s[1] |= 0x40;  // scale 5 high bits = 1
  s[5] = 0x80;  // min 5 high bits = 2
  uint8_t sc, m;
  Q4KScaleMin(1, s, &sc, &m);
  EXPECT_EQ(sc, 63);
  Q4KScaleMin(2, s, &sc, &m);
  EXPECT_EQ(m, 5);
  Q4KScaleMin(5, s, &sc, &m);
  EXPECT_EQ(sc, 7 | 1 << 4);
  EXPECT_EQ(m, 10 | 2 << 4);
}

TEST(QuantDecode, Q3KHmaskSetMeansNoOffset) {
  BlockQ3_K b{};
  // All scales 33 (signed 1): low nibbles 1, high bits 2 (0b10 in each 2-bit field).
  for (int i = 0; i < 8; i++) b.scales[i] = 0x11;
  for (int i = 8; i < 12; i++) b.scales[i] = 0xAA;
  b.d = F32ToF16(1.0f);
  b.qs[0] = 0x03;         // element 0: q = 3
  b.hmask[0] = 0x01;      // element 0 high bit set: no subtraction
  b.qs[1] = 0x04;         // element 33 (half 0, shift 2, byte 1): q = 1, hbit clear
  std::vector<float> y(kQKK);
  ToF32(DType::Q3_K, &b, y.data(), kQKK);
  EXPECT_EQ(y[0], 3.0f);
  EXPECT_EQ(y[1], -4.0f);  // q = 0, high bit clear
  EXPECT_EQ(y[33], -3.0f);
}

}  // namespace
}  // namespace mnemo
