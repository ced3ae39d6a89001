// AVX-512 attention kernels (attention_internal.h). Two shapes of the same online softmax:
//  - wide (prefill, > kAttnNarrowVecs query vectors): one query vector per lane. Q^T and O^T
//    [head_dim][16] live in a thread-local tile; every K and V element is broadcast once per key
//    and feeds 16 queries, so there are no horizontal reductions and the running max / sum are
//    plain vectors. K/V blocks of F16/BF16 are converted to f32 once per block.
//  - narrow (decode, few query vectors): lanes along head_dim, K/V rows converted on the fly,
//    16 key scores reduced together by a transpose-add tree.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <vector>

#include "kernels/cpu/attention_internal.h"
#include "kernels/cpu/simd_avx512.h"

namespace mnemo::kernels::detail {
namespace {

// Query vector v of task t: its row and its head.
inline void VecRowHead(const AttnArgs& a, const AttnTask& t, int v, int* row, int* head) {
  *row = a.seqs[t.seq].q_begin + v / a.group;
  *head = t.kv_head * a.group + v % a.group;
}

template <DType DT>
inline __m512 LoadRow16(const void* base, size_t idx) {
  if constexpr (DT == DType::F32) {
    return _mm512_loadu_ps(static_cast<const float*>(base) + idx);
  } else if constexpr (DT == DType::BF16) {
    return LoadBf16x16(static_cast<const uint16_t*>(base) + idx);
  } else {
    return LoadF16x16(static_cast<const uint16_t*>(base) + idx);
  }
}

// rows x hd elements of DT at src -> f32 at dst (hd a multiple of 16).
template <DType DT>
void ConvertRows(const void* src, int rows, int hd, float* dst) {
  const size_t n = size_t(rows) * hd;
  for (size_t i = 0; i < n; i += 16) _mm512_storeu_ps(dst + i, LoadRow16<DT>(src, i));
}

// r[i] = sum of the 16 lanes of v[i]: a transpose-add tree, 45 shuffles/adds for 16 vectors.
// The tree leaves the sums in a fixed permuted order; kPerm (found once by running the tree on
// known inputs) puts them back.
inline __m512 Reduce16Raw(const __m512* v) {
  __m512 a[8], b[4], c[2];
  for (int i = 0; i < 8; i++) {
    a[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[i], v[i + 8], 0x44),
                         _mm512_shuffle_f32x4(v[i], v[i + 8], 0xee));
  }
  for (int i = 0; i < 4; i++) {
    b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[i], a[i + 4], 0x88),
                         _mm512_shuffle_f32x4(a[i], a[i + 4], 0xdd));
  }
  for (int i = 0; i < 2; i++) {
    c[i] = _mm512_add_ps(_mm512_shuffle_ps(b[i], b[i + 2], 0x44), _mm512_shuffle_ps(b[i], b[i + 2], 0xee));
  }
  return _mm512_add_ps(_mm512_shuffle_ps(c[0], c[1], 0x88), _mm512_shuffle_ps(c[0], c[1], 0xdd));
}

__m512i Reduce16Perm() {
  __m512 v[16];
  for (int i = 0; i < 16; i++) v[i] = _mm512_set1_ps(float(i));
  alignas(64) float r[16];
  _mm512_store_ps(r, Reduce16Raw(v));
  alignas(64) int32_t idx[16];
  for (int lane = 0; lane < 16; lane++) idx[int(r[lane]) / 16] = lane;
  return _mm512_load_si512(idx);
}

inline __m512 Reduce16(const __m512* v) {
  static const __m512i perm = Reduce16Perm();
  return _mm512_permutexvar_ps(perm, Reduce16Raw(v));
}

// ---- wide kernel ---------------------------------------------------------------------------------

struct WideScratch {
  std::vector<float> qt;  // [hd][16] scaled queries, transposed
  std::vector<float> ot;  // [hd][16] running sum of p * v, transposed
  std::vector<float> s;   // [32][16] scores, then probabilities
  std::vector<float> kb;  // [32][hd] K block in f32
  std::vector<float> vb;  // [32][hd] V block in f32
};

template <DType DT>
void WideTask(const AttnArgs& a, const AttnTask& t) {
  const AttnSeq& seq = a.seqs[t.seq];
  const PagedKvLayer& kv = *a.kv;
  const int hd = kv.head_dim;
  const int nvec = t.v1 - t.v0;
  thread_local WideScratch ws;
  ws.qt.assign(size_t(hd) * 16, 0.0f);
  ws.ot.assign(size_t(hd) * 16, 0.0f);
  ws.s.resize(kBlockTokens * 16);
  if (DT != DType::F32) {
    ws.kb.resize(size_t(kBlockTokens) * hd);
    ws.vb.resize(size_t(kBlockTokens) * hd);
  }
  float* qt = ws.qt.data();
  float* ot = ws.ot.data();
  float* sp = ws.s.data();
  alignas(64) int32_t last[16];  // last visible key per lane, -1 for unused lanes
  int kmax = -1, kmin = INT32_MAX;
  for (int i = 0; i < 16; i++) {
    last[i] = -1;
    if (i >= nvec) continue;
    int row, head;
    VecRowHead(a, t, t.v0 + i, &row, &head);
    const float* q = a.q + (size_t(row) * a.n_heads + head) * hd;
    for (int d = 0; d < hd; d++) qt[d * 16 + i] = q[d] * a.scale;
    last[i] = std::min(a.q_pos[row], seq.n_ctx - 1);
    kmax = std::max(kmax, last[i]);
    kmin = std::min(kmin, last[i]);
  }
  const __m512i vlast = _mm512_load_si512(last);
  __m512 m = _mm512_set1_ps(-FLT_MAX), l = _mm512_setzero_ps();
  for (int k0 = 0; k0 <= kmax; k0 += kBlockTokens) {
    const int nvalid = std::min(kBlockTokens, kmax - k0 + 1);
    const int32_t block = seq.block_table[k0 / kBlockTokens];
    const float* kr;
    const float* vr;
    if constexpr (DT == DType::F32) {
      kr = static_cast<const float*>(KvBlockPtr(kv, block, 0, t.kv_head));
      vr = static_cast<const float*>(KvBlockPtr(kv, block, 1, t.kv_head));
    } else {
      ConvertRows<DT>(KvBlockPtr(kv, block, 0, t.kv_head), nvalid, hd, ws.kb.data());
      ConvertRows<DT>(KvBlockPtr(kv, block, 1, t.kv_head), nvalid, hd, ws.vb.data());
      kr = ws.kb.data();
      vr = ws.vb.data();
    }
    // Scores, 8 keys at a time (rows past nvalid are computed on stale data and never used).
    const bool need_mask = k0 + nvalid - 1 > kmin;
    __m512 mb = m;
    for (int j0 = 0; j0 < nvalid; j0 += 8) {
      __m512 s[8];
      for (int i = 0; i < 8; i++) s[i] = _mm512_setzero_ps();
      const float* kj = kr + size_t(j0) * hd;
      for (int d = 0; d < hd; d++) {
        const __m512 qd = _mm512_loadu_ps(qt + d * 16);
        for (int i = 0; i < 8; i++) s[i] = _mm512_fmadd_ps(qd, _mm512_set1_ps(kj[i * hd + d]), s[i]);
      }
      const int nk = std::min(8, nvalid - j0);
      for (int i = 0; i < nk; i++) {
        if (need_mask) {
          const __mmask16 vis = _mm512_cmpge_epi32_mask(vlast, _mm512_set1_epi32(k0 + j0 + i));
          s[i] = _mm512_mask_blend_ps(vis, _mm512_set1_ps(-INFINITY), s[i]);
        }
        mb = _mm512_max_ps(mb, s[i]);
        _mm512_storeu_ps(sp + (j0 + i) * 16, s[i]);
      }
    }
    const __m512 corr = Exp512(_mm512_sub_ps(m, mb));
    m = mb;
    __m512 sum = _mm512_setzero_ps();
    for (int j = 0; j < nvalid; j++) {
      const __m512 p = Exp512(_mm512_sub_ps(_mm512_loadu_ps(sp + j * 16), mb));
      sum = _mm512_add_ps(sum, p);
      _mm512_storeu_ps(sp + j * 16, p);
    }
    l = _mm512_fmadd_ps(l, corr, sum);
    // O^T[d] = O^T[d] * corr + sum_j p_j V[j][d], 16 dims at a time.
    for (int d0 = 0; d0 < hd; d0 += 16) {
      __m512 acc[16];
      for (int k = 0; k < 16; k++) acc[k] = _mm512_mul_ps(_mm512_loadu_ps(ot + (d0 + k) * 16), corr);
      for (int j = 0; j < nvalid; j++) {
        const __m512 p = _mm512_loadu_ps(sp + j * 16);
        const float* vj = vr + size_t(j) * hd + d0;
        for (int k = 0; k < 16; k++) acc[k] = _mm512_fmadd_ps(p, _mm512_set1_ps(vj[k]), acc[k]);
      }
      for (int k = 0; k < 16; k++) _mm512_storeu_ps(ot + (d0 + k) * 16, acc[k]);
    }
  }
  alignas(64) float ls[16];
  _mm512_store_ps(ls, l);
  for (int i = 0; i < nvec; i++) {
    int row, head;
    VecRowHead(a, t, t.v0 + i, &row, &head);
    float* o = a.out + (size_t(row) * a.n_heads + head) * hd;
    const float inv = ls[i] > 0 ? 1.0f / ls[i] : 0.0f;
    for (int d = 0; d < hd; d++) o[d] = ot[d * 16 + i] * inv;
  }
}

// ---- narrow kernel -------------------------------------------------------------------------------

// C = head_dim / 16 registers per vector. Blocks outermost, so each K/V block is read from
// memory once for all the task's vectors (the GQA group of a decode step).
template <DType DT, int C>
void NarrowTask(const AttnArgs& a, const AttnTask& t) {
  const AttnSeq& seq = a.seqs[t.seq];
  const PagedKvLayer& kv = *a.kv;
  constexpr int hd = C * 16;
  const int nvec = t.v1 - t.v0;
  alignas(64) float qs[kAttnNarrowVecs][hd];   // scaled queries
  alignas(64) float acc[kAttnNarrowVecs][hd];  // running sum of p * v
  float m[kAttnNarrowVecs], l[kAttnNarrowVecs];
  int last[kAttnNarrowVecs];  // last visible key per vector
  float* outp[kAttnNarrowVecs];
  int kmax = -1;
  const __m512 scale = _mm512_set1_ps(a.scale);
  for (int i = 0; i < nvec; i++) {
    int row, head;
    VecRowHead(a, t, t.v0 + i, &row, &head);
    const float* q = a.q + (size_t(row) * a.n_heads + head) * hd;
    for (int c = 0; c < C; c++) {
      _mm512_store_ps(qs[i] + c * 16, _mm512_mul_ps(_mm512_loadu_ps(q + c * 16), scale));
      _mm512_store_ps(acc[i] + c * 16, _mm512_setzero_ps());
    }
    m[i] = -FLT_MAX;
    l[i] = 0;
    last[i] = std::min(a.q_pos[row], seq.n_ctx - 1);
    kmax = std::max(kmax, last[i]);
    outp[i] = a.out + (size_t(row) * a.n_heads + head) * hd;
  }
  for (int k0 = 0; k0 <= kmax; k0 += kBlockTokens) {
    const int32_t block = seq.block_table[k0 / kBlockTokens];
    const void* kr = KvBlockPtr(kv, block, 0, t.kv_head);
    const void* vr = KvBlockPtr(kv, block, 1, t.kv_head);
    // The next block's K and V, one row each per key of this block for the first vector:
    // spread out so that the prefetches are not dropped for want of miss buffers.
    const char* next_k = nullptr;
    const char* next_v = nullptr;
    if (k0 + kBlockTokens <= kmax) {
      const int32_t nb = seq.block_table[k0 / kBlockTokens + 1];
      next_k = static_cast<const char*>(KvBlockPtr(kv, nb, 0, t.kv_head));
      next_v = static_cast<const char*>(KvBlockPtr(kv, nb, 1, t.kv_head));
    }
    constexpr size_t row_bytes = size_t(hd) * (DT == DType::F32 ? 4 : 2);
    for (int i = 0; i < nvec; i++) {
      const int lim = std::min(kBlockTokens, last[i] - k0 + 1);  // visible keys in this block
      if (lim <= 0) continue;
      __m512 qv[C];
      for (int c = 0; c < C; c++) qv[c] = _mm512_load_ps(qs[i] + c * 16);
      __m512 s[2];
      for (int h = 0; h * 16 < lim; h++) {
        __m512 part[16];
        for (int jj = 0; jj < 16; jj++) {
          if (i == 0 && next_k != nullptr) {
            const size_t off = size_t(h * 16 + jj) * row_bytes;
            for (size_t b = 0; b < row_bytes; b += 64) {
              _mm_prefetch(next_k + off + b, _MM_HINT_T0);
              _mm_prefetch(next_v + off + b, _MM_HINT_T0);
            }
          }
          // Rows past lim (stale or garbage) only reach lanes that the blend below discards.
          const size_t base = size_t(h * 16 + jj) * hd;
          __m512 p = _mm512_mul_ps(qv[0], LoadRow16<DT>(kr, base));
          for (int c = 1; c < C; c++) p = _mm512_fmadd_ps(qv[c], LoadRow16<DT>(kr, base + c * 16), p);
          part[jj] = p;
        }
        s[h] = _mm512_mask_blend_ps(TailMask(lim - h * 16), _mm512_set1_ps(-INFINITY), Reduce16(part));
      }
      const int halves = (lim + 15) / 16;
      const float mb = std::max(m[i], _mm512_reduce_max_ps(halves == 2 ? _mm512_max_ps(s[0], s[1]) : s[0]));
      const float corr = std::exp(m[i] - mb);
      m[i] = mb;
      alignas(64) float p[kBlockTokens];
      __m512 psum = _mm512_setzero_ps();
      for (int h = 0; h < halves; h++) {
        const __m512 e = Exp512(_mm512_sub_ps(s[h], _mm512_set1_ps(mb)));
        psum = _mm512_add_ps(psum, e);
        _mm512_store_ps(p + h * 16, e);
      }
      l[i] = l[i] * corr + _mm512_reduce_add_ps(psum);
      __m512 av[C];
      const __m512 vc = _mm512_set1_ps(corr);
      for (int c = 0; c < C; c++) av[c] = _mm512_mul_ps(_mm512_load_ps(acc[i] + c * 16), vc);
      for (int j = 0; j < lim; j++) {
        const __m512 pj = _mm512_set1_ps(p[j]);
        for (int c = 0; c < C; c++) {
          av[c] = _mm512_fmadd_ps(pj, LoadRow16<DT>(vr, size_t(j) * hd + c * 16), av[c]);
        }
      }
      for (int c = 0; c < C; c++) _mm512_store_ps(acc[i] + c * 16, av[c]);
    }
  }
  for (int i = 0; i < nvec; i++) {
    const __m512 inv = _mm512_set1_ps(l[i] > 0 ? 1.0f / l[i] : 0.0f);
    for (int c = 0; c < C; c++) _mm512_storeu_ps(outp[i] + c * 16, _mm512_mul_ps(_mm512_load_ps(acc[i] + c * 16), inv));
  }
}

template <DType DT>
void NarrowDispatch(const AttnArgs& a, const AttnTask& t) {
  switch (a.kv->head_dim / 16) {
    case 1: return NarrowTask<DT, 1>(a, t);
    case 2: return NarrowTask<DT, 2>(a, t);
    case 3: return NarrowTask<DT, 3>(a, t);
    case 4: return NarrowTask<DT, 4>(a, t);
    case 5: return NarrowTask<DT, 5>(a, t);
    case 6: return NarrowTask<DT, 6>(a, t);
    case 7: return NarrowTask<DT, 7>(a, t);
    case 8: return NarrowTask<DT, 8>(a, t);
    default: return WideTask<DT>(a, t);  // large heads: the wide kernel's registers don't grow
  }
}

template <DType DT>
void RunTask(const AttnArgs& a, const AttnTask& t) {
  if (t.v1 - t.v0 <= kAttnNarrowVecs) {
    NarrowDispatch<DT>(a, t);
  } else {
    WideTask<DT>(a, t);
  }
}

}  // namespace

void AttnTaskAvx512(const AttnArgs& a, const AttnTask& t) {
  switch (a.kv->dtype) {
    case DType::F32: return RunTask<DType::F32>(a, t);
    case DType::F16: return RunTask<DType::F16>(a, t);
    case DType::BF16: return RunTask<DType::BF16>(a, t);
    default: return AttnTaskRef(a, t);
  }
}

}  // namespace mnemo::kernels::detail
