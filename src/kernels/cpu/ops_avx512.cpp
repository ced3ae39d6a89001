// AVX-512 versions of the row-wise ops (ops_internal.h).
#include <cmath>

#include "kernels/cpu/ops_internal.h"
#include "kernels/cpu/simd_avx512.h"

namespace mnemo::kernels::detail {

void RmsNormAvx512(const float* x, const float* w, int n, int dim, float eps, float* y) {
  for (int i = 0; i < n; i++) {
    const float* xi = x + size_t(i) * dim;
    float* yi = y + size_t(i) * dim;
    __m512 acc = _mm512_setzero_ps();
    for (int k = 0; k < dim; k += 16) {
      __m512 v = _mm512_maskz_loadu_ps(TailMask(dim - k), xi + k);
      acc = _mm512_fmadd_ps(v, v, acc);
    }
    const float inv = 1.0f / std::sqrt(_mm512_reduce_add_ps(acc) / dim + eps);
    const __m512 vinv = _mm512_set1_ps(inv);
    for (int k = 0; k < dim; k += 16) {
      __mmask16 m = TailMask(dim - k);
      __m512 v = _mm512_mul_ps(vinv, _mm512_maskz_loadu_ps(m, xi + k));
      _mm512_mask_storeu_ps(yi + k, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, w + k), v));
    }
  }
}

void SwiGluAvx512(const float* gate_up, int n, int ffn, float* out) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int j = 0; j < n; j++) {
    const float* g = gate_up + size_t(j) * 2 * ffn;
    const float* u = g + ffn;
    float* o = out + size_t(j) * ffn;
    for (int i = 0; i < ffn; i += 16) {
      __mmask16 m = TailMask(ffn - i);
      __m512 gv = _mm512_maskz_loadu_ps(m, g + i);
      __m512 e = Exp512(_mm512_sub_ps(_mm512_setzero_ps(), gv));
      __m512 s = _mm512_div_ps(gv, _mm512_add_ps(one, e));
      _mm512_mask_storeu_ps(o + i, m, _mm512_mul_ps(s, _mm512_maskz_loadu_ps(m, u + i)));
    }
  }
}

void AddInPlaceAvx512(float* y, const float* x, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(y + i, _mm512_add_ps(_mm512_loadu_ps(y + i), _mm512_loadu_ps(x + i)));
  }
  if (i < n) {
    __mmask16 m = TailMask(int(n - i));
    _mm512_mask_storeu_ps(y + i, m,
                          _mm512_add_ps(_mm512_maskz_loadu_ps(m, y + i), _mm512_maskz_loadu_ps(m, x + i)));
  }
}

}  // namespace mnemo::kernels::detail
