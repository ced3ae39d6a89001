// AVX2 versions of the row-wise ops (ops_internal.h), for CPUs without AVX-512.
#include <cmath>

#include "kernels/cpu/ops_internal.h"
#include "kernels/cpu/simd_avx2.h"

namespace mnemo::kernels::detail {

void RmsNormAvx2(const float *x, const float *w, int n, int dim, float eps,
                 float *y) {
  for (int i = 0; i < n; i++) {
    const float *xi = x + size_t(i) * dim;
    float *yi = y + size_t(i) * dim;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int k = 0;
    for (; k + 16 <= dim; k += 16) {
      const __m256 v0 = _mm256_loadu_ps(xi + k),
                   v1 = _mm256_loadu_ps(xi + k + 8);
      acc0 = _mm256_fmadd_ps(v0, v0, acc0);
      acc1 = _mm256_fmadd_ps(v1, v1, acc1);
    }
    for (; k < dim; k += 8) {
      const __m256 v = _mm256_maskload_ps(xi + k, TailMask8(dim - k));
      acc0 = _mm256_fmadd_ps(v, v, acc0);
    }
    const float inv =
        1.0f / std::sqrt(HSum256(_mm256_add_ps(acc0, acc1)) / dim + eps);
    const __m256 vinv = _mm256_set1_ps(inv);
    for (k = 0; k + 8 <= dim; k += 8) {
      const __m256 v = _mm256_mul_ps(vinv, _mm256_loadu_ps(xi + k));
      _mm256_storeu_ps(yi + k, _mm256_mul_ps(_mm256_loadu_ps(w + k), v));
    }
    if (k < dim) {
      const __m256i m = TailMask8(dim - k);
      const __m256 v = _mm256_mul_ps(vinv, _mm256_maskload_ps(xi + k, m));
      _mm256_maskstore_ps(yi + k, m,
                          _mm256_mul_ps(_mm256_maskload_ps(w + k, m), v));
    }
  }
}

void SwiGluAvx2(const float *gate_up, int n, int ffn, float *out) {
  const __m256 one = _mm256_set1_ps(1.0f);
  for (int j = 0; j < n; j++) {
    const float *g = gate_up + size_t(j) * 2 * ffn;
    const float *u = g + ffn;
    float *o = out + size_t(j) * ffn;
    for (int i = 0; i < ffn; i += 8) {
      const __m256i m = TailMask8(ffn - i);
      const __m256 gv = _mm256_maskload_ps(g + i, m);
      const __m256 e = Exp256(_mm256_sub_ps(_mm256_setzero_ps(), gv));
      const __m256 s = _mm256_div_ps(gv, _mm256_add_ps(one, e));
      _mm256_maskstore_ps(o + i, m,
                          _mm256_mul_ps(s, _mm256_maskload_ps(u + i, m)));
    }
  }
}

void AddInPlaceAvx2(float *y, const float *x, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(
        y + i, _mm256_add_ps(_mm256_loadu_ps(y + i), _mm256_loadu_ps(x + i)));
  }
  for (; i < n; i++)
    y[i] += x[i];
}

} // namespace mnemo::kernels::detail
