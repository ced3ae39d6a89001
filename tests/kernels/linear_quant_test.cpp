// Linear with ggml block-type weights (Q4_0 .. IQ4_XS) on both precisions, against a scalar
// reference built on ToF32 (base/quant.cpp, an independent decoder of the same blocks), and the
// portable block kernels against the AVX-512 ones.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <vector>

#include "base/cpu.h"
#include "base/dtype.h"
#include "base/rng.h"
#include "kernels/cpu/gemv_quant.h"
#include "kernels/cpu/linear.h"
#include "random_blocks.h"

namespace mnemo::kernels {
namespace {

struct Weights {
  std::vector<uint8_t> raw;  // [out, in] blocks of the type
  std::vector<float> exact;  // [out, in]: their values (ToF32)
};

Weights RandomWeights(DType t, int out, int in, Rng& rng) {
  Weights w;
  w.raw = RandomBlocks(t, out, in, rng);
  w.exact.resize(size_t(out) * in);
  ToF32(t, w.raw.data(), w.exact.data(), w.exact.size());
  return w;
}

// Activations as the fast path quantises them, written out independently: per 32-block
// d = max|x| / 127, q = round-to-even(x * 127 / max|x|); value d * q.
std::vector<double> QuantizedActs(const float* x, int in) {
  std::vector<double> r(in);
  for (int b = 0; b < in; b += 32) {
    float amax = 0;
    for (int k = 0; k < 32; k++) amax = std::max(amax, std::fabs(x[b + k]));
    const float id = amax > 0 ? 127.0f / amax : 0.0f;
    const double d = double(amax / 127.0f);
    for (int k = 0; k < 32; k++) r[b + k] = d * std::nearbyint(x[b + k] * id);
  }
  return r;
}

// max over outputs of |y - sum_k w x'| / sum_k |w x'|, x' = x or its quantised form.
double MaxRelError(const std::vector<float>& w, const std::vector<float>& x, int n, int out, int in,
                   const std::vector<float>& y, bool quantised_acts) {
  double worst = 0;
  for (int j = 0; j < n; j++) {
    std::vector<double> xr = QuantizedActs(x.data() + size_t(j) * in, in);
    if (!quantised_acts) {
      for (int k = 0; k < in; k++) xr[k] = x[size_t(j) * in + k];
    }
    for (int o = 0; o < out; o++) {
      double acc = 0, mag = 0;
      for (int k = 0; k < in; k++) {
        const double p = double(w[size_t(o) * in + k]) * xr[k];
        acc += p;
        mag += std::fabs(p);
      }
      const float v = y[size_t(j) * out + o];
      if (!std::isfinite(v)) return INFINITY;
      worst = std::max(worst, std::fabs(v - acc) / (mag + 1e-6));
    }
  }
  return worst;
}

std::vector<float> RandomVec(size_t n, Rng& rng) {
  std::vector<float> v(n);
  for (float& x : v) x = float(rng.Normal());
  return v;
}

void CheckType(DType t, Precision p, int out, int in, const std::vector<int>& ns, uint64_t seed) {
  Rng rng(seed);
  Weights w = RandomWeights(t, out, in, rng);
  Linear lin = Linear::Create(t, w.raw.data(), out, in, p);
  if (p == Precision::kBF16) {
    // Kept at the file's size (within the per-output header of the panels), not expanded.
    EXPECT_LE(lin.weight_bytes(), w.raw.size() * 1.2 + 64 * 16) << DTypeName(t);
  }
  for (int n : ns) {
    SCOPED_TRACE(testing::Message() << DTypeName(t) << " prec=" << int(p) << " out=" << out
                                    << " in=" << in << " n=" << n);
    std::vector<float> x = RandomVec(size_t(n) * in, rng);
    std::vector<float> y(size_t(n) * out, NAN);
    lin.Forward(x.data(), n, y.data());
    if (p == Precision::kF32) {
      EXPECT_LT(MaxRelError(w.exact, x, n, out, in, y, false), 1e-5);
    } else {
      // Exact arithmetic on the quantised activations, up to f32 rounding.
      EXPECT_LT(MaxRelError(w.exact, x, n, out, in, y, true), 1e-5);
      // Against the unquantised activations: each x moves by at most max|x| / 254 of its
      // 32-block, ~1/250 of a typical term; 2e-2 of sum |w x| bounds that with margin (the
      // same bound as for q8_0 weights in linear_test).
      EXPECT_LT(MaxRelError(w.exact, x, n, out, in, y, false), 2e-2);
    }
  }
}

TEST(CpuLinearQuant, EveryBlockTypeBothPrecisions) {
  uint64_t seed = 100;
  for (DType t : kQTypes) {
    const int g = DTypeBlockElems(t);
    for (Precision p : {Precision::kF32, Precision::kBF16}) {
      // out not a multiple of 16 (padded panels), 1 .. several groups per row.
      CheckType(t, p, 37, g, {1, 3, 8, 9}, seed++);
      CheckType(t, p, 130, 3 * g, {1, 2, 5, 17, 40}, seed++);
    }
  }
}

TEST(CpuLinearQuant, ManyRowsInParallel) {
  // n * in >= 64 K: activations are quantised in parallel row ranges.
  CheckType(DType::Q4_K, Precision::kBF16, 48, 512, {300}, 7);
  CheckType(DType::Q6_K, Precision::kBF16, 40, 256, {260}, 8);
}

TEST(CpuLinearQuant, SameResultWithOneThread) {
  Rng rng(9);
  const int out = 300, in = 512;
  for (DType t : {DType::Q4_K, DType::Q6_K, DType::Q4_0}) {
    Weights w = RandomWeights(t, out, in, rng);
    Linear lin = Linear::Create(t, w.raw.data(), out, in, Precision::kBF16);
    for (int n : {1, 4, 20}) {
      std::vector<float> x = RandomVec(size_t(n) * in, rng);
      std::vector<float> y1(size_t(n) * out), y2(size_t(n) * out);
      const int saved = NumThreads();
      lin.Forward(x.data(), n, y1.data());
      SetNumThreads(1);
      lin.Forward(x.data(), n, y2.data());
      SetNumThreads(saved);
      EXPECT_EQ(y1, y2) << DTypeName(t) << " n=" << n;
    }
  }
}

// The portable block kernels against a SIMD family's (quantiser and GEMV), on the same packed
// weights; n = 5 rows (row groups of 4 and 1 on AVX2, of 5 on AVX-512), 40 outputs (a cut panel).
using QuantizeFn = void (*)(const float*, int, int, int8_t*, detail::QActBlock*);
using GemvQFn = void (*)(const uint8_t*, const detail::QPacked&, const detail::QActs&, int, int, int, float*, int);
void ExpectPortableMatches(QuantizeFn quantize, GemvQFn gemv, uint64_t seed) {
  Rng rng(seed);
  for (DType t : kQTypes) {
    const int out = 40, in = 2 * DTypeBlockElems(t), n = 5;
    Weights w = RandomWeights(t, out, in, rng);
    detail::QPacked s = detail::QShape(t, out, in);
    std::vector<uint8_t> packed(s.Bytes());
    detail::PackQ(w.raw.data(), s, packed.data());
    std::vector<float> x = RandomVec(size_t(n) * in, rng);
    x[5] = 0;  // a zero and a tie-ish value inside the first block
    x[6] = 0.5f * x[7];
    std::vector<int8_t> q1(size_t(n) * in), q2(size_t(n) * in);
    std::vector<detail::QActBlock> b1(n * in / 32), b2(n * in / 32);
    detail::QuantizeActS8Ref(x.data(), n, in, q1.data(), b1.data());
    quantize(x.data(), n, in, q2.data(), b2.data());
    EXPECT_EQ(q1, q2) << DTypeName(t);
    for (size_t i = 0; i < b1.size(); i++) {
      EXPECT_EQ(b1[i].dx, b2[i].dx);
      EXPECT_EQ(b1[i].dxs32, b2[i].dxs32);
      for (int h = 0; h < 2; h++) {
        EXPECT_EQ(b1[i].qsum[h], b2[i].qsum[h]);
        EXPECT_EQ(b1[i].dxs[h], b2[i].dxs[h]);
      }
    }
    const detail::QActs acts{q1.data(), b1.data()};
    std::vector<float> y1(size_t(n) * out), y2(size_t(n) * out);
    detail::GemvQRef(packed.data(), s, acts, n, 0, out, y1.data(), out);
    gemv(packed.data(), s, acts, n, 0, out, y2.data(), out);
    // The two differ in f32 summation order only: bound by the largest output (terms cancel,
    // so a single output can be far smaller than the terms that made it).
    double ymax = 0;
    for (float v : y1) ymax = std::max(ymax, double(std::fabs(v)));
    for (size_t i = 0; i < y1.size(); i++) {
      EXPECT_NEAR(y1[i], y2[i], 1e-5 * ymax) << DTypeName(t) << " i=" << i;
    }
  }
}

// The portable kernels (taken on CPUs without AVX2 and under MNEMO_KERNELS=portable) against
// the AVX-512 ones and the AVX2 ones, where the CPU has them.
TEST(CpuLinearQuantKernels, PortableMatchesAvx512) {
  const CpuFeatures& f = GetCpuFeatures();
  if (!f.avx512f || !f.avx512_vnni) GTEST_SKIP() << "no AVX512-VNNI";
  ExpectPortableMatches(detail::QuantizeActS8Avx512, detail::GemvQAvx512, 12);
}

TEST(CpuLinearQuantKernels, PortableMatchesAvx2) {
  const CpuFeatures& f = GetCpuFeatures();
  if (!f.avx2 || !f.fma || !f.f16c) GTEST_SKIP() << "no AVX2 + FMA + F16C";
  ExpectPortableMatches(detail::QuantizeActS8Avx2, detail::GemvQAvx2, 13);
}

}  // namespace
}  // namespace mnemo::kernels
