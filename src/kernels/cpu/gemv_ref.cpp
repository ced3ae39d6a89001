// Portable versions of the Linear kernels and the weight packers (see gemv.h). They define the
// arithmetic the AVX-512 versions must reproduce (up to f32 summation order).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/gemv.h"

namespace mnemo::kernels::detail {

Bf16Blocked Bf16Shape(int out, int in) {
  Bf16Blocked s;
  s.out = out;
  s.in = in;
  s.out_pad = (out + kBf16TileOut - 1) / kBf16TileOut * kBf16TileOut;
  s.in_pad = (in + kBf16TileIn - 1) / kBf16TileIn * kBf16TileIn;
  return s;
}

namespace {

// Offset of element (output o, input k) in the BA16a64b2a layout.
inline size_t Bf16Offset(const Bf16Blocked& s, int o, int k) {
  size_t tile = size_t(o / kBf16TileOut) * (s.in_pad / kBf16TileIn) + k / kBf16TileIn;
  int ko = k % kBf16TileIn, oo = o % kBf16TileOut;
  return tile * kBf16TileElems + size_t((ko / 2) * kBf16TileOut + oo) * 2 + ko % 2;
}

}  // namespace

void PackBf16Blocked(DType t, const void* src, const Bf16Blocked& s, uint16_t* dst) {
  std::fill(dst, dst + size_t(s.out_pad) * s.in_pad, uint16_t(0));
  // Whole rows are decoded (block types: in is a multiple of the block size, checked by Linear).
  const size_t row_bytes = DTypeBytes(t, s.in);
#pragma omp parallel
  {
    std::vector<float> row(s.in);  // [in]
#pragma omp for schedule(static)
    for (int o = 0; o < s.out; o++) {
      ToF32(t, static_cast<const char*>(src) + size_t(o) * row_bytes, row.data(), s.in);
      for (int k = 0; k < s.in; k++) dst[Bf16Offset(s, o, k)] = F32ToBf16(row[k]);
    }
  }
}

void GemvBf16Ref(const uint16_t* w, const Bf16Blocked& s, const uint16_t* x, int n, int o0, int o1,
                 float* y, int ldy) {
  for (int j = 0; j < n; j++) {
    const uint16_t* xj = x + size_t(j) * s.in_pad;
    for (int o = o0; o < o1; o++) {
      float acc = 0;
      for (int k = 0; k < s.in; k++) acc += Bf16ToF32(w[Bf16Offset(s, o, k)]) * Bf16ToF32(xj[k]);
      y[size_t(j) * ldy + o] = acc;
    }
  }
}

void PackQ8(const BlockQ8_0* src, const Q8Packed& s, uint8_t* dst) {
  const int nb = s.in / kQ8Block;
  const int panels = s.out_pad / kQ8PanelOut;
#pragma omp parallel for schedule(static)
  for (int p = 0; p < panels; p++) {
    for (int b = 0; b < nb; b++) {
      uint8_t* rec = dst + (size_t(p) * nb + b) * kQ8RecordBytes;
      auto* q = reinterpret_cast<int8_t*>(rec);  // [8][16][4]
      uint16_t d[kQ8PanelOut];                   // f16 scales
      int16_t corr[kQ8PanelOut];                 // -128 * sum(q)
      for (int i = 0; i < kQ8PanelOut; i++) {
        int o = p * kQ8PanelOut + i;
        int sum = 0;
        for (int k = 0; k < kQ8Block; k++) {
          int8_t v = o < s.out ? src[size_t(o) * nb + b].q[k] : 0;
          q[((k / 4) * kQ8PanelOut + i) * 4 + k % 4] = v;
          sum += v;
        }
        d[i] = o < s.out ? src[size_t(o) * nb + b].d : 0;
        corr[i] = int16_t(-sum);
      }
      std::memcpy(rec + 512, d, sizeof(d));
      std::memcpy(rec + 544, corr, sizeof(corr));
    }
  }
}

void QuantizeActQ8Ref(const float* x, int n, int in, uint8_t* xq, float* xd) {
  const int nb = in / kQ8Block;
  for (int j = 0; j < n; j++) {
    for (int b = 0; b < nb; b++) {
      const float* xb = x + size_t(j) * in + b * kQ8Block;
      float amax = 0;
      for (int k = 0; k < kQ8Block; k++) amax = std::max(amax, std::fabs(xb[k]));
      float d = amax / 127.0f;
      float id = amax > 0 ? 127.0f / amax : 0.0f;
      xd[size_t(j) * nb + b] = d;
      for (int k = 0; k < kQ8Block; k++) {
        xq[size_t(j) * in + b * kQ8Block + k] = uint8_t(int(std::nearbyint(xb[k] * id)) + 128);
      }
    }
  }
}

void GemvQ8Ref(const uint8_t* w, const Q8Packed& s, const uint8_t* xq, const float* xd, int n,
               int o0, int o1, float* y, int ldy) {
  const int nb = s.in / kQ8Block;
  for (int j = 0; j < n; j++) {
    for (int o = o0; o < o1; o++) {
      int p = o / kQ8PanelOut, i = o % kQ8PanelOut;
      float acc = 0;
      for (int b = 0; b < nb; b++) {
        const uint8_t* rec = w + (size_t(p) * nb + b) * kQ8RecordBytes;
        auto* q = reinterpret_cast<const int8_t*>(rec);
        uint16_t d;
        int16_t corr;
        std::memcpy(&d, rec + 512 + 2 * i, 2);
        std::memcpy(&corr, rec + 544 + 2 * i, 2);
        int32_t dot = 128 * int32_t(corr);
        const uint8_t* xb = xq + size_t(j) * s.in + b * kQ8Block;
        for (int k = 0; k < kQ8Block; k++) dot += int32_t(xb[k]) * q[((k / 4) * kQ8PanelOut + i) * 4 + k % 4];
        acc += float(dot) * (F16ToF32(d) * xd[size_t(j) * nb + b]);
      }
      y[size_t(j) * ldy + o] = acc;
    }
  }
}

void GemvF32Ref(const float* w, int in, const float* x, int n, int o0, int o1, float* y, int ldy) {
  for (int o = o0; o < o1; o++) {
    const float* wo = w + size_t(o) * in;
    for (int j = 0; j < n; j++) {
      const float* xj = x + size_t(j) * in;
      float acc[8] = {};
      int k = 0;
      for (; k + 8 <= in; k += 8)
        for (int u = 0; u < 8; u++) acc[u] += wo[k + u] * xj[k + u];
      for (; k < in; k++) acc[0] += wo[k] * xj[k];
      float sum = 0;
      for (float a : acc) sum += a;
      y[size_t(j) * ldy + o] = sum;
    }
  }
}

void F32ToBf16Ref(const float* src, uint16_t* dst, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = F32ToBf16(src[i]);
}

}  // namespace mnemo::kernels::detail
