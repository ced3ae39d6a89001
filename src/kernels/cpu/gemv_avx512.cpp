// AVX-512 versions of the Linear kernels (gemv.h). Weight-streaming kernels: each weight byte is
// read once per group of up to 6-8 activation rows, whose accumulators stay in registers.
#include <algorithm>
#include <cstring>

#include "kernels/cpu/gemv.h"
#include "kernels/cpu/row_groups.h"
#include "kernels/cpu/simd_avx512.h"

namespace mnemo::kernels::detail {
namespace {

inline __m512bh AsBh(__m512i v) { return reinterpret_cast<__m512bh>(v); }

// acc + a.even * b.even + a.odd * b.odd per 32-bit lane (a, b: pairs of bf16). kNative uses
// vdpbf16ps (AVX512-BF16); otherwise the pairs are widened by shifts (exact) and two FMAs.
template <bool kNative>
inline __m512 DotBf16Pairs(__m512 acc, __m512i a, __m512i b) {
  if constexpr (kNative) {
    return _mm512_dpbf16_ps(acc, AsBh(a), AsBh(b));
  } else {
    const __m512i hi = _mm512_set1_epi32(int32_t(0xffff0000u));
    acc = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(a, 16)),
                          _mm512_castsi512_ps(_mm512_slli_epi32(b, 16)), acc);
    return _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(a, hi)),
                           _mm512_castsi512_ps(_mm512_and_si512(b, hi)), acc);
  }
}

// Rows [j0, j0 + R) of x against one 64-output block of bf16 weights (all its k tiles).
template <bool kNative, int R>
void Bf16Block(const uint16_t* wb, int k_tiles, const uint16_t* x, int ldx, float* y, int ldy,
               int valid) {
  __m512 acc[R][4];
  for (int j = 0; j < R; j++)
    for (int c = 0; c < 4; c++) acc[j][c] = _mm512_setzero_ps();
  for (int kt = 0; kt < k_tiles; kt++) {
    const uint16_t* tile = wb + size_t(kt) * kBf16TileElems;
    _mm_prefetch(reinterpret_cast<const char*>(tile + 8 * kBf16TileElems), _MM_HINT_T0);
    for (int kk = 0; kk < kBf16TileIn / 2; kk++) {
      const uint16_t* row = tile + kk * 2 * kBf16TileOut;  // 64 outputs x 2 inputs
      __m512i w[4];
      for (int c = 0; c < 4; c++) w[c] = _mm512_loadu_si512(row + 32 * c);
      for (int j = 0; j < R; j++) {
        int32_t pair;
        std::memcpy(&pair, x + size_t(j) * ldx + kt * kBf16TileIn + 2 * kk, 4);
        const __m512i xp = _mm512_set1_epi32(pair);
        for (int c = 0; c < 4; c++) acc[j][c] = DotBf16Pairs<kNative>(acc[j][c], w[c], xp);
      }
    }
  }
  for (int j = 0; j < R; j++) {
    for (int c = 0; c < 4; c++) {
      _mm512_mask_storeu_ps(y + size_t(j) * ldy + c * 16, TailMask(valid - c * 16), acc[j][c]);
    }
  }
}

template <bool kNative>
void GemvBf16Impl(const uint16_t* w, const Bf16Blocked& s, const uint16_t* x, int n, int o0,
                  int o1, float* y, int ldy) {
  const int k_tiles = s.in_pad / kBf16TileIn;
  for (int ob = o0; ob < o1; ob += kBf16TileOut) {
    const uint16_t* wb = w + size_t(ob / kBf16TileOut) * k_tiles * kBf16TileElems;
    const int valid = std::min(kBf16TileOut, o1 - ob);
    ForRowGroups<6>(n, [&]<int R>(int j) {
      Bf16Block<kNative, R>(wb, k_tiles, x + size_t(j) * s.in_pad, s.in_pad,
                            y + size_t(j) * ldy + ob, ldy, valid);
    });
  }
}

// Rows [j0, j0 + R) against one 16-output q8 panel (all its 32-input blocks).
template <int R>
void Q8Panel(const uint8_t* panel, int n_blocks, const uint8_t* xq, const float* xd, int in,
             float* y, int ldy, int valid) {
  __m512 acc[R];
  for (int j = 0; j < R; j++) acc[j] = _mm512_setzero_ps();
  for (int b = 0; b < n_blocks; b++) {
    const uint8_t* rec = panel + size_t(b) * kQ8RecordBytes;
    // One line per record, ~18 KB ahead: keeps the hardware prefetcher a few pages ahead
    // (measured: 13 -> 21 GB/s from DRAM on one core against a 4.6 KB distance).
    _mm_prefetch(reinterpret_cast<const char*>(rec + 32 * kQ8RecordBytes), _MM_HINT_T0);
    __m512i w[8];
    for (int qd = 0; qd < 8; qd++) w[qd] = _mm512_loadu_si512(rec + 64 * qd);
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + 512)));
    const __m512i corr = _mm512_slli_epi32(
        _mm512_cvtepi16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + 544))), 7);
    for (int j = 0; j < R; j++) {
      const uint8_t* xb = xq + size_t(j) * in + b * kQ8Block;
      // Two partial chains halve the dependent vpdpbusd latency per block.
      __m512i dot0 = corr, dot1 = _mm512_setzero_si512();
      for (int qd = 0; qd < 8; qd += 2) {
        int32_t q0, q1;
        std::memcpy(&q0, xb + 4 * qd, 4);
        std::memcpy(&q1, xb + 4 * qd + 4, 4);
        dot0 = _mm512_dpbusd_epi32(dot0, _mm512_set1_epi32(q0), w[qd]);
        dot1 = _mm512_dpbusd_epi32(dot1, _mm512_set1_epi32(q1), w[qd + 1]);
      }
      const __m512 scale = _mm512_mul_ps(d, _mm512_set1_ps(xd[size_t(j) * (in / kQ8Block) + b]));
      acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(dot0, dot1)), scale, acc[j]);
    }
  }
  for (int j = 0; j < R; j++) _mm512_mask_storeu_ps(y + size_t(j) * ldy, TailMask(valid), acc[j]);
}

// Rows [j0, j0 + R) of x against one f32 weight row: a single sequential stream of weights
// (measured: 4 rows side by side stream slower from DRAM), two partial sums per x row.
template <int R>
void F32Row(const float* w, int in, const float* x, float* y, int ldy) {
  __m512 acc[R][2];
  for (int j = 0; j < R; j++) acc[j][0] = acc[j][1] = _mm512_setzero_ps();
  int k = 0;
  for (; k + 32 <= in; k += 32) {
    const __m512 w0 = _mm512_loadu_ps(w + k), w1 = _mm512_loadu_ps(w + k + 16);
    for (int j = 0; j < R; j++) {
      acc[j][0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + size_t(j) * in + k), acc[j][0]);
      acc[j][1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + size_t(j) * in + k + 16), acc[j][1]);
    }
  }
  for (; k < in; k += 16) {
    const __mmask16 m = TailMask(in - k);
    const __m512 w0 = _mm512_maskz_loadu_ps(m, w + k);
    for (int j = 0; j < R; j++)
      acc[j][0] = _mm512_fmadd_ps(w0, _mm512_maskz_loadu_ps(m, x + size_t(j) * in + k), acc[j][0]);
  }
  for (int j = 0; j < R; j++) y[size_t(j) * ldy] = _mm512_reduce_add_ps(_mm512_add_ps(acc[j][0], acc[j][1]));
}

}  // namespace

void GemvBf16Avx512(const uint16_t* w, const Bf16Blocked& s, const uint16_t* x, int n, int o0,
                    int o1, float* y, int ldy) {
  GemvBf16Impl<true>(w, s, x, n, o0, o1, y, ldy);
}

void GemvBf16Avx512NoBf16(const uint16_t* w, const Bf16Blocked& s, const uint16_t* x, int n,
                          int o0, int o1, float* y, int ldy) {
  GemvBf16Impl<false>(w, s, x, n, o0, o1, y, ldy);
}

void QuantizeActQ8Avx512(const float* x, int n, int in, uint8_t* xq, float* xd) {
  const int nb = in / kQ8Block;
  const __m512i bias = _mm512_set1_epi32(128);
  for (int j = 0; j < n; j++) {
    for (int b = 0; b < nb; b++) {
      const float* xb = x + size_t(j) * in + b * kQ8Block;
      const __m512 v0 = _mm512_loadu_ps(xb), v1 = _mm512_loadu_ps(xb + 16);
      const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
      const float id = amax > 0 ? 127.0f / amax : 0.0f;
      xd[size_t(j) * nb + b] = amax / 127.0f;
      const __m512 vid = _mm512_set1_ps(id);
      // cvtps_epi32 rounds to nearest even (default MXCSR), as nearbyint in the reference.
      const __m512i q0 = _mm512_add_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(v0, vid)), bias);
      const __m512i q1 = _mm512_add_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(v1, vid)), bias);
      uint8_t* dst = xq + size_t(j) * in + b * kQ8Block;
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm512_cvtepi32_epi8(q0));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 16), _mm512_cvtepi32_epi8(q1));
    }
  }
}

void GemvQ8Avx512(const uint8_t* w, const Q8Packed& s, const uint8_t* xq, const float* xd, int n,
                  int o0, int o1, float* y, int ldy) {
  const int nb = s.in / kQ8Block;
  // Tiles of 16 panels (~200 KB of weights at in = 768) stay in L2 while every row group passes
  // over them; y is then written in 1 KB runs per row instead of 64 B ones.
  constexpr int kTileOut = 16 * kQ8PanelOut;
  for (int t0 = o0; t0 < o1; t0 += kTileOut) {
    const int t1 = std::min(o1, t0 + kTileOut);
    ForRowGroups<8>(n, [&]<int R>(int j) {
      for (int p0 = t0; p0 < t1; p0 += kQ8PanelOut) {
        const uint8_t* panel = w + size_t(p0 / kQ8PanelOut) * nb * kQ8RecordBytes;
        Q8Panel<R>(panel, nb, xq + size_t(j) * s.in, xd + size_t(j) * nb, s.in,
                   y + size_t(j) * ldy + p0, ldy, std::min(kQ8PanelOut, t1 - p0));
      }
    });
  }
}

void GemvF32Avx512(const float* w, int in, const float* x, int n, int o0, int o1, float* y,
                   int ldy) {
  for (int o = o0; o < o1; o++) {
    ForRowGroups<8>(n, [&]<int R>(int j) {
      F32Row<R>(w + size_t(o) * in, in, x + size_t(j) * in, y + size_t(j) * ldy + o, ldy);
    });
  }
}

void F32ToBf16Avx512(const float* src, uint16_t* dst, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), F32ToBf16x16(_mm512_loadu_ps(src + i)));
  }
  if (i < n) {
    const __mmask16 m = TailMask(int(n - i));
    _mm256_mask_storeu_epi16(dst + i, m, F32ToBf16x16(_mm512_maskz_loadu_ps(m, src + i)));
  }
}

}  // namespace mnemo::kernels::detail
