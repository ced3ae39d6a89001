// RmsNorm, Rope, SwiGlu, AddInPlace against double-precision references.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "base/rng.h"
#include "kernels/cpu/ops.h"

namespace mnemo::kernels {
namespace {

std::vector<float> RandomVec(size_t n, Rng& rng, double scale = 1.0) {
  std::vector<float> v(n);
  for (float& x : v) x = float(rng.Normal() * scale);
  return v;
}

TEST(CpuRmsNorm, MatchesReference) {
  Rng rng(1);
  for (int dim : {1, 7, 16, 64, 100, 768}) {
    for (int n : {1, 3}) {
      std::vector<float> x = RandomVec(size_t(n) * dim, rng, 3.0), w = RandomVec(dim, rng);
      std::vector<float> y(x.size());
      const float eps = 1e-5f;
      RmsNorm(x.data(), w.data(), n, dim, eps, y.data());
      for (int i = 0; i < n; i++) {
        double ss = 0;
        for (int k = 0; k < dim; k++) ss += double(x[i * dim + k]) * x[i * dim + k];
        double inv = 1.0 / std::sqrt(ss / dim + eps);
        for (int k = 0; k < dim; k++) {
          double ref = x[i * dim + k] * inv * w[k];
          EXPECT_NEAR(y[i * dim + k], ref, 2e-6 * (1 + std::fabs(ref))) << dim << " " << i << " " << k;
        }
      }
      // In place gives the same values.
      std::vector<float> z = x;
      RmsNorm(z.data(), w.data(), n, dim, eps, z.data());
      EXPECT_EQ(z, y);
    }
  }
}

// Rotation angles as the contract states them, in double.
void RopeRef(std::vector<double>& x, const std::vector<int32_t>& pos, int n, int n_heads,
             int head_dim, int rope_dims, double theta) {
  for (int t = 0; t < n; t++) {
    for (int h = 0; h < n_heads; h++) {
      double* xh = x.data() + (size_t(t) * n_heads + h) * head_dim;
      for (int i = 0; 2 * i < rope_dims; i++) {
        double a = pos[t] * std::pow(theta, -2.0 * i / rope_dims);
        double c = std::cos(a), s = std::sin(a);
        double v0 = xh[2 * i], v1 = xh[2 * i + 1];
        xh[2 * i] = v0 * c - v1 * s;
        xh[2 * i + 1] = v0 * s + v1 * c;
      }
    }
  }
}

TEST(CpuRope, MatchesReference) {
  Rng rng(2);
  struct Shape {
    int n_heads, head_dim, rope_dims;
  };
  for (Shape s : {Shape{1, 2, 2}, Shape{3, 8, 8}, Shape{4, 64, 64}, Shape{2, 64, 32}, Shape{1, 600, 600}}) {
    const int n = 20;
    std::vector<int32_t> pos(n);
    for (int t = 0; t < n; t++) pos[t] = int32_t(rng.Next() % 3000) - (t % 5 == 0 ? 1500 : 0);
    pos[0] = 0;
    std::vector<float> x = RandomVec(size_t(n) * s.n_heads * s.head_dim, rng);
    std::vector<double> ref(x.begin(), x.end());
    Rope(x.data(), pos.data(), n, s.n_heads, s.head_dim, s.rope_dims, 10000.0f);
    RopeRef(ref, pos, n, s.n_heads, s.head_dim, s.rope_dims, 10000.0);
    for (size_t i = 0; i < x.size(); i++) {
      // The float angle pos * freq carries ~|pos| * 6e-8 rad of rounding, as in llama2.c.
      EXPECT_NEAR(x[i], ref[i], 1e-3) << i;
    }
    // Dimensions past rope_dims are untouched.
    if (s.rope_dims < s.head_dim) {
      std::vector<float> y = RandomVec(size_t(s.n_heads) * s.head_dim, rng), y0 = y;
      int32_t p = 77;
      Rope(y.data(), &p, 1, s.n_heads, s.head_dim, s.rope_dims, 10000.0f);
      for (int h = 0; h < s.n_heads; h++) {
        for (int d = s.rope_dims; d < s.head_dim; d++) EXPECT_EQ(y[h * s.head_dim + d], y0[h * s.head_dim + d]);
      }
    }
  }
}

// Small positions carry no angle rounding to speak of: then the match is tight.
TEST(CpuRope, TightAtSmallPositions) {
  Rng rng(3);
  const int n = 64, heads = 2, hd = 64;
  std::vector<int32_t> pos(n);
  for (int t = 0; t < n; t++) pos[t] = t;
  std::vector<float> x = RandomVec(size_t(n) * heads * hd, rng);
  std::vector<double> ref(x.begin(), x.end());
  Rope(x.data(), pos.data(), n, heads, hd, hd, 10000.0f);
  RopeRef(ref, pos, n, heads, hd, hd, 10000.0);
  for (size_t i = 0; i < x.size(); i++) EXPECT_NEAR(x[i], ref[i], 2e-5) << i;
}

TEST(CpuRope, RotationsCompose) {
  Rng rng(4);
  const int heads = 3, hd = 32;
  std::vector<float> a = RandomVec(size_t(heads) * hd, rng), b = a;
  int32_t p = 100, d = -37, sum = p + d;
  Rope(a.data(), &p, 1, heads, hd, hd, 10000.0f);
  Rope(a.data(), &d, 1, heads, hd, hd, 10000.0f);
  Rope(b.data(), &sum, 1, heads, hd, hd, 10000.0f);
  for (size_t i = 0; i < a.size(); i++) EXPECT_NEAR(a[i], b[i], 1e-4);
}

TEST(CpuSwiGlu, MatchesReference) {
  Rng rng(5);
  for (int ffn : {1, 15, 16, 33, 2048}) {
    const int n = 3;
    std::vector<float> gu = RandomVec(size_t(n) * 2 * ffn, rng, 4.0);
    gu[0] = 100.0f;
    if (ffn > 1) gu[1] = -100.0f;
    std::vector<float> out(size_t(n) * ffn);
    SwiGlu(gu.data(), n, ffn, out.data());
    for (int j = 0; j < n; j++) {
      for (int i = 0; i < ffn; i++) {
        double g = gu[size_t(j) * 2 * ffn + i], u = gu[size_t(j) * 2 * ffn + ffn + i];
        double ref = g / (1 + std::exp(-g)) * u;
        EXPECT_NEAR(out[size_t(j) * ffn + i], ref, 1e-6 * (1 + std::fabs(ref))) << ffn << " " << i;
      }
    }
  }
}

TEST(CpuAddInPlace, MatchesReference) {
  Rng rng(6);
  for (size_t n : {size_t(1), size_t(17), size_t(1000)}) {
    std::vector<float> y = RandomVec(n, rng), x = RandomVec(n, rng), ref(n);
    for (size_t i = 0; i < n; i++) ref[i] = y[i] + x[i];
    AddInPlace(y.data(), x.data(), n);
    EXPECT_EQ(y, ref);
  }
}

}  // namespace
}  // namespace mnemo::kernels
