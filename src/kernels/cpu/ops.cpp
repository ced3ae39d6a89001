#include "kernels/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "base/cpu.h"
#include "base/thread_pool.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/ops_internal.h"
#include "kernels/cpu/parallel.h"

namespace mnemo::kernels {
namespace {

bool UseAvx512() {
  static const bool yes = detail::KernelFeatures().avx512f;
  return yes;
}

bool UseAvx2() {
  static const bool yes = detail::UseAvx2Kernels(detail::KernelFeatures());
  return yes;
}


}  // namespace

void RmsNorm(const float* x, const float* w, int n, int dim, float eps, float* y) {
  if (UseAvx512()) {
    return detail::ForRowRanges(n, dim, [&](int i0, int i1) {
      detail::RmsNormAvx512(x + size_t(i0) * dim, w, i1 - i0, dim, eps, y + size_t(i0) * dim);
    });
  }
  if (UseAvx2()) {
    return detail::ForRowRanges(n, dim, [&](int i0, int i1) {
      detail::RmsNormAvx2(x + size_t(i0) * dim, w, i1 - i0, dim, eps, y + size_t(i0) * dim);
    });
  }
  for (int i = 0; i < n; i++) {
    const float* xi = x + size_t(i) * dim;
    float* yi = y + size_t(i) * dim;
    float ss = 0;
    for (int k = 0; k < dim; k++) ss += xi[k] * xi[k];
    float inv = 1.0f / std::sqrt(ss / dim + eps);
    for (int k = 0; k < dim; k++) yi[k] = w[k] * (inv * xi[k]);
  }
}

// Angles are computed as llama2.c does (float powf, then pos * freq in float, cosf / sinf), so
// that golden tests against it agree closely; the table is per call, shared by all heads.
void Rope(float* x, const int32_t* pos, int n, int n_heads, int head_dim, const RopeParams& p) {
  const int half = p.dims / 2;
  // Element offsets of the two members of pair i: (2i, 2i + 1) or (i, i + half).
  const bool neox = p.pairs == RopePairs::kNeox;
  const int stride = neox ? 1 : 2, second = neox ? half : 1;
  std::vector<float> freq(half);  // [dims / 2] angle per unit position
  for (int i = 0; i < half; i++) {
    freq[i] = p.freq_scale / powf(p.theta, float(2 * i) / float(p.dims));
    if (p.freq_factors) freq[i] /= p.freq_factors[i];
  }
  const float mscale = p.attn_factor;
  auto rotate = [&](int t) {
    float cs[256], sn[256];  // cos / sin per pair, chunked to keep them on the stack
    for (int i0 = 0; i0 < half; i0 += 256) {
      const int i1 = std::min(half, i0 + 256);
      for (int i = i0; i < i1; i++) {
        float val = float(pos[t]) * freq[i];
        cs[i - i0] = cosf(val) * mscale;
        sn[i - i0] = sinf(val) * mscale;
      }
      for (int h = 0; h < n_heads; h++) {
        float* xh = x + (size_t(t) * n_heads + h) * head_dim;
        for (int i = i0; i < i1; i++) {
          float* a = xh + i * stride;
          float v0 = a[0], v1 = a[second];
          float c = cs[i - i0], s = sn[i - i0];
          a[0] = v0 * c - v1 * s;
          a[second] = v0 * s + v1 * c;
        }
      }
    }
  };
  if (n >= 16) {
    ThreadPool::Get().For(n, rotate);
  } else {
    for (int t = 0; t < n; t++) rotate(t);
  }
}

void Rope(float* x, const int32_t* pos, int n, int n_heads, int head_dim, int rope_dims, float theta) {
  RopeParams p;
  p.dims = rope_dims;
  p.theta = theta;
  Rope(x, pos, n, n_heads, head_dim, p);
}

void AddBias(float* x, const float* b, int n, int dim) {
  for (int i = 0; i < n; i++) AddInPlace(x + size_t(i) * dim, b, size_t(dim));
}

void SwiGlu(const float* gate_up, int n, int ffn, float* out) {
  if (UseAvx512()) {
    return detail::ForRowRanges(n, 2 * size_t(ffn), [&](int i0, int i1) {
      detail::SwiGluAvx512(gate_up + size_t(i0) * 2 * ffn, i1 - i0, ffn, out + size_t(i0) * ffn);
    });
  }
  if (UseAvx2()) {
    return detail::ForRowRanges(n, 2 * size_t(ffn), [&](int i0, int i1) {
      detail::SwiGluAvx2(gate_up + size_t(i0) * 2 * ffn, i1 - i0, ffn, out + size_t(i0) * ffn);
    });
  }
  for (int j = 0; j < n; j++) {
    const float* g = gate_up + size_t(j) * 2 * ffn;
    const float* u = g + ffn;
    float* o = out + size_t(j) * ffn;
    for (int i = 0; i < ffn; i++) o[i] = g[i] * (1.0f / (1.0f + expf(-g[i]))) * u[i];
  }
}

void AddInPlace(float* y, const float* x, size_t n) {
  if (UseAvx512()) return detail::AddInPlaceAvx512(y, x, n);
  if (UseAvx2()) return detail::AddInPlaceAvx2(y, x, n);
  for (size_t i = 0; i < n; i++) y[i] += x[i];
}

}  // namespace mnemo::kernels
