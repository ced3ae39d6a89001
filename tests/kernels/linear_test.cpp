// Linear (y = x W^T) for every weight dtype and precision against a double-precision reference.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <fstream>
#include <thread>
#include <vector>

#include "base/cpu.h"
#include "base/dtype.h"
#include "base/rng.h"
#include "kernels/cpu/gemv.h"
#include "kernels/cpu/linear.h"
#include "random_blocks.h"

namespace mnemo::kernels {
namespace {

struct Weights {
  std::vector<uint8_t> raw;  // [out, in] of dtype
  std::vector<float> exact;  // [out, in]: the values raw holds, in f32
};

Weights MakeWeights(DType t, int out, int in, Rng& rng) {
  std::vector<float> w(size_t(out) * in);
  for (float& v : w) v = float(rng.Normal());
  Weights r;
  r.raw.resize(DTypeBytes(t, w.size()));
  FromF32(t, w.data(), r.raw.data(), w.size());
  r.exact.resize(w.size());
  ToF32(t, r.raw.data(), r.exact.data(), w.size());
  return r;
}

std::vector<float> RandomVec(size_t n, Rng& rng) {
  std::vector<float> v(n);
  for (float& x : v) x = float(rng.Normal());
  return v;
}

float RoundBf16(float v) { return Bf16ToF32(F32ToBf16(v)); }

// Activation quantisation of the q8_0 fast path, written out independently: per 32-block,
// d = max|x| / 127 and q = round-to-even(x * 127 / max|x|).
void QuantizeRef(const float* x, int in, std::vector<double>* xq) {
  xq->resize(in);
  for (int b = 0; b < in; b += 32) {
    float amax = 0;
    for (int k = 0; k < 32; k++) amax = std::max(amax, std::fabs(x[b + k]));
    const float id = amax > 0 ? 127.0f / amax : 0.0f;
    const double d = double(amax / 127.0f);
    for (int k = 0; k < 32; k++) (*xq)[b + k] = d * std::nearbyint(x[b + k] * id);
  }
}

enum class RefKind {
  kExact,     // f32 values as given
  kBf16,      // x and W rounded to bf16
  kQ8Acts,    // x quantised per 32-block to int8
};

// y_ref[j, o] and the scale sum_k |x w| that bounds rounding errors.
void Reference(const std::vector<float>& w, const std::vector<float>& x, int n, int out, int in,
               RefKind kind, std::vector<double>* y, std::vector<double>* mag) {
  y->assign(size_t(n) * out, 0);
  mag->assign(size_t(n) * out, 0);
  std::vector<double> xr(in);
  for (int j = 0; j < n; j++) {
    const float* xj = x.data() + size_t(j) * in;
    if (kind == RefKind::kQ8Acts) {
      QuantizeRef(xj, in, &xr);
    } else {
      for (int k = 0; k < in; k++) xr[k] = kind == RefKind::kBf16 ? RoundBf16(xj[k]) : xj[k];
    }
    for (int o = 0; o < out; o++) {
      double acc = 0, m = 0;
      for (int k = 0; k < in; k++) {
        double wv = w[size_t(o) * in + k];
        if (kind == RefKind::kBf16) wv = RoundBf16(float(wv));
        acc += xr[k] * wv;
        m += std::fabs(xr[k] * wv);
      }
      (*y)[size_t(j) * out + o] = acc;
      (*mag)[size_t(j) * out + o] = m;
    }
  }
}

// Max over outputs of |y - ref| / (mag + tiny): the error relative to the sum of |terms|.
double MaxRelError(const std::vector<float>& y, const std::vector<double>& ref,
                   const std::vector<double>& mag) {
  double worst = 0;
  for (size_t i = 0; i < y.size(); i++) {
    if (!std::isfinite(y[i])) return INFINITY;
    worst = std::max(worst, std::fabs(y[i] - ref[i]) / (mag[i] + 1e-6));
  }
  return worst;
}

struct Case {
  int out, in;
};

void CheckLinear(DType t, Precision p, const Case& c, const std::vector<int>& ns, uint64_t seed) {
  Rng rng(seed);
  Weights w = MakeWeights(t, c.out, c.in, rng);
  Linear lin = Linear::Create(t, w.raw.data(), c.out, c.in, p);
  ASSERT_EQ(lin.out(), c.out);
  ASSERT_EQ(lin.in(), c.in);
  ASSERT_GT(lin.weight_bytes(), 0u);
  for (int n : ns) {
    SCOPED_TRACE(testing::Message() << DTypeName(t) << " prec=" << int(p) << " out=" << c.out
                                    << " in=" << c.in << " n=" << n);
    std::vector<float> x = RandomVec(size_t(n) * c.in, rng);
    std::vector<float> y(size_t(n) * c.out, NAN);
    lin.Forward(x.data(), n, y.data());
    std::vector<double> ref, mag;
    if (p == Precision::kF32) {
      Reference(w.exact, x, n, c.out, c.in, RefKind::kExact, &ref, &mag);
      EXPECT_LT(MaxRelError(y, ref, mag), 1e-5);
    } else if (t == DType::Q8_0) {
      Reference(w.exact, x, n, c.out, c.in, RefKind::kQ8Acts, &ref, &mag);
      EXPECT_LT(MaxRelError(y, ref, mag), 1e-5);
      Reference(w.exact, x, n, c.out, c.in, RefKind::kExact, &ref, &mag);
      EXPECT_LT(MaxRelError(y, ref, mag), 2e-2);
    } else {
      Reference(w.exact, x, n, c.out, c.in, RefKind::kBf16, &ref, &mag);
      EXPECT_LT(MaxRelError(y, ref, mag), 1e-5);
      Reference(w.exact, x, n, c.out, c.in, RefKind::kExact, &ref, &mag);
      EXPECT_LT(MaxRelError(y, ref, mag), 1e-2);
    }
  }
}

// Row counts around the GEMV / GEMM switch and the GEMM row buckets.
const std::vector<int> kRows = {1, 2, 3, 5, 8, 9, 17, 40};

TEST(CpuLinear, F32WeightsExactPath) {
  for (Case c : {Case{1, 1}, Case{37, 96}, Case{130, 200}, Case{65, 33}}) {
    CheckLinear(DType::F32, Precision::kF32, c, kRows, 1);
  }
}

TEST(CpuLinear, F16AndBf16WeightsExactPath) {
  for (DType t : {DType::F16, DType::BF16}) {
    for (Case c : {Case{37, 96}, Case{130, 200}}) CheckLinear(t, Precision::kF32, c, kRows, 2);
  }
}

TEST(CpuLinear, Q8WeightsExactPath) {
  for (Case c : {Case{37, 96}, Case{130, 224}}) CheckLinear(DType::Q8_0, Precision::kF32, c, kRows, 3);
}

TEST(CpuLinear, Bf16PathFromF32F16Bf16) {
  for (DType t : {DType::F32, DType::F16, DType::BF16}) {
    for (Case c : {Case{1, 1}, Case{37, 96}, Case{130, 200}, Case{64, 32}, Case{200, 70}}) {
      CheckLinear(t, Precision::kBF16, c, kRows, 4);
    }
  }
}

TEST(CpuLinear, Bf16PathQ8Weights) {
  for (Case c : {Case{1, 32}, Case{37, 96}, Case{130, 224}, Case{16, 64}}) {
    CheckLinear(DType::Q8_0, Precision::kBF16, c, kRows, 5);
  }
}

// A trained matrix: the token embedding table of stories260K (llama2.c checkpoint: 7 int32 of
// config, then [vocab, dim] f32), used as the classifier it also is, in every dtype and path.
TEST(CpuLinear, RealWeightsStories260K) {
  std::ifstream f(MNEMO_SHARED_DIR "/models/stories260K/stories260K.bin", std::ios::binary);
  ASSERT_TRUE(f) << "missing stories260K.bin";
  int32_t cfg[7];
  f.read(reinterpret_cast<char*>(cfg), sizeof(cfg));
  const int dim = cfg[0], vocab = std::abs(cfg[5]);
  ASSERT_EQ(dim, 64);
  ASSERT_EQ(vocab, 512);
  std::vector<float> emb(size_t(vocab) * dim);
  f.read(reinterpret_cast<char*>(emb.data()), emb.size() * sizeof(float));
  ASSERT_TRUE(f);
  Rng rng(11);
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q8_0}) {
    std::vector<uint8_t> raw(DTypeBytes(t, emb.size()));
    FromF32(t, emb.data(), raw.data(), emb.size());
    std::vector<float> exact(emb.size());
    ToF32(t, raw.data(), exact.data(), emb.size());
    for (Precision p : {Precision::kF32, Precision::kBF16}) {
      Linear lin = Linear::Create(t, raw.data(), vocab, dim, p);
      for (int n : {1, 7, 20}) {
        SCOPED_TRACE(testing::Message() << DTypeName(t) << " prec=" << int(p) << " n=" << n);
        std::vector<float> x = RandomVec(size_t(n) * dim, rng), y(size_t(n) * vocab);
        lin.Forward(x.data(), n, y.data());
        std::vector<double> ref, mag;
        RefKind kind = p == Precision::kF32 ? RefKind::kExact
                       : t == DType::Q8_0   ? RefKind::kQ8Acts
                                            : RefKind::kBf16;
        Reference(exact, x, n, vocab, dim, kind, &ref, &mag);
        EXPECT_LT(MaxRelError(y, ref, mag), 1e-5);
      }
    }
  }
}

// More rows than one oneDNN call takes (the GEMM runs in row chunks).
TEST(CpuLinear, ManyRows) {
  CheckLinear(DType::F32, Precision::kF32, Case{24, 40}, {530}, 6);
  CheckLinear(DType::BF16, Precision::kBF16, Case{24, 40}, {530}, 7);
  CheckLinear(DType::Q8_0, Precision::kBF16, Case{24, 64}, {530}, 8);
  // Enough activations (n * in >= 64 K) to be converted / quantised in parallel.
  CheckLinear(DType::BF16, Precision::kBF16, Case{24, 256}, {300}, 12);
  CheckLinear(DType::Q8_0, Precision::kBF16, Case{24, 256}, {300}, 13);
}

TEST(CpuLinear, SameResultWithOneThread) {
  Rng rng(9);
  const int out = 300, in = 128;
  for (DType t : {DType::F32, DType::BF16, DType::Q8_0}) {
    for (Precision p : {Precision::kF32, Precision::kBF16}) {
      Weights w = MakeWeights(t, out, in, rng);
      Linear lin = Linear::Create(t, w.raw.data(), out, in, p);
      for (int n : {1, 4}) {
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
}

// Two threads running Linears of the same shapes at once (an engine thread and a second model)
// get exactly what each gets alone: no state is shared between calls (oneDNN's default
// per-primitive scratchpad was, and corrupted results).
TEST(CpuLinear, ConcurrentCallersGetTheirOwnResults) {
  Rng rng(10);
  const int out = 256, in = 192;
  for (auto [t, p] : {std::pair{DType::F32, Precision::kF32}, std::pair{DType::BF16, Precision::kBF16},
                      std::pair{DType::Q8_0, Precision::kBF16}}) {
    Weights w = MakeWeights(t, out, in, rng);
    Linear lin = Linear::Create(t, w.raw.data(), out, in, p);
    std::vector<std::vector<float>> xs, want;
    for (int c = 0; c < 2; c++) {
      for (int n : {1, 5, 64, 200}) {
        xs.push_back(RandomVec(size_t(n) * in, rng));
        want.emplace_back(size_t(n) * out);
        lin.Forward(xs.back().data(), n, want.back().data());
      }
    }
    std::atomic<int> mismatches{0};
    std::vector<std::thread> callers;
    for (int c = 0; c < 2; c++) {
      callers.emplace_back([&, c] {
        for (int rep = 0; rep < 200; rep++) {
          const int i = c * 4 + rep % 4;
          const int n = int(xs[i].size()) / in;
          std::vector<float> y(size_t(n) * out);
          lin.Forward(xs[i].data(), n, y.data());
          if (y != want[i]) mismatches++;
        }
      });
    }
    for (auto& th : callers) th.join();
    EXPECT_EQ(mismatches.load(), 0) << DTypeName(t);
  }
}

// The portable kernels (taken on CPUs without AVX-512) against the AVX-512 ones, when present.
TEST(CpuLinearKernels, PortableMatchesAvx512) {
  const CpuFeatures& f = GetCpuFeatures();
  Rng rng(10);
  const int out = 100, in = 96, n = 3;
  std::vector<float> x = RandomVec(size_t(n) * in, rng);
  Weights w = MakeWeights(DType::F32, out, in, rng);
  std::vector<float> y1(size_t(n) * out), y2(size_t(n) * out);
  auto close = [&](double tol) {
    for (size_t i = 0; i < y1.size(); i++) EXPECT_NEAR(y1[i], y2[i], tol * (1 + std::fabs(y1[i])));
  };
  if (f.avx512f) {
    detail::GemvF32Ref(w.exact.data(), in, x.data(), n, 0, out, y1.data(), out);
    detail::GemvF32Avx512(w.exact.data(), in, x.data(), n, 0, out, y2.data(), out);
    close(1e-5);
    std::vector<uint16_t> b1(x.size() + 5), b2(x.size() + 5);
    std::vector<float> xs = x;
    xs.insert(xs.end(), {1e30f, -0.0f, NAN, 3.0f, 1.0f / 3});
    detail::F32ToBf16Ref(xs.data(), b1.data(), xs.size());
    detail::F32ToBf16Avx512(xs.data(), b2.data(), xs.size());
    EXPECT_EQ(b1, b2);
    std::vector<uint8_t> q1(size_t(n) * in), q2(size_t(n) * in);
    std::vector<float> d1(n * in / 32), d2(n * in / 32);
    detail::QuantizeActQ8Ref(x.data(), n, in, q1.data(), d1.data());
    detail::QuantizeActQ8Avx512(x.data(), n, in, q2.data(), d2.data());
    EXPECT_EQ(q1, q2);
    EXPECT_EQ(d1, d2);
  }
  if (f.avx512_bf16) {
    detail::Bf16Blocked s = detail::Bf16Shape(out, in);
    std::vector<uint16_t> wb(size_t(s.out_pad) * s.in_pad), xb(size_t(n) * s.in_pad);
    detail::PackBf16Blocked(DType::F32, w.exact.data(), s, wb.data());
    for (int j = 0; j < n; j++) detail::F32ToBf16Ref(x.data() + j * in, xb.data() + j * s.in_pad, in);
    detail::GemvBf16Ref(wb.data(), s, xb.data(), n, 0, out, y1.data(), out);
    detail::GemvBf16Avx512(wb.data(), s, xb.data(), n, 0, out, y2.data(), out);
    close(1e-5);
  }
  if (f.avx512f) {
    detail::Bf16Blocked s = detail::Bf16Shape(out, in);
    std::vector<uint16_t> wb(size_t(s.out_pad) * s.in_pad), xb(size_t(n) * s.in_pad);
    detail::PackBf16Blocked(DType::F32, w.exact.data(), s, wb.data());
    for (int j = 0; j < n; j++) detail::F32ToBf16Ref(x.data() + j * in, xb.data() + j * s.in_pad, in);
    detail::GemvBf16Ref(wb.data(), s, xb.data(), n, 0, out, y1.data(), out);
    detail::GemvBf16Avx512NoBf16(wb.data(), s, xb.data(), n, 0, out, y2.data(), out);
    close(1e-5);
  }
  if (f.avx512_vnni) {
    Weights wq = MakeWeights(DType::Q8_0, out, in, rng);
    detail::Q8Packed s{out, in, (out + 15) / 16 * 16};
    std::vector<uint8_t> packed(size_t(s.out_pad / 16) * (in / 32) * detail::kQ8RecordBytes);
    detail::PackQ8(reinterpret_cast<const BlockQ8_0*>(wq.raw.data()), s, packed.data());
    std::vector<uint8_t> xq(size_t(n) * in);
    std::vector<float> xd(n * in / 32);
    detail::QuantizeActQ8Ref(x.data(), n, in, xq.data(), xd.data());
    detail::GemvQ8Ref(packed.data(), s, xq.data(), xd.data(), n, 0, out, y1.data(), out);
    detail::GemvQ8Avx512(packed.data(), s, xq.data(), xd.data(), n, 0, out, y2.data(), out);
    close(1e-5);
  }
}

// The portable kernels against the AVX2 ones (taken on CPUs with AVX2 but no AVX-512; any
// AVX-512 CPU has AVX2 too, so this runs there as well). Shapes with partial tiles and tails:
// 100 outputs (64- and 16-output blocks cut), f32 inputs not a multiple of 8, and 1 row (the
// single-pass bf16 kernel) as well as several (the row-group ones).
TEST(CpuLinearKernels, PortableMatchesAvx2) {
  const CpuFeatures& f = GetCpuFeatures();
  if (!f.avx2 || !f.fma || !f.f16c) GTEST_SKIP() << "no AVX2 + FMA + F16C";
  Rng rng(11);
  const int out = 100, in = 96;
  for (int n : {1, 3, 7}) {
    std::vector<float> x = RandomVec(size_t(n) * in, rng);
    std::vector<float> y1(size_t(n) * out), y2(size_t(n) * out);
    auto close = [&](double tol) {
      for (size_t i = 0; i < y1.size(); i++) EXPECT_NEAR(y1[i], y2[i], tol * (1 + std::fabs(y1[i]))) << "n=" << n;
    };
    for (int fin : {in, 101}) {  // 101: a masked tail of 5
      std::vector<float> xf = RandomVec(size_t(n) * fin, rng);
      Weights w = MakeWeights(DType::F32, out, fin, rng);
      detail::GemvF32Ref(w.exact.data(), fin, xf.data(), n, 0, out, y1.data(), out);
      detail::GemvF32Avx2(w.exact.data(), fin, xf.data(), n, 0, out, y2.data(), out);
      close(1e-5);
    }
    std::vector<uint16_t> b1(x.size() + 5), b2(x.size() + 5);
    std::vector<float> xs = x;
    xs.insert(xs.end(), {1e30f, -0.0f, NAN, 3.0f, 1.0f / 3});
    detail::F32ToBf16Ref(xs.data(), b1.data(), xs.size());
    detail::F32ToBf16Avx2(xs.data(), b2.data(), xs.size());
    EXPECT_EQ(b1, b2);
    std::vector<uint8_t> q1(size_t(n) * in), q2(size_t(n) * in);
    std::vector<float> d1(n * in / 32), d2(n * in / 32);
    detail::QuantizeActQ8Ref(x.data(), n, in, q1.data(), d1.data());
    detail::QuantizeActQ8Avx2(x.data(), n, in, q2.data(), d2.data());
    EXPECT_EQ(q1, q2);
    EXPECT_EQ(d1, d2);

    Weights w = MakeWeights(DType::F32, out, in, rng);
    detail::Bf16Blocked bs = detail::Bf16Shape(out, in);
    std::vector<uint16_t> wb(size_t(bs.out_pad) * bs.in_pad), xb(size_t(n) * bs.in_pad);
    detail::PackBf16Blocked(DType::F32, w.exact.data(), bs, wb.data());
    for (int j = 0; j < n; j++) detail::F32ToBf16Ref(x.data() + j * in, xb.data() + j * bs.in_pad, in);
    detail::GemvBf16Ref(wb.data(), bs, xb.data(), n, 0, out, y1.data(), out);
    detail::GemvBf16Avx2(wb.data(), bs, xb.data(), n, 0, out, y2.data(), out);
    close(1e-5);

    // Every int8 pattern, -128 included (|w| = 128 still fits vpmaddubsw's unsigned operand).
    std::vector<uint8_t> raw = RandomBlocks(DType::Q8_0, out, in, rng);
    detail::Q8Packed s{out, in, (out + 15) / 16 * 16};
    std::vector<uint8_t> packed(size_t(s.out_pad / 16) * (in / 32) * detail::kQ8RecordBytes);
    detail::PackQ8(reinterpret_cast<const BlockQ8_0*>(raw.data()), s, packed.data());
    detail::GemvQ8Ref(packed.data(), s, q1.data(), d1.data(), n, 0, out, y1.data(), out);
    detail::GemvQ8Avx2(packed.data(), s, q1.data(), d1.data(), n, 0, out, y2.data(), out);
    close(1e-5);
  }
}

}  // namespace
}  // namespace mnemo::kernels
