// AVX2 + FMA + F16C versions of the Linear kernels (gemv.h), for CPUs without
// AVX-512 (AMD Zen 2 and 3, most desktop CPUs). Same weight layouts as the
// AVX-512 ones; no bf16 dot and no VNNI, so bf16 pairs are widened by shifts
// and int8 dots go through vpmaddubsw + vpmaddwd.
#include <algorithm>
#include <cstring>

#include "kernels/cpu/gemv.h"
#include "kernels/cpu/row_groups.h"
#include "kernels/cpu/simd_avx2.h"

namespace mnemo::kernels::detail {
namespace {

// Rows [j, j + R) of x against columns [8 c0, 8 (c0 + NC)) of one 64-output
// block of bf16 weights (all its k tiles). A tile row holds 64 outputs x 2
// inputs as 32-bit pairs (gemv.h): the even input is the pair shifted left by
// 16, the odd one the pair with its low half cleared. 16 ymm registers: NC = 8
// (a whole block) for one row, NC = 4 for up to 3 rows.
template <int R, int NC>
void Bf16Block(const uint16_t *wb, int k_tiles, int c0, const uint16_t *x,
               int ldx, float *y, int ldy, int valid) {
  __m256 acc[R][NC];
  for (int j = 0; j < R; j++)
    for (int c = 0; c < NC; c++)
      acc[j][c] = _mm256_setzero_ps();
  const __m256i hi = _mm256_set1_epi32(int32_t(0xffff0000u));
  for (int kt = 0; kt < k_tiles; kt++) {
    const uint16_t *tile = wb + size_t(kt) * kBf16TileElems;
    _mm_prefetch(
        reinterpret_cast<const char *>(tile + 8 * kBf16TileElems + 16 * c0),
        _MM_HINT_T0);
    for (int kk = 0; kk < kBf16TileIn / 2; kk++) {
      const uint16_t *row = tile + kk * 2 * kBf16TileOut +
                            16 * c0; // 8 outputs x 2 inputs per ymm
      __m256 xe[R], xo[R];
      for (int j = 0; j < R; j++) {
        int32_t pair;
        std::memcpy(&pair, x + size_t(j) * ldx + kt * kBf16TileIn + 2 * kk, 4);
        xe[j] = _mm256_castsi256_ps(
            _mm256_set1_epi32(int32_t(uint32_t(pair) << 16)));
        xo[j] = _mm256_castsi256_ps(
            _mm256_set1_epi32(int32_t(uint32_t(pair) & 0xffff0000u)));
      }
      for (int c = 0; c < NC; c++) {
        const __m256i w =
            _mm256_loadu_si256(reinterpret_cast<const __m256i *>(row + 16 * c));
        const __m256 we = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
        const __m256 wo = _mm256_castsi256_ps(_mm256_and_si256(w, hi));
        for (int j = 0; j < R; j++) {
          acc[j][c] = _mm256_fmadd_ps(we, xe[j], acc[j][c]);
          acc[j][c] = _mm256_fmadd_ps(wo, xo[j], acc[j][c]);
        }
      }
    }
  }
  for (int j = 0; j < R; j++) {
    for (int c = 0; c < NC; c++) {
      const int lanes = valid - 8 * (c0 + c);
      float *dst = y + size_t(j) * ldy + 8 * (c0 + c);
      if (lanes >= 8) {
        _mm256_storeu_ps(dst, acc[j][c]);
      } else if (lanes > 0) {
        _mm256_maskstore_ps(dst, TailMask8(lanes), acc[j][c]);
      }
    }
  }
}

// Rows [j, j + R) against one 16-output q8 panel (all its 32-input blocks). The
// activations are stored + 128 (u8); vpmaddubsw takes u8 x s8 but would
// saturate at 255 * 127 * 2, so the signed activation q = xq ^ 0x80 is
// multiplied instead as |w| (u8) x sign(q, w) (s8): the exact sum q * w, which
// equals the reference's 128 * corr + sum xq * w.
template <int R>
void Q8Panel(const uint8_t *panel, int n_blocks, const uint8_t *xq,
             const float *xd, int in, float *y, int ldy, int valid) {
  __m256 acc[R][2];
  for (int j = 0; j < R; j++)
    acc[j][0] = acc[j][1] = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i flip = _mm256_set1_epi8(int8_t(0x80));
  for (int b = 0; b < n_blocks; b++) {
    const uint8_t *rec = panel + size_t(b) * kQ8RecordBytes;
    _mm_prefetch(reinterpret_cast<const char *>(rec + 32 * kQ8RecordBytes),
                 _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char *>(rec + 32 * kQ8RecordBytes + 64),
                 _MM_HINT_T0);
    const __m256 d0 = LoadF16x8(reinterpret_cast<const uint16_t *>(rec + 512));
    const __m256 d1 = LoadF16x8(reinterpret_cast<const uint16_t *>(rec + 528));
    for (int j = 0; j < R; j++) {
      const uint8_t *xb = xq + size_t(j) * in + b * kQ8Block;
      __m256i dot0 = _mm256_setzero_si256(), dot1 = _mm256_setzero_si256();
      for (int r = 0; r < 8; r++) {
        int32_t xv;
        std::memcpy(&xv, xb + 4 * r, 4);
        const __m256i qx = _mm256_xor_si256(_mm256_set1_epi32(xv), flip);
        const __m256i w0 =
            _mm256_loadu_si256(reinterpret_cast<const __m256i *>(rec + 64 * r));
        const __m256i w1 = _mm256_loadu_si256(
            reinterpret_cast<const __m256i *>(rec + 64 * r + 32));
        const __m256i p0 =
            _mm256_maddubs_epi16(_mm256_abs_epi8(w0), _mm256_sign_epi8(qx, w0));
        const __m256i p1 =
            _mm256_maddubs_epi16(_mm256_abs_epi8(w1), _mm256_sign_epi8(qx, w1));
        dot0 = _mm256_add_epi32(dot0, _mm256_madd_epi16(p0, ones));
        dot1 = _mm256_add_epi32(dot1, _mm256_madd_epi16(p1, ones));
      }
      const __m256 dx = _mm256_set1_ps(xd[size_t(j) * (in / kQ8Block) + b]);
      acc[j][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot0),
                                  _mm256_mul_ps(d0, dx), acc[j][0]);
      acc[j][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot1),
                                  _mm256_mul_ps(d1, dx), acc[j][1]);
    }
  }
  for (int j = 0; j < R; j++) {
    for (int h = 0; h < 2; h++) {
      const int lanes = valid - 8 * h;
      float *dst = y + size_t(j) * ldy + 8 * h;
      if (lanes >= 8) {
        _mm256_storeu_ps(dst, acc[j][h]);
      } else if (lanes > 0) {
        _mm256_maskstore_ps(dst, TailMask8(lanes), acc[j][h]);
      }
    }
  }
}

// Rows [j, j + R) of x against one f32 weight row, two partial sums per row (as
// the AVX-512 one).
template <int R>
void F32Row(const float *w, int in, const float *x, float *y, int ldy) {
  __m256 acc[R][2];
  for (int j = 0; j < R; j++)
    acc[j][0] = acc[j][1] = _mm256_setzero_ps();
  int k = 0;
  for (; k + 16 <= in; k += 16) {
    const __m256 w0 = _mm256_loadu_ps(w + k), w1 = _mm256_loadu_ps(w + k + 8);
    for (int j = 0; j < R; j++) {
      acc[j][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + size_t(j) * in + k),
                                  acc[j][0]);
      acc[j][1] = _mm256_fmadd_ps(
          w1, _mm256_loadu_ps(x + size_t(j) * in + k + 8), acc[j][1]);
    }
  }
  for (; k < in; k += 8) {
    const __m256i m = TailMask8(in - k);
    const __m256 w0 = _mm256_maskload_ps(w + k, m);
    for (int j = 0; j < R; j++)
      acc[j][0] = _mm256_fmadd_ps(
          w0, _mm256_maskload_ps(x + size_t(j) * in + k, m), acc[j][0]);
  }
  for (int j = 0; j < R; j++)
    y[size_t(j) * ldy] = HSum256(_mm256_add_ps(acc[j][0], acc[j][1]));
}

} // namespace

void GemvBf16Avx2(const uint16_t *w, const Bf16Blocked &s, const uint16_t *x,
                  int n, int o0, int o1, float *y, int ldy) {
  const int k_tiles = s.in_pad / kBf16TileIn;
  for (int ob = o0; ob < o1; ob += kBf16TileOut) {
    const uint16_t *wb =
        w + size_t(ob / kBf16TileOut) * k_tiles * kBf16TileElems;
    const int valid = std::min(kBf16TileOut, o1 - ob);
    if (n == 1) {
      Bf16Block<1, 8>(wb, k_tiles, 0, x, s.in_pad, y + ob, ldy, valid);
      continue;
    }
    // Two passes over the block, 32 outputs each (the second reads it from L2).
    ForRowGroups<3>(n, [&]<int R>(int j) {
      for (int c0 = 0; c0 < 8; c0 += 4) {
        Bf16Block<R, 4>(wb, k_tiles, c0, x + size_t(j) * s.in_pad, s.in_pad,
                        y + size_t(j) * ldy + ob, ldy, valid);
      }
    });
  }
}

void QuantizeActQ8Avx2(const float *x, int n, int in, uint8_t *xq, float *xd) {
  const int nb = in / kQ8Block;
  // vpackssdw / vpacksswb interleave the 128-bit lanes; this puts the 32 bytes
  // back in order.
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  const __m256i flip = _mm256_set1_epi8(int8_t(0x80));
  for (int j = 0; j < n; j++) {
    for (int b = 0; b < nb; b++) {
      const float *xb = x + size_t(j) * in + b * kQ8Block;
      __m256 v[4];
      for (int i = 0; i < 4; i++)
        v[i] = _mm256_loadu_ps(xb + 8 * i);
      const float amax =
          HMax256(_mm256_max_ps(_mm256_max_ps(Abs256(v[0]), Abs256(v[1])),
                                _mm256_max_ps(Abs256(v[2]), Abs256(v[3]))));
      const float id = amax > 0 ? 127.0f / amax : 0.0f;
      xd[size_t(j) * nb + b] = amax / 127.0f;
      const __m256 vid = _mm256_set1_ps(id);
      __m256i q[4]; // cvtps rounds to nearest even (default MXCSR), as
                    // nearbyint in the reference
      for (int i = 0; i < 4; i++)
        q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], vid));
      const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]),
                                           _mm256_packs_epi32(q[2], q[3]));
      // + 128 on a signed byte in [-127, 127] is a flip of its top bit.
      const __m256i u =
          _mm256_xor_si256(_mm256_permutevar8x32_epi32(p, order), flip);
      _mm256_storeu_si256(
          reinterpret_cast<__m256i *>(xq + size_t(j) * in + b * kQ8Block), u);
    }
  }
}

void GemvQ8Avx2(const uint8_t *w, const Q8Packed &s, const uint8_t *xq,
                const float *xd, int n, int o0, int o1, float *y, int ldy) {
  const int nb = s.in / kQ8Block;
  constexpr int kTileOut =
      16 * kQ8PanelOut; // as the AVX-512 kernel: tiles stay in L2
  for (int t0 = o0; t0 < o1; t0 += kTileOut) {
    const int t1 = std::min(o1, t0 + kTileOut);
    ForRowGroups<4>(n, [&]<int R>(int j) {
      for (int p0 = t0; p0 < t1; p0 += kQ8PanelOut) {
        const uint8_t *panel =
            w + size_t(p0 / kQ8PanelOut) * nb * kQ8RecordBytes;
        Q8Panel<R>(panel, nb, xq + size_t(j) * s.in, xd + size_t(j) * nb, s.in,
                   y + size_t(j) * ldy + p0, ldy,
                   std::min(kQ8PanelOut, t1 - p0));
      }
    });
  }
}

void GemvF32Avx2(const float *w, int in, const float *x, int n, int o0, int o1,
                 float *y, int ldy) {
  for (int o = o0; o < o1; o++) {
    ForRowGroups<6>(n, [&]<int R>(int j) {
      F32Row<R>(w + size_t(o) * in, in, x + size_t(j) * in,
                y + size_t(j) * ldy + o, ldy);
    });
  }
}

void F32ToBf16Avx2(const float *src, uint16_t *dst, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i *>(dst + i),
                     F32ToBf16x8(_mm256_loadu_ps(src + i)));
  }
  for (; i < n; i++)
    dst[i] = F32ToBf16(src[i]);
}

} // namespace mnemo::kernels::detail
