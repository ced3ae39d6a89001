// Internal to src/kernels/cpu: AVX-512 helpers, for files compiled with the AVX-512 flags only.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace mnemo::kernels::detail {

// e^x to ~2 ulp (Cephes' expf polynomial after reduction by ln 2); 0 for x < -87.3 (and -inf),
// saturates at x = 88.38.
inline __m512 Exp512(__m512 x) {
  const __m512 log2e = _mm512_set1_ps(1.44269504088896341f);
  const __m512 ln2_hi = _mm512_set1_ps(0.693359375f);
  const __m512 ln2_lo = _mm512_set1_ps(-2.12194440e-4f);
  x = _mm512_min_ps(x, _mm512_set1_ps(88.3762626647949f));
  const __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.33654475f), _CMP_GE_OQ);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, log2e),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, ln2_hi, x);
  r = _mm512_fnmadd_ps(n, ln2_lo, r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_maskz_mov_ps(keep, _mm512_scalef_ps(p, n));
}

// tanh(x) = 1 - 2 / (e^2x + 1): absolute error ~3e-7 (Exp512's), exactly -1 / 1 in the tails
// (Exp512 flushes to 0 and saturates).
inline __m512 Tanh512(__m512 x) {
  const __m512 e = Exp512(_mm512_add_ps(x, x));
  const __m512 one = _mm512_set1_ps(1.0f);
  return _mm512_sub_ps(one, _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(e, one)));
}

// 16 bf16 values at p -> f32.
inline __m512 LoadBf16x16(const uint16_t* p) {
  __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
// 16 f16 values at p -> f32.
inline __m512 LoadF16x16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
// Masked variants (lanes outside the mask read nothing and are 0).
inline __m512 MaskLoadBf16(const uint16_t* p, __mmask16 m) {
  __m256i h = _mm256_maskz_loadu_epi16(m, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline __m512 MaskLoadF16(const uint16_t* p, __mmask16 m) {
  return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
}

// f32 -> bf16 with round to nearest even (NaN kept quiet), 16 lanes.
inline __m256i F32ToBf16x16(__m512 v) {
  return reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v));
}

// Lanes [0, n) for n in any range (n <= 0: none, n >= 16: all).
inline __mmask16 TailMask(int n) {
  return n >= 16 ? __mmask16(0xffff) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1);
}

}  // namespace mnemo::kernels::detail
