// AVX-512 activation kernels (activation_internal.h).
#include <algorithm>

#include "kernels/cpu/activation_internal.h"
#include "kernels/cpu/simd_avx512.h"

namespace mnemo::kernels::detail {

// gelu(x) = 0.5 x (1 + tanh(u)) = x / (1 + e^(-2u)), u = sqrt(2 / pi) x (1 + 0.044715 x^2): the
// same function as GeluTanh without tanh's cancellation near 0; e^(-2u) flushes to 0 for large x
// (gelu = x) and saturates for very negative x (gelu = -0).
void GeluTanhGatedAvx512(const float* gate_up, int n, int ffn, float* out) {
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 c = _mm512_set1_ps(-2.0f * 0.79788456080286535588f);  // -2 sqrt(2 / pi)
  const __m512 a = _mm512_set1_ps(0.044715f);
  for (int j = 0; j < n; j++) {
    const float* g = gate_up + size_t(j) * 2 * ffn;
    const float* u = g + ffn;
    float* o = out + size_t(j) * ffn;
    for (int i = 0; i < ffn; i += 16) {
      const __mmask16 m = TailMask(ffn - i);
      const __m512 x = _mm512_maskz_loadu_ps(m, g + i);
      const __m512 inner = _mm512_mul_ps(_mm512_mul_ps(c, x), _mm512_fmadd_ps(a, _mm512_mul_ps(x, x), one));
      const __m512 gelu = _mm512_div_ps(x, _mm512_add_ps(one, Exp512(inner)));
      _mm512_mask_storeu_ps(o + i, m, _mm512_mul_ps(gelu, _mm512_maskz_loadu_ps(m, u + i)));
    }
  }
}

void SoftCapAvx512(float* x, size_t n, float cap) {
  const __m512 vcap = _mm512_set1_ps(cap), inv = _mm512_set1_ps(1.0f / cap);
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 m = TailMask(int(std::min<size_t>(16, n - i)));
    const __m512 v = _mm512_maskz_loadu_ps(m, x + i);
    _mm512_mask_storeu_ps(x + i, m, _mm512_mul_ps(vcap, Tanh512(_mm512_mul_ps(v, inv))));
  }
}

}  // namespace mnemo::kernels::detail
