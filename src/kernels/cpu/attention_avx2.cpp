// AVX2 attention kernel (attention_internal.h), for CPUs without AVX-512: one
// shape for decode and prefill tasks alike. Lanes run along head_dim; K/V
// blocks are read once per task (blocks outermost), F16/BF16 ones converted to
// f32 into L1-resident scratch for all the task's query vectors; scores of 8
// keys are reduced together by an hadd tree; online softmax per vector.
#include <algorithm>
#include <cfloat>
#include <cmath>

#include "kernels/cpu/attention_internal.h"
#include "kernels/cpu/simd_avx2.h"

namespace mnemo::kernels::detail {
namespace {

// Per-thread scratch (too large for a worker's stack at head_dim 256).
struct Scratch {
  alignas(32) float qs[kAttnTileVecs][kAttnMaxHeadDimAvx2]; // scaled queries
  alignas(
      32) float acc[kAttnTileVecs][kAttnMaxHeadDimAvx2]; // running sum of p * v
  alignas(
      32) float p[kAttnTileVecs][kBlockTokens]; // this block's probabilities
  alignas(32) float kf[kBlockTokens *
                       kAttnMaxHeadDimAvx2]; // K block in f32, [32][head_dim]
  alignas(32) float vf[kBlockTokens *
                       kAttnMaxHeadDimAvx2]; // V block in f32, [32][head_dim]
};

template <DType DT> inline __m256 LoadRow8(const void *base, size_t idx) {
  if constexpr (DT == DType::F32) {
    return _mm256_loadu_ps(static_cast<const float *>(base) + idx);
  } else if constexpr (DT == DType::BF16) {
    return LoadBf16x8(static_cast<const uint16_t *>(base) + idx);
  } else {
    return LoadF16x8(static_cast<const uint16_t *>(base) + idx);
  }
}

// v rounded to the nearest bf16 (ties to even), as f32 (as F32ToBf16 for finite
// values; attention inputs are finite).
inline __m256 RoundBf16(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i odd =
      _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i r =
      _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd));
  return _mm256_castsi256_ps(
      _mm256_and_si256(r, _mm256_set1_epi32(int32_t(0xffff0000u))));
}

// The 8 sums of the lanes of v[0..7], in order.
inline __m256 Reduce8(const __m256 *v) {
  const __m256 t0 = _mm256_hadd_ps(v[0], v[1]), t1 = _mm256_hadd_ps(v[2], v[3]);
  const __m256 t2 = _mm256_hadd_ps(v[4], v[5]), t3 = _mm256_hadd_ps(v[6], v[7]);
  const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20),
                       _mm256_permute2f128_ps(u0, u1, 0x31));
}

// Scores of query q against keys [0, 8 * groups) of k (rows of hd floats) into
// s.
inline void Scores(const float *q, const float *k, int hd, int groups,
                   float *s) {
  for (int g = 0; g < groups; g++) {
    const float *kg = k + size_t(8 * g) * hd;
    __m256 d[8];
    for (int i = 0; i < 8; i++)
      d[i] = _mm256_setzero_ps();
    for (int c = 0; c < hd; c += 8) {
      const __m256 qc = _mm256_load_ps(q + c);
      for (int i = 0; i < 8; i++)
        d[i] =
            _mm256_fmadd_ps(qc, _mm256_loadu_ps(kg + size_t(i) * hd + c), d[i]);
    }
    _mm256_store_ps(s + 8 * g, Reduce8(d));
  }
}

// acc = acc * corr + sum_{j < n} p[j] v[j], 32 dims per pass (4 independent FMA
// chains).
inline void AccumulateV(const float *v, int n, int hd, const float *p,
                        float corr, float *acc) {
  const __m256 c = _mm256_set1_ps(corr);
  int d0 = 0;
  for (; d0 + 32 <= hd; d0 += 32) {
    __m256 a[4];
    for (int u = 0; u < 4; u++)
      a[u] = _mm256_mul_ps(_mm256_load_ps(acc + d0 + 8 * u), c);
    for (int j = 0; j < n; j++) {
      const __m256 pj = _mm256_set1_ps(p[j]);
      for (int u = 0; u < 4; u++)
        a[u] = _mm256_fmadd_ps(
            pj, _mm256_loadu_ps(v + size_t(j) * hd + d0 + 8 * u), a[u]);
    }
    for (int u = 0; u < 4; u++)
      _mm256_store_ps(acc + d0 + 8 * u, a[u]);
  }
  for (; d0 < hd; d0 += 8) {
    __m256 a = _mm256_mul_ps(_mm256_load_ps(acc + d0), c);
    for (int j = 0; j < n; j++)
      a = _mm256_fmadd_ps(_mm256_set1_ps(p[j]),
                          _mm256_loadu_ps(v + size_t(j) * hd + d0), a);
    _mm256_store_ps(acc + d0, a);
  }
}

template <DType DT> void Task(const AttnArgs &a, const AttnTask &t) {
  const AttnSeq &seq = a.seqs[t.seq];
  const PagedKvLayer &kv = *a.kv;
  const int hd = kv.head_dim;
  const int nvec = t.v1 - t.v0;
  thread_local Scratch sc;
  float m[kAttnTileVecs], l[kAttnTileVecs];
  int first[kAttnTileVecs],
      last[kAttnTileVecs]; // visible keys per vector: [first, last]
  float *outp[kAttnTileVecs];
  int kmax = -1, first_min = INT32_MAX;
  const __m256 scale = _mm256_set1_ps(a.scale);
  for (int i = 0; i < nvec; i++) {
    const int v = t.v0 + i;
    const int row = seq.q_begin + v / a.group;
    const int head = t.kv_head * a.group + v % a.group;
    const float *q = a.q + (size_t(row) * a.n_heads + head) * hd;
    for (int c = 0; c < hd; c += 8) {
      __m256 qc = _mm256_mul_ps(_mm256_loadu_ps(q + c), scale);
      if constexpr (DT == DType::BF16)
        qc = RoundBf16(qc); // as the other kernels (AttnArgs::bf16_dot)
      _mm256_store_ps(sc.qs[i] + c, qc);
      _mm256_store_ps(sc.acc[i] + c, _mm256_setzero_ps());
    }
    m[i] = -FLT_MAX;
    l[i] = 0;
    last[i] = std::min(a.q_pos[row], seq.n_ctx - 1);
    first[i] = FirstVisibleKey(a.q_pos[row], a.window);
    kmax = std::max(kmax, last[i]);
    first_min = std::min(first_min, first[i]);
    outp[i] = a.out + (size_t(row) * a.n_heads + head) * hd;
  }
  for (int k0 = first_min / kBlockTokens * kBlockTokens; k0 <= kmax;
       k0 += kBlockTokens) {
    if (!BlockVisible(first, last, nvec, k0))
      continue; // outside every window
    const int nvalid = std::min(kBlockTokens, kmax - k0 + 1);
    const int32_t block = seq.block_table[k0 / kBlockTokens];
    const void *kr = KvBlockPtr(kv, block, 0, t.kv_head);
    const void *vr = KvBlockPtr(kv, block, 1, t.kv_head);
    const int groups =
        (nvalid + 7) / 8; // keys scored 8 at a time; rows past nvalid are zeros
    const float *kp;
    const float *vp;
    if constexpr (DT == DType::F32) {
      if (groups * 8 == nvalid) {
        kp = static_cast<const float *>(kr);
      } else { // a partial last group: copy, so no row past the block's valid
               // ones is read
        std::copy_n(static_cast<const float *>(kr), size_t(nvalid) * hd, sc.kf);
        std::fill_n(sc.kf + size_t(nvalid) * hd,
                    size_t(groups * 8 - nvalid) * hd, 0.0f);
        kp = sc.kf;
      }
      vp = static_cast<const float *>(vr);
    } else {
      for (int j = 0; j < nvalid; j++) {
        for (int c = 0; c < hd; c += 8) {
          _mm256_store_ps(sc.kf + size_t(j) * hd + c,
                          LoadRow8<DT>(kr, size_t(j) * hd + c));
          _mm256_store_ps(sc.vf + size_t(j) * hd + c,
                          LoadRow8<DT>(vr, size_t(j) * hd + c));
        }
      }
      std::fill_n(sc.kf + size_t(nvalid) * hd, size_t(groups * 8 - nvalid) * hd,
                  0.0f);
      kp = sc.kf;
      vp = sc.vf;
    }
    for (int i = 0; i < nvec; i++) {
      const int j0 = std::max(0, first[i] - k0); // visible keys in this block:
      const int lim = std::min(kBlockTokens, last[i] - k0 + 1); // [j0, lim)
      float corr = 1.0f;
      if (lim > j0) {
        alignas(32) float s[kBlockTokens];
        const int gi = (lim + 7) / 8;
        Scores(sc.qs[i], kp, hd, gi, s);
        const __m256i vj0 = _mm256_set1_epi32(j0),
                      vlim = _mm256_set1_epi32(lim);
        __m256 mx = _mm256_set1_ps(-FLT_MAX);
        for (int g = 0; g < gi; g++) {
          __m256 sg = _mm256_load_ps(s + 8 * g);
          if (a.softcap > 0) {
            sg = _mm256_mul_ps(
                _mm256_set1_ps(a.softcap),
                Tanh256(_mm256_mul_ps(sg, _mm256_set1_ps(1.0f / a.softcap))));
          }
          const __m256i key =
              _mm256_add_epi32(_mm256_set1_epi32(8 * g),
                               _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
          const __m256i vis = _mm256_andnot_si256(
              _mm256_cmpgt_epi32(vj0, key), _mm256_cmpgt_epi32(vlim, key));
          sg = _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), sg,
                                _mm256_castsi256_ps(vis));
          mx = _mm256_max_ps(mx, sg);
          _mm256_store_ps(s + 8 * g, sg);
        }
        const float mb = std::max(m[i], HMax256(mx));
        corr = std::exp(m[i] - mb);
        m[i] = mb;
        __m256 psum = _mm256_setzero_ps();
        for (int g = 0; g < 4; g++) {
          // exp(-inf) = 0 for the hidden keys; groups past lim are 0.
          const __m256 e = g < gi
                               ? Exp256(_mm256_sub_ps(_mm256_load_ps(s + 8 * g),
                                                      _mm256_set1_ps(mb)))
                               : _mm256_setzero_ps();
          psum = _mm256_add_ps(psum, e);
          _mm256_store_ps(sc.p[i] + 8 * g, e);
        }
        l[i] = l[i] * corr + HSum256(psum);
      } else {
        std::fill_n(sc.p[i], kBlockTokens, 0.0f);
      }
      // Rows [0, lim) of V are this block's real data; p = 0 leaves acc
      // unchanged.
      if (lim > j0)
        AccumulateV(vp, lim, hd, sc.p[i], corr, sc.acc[i]);
    }
  }
  for (int i = 0; i < nvec; i++) {
    const __m256 inv = _mm256_set1_ps(l[i] > 0 ? 1.0f / l[i] : 0.0f);
    for (int c = 0; c < hd; c += 8)
      _mm256_storeu_ps(outp[i] + c,
                       _mm256_mul_ps(_mm256_load_ps(sc.acc[i] + c), inv));
  }
}

} // namespace

void AttnTaskAvx2(const AttnArgs &a, const AttnTask &t) {
  switch (a.kv->dtype) {
  case DType::F32:
    return Task<DType::F32>(a, t);
  case DType::F16:
    return Task<DType::F16>(a, t);
  case DType::BF16:
    return Task<DType::BF16>(a, t);
  default:
    return AttnTaskRef(a, t);
  }
}

} // namespace mnemo::kernels::detail
