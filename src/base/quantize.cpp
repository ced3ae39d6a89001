// Quantisers of ggml's block types (decoders in quant.cpp).
#include <cmath>
#include <string>

#include "base/quant.h"
#include "base/status.h"

namespace mnemo {
namespace {

// Q8_0 as llama.cpp: d = max|x| / 127, q = round(x / d) (half away from zero).
void QuantizeQ8_0(const float* x, BlockQ8_0* b, size_t nb) {
  for (size_t i = 0; i < nb; i++, x += kQK) {
    float amax = 0;
    for (int j = 0; j < kQK; j++) amax = std::fmax(amax, std::fabs(x[j]));
    float d = amax / 127.0f;
    float id = d != 0 ? 1.0f / d : 0.0f;
    b[i].d = F32ToF16(d);
    for (int j = 0; j < kQK; j++) b[i].q[j] = int8_t(std::lround(x[j] * id));
  }
}

}  // namespace

void QuantizeBlocks(DType t, const float* src, void* dst, size_t n) {
  size_t nb = n / size_t(DTypeBlockElems(t));
  switch (t) {
    case DType::Q8_0: return QuantizeQ8_0(src, static_cast<BlockQ8_0*>(dst), nb);
    default: break;
  }
  MNEMO_CHECK_MSG(false, std::string("QuantizeBlocks: no quantiser for ") + DTypeName(t));
}

}  // namespace mnemo
