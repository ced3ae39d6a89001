// AVX2 activation kernels (activation_internal.h), for CPUs without AVX-512;
// the same formulas as activation_avx512.cpp.
#include <algorithm>

#include "kernels/cpu/activation_internal.h"
#include "kernels/cpu/simd_avx2.h"

namespace mnemo::kernels::detail {

// gelu(x) = x / (1 + e^(-2u)), u = sqrt(2 / pi) x (1 + 0.044715 x^2) (see
// GeluTanhGatedAvx512).
void GeluTanhGatedAvx2(const float *gate_up, int n, int ffn, float *out) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 c =
      _mm256_set1_ps(-2.0f * 0.79788456080286535588f); // -2 sqrt(2 / pi)
  const __m256 a = _mm256_set1_ps(0.044715f);
  for (int j = 0; j < n; j++) {
    const float *g = gate_up + size_t(j) * 2 * ffn;
    const float *u = g + ffn;
    float *o = out + size_t(j) * ffn;
    for (int i = 0; i < ffn; i += 8) {
      const __m256i m = TailMask8(ffn - i);
      const __m256 x = _mm256_maskload_ps(g + i, m);
      const __m256 inner = _mm256_mul_ps(
          _mm256_mul_ps(c, x), _mm256_fmadd_ps(a, _mm256_mul_ps(x, x), one));
      const __m256 gelu = _mm256_div_ps(x, _mm256_add_ps(one, Exp256(inner)));
      _mm256_maskstore_ps(o + i, m,
                          _mm256_mul_ps(gelu, _mm256_maskload_ps(u + i, m)));
    }
  }
}

void SoftCapAvx2(float *x, size_t n, float cap) {
  const __m256 vcap = _mm256_set1_ps(cap), inv = _mm256_set1_ps(1.0f / cap);
  for (size_t i = 0; i < n; i += 8) {
    const __m256i m = TailMask8(int(std::min<size_t>(8, n - i)));
    const __m256 v = _mm256_maskload_ps(x + i, m);
    _mm256_maskstore_ps(x + i, m,
                        _mm256_mul_ps(vcap, Tanh256(_mm256_mul_ps(v, inv))));
  }
}

} // namespace mnemo::kernels::detail
