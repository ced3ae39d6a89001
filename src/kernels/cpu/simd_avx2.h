// Internal to src/kernels/cpu: AVX2 helpers, for files compiled with the AVX2
// flags
// (-mavx2 -mfma -mf16c) only.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace mnemo::kernels::detail {

// Sum of the 8 lanes.
inline float HSum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline float HMax256(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline int32_t HSumI256(__m256i v) {
  __m128i s =
      _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}
inline __m256 Abs256(__m256 v) {
  return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v);
}

// Lanes [0, n) set (all-ones int32) for n in any range, as the mask operand of
// maskload/maskstore.
inline __m256i TailMask8(int n) {
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), idx);
}

// e^x as Exp512 (simd_avx512.h): Cephes' expf polynomial after reduction by ln
// 2; 0 for x < -87.3 (and -inf), saturates at x = 88.38. AVX2 has no vscalefps:
// p * 2^n is taken as (2 p) * 2^(n - 1) with 2^(n - 1) built in the exponent
// bits, which stays finite for n = 128 (x near 88.38); at n = -126 (x within
// 0.01 of -87.3) it gives 0 where Exp512 gives 1.2e-38.
inline __m256 Exp256(__m256 x) {
  const __m256 log2e = _mm256_set1_ps(1.44269504088896341f);
  const __m256 ln2_hi = _mm256_set1_ps(0.693359375f);
  const __m256 ln2_lo = _mm256_set1_ps(-2.12194440e-4f);
  x = _mm256_min_ps(x, _mm256_set1_ps(88.3762626647949f));
  const __m256 keep =
      _mm256_cmp_ps(x, _mm256_set1_ps(-87.33654475f), _CMP_GE_OQ);
  const __m256 n = _mm256_round_ps(
      _mm256_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, ln2_hi, x);
  r = _mm256_fnmadd_ps(n, ln2_lo, r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r),
                      _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(126)), 23);
  const __m256 v = _mm256_mul_ps(_mm256_add_ps(p, p), _mm256_castsi256_ps(e));
  return _mm256_and_ps(v, keep);
}

// tanh(x) = 1 - 2 / (e^2x + 1), as Tanh512.
inline __m256 Tanh256(__m256 x) {
  const __m256 e = Exp256(_mm256_add_ps(x, x));
  const __m256 one = _mm256_set1_ps(1.0f);
  return _mm256_sub_ps(
      one, _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, one)));
}

// 8 bf16 / f16 values at p -> f32.
inline __m256 LoadBf16x8(const uint16_t *p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i *>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline __m256 LoadF16x8(const uint16_t *p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(p)));
}

// f32 -> bf16, round to nearest even, NaN kept quiet (base/dtype.h's
// F32ToBf16), 8 lanes.
inline __m128i F32ToBf16x8(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i abs = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
  const __m256i nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f800000));
  const __m256i lsb =
      _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(
      _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))),
      16);
  const __m256i quiet =
      _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  const __m256i r = _mm256_blendv_epi8(rounded, quiet, nan);
  const __m256i packed =
      _mm256_packus_epi32(r, r); // lanes 0-3 | 0-3 || 4-7 | 4-7 (values < 2^16)
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08));
}

} // namespace mnemo::kernels::detail
