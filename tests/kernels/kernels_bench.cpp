// Microbenchmark of the CPU kernels at llama-110m shapes (dim 768, ffn 2048, 12 heads, 4 KV heads,
// head_dim 64, vocab 32000). Not a test: prints GFLOP/s for GEMM, GB/s of weight streaming for
// GEMV, and attention timings. Usage: kernels_bench [--quick] [--threads N]
// [--cpu-time] [--only linear|quant|crossover|f32gemm|attention|ops]
#include <cblas.h>
#include <omp.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "base/block.h"
#include "base/cpu.h"
#include "base/dtype.h"
#include "base/rng.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/buffer.h"
#include "kernels/cpu/gemv.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/matmul_dnnl.h"
#include "kernels/cpu/ops.h"
#include "random_blocks.h"

using namespace mnemo;
using namespace mnemo::kernels;

namespace {

// --cpu-time: the calling thread's CPU time instead of wall time. With --threads 1 every kernel
// runs on the calling thread, so this measures the kernels' work even while other processes
// share the cores (time spent descheduled is not counted; cache and memory contention are).
bool g_cpu_time = false;

double Now() {
  if (g_cpu_time) {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Best time of several repetitions (the machine is shared: the minimum is the least disturbed).
double TimeIt(const std::function<void()>& fn, double budget_s) {
  fn();  // warm up: primitive creation, page faults
  double best = 1e30, start = Now();
  int reps = 0;
  do {
    double t0 = Now();
    fn();
    best = std::min(best, Now() - t0);
    reps++;
  } while ((Now() - start < budget_s || reps < 3) && reps < 1000);
  return best;
}

std::vector<float> RandomVec(size_t n, Rng& rng) {
  std::vector<float> v(n);
  for (float& x : v) x = float(rng.Normal() * 0.5);
  return v;
}

struct Shape {
  const char* name;
  int out, in;
};
const Shape kShapes[] = {{"qkv  ", 1280, 768}, {"gate+up", 4096, 768}, {"down ", 768, 2048},
                         {"vocab", 32000, 768}};

struct Mode {
  const char* name;
  DType t;
  Precision p;
};
const Mode kModes[] = {{"f32/kF32", DType::F32, Precision::kF32},
                       {"bf16/kBF16", DType::BF16, Precision::kBF16},
                       {"q8_0/kBF16", DType::Q8_0, Precision::kBF16}};

void BenchLinear(double budget) {
  Rng rng(1);
  printf("== Linear: GEMM n=512 (GFLOP/s) and GEMV n=1 (GB/s of weights; copies cycled so that\n"
         "   >= 256 MB are streamed from DRAM, as a decode step streams the whole model), %d threads\n",
         NumThreads());
  for (const Mode& m : kModes) {
    for (const Shape& s : kShapes) {
      std::vector<float> w = RandomVec(size_t(s.out) * s.in, rng);
      std::vector<uint8_t> raw(DTypeBytes(m.t, w.size()));
      FromF32(m.t, w.data(), raw.data(), w.size());
      std::vector<Linear> lins;
      lins.push_back(Linear::Create(m.t, raw.data(), s.out, s.in, m.p));
      // F32 weights on the exact path are used in place: copy them so each Linear has its own.
      std::vector<std::vector<uint8_t>> copies;
      const size_t copies_wanted = std::max<size_t>(1, (size_t(256) << 20) / lins[0].weight_bytes());
      copies.reserve(copies_wanted);
      while (lins.size() < copies_wanted) {
        copies.push_back(raw);
        lins.push_back(Linear::Create(m.t, copies.back().data(), s.out, s.in, m.p));
      }
      std::vector<float> x = RandomVec(size_t(512) * s.in, rng), y(size_t(512) * s.out);
      double t512 = TimeIt([&] { lins[0].Forward(x.data(), 512, y.data()); }, budget);
      size_t next = 0;
      double t1 = TimeIt([&] { lins[next++ % lins.size()].Forward(x.data(), 1, y.data()); }, budget);
      printf("%-11s %-8s [%5d x %4d]  n=512: %7.1f GFLOP/s (%6.2f ms)   n=1: %6.1f GB/s (%7.1f us)\n",
             m.name, s.name, s.out, s.in, 2.0 * 512 * s.out * s.in / t512 / 1e9, t512 * 1e3,
             lins[0].weight_bytes() / t1 / 1e9, t1 * 1e6);
    }
  }
}

// The machine's memory bandwidth as the decode kernels see it: NumThreads() threads each summing
// its half of a 1 GiB buffer (on huge pages, as the weights), best of several passes.
double MeasureReadBandwidth(double budget) {
  const size_t bytes = size_t(1) << 30;
  detail::HugeBuffer buf(bytes);
  float* p = buf.as<float>();
  const size_t n = bytes / sizeof(float);
  const int nt = NumThreads();
#pragma omp parallel for num_threads(nt) schedule(static)
  for (size_t i = 0; i < n; i++) p[i] = 1.0f;
  // Integer adds (vectorised even at the baseline -march): the loop is bound by the loads.
  const uint64_t* w = buf.as<uint64_t>();
  const size_t words = bytes / 8;
  volatile uint64_t sink = 0;
  const double t = TimeIt([&] {
    uint64_t total = 0;
#pragma omp parallel for num_threads(nt) schedule(static) reduction(+ : total)
    for (int c = 0; c < 64; c++) {
      uint64_t acc[8] = {};
      const uint64_t* q = w + words / 64 * c;
      for (size_t i = 0; i < words / 64; i += 8)
        for (int u = 0; u < 8; u++) acc[u] += q[i + u];
      for (uint64_t a : acc) total += a;
    }
    sink = total;
  }, budget);
  (void)n;
  return bytes / t / 1e9;
}

// Block-type weights on the fast path (kBF16: int8 activations, weights kept compact): GEMM
// n=512 GFLOP/s and GEMV n=1 GB/s of packed weights streamed from DRAM, against the measured
// read bandwidth.
void BenchQuant(double budget) {
  Rng rng(6);
  const double bw = MeasureReadBandwidth(budget);
  printf("== Block types, kBF16 path, %d threads; memory read bandwidth %.1f GB/s\n", NumThreads(), bw);
  std::vector<DType> types(std::begin(kQTypes), std::end(kQTypes));
  types.insert(types.begin(), DType::Q8_0);
  for (DType t : types) {
    for (const Shape& s : {kShapes[1], kShapes[2]}) {
      std::vector<uint8_t> raw = RandomBlocks(t, s.out, s.in, rng);
      std::vector<Linear> lins;
      lins.push_back(Linear::Create(t, raw.data(), s.out, s.in, Precision::kBF16));
      const size_t copies = std::max<size_t>(1, (size_t(256) << 20) / lins[0].weight_bytes());
      while (lins.size() < copies) lins.push_back(Linear::Create(t, raw.data(), s.out, s.in, Precision::kBF16));
      std::vector<float> x = RandomVec(size_t(512) * s.in, rng), y(size_t(512) * s.out);
      const double t512 = TimeIt([&] { lins[0].Forward(x.data(), 512, y.data()); }, budget);
      size_t next = 0;
      const double t1 = TimeIt([&] { lins[next++ % lins.size()].Forward(x.data(), 1, y.data()); }, budget);
      const double gbs = lins[0].weight_bytes() / t1 / 1e9;
      printf("%-7s %-8s [%5d x %4d] %5.2f bits/w  n=512: %7.1f GFLOP/s   n=1: %6.1f GB/s (%3.0f%% of bw, %6.1f us)\n",
             DTypeName(t), s.name, s.out, s.in, 8.0 * lins[0].weight_bytes() / (double(s.out) * s.in),
             2.0 * 512 * s.out * s.in / t512 / 1e9, gbs, 100 * gbs / bw, t1 * 1e6);
    }
  }
}

// Time per call against n for the decode kernel and the GEMM, to place the switch.
void BenchCrossover(double budget) {
  Rng rng(2);
  const Shape s = kShapes[1];
  printf("== GEMV vs GEMM crossover at [%d x %d] (us per call)\n", s.out, s.in);
  std::vector<float> w = RandomVec(size_t(s.out) * s.in, rng);
  detail::Bf16Blocked bs = detail::Bf16Shape(s.out, s.in);
  std::vector<uint16_t> wb(size_t(bs.out_pad) * bs.in_pad);
  detail::PackBf16Blocked(DType::F32, w.data(), bs, wb.data());
  std::vector<BlockQ8_0> wq(size_t(s.out) * s.in / 32);
  FromF32(DType::Q8_0, w.data(), wq.data(), w.size());
  Linear lq = Linear::Create(DType::Q8_0, wq.data(), s.out, s.in, Precision::kBF16);
  const int nt = NumThreads();
  for (int n : {1, 2, 4, 6, 8, 12, 16, 24, 32, 64}) {
    std::vector<float> x = RandomVec(size_t(n) * s.in, rng), y(size_t(n) * s.out);
    std::vector<uint16_t> xb(size_t(n) * bs.in_pad);
    for (int j = 0; j < n; j++) detail::F32ToBf16Ref(x.data() + j * s.in, xb.data() + j * bs.in_pad, s.in);
    const int blocks = bs.out_pad / 64;
    auto gemv = [&] {
#pragma omp parallel for num_threads(nt) schedule(static)
      for (int b = 0; b < blocks; b++)
        detail::GemvBf16Avx512(wb.data(), bs, xb.data(), n, b * 64, std::min(s.out, b * 64 + 64), y.data(), s.out);
    };
    double tg = GetCpuFeatures().avx512_bf16 ? TimeIt(gemv, budget) : NAN;
    double td = detail::DnnlBf16Supported()
                    ? TimeIt([&] { detail::DnnlMatmulBf16(wb.data(), bs, xb.data(), n, y.data()); }, budget)
                    : NAN;
    auto gemv_f32 = [&] {
#pragma omp parallel for num_threads(nt) schedule(static)
      for (int b = 0; b < s.out / 64; b++)
        detail::GemvF32Avx512(w.data(), s.in, x.data(), n, b * 64, b * 64 + 64, y.data(), s.out);
    };
    double tf32g = GetCpuFeatures().avx512f ? TimeIt(gemv_f32, budget) : NAN;
    double tf32d = TimeIt([&] { detail::DnnlMatmulF32(w.data(), s.out, s.in, x.data(), n, y.data()); }, budget);
    double tq = TimeIt([&] { lq.Forward(x.data(), n, y.data()); }, budget);
    printf("n=%3d  bf16 gemv %8.1f  onednn bf16 %8.1f  | f32 gemv %8.1f  onednn f32 %8.1f  | q8 vnni %8.1f\n",
           n, tg * 1e6, td * 1e6, tf32g * 1e6, tf32d * 1e6, tq * 1e6);
  }
}

// The f32 GEMM backend choice: oneDNN (what Linear kF32 uses) against OpenBLAS sgemm.
void BenchF32Gemm(double budget) {
  Rng rng(5);
  printf("== f32 GEMM: oneDNN vs OpenBLAS sgemm (GFLOP/s)\n");
  openblas_set_num_threads(NumThreads());
  for (const Shape& s : kShapes) {
    std::vector<float> w = RandomVec(size_t(s.out) * s.in, rng);
    for (int n : {64, 512}) {
      std::vector<float> x = RandomVec(size_t(n) * s.in, rng), y(size_t(n) * s.out);
      double td = TimeIt([&] { detail::DnnlMatmulF32(w.data(), s.out, s.in, x.data(), n, y.data()); }, budget);
      double tb = TimeIt([&] {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, s.out, s.in, 1.0f, x.data(), s.in,
                    w.data(), s.in, 0.0f, y.data(), s.out);
      }, budget);
      const double flop = 2.0 * n * s.out * s.in;
      printf("%-8s [%5d x %4d] n=%3d  onednn %6.1f  openblas %6.1f\n", s.name, s.out, s.in, n,
             flop / td / 1e9, flop / tb / 1e9);
    }
  }
}

void BenchAttention(double budget, bool quick) {
  printf("== PagedAttention (12 heads, 4 KV heads, head_dim 64)\n");
  const int n_heads = 12, n_kv = 4, hd = 64;
  Rng rng(3);
  for (DType t : {DType::F32, DType::BF16}) {
    struct Case {
      const char* name;
      int n_seqs, n_ctx, n_q;
      int window = 0;  // sliding window (AttnOptions::window), 0 none
    };
    std::vector<Case> cases = {{"decode 32 seqs x ctx 128", 32, 128, 1},
                               {"decode 32 seqs x ctx 512", 32, 512, 1},
                               {"decode 1 seq x ctx 512", 1, 512, 1},
                               {"decode 1 seq x ctx 2048", 1, 2048, 1},
                               {"decode 1 x 2048, window 512", 1, 2048, 1, 512},
                               {"prefill 512 / ctx 512", 1, 512, 512},
                               {"prefill 512 / 512, win 128", 1, 512, 512, 128}};
    if (!quick) {
      cases.push_back({"prefill 2048 / ctx 2048", 1, 2048, 2048});
      cases.push_back({"prefill 2048 / 2048, win 512", 1, 2048, 2048, 512});
    }
    for (const Case& c : cases) {
      const int blocks_per = (c.n_ctx + kBlockTokens - 1) / kBlockTokens;
      const int n_blocks = blocks_per * c.n_seqs;
      // On huge pages, as a KV pool should be (see buffer.h): decode streams K/V like a GEMV.
      detail::HugeBuffer pool(DTypeBytes(t, size_t(n_blocks) * 2 * n_kv * kBlockTokens * hd));
      PagedKvLayer kv{pool.as<void>(), t, n_kv, hd};
      std::vector<int32_t> table(n_blocks);
      std::iota(table.begin(), table.end(), 0);
      for (int i = n_blocks - 1; i > 0; i--) std::swap(table[i], table[rng.Next() % (i + 1)]);
      std::vector<int32_t> pos(c.n_ctx);
      std::iota(pos.begin(), pos.end(), 0);
      std::vector<float> kk = RandomVec(size_t(c.n_ctx) * n_kv * hd, rng), vv = kk;
      for (int s = 0; s < c.n_seqs; s++)
        KvWrite(kv, table.data() + s * blocks_per, pos.data(), c.n_ctx, kk.data(), vv.data());
      std::vector<AttnSeq> seqs;
      std::vector<int32_t> qpos;
      for (int s = 0; s < c.n_seqs; s++) {
        seqs.push_back({table.data() + s * blocks_per, c.n_ctx, int(qpos.size()), c.n_q});
        for (int i = 0; i < c.n_q; i++) qpos.push_back(c.n_ctx - c.n_q + i);
      }
      std::vector<float> q = RandomVec(qpos.size() * n_heads * hd, rng), out(q.size());
      double tm = TimeIt([&] {
        PagedAttention(q.data(), qpos.data(), seqs.data(), c.n_seqs, kv, n_heads, 0.125f, out.data(),
                       AttnOptions{c.window, 0.0f});
      }, budget);
      // Useful work: 4 flops per (query head, visible key, dim) pair.
      double pairs = 0;
      for (int s = 0; s < c.n_seqs; s++) {
        for (int i = 0; i < c.n_q; i++) {
          const int p = c.n_ctx - c.n_q + i;
          pairs += c.window > 0 ? std::min(p + 1, c.window) : p + 1;
        }
      }
      // K/V the step must read (all of it, or the last window's for decode).
      const int read = c.window > 0 && c.n_q == 1 ? std::min(c.n_ctx, c.window) : c.n_ctx;
      double kv_bytes = double(c.n_seqs) * read * n_kv * hd * 2 * DTypeBytes(t, 1);
      printf("%-5s %-26s %9.1f us  %7.1f GFLOP/s  %6.1f GB/s of K/V\n", DTypeName(t), c.name, tm * 1e6,
             4.0 * pairs * n_heads * hd / tm / 1e9, kv_bytes / tm / 1e9);
    }
  }
}

void BenchOps(double budget) {
  printf("== Ops (n=512 rows)\n");
  Rng rng(4);
  const int n = 512, dim = 768, ffn = 2048;
  std::vector<float> x = RandomVec(size_t(n) * 2 * ffn, rng), w = RandomVec(dim, rng), y(x.size());
  std::vector<int32_t> pos(n);
  std::iota(pos.begin(), pos.end(), 0);
  printf("RmsNorm [512 x 768]       %8.1f us\n",
         1e6 * TimeIt([&] { RmsNorm(x.data(), w.data(), n, dim, 1e-5f, y.data()); }, budget));
  printf("Rope    [512 x 12 x 64]   %8.1f us\n",
         1e6 * TimeIt([&] { Rope(x.data(), pos.data(), n, 12, 64, 64, 10000.0f); }, budget));
  printf("SwiGlu  [512 x 2048]      %8.1f us\n",
         1e6 * TimeIt([&] { SwiGlu(x.data(), n, ffn, y.data()); }, budget));
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  std::string only;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--quick")) quick = true;
    if (!strcmp(argv[i], "--cpu-time")) g_cpu_time = true;
    if (!strcmp(argv[i], "--threads") && i + 1 < argc) SetNumThreads(atoi(argv[++i]));
    if (!strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
  }
  const CpuFeatures& f = GetCpuFeatures();
  printf("cpu: avx512f=%d avx512_bf16=%d avx512_vnni=%d amx_bf16=%d threads=%d\n", f.avx512f,
         f.avx512_bf16, f.avx512_vnni, f.amx_bf16, NumThreads());
  const double budget = quick ? 0.05 : 0.3;
  if (only.empty() || only == "linear") BenchLinear(budget);
  if (only.empty() || only == "quant") BenchQuant(budget);
  if (only.empty() || only == "crossover") BenchCrossover(budget);
  if (only.empty() || only == "f32gemm") BenchF32Gemm(budget);
  if (only.empty() || only == "attention") BenchAttention(budget, quick);
  if (only.empty() || only == "ops") BenchOps(budget);
  return 0;
}
