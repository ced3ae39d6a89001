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
#include <cstring>
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

// v rounded to the nearest bf16 (ties to even), as f32; AVX-512F only (as F32ToBf16 for finite
// values; attention inputs are finite).
inline __m512 RoundBf16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd));
  return _mm512_castsi512_ps(_mm512_and_si512(r, _mm512_set1_epi32(int32_t(0xffff0000u))));
}

// The scaled query element the scores use (attention_internal.h, AttnArgs::bf16_dot).
template <DType DT>
inline float ScoreQuery(float q, float scale) {
  if constexpr (DT == DType::BF16) {
    return Bf16ToF32(F32ToBf16(q * scale));
  } else {
    return q * scale;
  }
}

// AttnOptions::softcap applied to 16 scores (cap > 0).
inline __m512 SoftCap(__m512 s, float cap) {
  return _mm512_mul_ps(_mm512_set1_ps(cap), Tanh512(_mm512_mul_ps(s, _mm512_set1_ps(1.0f / cap))));
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
  std::vector<uint32_t> qt2;  // [hd / 2][16] pairs of bf16 queries (bf16_dot)
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
  // Visible keys per lane: [first, last]; last = -1 for unused lanes.
  alignas(64) int32_t first[16], last[16];
  int kmax = -1, kmin = INT32_MAX;              // max and min of last
  int first_min = INT32_MAX, first_max = 0;      // min and max of first
  for (int i = 0; i < 16; i++) {
    last[i] = -1;
    first[i] = 0;
    if (i >= nvec) continue;
    int row, head;
    VecRowHead(a, t, t.v0 + i, &row, &head);
    const float* q = a.q + (size_t(row) * a.n_heads + head) * hd;
    for (int d = 0; d < hd; d++) qt[d * 16 + i] = ScoreQuery<DT>(q[d], a.scale);
    last[i] = std::min(a.q_pos[row], seq.n_ctx - 1);
    first[i] = FirstVisibleKey(a.q_pos[row], a.window);
    kmax = std::max(kmax, last[i]);
    kmin = std::min(kmin, last[i]);
    first_min = std::min(first_min, first[i]);
    first_max = std::max(first_max, first[i]);
  }
  const __m512i vlast = _mm512_load_si512(last);
  const __m512i vfirst = _mm512_load_si512(first);
  const bool dot = DT == DType::BF16 && a.bf16_dot;
  if (dot) {  // qt holds bf16 values: the pairs are exact
    ws.qt2.resize(size_t(hd / 2) * 16);
    for (int dd = 0; dd < hd / 2; dd++) {
      const __m512i lo = _mm512_srli_epi32(_mm512_castps_si512(_mm512_loadu_ps(qt + 2 * dd * 16)), 16);
      const __m512i hi = _mm512_and_si512(_mm512_castps_si512(_mm512_loadu_ps(qt + (2 * dd + 1) * 16)),
                                          _mm512_set1_epi32(int32_t(0xffff0000u)));
      _mm512_storeu_si512(ws.qt2.data() + dd * 16, _mm512_or_si512(lo, hi));
    }
  }
  __m512 m = _mm512_set1_ps(-FLT_MAX), l = _mm512_setzero_ps();
  for (int k0 = first_min / kBlockTokens * kBlockTokens; k0 <= kmax; k0 += kBlockTokens) {
    // Lanes that see a key of this block; none: skip it (outside every window).
    const __mmask16 seen = _mm512_cmpge_epi32_mask(vlast, _mm512_set1_epi32(k0)) &
                           _mm512_cmple_epi32_mask(vfirst, _mm512_set1_epi32(k0 + kBlockTokens - 1)) &
                           _mm512_cmple_epi32_mask(vfirst, vlast);
    if (seen == 0) continue;
    const int nvalid = std::min(kBlockTokens, kmax - k0 + 1);
    const int32_t block = seq.block_table[k0 / kBlockTokens];
    const float* kr;
    const float* vr;
    if constexpr (DT == DType::F32) {
      kr = static_cast<const float*>(KvBlockPtr(kv, block, 0, t.kv_head));
      vr = static_cast<const float*>(KvBlockPtr(kv, block, 1, t.kv_head));
    } else {
      if (!dot) ConvertRows<DT>(KvBlockPtr(kv, block, 0, t.kv_head), nvalid, hd, ws.kb.data());
      ConvertRows<DT>(KvBlockPtr(kv, block, 1, t.kv_head), nvalid, hd, ws.vb.data());
      kr = ws.kb.data();
      vr = ws.vb.data();
    }
    // Scores, 8 keys at a time (rows past nvalid are computed on stale data and never used).
    const bool need_mask = k0 + nvalid - 1 > kmin || first_max > k0;
    __m512 mb = m;
    for (int j0 = 0; j0 < nvalid; j0 += 8) {
      __m512 s[8];
      for (int i = 0; i < 8; i++) s[i] = _mm512_setzero_ps();
      if (dot) {  // q . k from the stored bf16 keys, two dimensions per instruction
        const uint16_t* kj = static_cast<const uint16_t*>(KvBlockPtr(kv, block, 0, t.kv_head)) + size_t(j0) * hd;
        for (int dd = 0; dd < hd / 2; dd++) {
          const __m512bh qp = reinterpret_cast<__m512bh>(_mm512_loadu_si512(ws.qt2.data() + dd * 16));
          for (int i = 0; i < 8; i++) {
            int32_t pair;
            std::memcpy(&pair, kj + size_t(i) * hd + 2 * dd, 4);
            s[i] = _mm512_dpbf16_ps(s[i], qp, reinterpret_cast<__m512bh>(_mm512_set1_epi32(pair)));
          }
        }
      } else {
        const float* kj = kr + size_t(j0) * hd;
        for (int d = 0; d < hd; d++) {
          const __m512 qd = _mm512_loadu_ps(qt + d * 16);
          for (int i = 0; i < 8; i++) s[i] = _mm512_fmadd_ps(qd, _mm512_set1_ps(kj[i * hd + d]), s[i]);
        }
      }
      const int nk = std::min(8, nvalid - j0);
      for (int i = 0; i < nk; i++) {
        if (a.softcap > 0) s[i] = SoftCap(s[i], a.softcap);
        if (need_mask) {
          const __m512i key = _mm512_set1_epi32(k0 + j0 + i);
          const __mmask16 vis = _mm512_cmpge_epi32_mask(vlast, key) & _mm512_cmple_epi32_mask(vfirst, key);
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

// acc[i] = acc[i] * corr[i] + sum_{j < n} p[i][j] v[j] for NG query vectors at once: each V row is
// loaded once for all of them, and the NG * C accumulators are independent FMA chains.
// v: [n][hd] f32; p: [NG][kBlockTokens]; acc: [NG][hd].
template <int C, int NG>
inline void AccumulateV(const float* v, int n, const float* p, const float* corr, float* acc) {
  constexpr int hd = C * 16;
  __m512 av[NG][C];
  for (int i = 0; i < NG; i++) {
    const __m512 ci = _mm512_set1_ps(corr[i]);
    for (int c = 0; c < C; c++) av[i][c] = _mm512_mul_ps(_mm512_load_ps(acc + i * hd + c * 16), ci);
  }
  for (int j = 0; j < n; j++) {
    __m512 vj[C];
    for (int c = 0; c < C; c++) vj[c] = _mm512_loadu_ps(v + size_t(j) * hd + c * 16);
    for (int i = 0; i < NG; i++) {
      const __m512 pij = _mm512_set1_ps(p[i * kBlockTokens + j]);
      for (int c = 0; c < C; c++) av[i][c] = _mm512_fmadd_ps(pij, vj[c], av[i][c]);
    }
  }
  for (int i = 0; i < NG; i++)
    for (int c = 0; c < C; c++) _mm512_store_ps(acc + i * hd + c * 16, av[i][c]);
}

// Vectors per AccumulateV call: as many as keep NG * C accumulators within 16 registers.
template <int C>
constexpr int kVGroup = C <= 4 ? 4 : 2;

template <int C>
void AccumulateVGroup(const float* v, int n, const float* p, const float* corr, float* acc, int ng) {
  switch (ng) {
    case 1: return AccumulateV<C, 1>(v, n, p, corr, acc);
    case 2: return AccumulateV<C, 2>(v, n, p, corr, acc);
    case 3: if constexpr (kVGroup<C> >= 3) return AccumulateV<C, 3>(v, n, p, corr, acc); break;
    case 4: if constexpr (kVGroup<C> >= 4) return AccumulateV<C, 4>(v, n, p, corr, acc); break;
  }
}

// C = head_dim / 16 registers per vector. Blocks outermost, so each K/V block is read from
// memory once for all the task's vectors (the GQA group of a decode step); F16/BF16 blocks are
// converted to f32 once, into L1-resident scratch, for all of them.
template <DType DT, int C>
void NarrowTask(const AttnArgs& a, const AttnTask& t) {
  const AttnSeq& seq = a.seqs[t.seq];
  const PagedKvLayer& kv = *a.kv;
  constexpr int hd = C * 16;
  const int nvec = t.v1 - t.v0;
  alignas(64) float qs[kAttnNarrowVecs][hd];   // scaled queries
  alignas(64) float acc[kAttnNarrowVecs][hd];  // running sum of p * v
  alignas(64) float p[kAttnNarrowVecs][kBlockTokens];  // this block's probabilities (0 if hidden)
  alignas(64) float kf[DT == DType::F32 ? 1 : kBlockTokens][hd];  // K block in f32
  alignas(64) float vf[DT == DType::F32 ? 1 : kBlockTokens][hd];  // V block in f32
  float m[kAttnNarrowVecs], l[kAttnNarrowVecs], corr[kAttnNarrowVecs];
  int first[kAttnNarrowVecs], last[kAttnNarrowVecs];  // visible keys per vector: [first, last]
  float* outp[kAttnNarrowVecs];
  int kmax = -1, first_min = INT32_MAX;
  const __m512 scale = _mm512_set1_ps(a.scale);
  for (int i = 0; i < nvec; i++) {
    int row, head;
    VecRowHead(a, t, t.v0 + i, &row, &head);
    const float* q = a.q + (size_t(row) * a.n_heads + head) * hd;
    for (int c = 0; c < C; c++) {
      __m512 qc = _mm512_mul_ps(_mm512_loadu_ps(q + c * 16), scale);
      if constexpr (DT == DType::BF16) qc = RoundBf16(qc);  // as ScoreQuery
      _mm512_store_ps(qs[i] + c * 16, qc);
      _mm512_store_ps(acc[i] + c * 16, _mm512_setzero_ps());
    }
    m[i] = -FLT_MAX;
    l[i] = 0;
    last[i] = std::min(a.q_pos[row], seq.n_ctx - 1);
    first[i] = FirstVisibleKey(a.q_pos[row], a.window);
    kmax = std::max(kmax, last[i]);
    first_min = std::min(first_min, first[i]);
    outp[i] = a.out + (size_t(row) * a.n_heads + head) * hd;
  }
  constexpr size_t row_bytes = size_t(hd) * (DT == DType::F32 ? 4 : 2);
  // bf16 dot products need dimension pairs within a register: C even.
  const bool dot = DT == DType::BF16 && C % 2 == 0 && a.bf16_dot;
  __m512i qpair[kAttnNarrowVecs][(C + 1) / 2];  // dot: each query as 32 bf16 per register
  if (dot) {
    for (int i = 0; i < nvec; i++) {
      for (int c2 = 0; c2 < C / 2; c2++) {
        const __m512i lo = _mm512_srli_epi32(_mm512_castps_si512(_mm512_load_ps(qs[i] + 32 * c2)), 16);
        const __m512i hi = _mm512_srli_epi32(_mm512_castps_si512(_mm512_load_ps(qs[i] + 32 * c2 + 16)), 16);
        // 32 consecutive bf16: qs[32 c2 .. 32 c2 + 31] (exact: qs holds bf16 values).
        qpair[i][c2] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi32_epi16(lo)), _mm512_cvtepi32_epi16(hi), 1);
      }
    }
  }
  for (int k0 = first_min / kBlockTokens * kBlockTokens; k0 <= kmax; k0 += kBlockTokens) {
    if (!BlockVisible(first, last, nvec, k0)) continue;  // outside every window
    const int nvalid = std::min(kBlockTokens, kmax - k0 + 1);
    const int32_t block = seq.block_table[k0 / kBlockTokens];
    const void* kr = KvBlockPtr(kv, block, 0, t.kv_head);
    const void* vr = KvBlockPtr(kv, block, 1, t.kv_head);
    // K and V of the block after next, a row at a time alongside this block's rows: decode is
    // bound by the latency of these reads once the weights' stream has flushed the caches.
    const char* ahead_k = nullptr;
    const char* ahead_v = nullptr;
    if (k0 + 2 * kBlockTokens <= kmax && BlockVisible(first, last, nvec, k0 + 2 * kBlockTokens)) {
      const int32_t ab = seq.block_table[k0 / kBlockTokens + 2];
      ahead_k = static_cast<const char*>(KvBlockPtr(kv, ab, 0, t.kv_head));
      ahead_v = static_cast<const char*>(KvBlockPtr(kv, ab, 1, t.kv_head));
    }
    const float* kp;
    const float* vp;
    if constexpr (DT == DType::F32) {
      kp = static_cast<const float*>(kr);
      vp = static_cast<const float*>(vr);
    } else {
      for (int j = 0; j < nvalid; j++) {
        for (int c = 0; c < C; c++) {
          if (!dot) _mm512_store_ps(kf[j] + c * 16, LoadRow16<DT>(kr, size_t(j) * hd + c * 16));
          _mm512_store_ps(vf[j] + c * 16, LoadRow16<DT>(vr, size_t(j) * hd + c * 16));
        }
      }
      kp = kf[0];
      vp = vf[0];
    }
    if (ahead_k != nullptr) {
      for (size_t b = 0; b < kBlockTokens * row_bytes; b += 64) {
        _mm_prefetch(ahead_k + b, _MM_HINT_T0);
        _mm_prefetch(ahead_v + b, _MM_HINT_T0);
      }
    }
    int jmax = 0;  // keys of this block visible to any vector
    for (int i = 0; i < nvec; i++) {
      const int j0 = std::max(0, first[i] - k0);                 // visible keys in this block:
      const int lim = std::min(kBlockTokens, last[i] - k0 + 1);  // [j0, lim)
      corr[i] = 1.0f;
      if (lim <= j0) {
        std::fill(p[i], p[i] + kBlockTokens, 0.0f);
        continue;
      }
      jmax = std::max(jmax, lim);
      __m512 qv[C];
      for (int c = 0; c < C; c++) qv[c] = _mm512_load_ps(qs[i] + c * 16);
      __m512 s[2];
      for (int h = 0; h * 16 < lim; h++) {
        __m512 part[16];
        for (int jj = 0; jj < 16; jj++) {
          // Rows past lim (stale data) only reach lanes that the blend below discards.
          if (dot) {  // lane l: q[2l] k[2l] + q[2l+1] k[2l+1], per 32 dimensions
            const uint16_t* kj = static_cast<const uint16_t*>(kr) + size_t(h * 16 + jj) * hd;
            __m512 d = _mm512_setzero_ps();
            for (int c2 = 0; c2 < C / 2; c2++) {
              d = _mm512_dpbf16_ps(d, reinterpret_cast<__m512bh>(qpair[i][c2]),
                                   reinterpret_cast<__m512bh>(_mm512_loadu_si512(kj + 32 * c2)));
            }
            part[jj] = d;
            continue;
          }
          const float* kj = kp + size_t(h * 16 + jj) * hd;
          __m512 d = _mm512_mul_ps(qv[0], _mm512_loadu_ps(kj));
          for (int c = 1; c < C; c++) d = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(kj + c * 16), d);
          part[jj] = d;
        }
        __m512 sh = Reduce16(part);
        if (a.softcap > 0) sh = SoftCap(sh, a.softcap);
        const __mmask16 vis = TailMask(lim - h * 16) & ~TailMask(j0 - h * 16);
        s[h] = _mm512_mask_blend_ps(vis, _mm512_set1_ps(-INFINITY), sh);
      }
      const int halves = (lim + 15) / 16;
      const float mb = std::max(m[i], _mm512_reduce_max_ps(halves == 2 ? _mm512_max_ps(s[0], s[1]) : s[0]));
      corr[i] = std::exp(m[i] - mb);
      m[i] = mb;
      __m512 psum = _mm512_setzero_ps();
      for (int h = 0; h < 2; h++) {
        // exp(-inf) = 0 for the hidden keys and for the half past lim.
        const __m512 e = h < halves ? Exp512(_mm512_sub_ps(s[h], _mm512_set1_ps(mb))) : _mm512_setzero_ps();
        psum = _mm512_add_ps(psum, e);
        _mm512_store_ps(p[i] + h * 16, e);
      }
      l[i] = l[i] * corr[i] + _mm512_reduce_add_ps(psum);
    }
    // Rows [0, jmax) of V are this block's real data, so p = 0 leaves a vector unchanged.
    for (int i0 = 0; i0 < nvec; i0 += kVGroup<C>) {
      AccumulateVGroup<C>(vp, jmax, p[i0], corr + i0, acc[i0], std::min(kVGroup<C>, nvec - i0));
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
