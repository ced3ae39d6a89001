#include "base/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "base/rng.h"

namespace mnemo {
namespace {

TEST(DType, F16RoundTripsEveryHalf) {
  for (uint32_t h = 0; h < 0x10000; h++) {
    float f = F16ToF32(uint16_t(h));
    if (std::isnan(f)) continue;
    EXPECT_EQ(F32ToF16(f), h) << std::hex << h;
  }
}

TEST(DType, F16RoundsToNearestEven) {
  EXPECT_EQ(F32ToF16(1.0f), 0x3c00);
  EXPECT_EQ(F32ToF16(1.0f + 1.0f / 2048), 0x3c00);           // tie -> even
  EXPECT_EQ(F32ToF16(1.0f + 3.0f / 2048), 0x3c02);           // tie -> even (up)
  EXPECT_EQ(F32ToF16(65520.0f), 0x7c00);                     // rounds to inf
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -25)), 0x0000);        // tie at smallest subnormal -> 0
  EXPECT_EQ(F32ToF16(std::ldexp(1.5f, -25)), 0x0001);
}

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(F32ToBf16(1.0f), 0x3f80);
  EXPECT_EQ(Bf16ToF32(F32ToBf16(3.140625f)), 3.140625f);
  EXPECT_TRUE(std::isnan(Bf16ToF32(F32ToBf16(NAN))));
}

TEST(DType, Q8RoundTripWithinHalfStep) {
  Rng rng(7);
  std::vector<float> x(256), y(256);
  for (auto& v : x) v = float(rng.Normal());
  std::vector<BlockQ8_0> q(256 / 32);
  FromF32(DType::Q8_0, x.data(), q.data(), x.size());
  ToF32(DType::Q8_0, q.data(), y.data(), y.size());
  for (int b = 0; b < 8; b++) {
    float d = F16ToF32(q[b].d);
    for (int i = 0; i < 32; i++) EXPECT_LE(std::fabs(x[b * 32 + i] - y[b * 32 + i]), 0.57f * d  /* half a step plus the f16 rounding of d times 127 */);
  }
}

}  // namespace
}  // namespace mnemo
