// GeluTanh, GeluTanhGated and SoftCapInPlace against double-precision references (both kernel
// paths: this binary runs again under MNEMO_KERNELS_PORTABLE=1).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "base/rng.h"
#include "kernels/cpu/activation.h"

namespace mnemo::kernels {
namespace {

double GeluRef(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * x * (1.0 + 0.044715 * x * x)));
}

TEST(CpuGeluTanh, KnownValues) {
  // gelu(1) = 0.5 (1 + tanh(0.79788456 * 1.044715)) = 0.8411920; gelu(-1) = gelu(1) - 1.
  EXPECT_NEAR(GeluTanh(1.0f), 0.841192f, 1e-6);
  EXPECT_NEAR(GeluTanh(-1.0f), -0.158808f, 1e-6);
  EXPECT_EQ(GeluTanh(0.0f), 0.0f);
  EXPECT_NEAR(GeluTanh(20.0f), 20.0f, 1e-5);
  EXPECT_NEAR(GeluTanh(-20.0f), 0.0f, 1e-6);
}

TEST(CpuGeluTanhGated, MatchesReference) {
  Rng rng(7);
  for (int ffn : {1, 15, 16, 33, 1152}) {
    for (int n : {1, 3, 70}) {  // 70 rows of 1152: enough to split over threads
      std::vector<float> gu(size_t(n) * 2 * ffn);
      for (float& x : gu) x = float(rng.Normal() * 3.0);
      gu[0] = 30.0f;
      if (ffn > 1) gu[1] = -30.0f;
      if (ffn > 2) gu[2] = 1e-4f;
      std::vector<float> out(size_t(n) * ffn, NAN);
      GeluTanhGated(gu.data(), n, ffn, out.data());
      for (int j = 0; j < n; j++) {
        for (int i = 0; i < ffn; i++) {
          const double g = gu[size_t(j) * 2 * ffn + i], u = gu[size_t(j) * 2 * ffn + ffn + i];
          const double ref = GeluRef(g) * u;
          ASSERT_NEAR(out[size_t(j) * ffn + i], ref, 2e-6 * (1 + std::fabs(ref))) << "ffn=" << ffn << " g=" << g;
        }
      }
    }
  }
}

TEST(CpuSoftCap, MatchesReferenceAndBounds) {
  Rng rng(8);
  for (float cap : {0.5f, 5.0f, 30.0f}) {
    for (size_t n : {1, 16, 17, 1000}) {
      std::vector<float> x(n);
      for (float& v : x) v = float(rng.Normal() * 20.0);
      x[0] = 1e6f;
      std::vector<float> y = x;
      SoftCapInPlace(y.data(), n, cap);
      for (size_t i = 0; i < n; i++) {
        const double ref = cap * std::tanh(double(x[i]) / cap);
        ASSERT_NEAR(y[i], ref, 1e-6 * cap) << "cap=" << cap << " x=" << x[i];
        ASSERT_LE(std::fabs(y[i]), cap);
      }
    }
  }
}

}  // namespace
}  // namespace mnemo::kernels
