// AVX-512 (BW + VNNI) versions of the block-type kernels of gemv_quant.h. Per panel of 16
// outputs and 32-input sub-block: the packed codes are expanded to 8 zmm of u8 (the vpdpbusd
// operand, 16 outputs x 4 inputs each), the scales to f32 lanes, and every activation row of the
// group is multiplied against them while they sit in registers. The weights are read from
// memory once per row group at their packed size (Q4_K: 4.625 bits per weight).
#include <algorithm>
#include <cstring>

#include "base/quant_blocks.h"
#include "kernels/cpu/gemv_quant.h"
#include "kernels/cpu/row_groups.h"
#include "kernels/cpu/simd_avx512.h"

namespace mnemo::kernels::detail {
namespace {

template <DType T>
struct Traits {
  static constexpr QFormat f = QFormatOf(T);
  static constexpr bool kIq4 = T == DType::IQ4_NL || T == DType::IQ4_XS;
  // Separate scales per 16-element half of a sub-block.
  static constexpr bool kHalves = T == DType::Q6_K || T == DType::Q3_K || T == DType::Q2_K;
  // Types whose offset is a constant multiple of the scale (off = k * s, i.e. w = s * (u + k)):
  // the offset then enters the integer dot as k * sum(q), which seeds the accumulator instead
  // of costing a float FMA per row. 0: an independent offset (a min: Q4_1, Q5_1, Q2_K, Q4_K, Q5_K).
  static constexpr int kOffK = T == DType::Q4_0 ? -8 : T == DType::Q5_0 ? -16
                             : T == DType::IQ4_NL || T == DType::IQ4_XS ? -128
                             : T == DType::Q6_K ? -32 : T == DType::Q3_K ? -4 : 0;
};

// The 8 zmm of u (u8) of one sub-block from its quant planes q (see gemv_quant.h).
template <DType T>
inline void DecodeU(const uint8_t* q, __m512i z[8]) {
  constexpr QFormat f = Traits<T>::f;
  if constexpr (f.nib) {
    const __m512i m4 = _mm512_set1_epi8(15);
    for (int m = 0; m < 4; m++) {
      const __m512i v = _mm512_loadu_si512(q + 64 * m);
      z[m] = _mm512_and_si512(v, m4);
      z[m + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
    }
    q += 256;
  }
  if constexpr (f.two) {
    for (int m = 0; m < 2; m++) {
      const __m512i v = _mm512_loadu_si512(q + 64 * m);
      if constexpr (f.nib) {  // bits 4-5 on top of the nibble (Q6_K); 0xF8 = a | (b & c)
        const __m512i m30 = _mm512_set1_epi8(0x30);
        z[4 * m + 0] = _mm512_ternarylogic_epi32(z[4 * m + 0], _mm512_slli_epi16(v, 4), m30, 0xF8);
        z[4 * m + 1] = _mm512_ternarylogic_epi32(z[4 * m + 1], _mm512_slli_epi16(v, 2), m30, 0xF8);
        z[4 * m + 2] = _mm512_ternarylogic_epi32(z[4 * m + 2], v, m30, 0xF8);
        z[4 * m + 3] = _mm512_ternarylogic_epi32(z[4 * m + 3], _mm512_srli_epi16(v, 2), m30, 0xF8);
      } else {
        const __m512i m3 = _mm512_set1_epi8(3);
        z[4 * m + 0] = _mm512_and_si512(v, m3);
        z[4 * m + 1] = _mm512_and_si512(_mm512_srli_epi16(v, 2), m3);
        z[4 * m + 2] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m3);
        z[4 * m + 3] = _mm512_and_si512(_mm512_srli_epi16(v, 6), m3);
      }
    }
    q += 128;
  }
  if constexpr (f.hbit) {
    const __m512i hv = _mm512_set1_epi8(f.nib ? 16 : 4);
    for (int r = 0; r < 8; r++) {
      uint64_t bits;
      std::memcpy(&bits, q + 8 * r, 8);
      z[r] = _mm512_mask_add_epi8(z[r], __mmask64(bits), z[r], hv);  // the bit is clear in z
    }
  }
  if constexpr (Traits<T>::kIq4) {
    alignas(16) static constexpr uint8_t kLut[16] = {
        uint8_t(kIq4nlValues[0] + 128),  uint8_t(kIq4nlValues[1] + 128),  uint8_t(kIq4nlValues[2] + 128),
        uint8_t(kIq4nlValues[3] + 128),  uint8_t(kIq4nlValues[4] + 128),  uint8_t(kIq4nlValues[5] + 128),
        uint8_t(kIq4nlValues[6] + 128),  uint8_t(kIq4nlValues[7] + 128),  uint8_t(kIq4nlValues[8] + 128),
        uint8_t(kIq4nlValues[9] + 128),  uint8_t(kIq4nlValues[10] + 128), uint8_t(kIq4nlValues[11] + 128),
        uint8_t(kIq4nlValues[12] + 128), uint8_t(kIq4nlValues[13] + 128), uint8_t(kIq4nlValues[14] + 128),
        uint8_t(kIq4nlValues[15] + 128)};
    const __m512i lut = _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(kLut)));
    for (int r = 0; r < 8; r++) z[r] = _mm512_shuffle_epi8(lut, z[r]);
  }
}

inline __m512 U8ToPs(const uint8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
inline __m512 I8ToPs(const uint8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

// Per-output scales and offsets of one sub-block (halves 0 and 1; s1, o1 only if kHalves; o0,
// o1 only if kOffK == 0), from the group's f16 headers d, d1 (as f32) and its sub-scale bytes.
template <DType T>
inline void Scales(__m512 d, __m512 d1, const uint8_t* sub, __m512* s0, __m512* s1, __m512* o0,
                   __m512* o1) {
  if constexpr (T == DType::Q4_0 || T == DType::Q5_0 || T == DType::IQ4_NL) {
    *s0 = d;  // offsets: Traits::kOffK
  } else if constexpr (T == DType::Q4_1 || T == DType::Q5_1) {
    *s0 = d;
    *o0 = d1;
  } else if constexpr (T == DType::Q4_K || T == DType::Q5_K) {
    *s0 = _mm512_mul_ps(d, U8ToPs(sub));
    *o0 = _mm512_mul_ps(_mm512_sub_ps(_mm512_setzero_ps(), d1), U8ToPs(sub + 16));
  } else if constexpr (T == DType::IQ4_XS) {
    *s0 = _mm512_mul_ps(d, I8ToPs(sub));
  } else if constexpr (T == DType::Q6_K || T == DType::Q3_K) {
    *s0 = _mm512_mul_ps(d, I8ToPs(sub));
    *s1 = _mm512_mul_ps(d, I8ToPs(sub + 16));
  } else if constexpr (T == DType::Q2_K) {
    const __m512i b0 = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sub)));
    const __m512i b1 = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sub + 16)));
    const __m512i m4 = _mm512_set1_epi32(15);
    const __m512 nd1 = _mm512_sub_ps(_mm512_setzero_ps(), d1);
    *s0 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_and_si512(b0, m4)));
    *s1 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_and_si512(b1, m4)));
    *o0 = _mm512_mul_ps(nd1, _mm512_cvtepi32_ps(_mm512_srli_epi32(b0, 4)));
    *o1 = _mm512_mul_ps(nd1, _mm512_cvtepi32_ps(_mm512_srli_epi32(b1, 4)));
  }
}

// Rows [j, j + R) of the activations against one panel (all its groups).
template <DType T, int R>
void QPanel(const uint8_t* panel, int groups, const QActs& x, int in, float* y, int ldy, int valid) {
  constexpr QFormat f = Traits<T>::f;
  constexpr int kSbs = f.group / 32;
  const int nb = in / 32;
  __m512 acc[R];
  for (int j = 0; j < R; j++) acc[j] = _mm512_setzero_ps();
  for (int g = 0; g < groups; g++) {
    const uint8_t* rec = panel + size_t(g) * f.RecordBytes();
    const __m512 d = LoadF16x16(reinterpret_cast<const uint16_t*>(rec));
    __m512 d1 = _mm512_setzero_ps();
    if constexpr (f.has_hdr1) d1 = LoadF16x16(reinterpret_cast<const uint16_t*>(rec + 32));
    for (int sb = 0; sb < kSbs; sb++) {
      const uint8_t* sub = rec + f.HeaderBytes() + sb * f.SubBlockBytes();
      // ~16 KB ahead, one line per 32 inputs of 16 outputs: as the q8_0 kernel, this keeps the
      // hardware prefetcher a few pages ahead of the stream.
      _mm_prefetch(reinterpret_cast<const char*>(sub + 16384), _MM_HINT_T0);
      __m512i z[8];
      DecodeU<T>(sub + f.sub_bytes, z);
      __m512 s0, s1, o0, o1;
      Scales<T>(d, d1, sub, &s0, &s1, &o0, &o1);
      const int kb = g * kSbs + sb;
      for (int j = 0; j < R; j++) {
        const int8_t* xb = x.q + size_t(j) * in + 32 * kb;
        const QActBlock& ab = x.b[size_t(j) * nb + kb];
        __m512i dot0, dot1;
        if constexpr (Traits<T>::kOffK != 0) {
          dot0 = _mm512_set1_epi32(Traits<T>::kOffK * ab.qsum[0]);
          dot1 = _mm512_set1_epi32(Traits<T>::kOffK * ab.qsum[1]);
        } else {
          dot0 = dot1 = _mm512_setzero_si512();
        }
        for (int r = 0; r < 4; r++) {
          int32_t a, b;
          std::memcpy(&a, xb + 4 * r, 4);
          std::memcpy(&b, xb + 16 + 4 * r, 4);
          dot0 = _mm512_dpbusd_epi32(dot0, z[r], _mm512_set1_epi32(a));
          dot1 = _mm512_dpbusd_epi32(dot1, z[r + 4], _mm512_set1_epi32(b));
        }
        const __m512 dx = _mm512_set1_ps(ab.dx);
        if constexpr (Traits<T>::kHalves) {
          const __m512 t = _mm512_fmadd_ps(s1, _mm512_cvtepi32_ps(dot1), _mm512_mul_ps(s0, _mm512_cvtepi32_ps(dot0)));
          acc[j] = _mm512_fmadd_ps(t, dx, acc[j]);
        } else {
          const __m512 t = _mm512_mul_ps(s0, _mm512_cvtepi32_ps(_mm512_add_epi32(dot0, dot1)));
          acc[j] = _mm512_fmadd_ps(t, dx, acc[j]);
        }
        if constexpr (Traits<T>::kOffK == 0) {
          if constexpr (Traits<T>::kHalves) {
            acc[j] = _mm512_fmadd_ps(o0, _mm512_set1_ps(ab.dxs[0]), acc[j]);
            acc[j] = _mm512_fmadd_ps(o1, _mm512_set1_ps(ab.dxs[1]), acc[j]);
          } else {
            acc[j] = _mm512_fmadd_ps(o0, _mm512_set1_ps(ab.dxs32), acc[j]);
          }
        }
      }
    }
  }
  for (int j = 0; j < R; j++) _mm512_mask_storeu_ps(y + size_t(j) * ldy, TailMask(valid), acc[j]);
}

// Rows per pass over a weight tile: the code expansion is paid once per pass. 12 accumulators
// + 8 code registers + 4 scale registers fit the 32 zmm; 12 against 8 rows: +6-8% GFLOP/s at
// n = 512 (Q4_K, Q6_K, IQ4_XS, single-thread CPU time on the 2-core Zen 4).
constexpr int kMaxRows = 12;
template <DType T>
void GemvQImpl(const uint8_t* w, const QPacked& s, const QActs& x, int n, int o0, int o1, float* y,
               int ldy) {
  const int groups = s.in / s.f.group;
  const size_t panel_bytes = size_t(groups) * s.f.RecordBytes();
  const int nb = s.in / 32;
  // Tiles of 16 panels stay in L2 while every row group passes over them (as the q8_0 kernel).
  constexpr int kTileOut = 16 * kQPanelOut;
  for (int t0 = o0; t0 < o1; t0 += kTileOut) {
    const int t1 = std::min(o1, t0 + kTileOut);
    ForRowGroups<kMaxRows>(n, [&]<int R>(int j) {
      const QActs xj{x.q + size_t(j) * s.in, x.b + size_t(j) * nb};
      for (int p0 = t0; p0 < t1; p0 += kQPanelOut) {
        QPanel<T, R>(w + size_t(p0 / kQPanelOut) * panel_bytes, groups, xj, s.in,
                     y + size_t(j) * ldy + p0, ldy, std::min(kQPanelOut, t1 - p0));
      }
    });
  }
}

}  // namespace

void GemvQAvx512(const uint8_t* w, const QPacked& s, const QActs& x, int n, int o0, int o1,
                 float* y, int ldy) {
  switch (s.type) {
#define MNEMO_Q_CASE(T) \
  case DType::T: return GemvQImpl<DType::T>(w, s, x, n, o0, o1, y, ldy);
    MNEMO_Q_CASE(Q4_0) MNEMO_Q_CASE(Q4_1) MNEMO_Q_CASE(Q5_0) MNEMO_Q_CASE(Q5_1)
    MNEMO_Q_CASE(Q2_K) MNEMO_Q_CASE(Q3_K) MNEMO_Q_CASE(Q4_K) MNEMO_Q_CASE(Q5_K)
    MNEMO_Q_CASE(Q6_K) MNEMO_Q_CASE(IQ4_NL) MNEMO_Q_CASE(IQ4_XS)
#undef MNEMO_Q_CASE
    default: break;
  }
}

void QuantizeActS8Avx512(const float* x, int n, int in, int8_t* q, QActBlock* out) {
  const int nb = in / 32;
  for (int j = 0; j < n; j++) {
    for (int b = 0; b < nb; b++) {
      const float* xb = x + size_t(j) * in + 32 * b;
      const __m512 v0 = _mm512_loadu_ps(xb), v1 = _mm512_loadu_ps(xb + 16);
      const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
      const float id = amax > 0 ? 127.0f / amax : 0.0f;
      const float d = amax / 127.0f;
      const __m512 vid = _mm512_set1_ps(id);
      // cvtps_epi32 rounds to nearest even (default MXCSR), as nearbyint in the reference.
      const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, vid));
      const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, vid));
      int8_t* dst = q + size_t(j) * in + 32 * b;
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm512_cvtepi32_epi8(q0));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 16), _mm512_cvtepi32_epi8(q1));
      const int32_t s0 = _mm512_reduce_add_epi32(q0), s1 = _mm512_reduce_add_epi32(q1);
      QActBlock& ab = out[size_t(j) * nb + b];
      ab.dx = d;
      ab.qsum[0] = s0;
      ab.qsum[1] = s1;
      ab.dxs[0] = d * float(s0);
      ab.dxs[1] = d * float(s1);
      ab.dxs32 = d * float(s0 + s1);
    }
  }
}

}  // namespace mnemo::kernels::detail
