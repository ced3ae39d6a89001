// Linear: weight repacking at Create, and the choice per call between the weight-streaming
// kernels (gemv.h, parallel over output rows) and oneDNN's GEMM (matmul_dnnl.h).
#include "kernels/cpu/linear.h"

#include <omp.h>

#include <algorithm>
#include <vector>

#include "base/cpu.h"
#include "base/status.h"
#include "base/thread_pool.h"
#include "kernels/cpu/buffer.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/gemv.h"
#include "kernels/cpu/gemv_quant.h"
#include "kernels/cpu/matmul_dnnl.h"
#include "kernels/cpu/parallel.h"

namespace mnemo::kernels {
namespace {

using namespace detail;

// Up to this many rows, decode-style kernels stream the weights once for all rows; beyond, GEMM.
// kernels_bench (crossover, 2-core Zen 4, weights in L3: the GEMM's best case): the f32 GEMV
// wins to n = 6; the bf16 GEMV ties oneDNN up to n = 32 and streams DRAM faster at small n.
// q8_0 has no switch: its VNNI kernel beat oneDNN bf16 at every n measured, n = 512 included.
constexpr int kGemvMaxRowsF32 = 6;
constexpr int kGemvMaxRowsBf16 = 8;

// Kernels picked once from CPUID.
struct Dispatch {
  decltype(&GemvF32Ref) gemv_f32 = GemvF32Ref;
  decltype(&GemvBf16Ref) gemv_bf16 = GemvBf16Ref;
  decltype(&GemvQ8Ref) gemv_q8 = GemvQ8Ref;
  decltype(&QuantizeActQ8Ref) quant_q8 = QuantizeActQ8Ref;
  decltype(&F32ToBf16Ref) to_bf16 = F32ToBf16Ref;
  decltype(&GemvQRef) gemv_q = GemvQRef;
  decltype(&QuantizeActS8Ref) quant_s8 = QuantizeActS8Ref;
  bool dnnl_bf16 = false;  // oneDNN's bf16 GEMM runs here; else the bf16 GEMV takes every n
};

const Dispatch& Kernels() {
  static const Dispatch d = [] {
    Dispatch k;
    const CpuFeatures& f = KernelFeatures();
    if (UseAvx2Kernels(f)) {
      k.gemv_f32 = GemvF32Avx2;
      k.to_bf16 = F32ToBf16Avx2;
      k.gemv_bf16 = GemvBf16Avx2;
      k.quant_q8 = QuantizeActQ8Avx2;
      k.gemv_q8 = GemvQ8Avx2;
      k.quant_s8 = QuantizeActS8Avx2;
      k.gemv_q = GemvQAvx2;
    }
    if (f.avx512f) {
      k.gemv_f32 = GemvF32Avx512;
      k.to_bf16 = F32ToBf16Avx512;
      k.quant_q8 = QuantizeActQ8Avx512;
      k.gemv_bf16 = GemvBf16Avx512NoBf16;
      k.quant_s8 = QuantizeActS8Avx512;
    }
    if (f.avx512_bf16) k.gemv_bf16 = GemvBf16Avx512;
    if (f.avx512_vnni) {
      k.gemv_q8 = GemvQ8Avx512;
      k.gemv_q = GemvQAvx512;
    }
    k.dnnl_bf16 = DnnlBf16Supported();
    return k;
  }();
  return d;
}

// Runs fn(o0, o1) over [0, out) cut into chunks of a multiple of `align` outputs, in parallel.
// Eight chunks per thread, handed out dynamically: with four, a 1280-output QKV matrix fell
// into 7 chunks of 192, 4 on one core and 3 on the other.
template <class Fn>
void ParallelRows(int out, int align, Fn fn) {
  const int threads = NumThreads();
  int chunks_wanted = threads * 8;
  int chunk = (out + chunks_wanted - 1) / chunks_wanted;
  chunk = std::max(align, (chunk + align - 1) / align * align);
  const int n_chunks = (out + chunk - 1) / chunk;
  if (n_chunks == 1 || threads == 1) {
    fn(0, out);
    return;
  }
  ThreadPool::Get().For(n_chunks, [&](int c) { fn(c * chunk, std::min(out, (c + 1) * chunk)); });
}


}  // namespace

struct Linear::Impl {
  DType dtype = DType::F32;          // weight type given at Create
  Precision precision = Precision::kF32;
  int out = 0;                       // output features
  int in = 0;                        // input features
  // kF32: the weights expanded to f32, [out, in] row-major (a copy even for F32 sources: the
  // copy sits on huge pages, which doubles GEMV streaming speed, and src may go away).
  HugeBuffer f32;
  // kBF16 from F32/F16/BF16: BA16a64b2a layout (gemv.h), shared by the GEMV and oneDNN.
  Bf16Blocked bf16_shape;
  HugeBuffer bf16;                   // [out_pad * in_pad] bf16
  // kBF16 from Q8_0: VNNI panels (gemv.h).
  Q8Packed q8_shape;
  HugeBuffer q8;                     // [out_pad / 16 * in / 32 * 576] bytes
  // kBF16 from the other block types: compact panels (gemv_quant.h).
  QPacked q_shape;
  HugeBuffer q;                      // [q_shape.Bytes()]
};

Linear::Linear() = default;
Linear::~Linear() = default;
Linear::Linear(Linear&&) noexcept = default;
Linear& Linear::operator=(Linear&&) noexcept = default;

Linear Linear::Create(DType t, const void* src, int out, int in, Precision p) {
  MNEMO_CHECK(out > 0 && in > 0);
  MNEMO_CHECK_MSG(in % DTypeBlockElems(t) == 0,
                  std::string(DTypeName(t)) + " weights need in to be a multiple of its block size");
  Linear lin;
  lin.impl_ = std::make_unique<Impl>();
  Impl& m = *lin.impl_;
  m.dtype = t;
  m.precision = p;
  m.out = out;
  m.in = in;
  if (p == Precision::kF32) {
    m.f32 = HugeBuffer(size_t(out) * in * sizeof(float));
    float* dst = m.f32.as<float>();
    const size_t row_bytes = DTypeBytes(t, in);
#pragma omp parallel for schedule(static)
    for (int o = 0; o < out; o++) {
      ToF32(t, static_cast<const char*>(src) + size_t(o) * row_bytes, dst + size_t(o) * in, in);
    }
  } else if (t == DType::Q8_0) {
    m.q8_shape = Q8Packed{out, in, (out + kQ8PanelOut - 1) / kQ8PanelOut * kQ8PanelOut};
    m.q8 = HugeBuffer(size_t(m.q8_shape.out_pad / kQ8PanelOut) * (in / kQ8Block) * kQ8RecordBytes);
    PackQ8(static_cast<const BlockQ8_0*>(src), m.q8_shape, m.q8.as<uint8_t>());
  } else if (HasQFormat(t)) {
    m.q_shape = QShape(t, out, in);
    m.q = HugeBuffer(m.q_shape.Bytes());
    PackQ(src, m.q_shape, m.q.as<uint8_t>());
  } else {
    m.bf16_shape = Bf16Shape(out, in);
    m.bf16 = HugeBuffer(size_t(m.bf16_shape.out_pad) * m.bf16_shape.in_pad * sizeof(uint16_t));
    PackBf16Blocked(t, src, m.bf16_shape, m.bf16.as<uint16_t>());
  }
  return lin;
}

void Linear::Forward(const float* x, int n, float* y) const {
  MNEMO_CHECK(impl_ && n >= 1);
  const Impl& m = *impl_;
  const Dispatch& k = Kernels();
  if (m.precision == Precision::kF32) {
    if (n <= kGemvMaxRowsF32) {
      const float* w = m.f32.as<float>();
      ParallelRows(m.out, 16, [&](int o0, int o1) { k.gemv_f32(w, m.in, x, n, o0, o1, y, m.out); });
    } else {
      DnnlMatmulF32(m.f32.as<float>(), m.out, m.in, x, n, y);
    }
    return;
  }
  if (m.q8.size() > 0) {
    thread_local std::vector<uint8_t> xq;  // [n, in]
    thread_local std::vector<float> xd;    // [n, in / 32]
    xq.resize(size_t(n) * m.in);
    xd.resize(size_t(n) * (m.in / kQ8Block));
    // Thread-locals are named through plain pointers: inside the parallel region the names
    // would refer to the worker threads' own (empty) instances.
    uint8_t* xq_p = xq.data();
    float* xd_p = xd.data();
    const int nb = m.in / kQ8Block;
    // Quantising a prefill batch serially would be ~10% of the q8_0 GEMM.
    ForRowRanges(n, m.in, [&](int j0, int j1) {
      k.quant_q8(x + size_t(j0) * m.in, j1 - j0, m.in, xq_p + size_t(j0) * m.in, xd_p + size_t(j0) * nb);
    });
    ParallelRows(m.out, kQ8PanelOut, [&](int o0, int o1) {
      k.gemv_q8(m.q8.as<uint8_t>(), m.q8_shape, xq_p, xd_p, n, o0, o1, y, m.out);
    });
    return;
  }
  if (m.q.size() > 0) {
    // One kernel for every n: it beat oneDNN bf16 at n = 512 as the q8_0 one does (see
    // docs/benchmarks.md); the weights are expanded in registers, never in memory.
    thread_local std::vector<int8_t> xq;      // [n, in]
    thread_local std::vector<QActBlock> xb;   // [n, in / 32]
    const int nb = m.in / 32;
    xq.resize(size_t(n) * m.in);
    xb.resize(size_t(n) * nb);
    int8_t* xq_p = xq.data();  // see the q8 case
    QActBlock* xb_p = xb.data();
    ForRowRanges(n, m.in, [&](int j0, int j1) {
      k.quant_s8(x + size_t(j0) * m.in, j1 - j0, m.in, xq_p + size_t(j0) * m.in, xb_p + size_t(j0) * nb);
    });
    const QActs acts{xq_p, xb_p};
    ParallelRows(m.out, kQPanelOut, [&](int o0, int o1) {
      k.gemv_q(m.q.as<uint8_t>(), m.q_shape, acts, n, o0, o1, y, m.out);
    });
    return;
  }
  const Bf16Blocked& s = m.bf16_shape;
  thread_local std::vector<uint16_t> xb;  // [n, in_pad] bf16, zero padded
  xb.resize(size_t(n) * s.in_pad);
  uint16_t* xb_w = xb.data();  // see the q8 case
  ForRowRanges(n, m.in, [&](int j0, int j1) {
    for (int j = j0; j < j1; j++) {
      k.to_bf16(x + size_t(j) * m.in, xb_w + size_t(j) * s.in_pad, m.in);
      std::fill(xb_w + size_t(j) * s.in_pad + m.in, xb_w + size_t(j + 1) * s.in_pad, uint16_t(0));
    }
  });
  if (n <= kGemvMaxRowsBf16 || !k.dnnl_bf16) {
    ParallelRows(m.out, kBf16TileOut, [&](int o0, int o1) {
      k.gemv_bf16(m.bf16.as<uint16_t>(), s, xb_w, n, o0, o1, y, m.out);
    });
  } else {
    DnnlMatmulBf16(m.bf16.as<uint16_t>(), s, xb.data(), n, y);
  }
}

int Linear::out() const { return impl_ ? impl_->out : 0; }
int Linear::in() const { return impl_ ? impl_->in : 0; }

size_t Linear::weight_bytes() const {
  if (!impl_) return 0;
  const Impl& m = *impl_;
  return m.f32.size() + m.bf16.size() + m.q8.size() + m.q.size();  // only one is in use
}

}  // namespace mnemo::kernels
