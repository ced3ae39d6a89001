// oneDNN matmul primitives, cached per (type, rows bucket, out, in), run in row chunks.
#include "kernels/cpu/matmul_dnnl.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>
#include <vector>

#include "base/status.h"

namespace mnemo::kernels::detail {
namespace {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

// Rows per primitive call: larger m runs in chunks of this many rows, so the number of distinct
// primitives stays bounded (m is padded up to a multiple of kRowQuantum beyond kExactRows).
constexpr int kMaxRows = 512;
constexpr int kRowQuantum = 16;
constexpr int kExactRows = 16;

int BucketRows(int m) {
  return m <= kExactRows ? m : (m + kRowQuantum - 1) / kRowQuantum * kRowQuantum;
}

dnnl::engine& Engine() {
  static dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  return eng;
}

struct Key {
  int type;  // 0 f32, 1 bf16
  int m, n, k, ldx;
  auto operator<=>(const Key&) const = default;
};

struct Entry {
  dnnl::matmul prim;
  dnnl::memory::desc src, wei, dst, scratch;
};

// Process-wide cache of primitives by shape. Entries are never evicted: shapes come from a
// model's few distinct layer shapes times the bounded set of row buckets.
const Entry& GetPrimitive(const Key& key) {
  static std::mutex mu;
  static std::map<Key, Entry> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  using dims = dnnl::memory::dims;
  Entry e;
  if (key.type == 1) {
    e.src = dnnl::memory::desc(dims{key.m, key.k}, dt::bf16, dims{key.ldx, 1});
    e.wei = dnnl::memory::desc(dims{key.k, key.n}, dt::bf16, tag::BA16a64b2a);
  } else {
    e.src = dnnl::memory::desc(dims{key.m, key.k}, dt::f32, dims{key.ldx, 1});
    e.wei = dnnl::memory::desc(dims{key.k, key.n}, dt::f32, tag::ba);
  }
  e.dst = dnnl::memory::desc(dims{key.m, key.n}, dt::f32, tag::ab);
  // The caller's own scratchpad: with the library's (shared per primitive), two threads running
  // the same shape at once corrupted each other's results (engine thread and a second model).
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  auto pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(e.src, e.wei, e.dst), attr, Engine());
  e.scratch = pd.scratchpad_desc();
  e.prim = dnnl::matmul(pd);
  return cache.emplace(key, std::move(e)).first->second;
}

void Execute(const Entry& e, const void* w, const void* x, float* y) {
  thread_local dnnl::stream stream(Engine());
  // 64-byte aligned, as the library aligns its own scratchpads; grows to the largest need.
  struct Scratch {
    char* p = nullptr;
    size_t size = 0;
    ~Scratch() { std::free(p); }
  };
  thread_local Scratch scratch;
  const size_t need = (std::max<size_t>(e.scratch.get_size(), 1) + 63) / 64 * 64;
  if (scratch.size < need) {
    std::free(scratch.p);
    scratch.p = static_cast<char*>(std::aligned_alloc(64, need));
    MNEMO_CHECK(scratch.p != nullptr);
    scratch.size = need;
  }
  dnnl::memory ms(e.src, Engine(), const_cast<void*>(x));
  dnnl::memory mw(e.wei, Engine(), const_cast<void*>(w));
  dnnl::memory md(e.dst, Engine(), y);
  dnnl::memory mscratch(e.scratch, Engine(), scratch.p);
  e.prim.execute(stream, {{DNNL_ARG_SRC, ms}, {DNNL_ARG_WEIGHTS, mw}, {DNNL_ARG_DST, md},
                          {DNNL_ARG_SCRATCHPAD, mscratch}});
  stream.wait();
}

// Runs y = x W^T in row chunks; rows beyond m in a padded bucket go through scratch buffers.
void Run(int type, const void* w, int out, int in, const void* x, int ldx, size_t esize, int m,
         float* y) {
  thread_local std::vector<char> xpad;  // [bucket, ldx] of esize
  thread_local std::vector<float> ypad;  // [bucket, out]
  for (int r = 0; r < m; r += kMaxRows) {
    int mm = std::min(kMaxRows, m - r);
    int mb = BucketRows(mm);
    const Entry& e = GetPrimitive(Key{type, mb, out, in, ldx});
    const char* xr = static_cast<const char*>(x) + size_t(r) * ldx * esize;
    float* yr = y + size_t(r) * out;
    if (mb == mm) {
      Execute(e, w, xr, yr);
      continue;
    }
    xpad.assign(size_t(mb) * ldx * esize, 0);
    std::memcpy(xpad.data(), xr, size_t(mm) * ldx * esize);
    ypad.resize(size_t(mb) * out);
    Execute(e, w, xpad.data(), ypad.data());
    std::memcpy(yr, ypad.data(), size_t(mm) * out * sizeof(float));
  }
}

}  // namespace

bool DnnlBf16Supported() {
  static const bool supported = [] {
    using dims = dnnl::memory::dims;
    const dnnl::memory::desc src(dims{16, 64}, dt::bf16, tag::ab);
    const dnnl::memory::desc wei(dims{64, 64}, dt::bf16, tag::BA16a64b2a);
    const dnnl::memory::desc dst(dims{16, 64}, dt::f32, tag::ab);
    try {
      dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, wei, dst), Engine());
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return supported;
}

void DnnlMatmulBf16(const uint16_t* w, const Bf16Blocked& s, const uint16_t* x, int m, float* y) {
  Run(1, w, s.out, s.in, x, s.in_pad, 2, m, y);
}

void DnnlMatmulF32(const float* w, int out, int in, const float* x, int m, float* y) {
  Run(0, w, out, in, x, in, 4, m, y);
}

}  // namespace mnemo::kernels::detail
