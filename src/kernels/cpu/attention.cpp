// KvWrite, the portable attention kernel, and PagedAttention's task split: tasks of up to 16
// query vectors of one (sequence, KV head), most expensive first, over NumThreads() threads.
#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "base/cpu.h"
#include "base/status.h"
#include "base/thread_pool.h"
#include "kernels/cpu/attention_internal.h"
#include "kernels/cpu/dispatch.h"

namespace mnemo::kernels {

void KvWrite(const PagedKvLayer& kv, const int32_t* block_table, const int32_t* pos, int n,
             const float* k, const float* v) {
  MNEMO_CHECK(kv.dtype == DType::F32 || kv.dtype == DType::F16 || kv.dtype == DType::BF16);
  const size_t row = size_t(kv.n_kv_heads) * kv.head_dim;  // floats per token in k / v
  const size_t elem = DTypeBytes(kv.dtype, 1);
  for (int t = 0; t < n; t++) {
    const int32_t block = block_table[pos[t] / kBlockTokens];
    const int slot = pos[t] % kBlockTokens;
    for (int h = 0; h < kv.n_kv_heads; h++) {
      for (int which = 0; which < 2; which++) {
        const float* src = (which == 0 ? k : v) + t * row + size_t(h) * kv.head_dim;
        char* dst = static_cast<char*>(const_cast<void*>(detail::KvBlockPtr(kv, block, which, h)));
        FromF32(kv.dtype, src, dst + size_t(slot) * kv.head_dim * elem, kv.head_dim);
      }
    }
  }
}

namespace detail {

void AttnTaskRef(const AttnArgs& a, const AttnTask& t) {
  const AttnSeq& seq = a.seqs[t.seq];
  const PagedKvLayer& kv = *a.kv;
  const int hd = kv.head_dim;
  const int nvec = t.v1 - t.v0;
  thread_local std::vector<float> buf;
  buf.resize(size_t(nvec) * hd * 2 + size_t(kBlockTokens) * hd * 2);
  float* qs = buf.data();                              // [nvec, hd] scaled queries
  float* acc = qs + size_t(nvec) * hd;                 // [nvec, hd] running sum of p * v
  float* kb = acc + size_t(nvec) * hd;                 // [32, hd] K block in f32
  float* vb = kb + size_t(kBlockTokens) * hd;          // [32, hd] V block in f32
  float m[kAttnTileVecs], l[kAttnTileVecs];            // running max and sum per vector
  int first[kAttnTileVecs], last[kAttnTileVecs];      // visible keys per vector: [first, last]
  int kmin = INT32_MAX, kmax = -1;
  for (int i = 0; i < nvec; i++) {
    const int v = t.v0 + i;
    const int row = seq.q_begin + v / a.group;
    const int head = t.kv_head * a.group + v % a.group;
    const float* q = a.q + (size_t(row) * a.n_heads + head) * hd;
    for (int d = 0; d < hd; d++) {
      const float v = q[d] * a.scale;
      qs[size_t(i) * hd + d] = kv.dtype == DType::BF16 ? Bf16ToF32(F32ToBf16(v)) : v;
    }
    std::fill(acc + size_t(i) * hd, acc + size_t(i + 1) * hd, 0.0f);
    m[i] = -std::numeric_limits<float>::max();
    l[i] = 0;
    last[i] = std::min(a.q_pos[row], seq.n_ctx - 1);
    first[i] = FirstVisibleKey(a.q_pos[row], a.window);
    kmax = std::max(kmax, last[i]);
    kmin = std::min(kmin, first[i]);
  }
  for (int b = std::max(kmin, 0) / kBlockTokens; b * kBlockTokens <= kmax; b++) {
    const int k0 = b * kBlockTokens;
    if (!BlockVisible(first, last, nvec, k0)) continue;
    const int nvalid = std::min(kBlockTokens, kmax - k0 + 1);
    const int32_t block = seq.block_table[b];
    ToF32(kv.dtype, KvBlockPtr(kv, block, 0, t.kv_head), kb, size_t(nvalid) * hd);
    ToF32(kv.dtype, KvBlockPtr(kv, block, 1, t.kv_head), vb, size_t(nvalid) * hd);
    for (int i = 0; i < nvec; i++) {
      const int j0 = std::max(0, first[i] - k0);           // keys of this block visible to i:
      const int lim = std::min(nvalid, last[i] - k0 + 1);  // [j0, lim)
      if (lim <= j0) continue;
      const float* qi = qs + size_t(i) * hd;
      float s[kBlockTokens];
      float mb = m[i];
      for (int j = j0; j < lim; j++) {
        float dot = 0;
        for (int d = 0; d < hd; d++) dot += qi[d] * kb[size_t(j) * hd + d];
        if (a.softcap > 0) dot = a.softcap * std::tanh(dot / a.softcap);
        s[j] = dot;
        mb = std::max(mb, dot);
      }
      const float corr = expf(m[i] - mb);
      float* ai = acc + size_t(i) * hd;
      for (int d = 0; d < hd; d++) ai[d] *= corr;
      float sum = 0;
      for (int j = j0; j < lim; j++) {
        const float p = expf(s[j] - mb);
        sum += p;
        for (int d = 0; d < hd; d++) ai[d] += p * vb[size_t(j) * hd + d];
      }
      l[i] = l[i] * corr + sum;
      m[i] = mb;
    }
  }
  for (int i = 0; i < nvec; i++) {
    const int v = t.v0 + i;
    const int row = seq.q_begin + v / a.group;
    const int head = t.kv_head * a.group + v % a.group;
    float* o = a.out + (size_t(row) * a.n_heads + head) * hd;
    const float inv = l[i] > 0 ? 1.0f / l[i] : 0.0f;
    for (int d = 0; d < hd; d++) o[d] = acc[size_t(i) * hd + d] * inv;
  }
}

}  // namespace detail

void PagedAttention(const float* q, const int32_t* q_pos, const AttnSeq* seqs, int n_seqs,
                    const PagedKvLayer& kv, int n_heads, float scale, float* out,
                    const AttnOptions& opt) {
  MNEMO_CHECK(kv.n_kv_heads > 0 && n_heads % kv.n_kv_heads == 0);
  MNEMO_CHECK(kv.dtype == DType::F32 || kv.dtype == DType::F16 || kv.dtype == DType::BF16);
  MNEMO_CHECK(opt.window >= 0 && opt.softcap >= 0);
  detail::AttnArgs a{q, q_pos, seqs, &kv, n_heads, n_heads / kv.n_kv_heads, scale, opt.window,
                     opt.softcap, out};
  // Tasks, most expensive first (cost ~ number of keys read), for dynamic scheduling.
  struct Item {
    detail::AttnTask task;
    int64_t cost;
  };
  std::vector<Item> items;
  for (int s = 0; s < n_seqs; s++) {
    const AttnSeq& seq = seqs[s];
    const int nvec = seq.n_q * a.group;
    const int tile = nvec <= detail::kAttnNarrowVecs ? nvec : detail::kAttnTileVecs;
    for (int v0 = 0; v0 < nvec; v0 += tile) {
      const int v1 = std::min(nvec, v0 + tile);
      int kmax = -1, kmin = INT32_MAX;
      for (int v = v0; v < v1; v++) {
        const int p = q_pos[seq.q_begin + v / a.group];
        kmax = std::max(kmax, p);
        kmin = std::min(kmin, detail::FirstVisibleKey(p, opt.window));
      }
      kmax = std::min(kmax, seq.n_ctx - 1);
      const int64_t keys = std::max(0, kmax - kmin + 1) + kBlockTokens;  // an upper bound
      for (int h = 0; h < kv.n_kv_heads; h++) {
        items.push_back({{s, h, v0, v1}, keys * (v1 - v0)});
      }
    }
  }
  std::stable_sort(items.begin(), items.end(),
                   [](const Item& x, const Item& y) { return x.cost > y.cost; });
  const CpuFeatures& f = detail::KernelFeatures();
  const bool fast = f.avx512f && f.f16c && kv.head_dim % 16 == 0 &&
                    kv.head_dim <= detail::kAttnMaxHeadDimAvx512;
  a.bf16_dot = fast && f.avx512_bf16 && kv.dtype == DType::BF16 && kv.head_dim % 32 == 0;
  const bool avx2 = !fast && detail::UseAvx2Kernels(f) && kv.head_dim % 8 == 0 &&
                    kv.head_dim <= detail::kAttnMaxHeadDimAvx2;
  const int n_items = static_cast<int>(items.size());
  ThreadPool::Get().For(n_items, [&](int i) {
    if (fast) {
      detail::AttnTaskAvx512(a, items[i].task);
    } else if (avx2) {
      detail::AttnTaskAvx2(a, items[i].task);
    } else {
      detail::AttnTaskRef(a, items[i].task);
    }
  });
}

}  // namespace mnemo::kernels
