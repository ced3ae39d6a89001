// Portable GeLU-tanh and soft-cap kernels, and the dispatch to activation_avx512.cpp and
// activation_avx2.cpp.
#include "kernels/cpu/activation.h"

#include <cmath>

#include "base/status.h"
#include "kernels/cpu/activation_internal.h"
#include "kernels/cpu/dispatch.h"
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

float GeluTanh(float x) {
  constexpr float kSqrt2OverPi = 0.79788456080286535588f;
  return 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * x * (1.0f + 0.044715f * x * x)));
}

void GeluTanhGated(const float* gate_up, int n, int ffn, float* out) {
  detail::ForRowRanges(n, 2 * size_t(ffn), [&](int i0, int i1) {
    if (UseAvx512()) {
      return detail::GeluTanhGatedAvx512(gate_up + size_t(i0) * 2 * ffn, i1 - i0, ffn,
                                         out + size_t(i0) * ffn);
    }
    if (UseAvx2()) {
      return detail::GeluTanhGatedAvx2(gate_up + size_t(i0) * 2 * ffn, i1 - i0, ffn, out + size_t(i0) * ffn);
    }
    for (int j = i0; j < i1; j++) {
      const float* g = gate_up + size_t(j) * 2 * ffn;
      const float* u = g + ffn;
      float* o = out + size_t(j) * ffn;
      for (int i = 0; i < ffn; i++) o[i] = GeluTanh(g[i]) * u[i];
    }
  });
}

void SoftCapInPlace(float* x, size_t n, float cap) {
  MNEMO_CHECK(cap > 0);
  if (UseAvx512()) return detail::SoftCapAvx512(x, n, cap);
  if (UseAvx2()) return detail::SoftCapAvx2(x, n, cap);
  const float inv = 1.0f / cap;
  for (size_t i = 0; i < n; i++) x[i] = cap * std::tanh(x[i] * inv);
}

}  // namespace mnemo::kernels
