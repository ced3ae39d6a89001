// AVX2 versions of the block-type kernels of gemv_quant.h, for CPUs without
// AVX-512. Per panel of 16 outputs and 32-input sub-block the packed codes are
// expanded once into 16 ymm of bytes (8 input quads x 2 halves of 8 outputs,
// the layout of the AVX-512 operand cut in two) in a stack buffer, then every
// activation row of the group is multiplied against them with vpmaddubsw (u8
// codes x s8 activations -> pairs in i16) and vpmaddwd (-> quads in i32).
//
// vpmaddubsw saturates a pair sum above 32767: the codes are at most 63 (Q6_K)
// for every type but IQ4_NL / IQ4_XS, whose u = value + 128 reaches 255. Those
// take the signed value v = u - 128 instead, as |v| (u8) x sign(q, v) (s8), and
// start the dot at 0 rather than at -128 * sum(q): the same integer, sum (u -
// 128) q.
#include <algorithm>
#include <cstring>

#include "base/quant_blocks.h"
#include "kernels/cpu/gemv_quant.h"
#include "kernels/cpu/row_groups.h"
#include "kernels/cpu/simd_avx2.h"

namespace mnemo::kernels::detail {
namespace {

template <DType T> struct Traits {
  static constexpr QFormat f = QFormatOf(T);
  static constexpr bool kIq4 = T == DType::IQ4_NL || T == DType::IQ4_XS;
  // Separate scales per 16-element half of a sub-block.
  static constexpr bool kHalves =
      T == DType::Q6_K || T == DType::Q3_K || T == DType::Q2_K;
  // w = s * (u + kOffK) for these types: the offset seeds the integer dot as
  // kOffK * sum(q). 0: an independent offset (a min), or IQ4 (signed values,
  // see above).
  static constexpr int kOffK = T == DType::Q4_0   ? -8
                               : T == DType::Q5_0 ? -16
                               : T == DType::Q6_K ? -32
                               : T == DType::Q3_K ? -4
                                                  : 0;
  static constexpr bool kMin =
      !kIq4 && kOffK == 0; // an offset term per row in f32
};

// One sub-block's codes: z[r][h] = 32 bytes of input quad r (0..7), outputs
// 8h..8h+7, each output's 4 inputs consecutive. For IQ4 z holds |v| and sgn the
// signed values v.
struct Codes {
  __m256i z[8][2];
  __m256i sgn[8][2];
};

// Expands 32 bits to 32 bytes: byte k = 0xff where bit k is set.
inline __m256i BitsToBytes(uint32_t bits) {
  const __m256i spread =
      _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, //
                       2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i sel = _mm256_set1_epi64x(0x8040201008040201LL);
  const __m256i v =
      _mm256_shuffle_epi8(_mm256_set1_epi32(int32_t(bits)), spread);
  return _mm256_cmpeq_epi8(_mm256_and_si256(v, sel), sel);
}

template <DType T> inline void DecodeU(const uint8_t *q, Codes *c) {
  constexpr QFormat f = Traits<T>::f;
  auto load = [](const uint8_t *p) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i *>(p));
  };
  if constexpr (f.nib) {
    const __m256i m4 = _mm256_set1_epi8(15);
    for (int m = 0; m < 4; m++) {
      for (int h = 0; h < 2; h++) {
        const __m256i v = load(q + 64 * m + 32 * h);
        c->z[m][h] = _mm256_and_si256(v, m4);
        c->z[m + 4][h] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
      }
    }
    q += 256;
  }
  if constexpr (f.two) {
    for (int m = 0; m < 2; m++) {
      for (int h = 0; h < 2; h++) {
        const __m256i v = load(q + 64 * m + 32 * h);
        if constexpr (f.nib) { // bits 4-5 on top of the nibble (Q6_K)
          const __m256i m30 = _mm256_set1_epi8(0x30);
          c->z[4 * m + 0][h] =
              _mm256_or_si256(c->z[4 * m + 0][h],
                              _mm256_and_si256(_mm256_slli_epi16(v, 4), m30));
          c->z[4 * m + 1][h] =
              _mm256_or_si256(c->z[4 * m + 1][h],
                              _mm256_and_si256(_mm256_slli_epi16(v, 2), m30));
          c->z[4 * m + 2][h] =
              _mm256_or_si256(c->z[4 * m + 2][h], _mm256_and_si256(v, m30));
          c->z[4 * m + 3][h] =
              _mm256_or_si256(c->z[4 * m + 3][h],
                              _mm256_and_si256(_mm256_srli_epi16(v, 2), m30));
        } else {
          const __m256i m3 = _mm256_set1_epi8(3);
          c->z[4 * m + 0][h] = _mm256_and_si256(v, m3);
          c->z[4 * m + 1][h] = _mm256_and_si256(_mm256_srli_epi16(v, 2), m3);
          c->z[4 * m + 2][h] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m3);
          c->z[4 * m + 3][h] = _mm256_and_si256(_mm256_srli_epi16(v, 6), m3);
        }
      }
    }
    q += 128;
  }
  if constexpr (f.hbit) {
    const __m256i hv = _mm256_set1_epi8(f.nib ? 16 : 4);
    for (int r = 0; r < 8; r++) {
      for (int h = 0; h < 2; h++) {
        uint32_t bits;
        std::memcpy(&bits, q + 8 * r + 4 * h, 4);
        // The bit is clear in z: or = add.
        c->z[r][h] = _mm256_or_si256(c->z[r][h],
                                     _mm256_and_si256(BitsToBytes(bits), hv));
      }
    }
  }
  if constexpr (Traits<T>::kIq4) {
    alignas(16) static constexpr int8_t kLut[16] = {
        kIq4nlValues[0],  kIq4nlValues[1],  kIq4nlValues[2],  kIq4nlValues[3],
        kIq4nlValues[4],  kIq4nlValues[5],  kIq4nlValues[6],  kIq4nlValues[7],
        kIq4nlValues[8],  kIq4nlValues[9],  kIq4nlValues[10], kIq4nlValues[11],
        kIq4nlValues[12], kIq4nlValues[13], kIq4nlValues[14], kIq4nlValues[15]};
    const __m256i lut = _mm256_broadcastsi128_si256(
        _mm_load_si128(reinterpret_cast<const __m128i *>(kLut)));
    for (int r = 0; r < 8; r++) {
      for (int h = 0; h < 2; h++) {
        c->sgn[r][h] = _mm256_shuffle_epi8(lut, c->z[r][h]);
        c->z[r][h] = _mm256_abs_epi8(c->sgn[r][h]);
      }
    }
  }
}

inline __m256 U8ToPs(const uint8_t *p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
      _mm_loadl_epi64(reinterpret_cast<const __m128i *>(p))));
}
inline __m256 I8ToPs(const uint8_t *p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
      _mm_loadl_epi64(reinterpret_cast<const __m128i *>(p))));
}

// Scales and offsets of one sub-block for outputs 8h..8h+7 (as the AVX-512
// Scales): s0, s1 per input half (s1 only if kHalves), o0, o1 the offsets (only
// if kMin).
struct SubScales {
  __m256 s0, s1, o0, o1;
};
template <DType T>
inline SubScales Scales(__m256 d, __m256 d1, const uint8_t *sub) {
  SubScales s{d, d, _mm256_setzero_ps(), _mm256_setzero_ps()};
  if constexpr (T == DType::Q4_1 || T == DType::Q5_1) {
    s.o0 = d1;
  } else if constexpr (T == DType::Q4_K || T == DType::Q5_K) {
    s.s0 = _mm256_mul_ps(d, U8ToPs(sub));
    s.o0 =
        _mm256_mul_ps(_mm256_sub_ps(_mm256_setzero_ps(), d1), U8ToPs(sub + 16));
  } else if constexpr (T == DType::IQ4_XS) {
    s.s0 = _mm256_mul_ps(d, I8ToPs(sub));
  } else if constexpr (T == DType::Q6_K || T == DType::Q3_K) {
    s.s0 = _mm256_mul_ps(d, I8ToPs(sub));
    s.s1 = _mm256_mul_ps(d, I8ToPs(sub + 16));
  } else if constexpr (T == DType::Q2_K) {
    const __m256i b0 = _mm256_cvtepu8_epi32(
        _mm_loadl_epi64(reinterpret_cast<const __m128i *>(sub)));
    const __m256i b1 = _mm256_cvtepu8_epi32(
        _mm_loadl_epi64(reinterpret_cast<const __m128i *>(sub + 16)));
    const __m256i m4 = _mm256_set1_epi32(15);
    const __m256 nd1 = _mm256_sub_ps(_mm256_setzero_ps(), d1);
    s.s0 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_and_si256(b0, m4)));
    s.s1 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_and_si256(b1, m4)));
    s.o0 = _mm256_mul_ps(nd1, _mm256_cvtepi32_ps(_mm256_srli_epi32(b0, 4)));
    s.o1 = _mm256_mul_ps(nd1, _mm256_cvtepi32_ps(_mm256_srli_epi32(b1, 4)));
  }
  return s;
}

// Rows [j, j + R) of the activations against one panel (all its groups).
template <DType T, int R>
void QPanel(const uint8_t *panel, int groups, const QActs &x, int in, float *y,
            int ldy, int valid) {
  using Tr = Traits<T>;
  constexpr QFormat f = Tr::f;
  constexpr int kSbs = f.group / 32;
  const int nb = in / 32;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[R][2];
  for (int j = 0; j < R; j++)
    acc[j][0] = acc[j][1] = _mm256_setzero_ps();
  Codes c;
  for (int g = 0; g < groups; g++) {
    const uint8_t *rec = panel + size_t(g) * f.RecordBytes();
    __m256 d[2], d1[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int h = 0; h < 2; h++) {
      d[h] = LoadF16x8(reinterpret_cast<const uint16_t *>(rec) + 8 * h);
      if constexpr (f.has_hdr1)
        d1[h] = LoadF16x8(reinterpret_cast<const uint16_t *>(rec + 32) + 8 * h);
    }
    for (int sb = 0; sb < kSbs; sb++) {
      const uint8_t *sub = rec + f.HeaderBytes() + sb * f.SubBlockBytes();
      _mm_prefetch(reinterpret_cast<const char *>(sub + 16384), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char *>(sub + 16384 + 64),
                   _MM_HINT_T0);
      DecodeU<T>(sub + f.sub_bytes, &c);
      SubScales sc[2];
      for (int h = 0; h < 2; h++)
        sc[h] = Scales<T>(d[h], d1[h], sub + 8 * h);
      const int kb = g * kSbs + sb;
      for (int j = 0; j < R; j++) {
        const int8_t *xb = x.q + size_t(j) * in + 32 * kb;
        const QActBlock &ab = x.b[size_t(j) * nb + kb];
        __m256i dot[2][2]; // [input half][output half]
        for (int ih = 0; ih < 2; ih++) {
          const __m256i seed = _mm256_set1_epi32(Tr::kOffK * ab.qsum[ih]);
          dot[ih][0] = dot[ih][1] = seed;
        }
        for (int r = 0; r < 8; r++) {
          int32_t xv;
          std::memcpy(&xv, xb + 4 * r, 4);
          const __m256i xr = _mm256_set1_epi32(xv);
          for (int h = 0; h < 2; h++) {
            const __m256i xs =
                Tr::kIq4 ? _mm256_sign_epi8(xr, c.sgn[r][h]) : xr;
            const __m256i p =
                _mm256_madd_epi16(_mm256_maddubs_epi16(c.z[r][h], xs), ones);
            dot[r / 4][h] = _mm256_add_epi32(dot[r / 4][h], p);
          }
        }
        const __m256 dx = _mm256_set1_ps(ab.dx);
        for (int h = 0; h < 2; h++) {
          __m256 t;
          if constexpr (Tr::kHalves) {
            t = _mm256_fmadd_ps(
                sc[h].s1, _mm256_cvtepi32_ps(dot[1][h]),
                _mm256_mul_ps(sc[h].s0, _mm256_cvtepi32_ps(dot[0][h])));
          } else {
            t = _mm256_mul_ps(sc[h].s0, _mm256_cvtepi32_ps(_mm256_add_epi32(
                                            dot[0][h], dot[1][h])));
          }
          acc[j][h] = _mm256_fmadd_ps(t, dx, acc[j][h]);
          if constexpr (Tr::kMin) {
            if constexpr (Tr::kHalves) {
              acc[j][h] = _mm256_fmadd_ps(sc[h].o0, _mm256_set1_ps(ab.dxs[0]),
                                          acc[j][h]);
              acc[j][h] = _mm256_fmadd_ps(sc[h].o1, _mm256_set1_ps(ab.dxs[1]),
                                          acc[j][h]);
            } else {
              acc[j][h] = _mm256_fmadd_ps(sc[h].o0, _mm256_set1_ps(ab.dxs32),
                                          acc[j][h]);
            }
          }
        }
      }
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

// Rows per pass over a weight tile: 8 accumulators; the codes come from L1 for
// every row.
constexpr int kMaxRows = 4;
template <DType T>
void GemvQImpl(const uint8_t *w, const QPacked &s, const QActs &x, int n,
               int o0, int o1, float *y, int ldy) {
  const int groups = s.in / s.f.group;
  const size_t panel_bytes = size_t(groups) * s.f.RecordBytes();
  const int nb = s.in / 32;
  constexpr int kTileOut =
      16 * kQPanelOut; // tiles stay in L2 while the row groups pass
  for (int t0 = o0; t0 < o1; t0 += kTileOut) {
    const int t1 = std::min(o1, t0 + kTileOut);
    ForRowGroups<kMaxRows>(n, [&]<int R>(int j) {
      const QActs xj{x.q + size_t(j) * s.in, x.b + size_t(j) * nb};
      for (int p0 = t0; p0 < t1; p0 += kQPanelOut) {
        QPanel<T, R>(w + size_t(p0 / kQPanelOut) * panel_bytes, groups, xj,
                     s.in, y + size_t(j) * ldy + p0, ldy,
                     std::min(kQPanelOut, t1 - p0));
      }
    });
  }
}

} // namespace

void GemvQAvx2(const uint8_t *w, const QPacked &s, const QActs &x, int n,
               int o0, int o1, float *y, int ldy) {
  switch (s.type) {
#define MNEMO_Q_CASE(T)                                                        \
  case DType::T:                                                               \
    return GemvQImpl<DType::T>(w, s, x, n, o0, o1, y, ldy);
    MNEMO_Q_CASE(Q4_0)
    MNEMO_Q_CASE(Q4_1) MNEMO_Q_CASE(Q5_0) MNEMO_Q_CASE(Q5_1) MNEMO_Q_CASE(Q2_K)
        MNEMO_Q_CASE(Q3_K) MNEMO_Q_CASE(Q4_K) MNEMO_Q_CASE(Q5_K)
            MNEMO_Q_CASE(Q6_K) MNEMO_Q_CASE(IQ4_NL) MNEMO_Q_CASE(IQ4_XS)
#undef MNEMO_Q_CASE
                default : break;
  }
}

void QuantizeActS8Avx2(const float *x, int n, int in, int8_t *q,
                       QActBlock *out) {
  const int nb = in / 32;
  const __m256i order = _mm256_setr_epi32(
      0, 4, 1, 5, 2, 6, 3, 7); // undoes the packs' lane interleave
  for (int j = 0; j < n; j++) {
    for (int b = 0; b < nb; b++) {
      const float *xb = x + size_t(j) * in + 32 * b;
      __m256 v[4];
      for (int i = 0; i < 4; i++)
        v[i] = _mm256_loadu_ps(xb + 8 * i);
      const float amax =
          HMax256(_mm256_max_ps(_mm256_max_ps(Abs256(v[0]), Abs256(v[1])),
                                _mm256_max_ps(Abs256(v[2]), Abs256(v[3]))));
      const float id = amax > 0 ? 127.0f / amax : 0.0f;
      const float d = amax / 127.0f;
      const __m256 vid = _mm256_set1_ps(id);
      __m256i qi[4]; // cvtps rounds to nearest even (default MXCSR), as
                     // nearbyint in the reference
      for (int i = 0; i < 4; i++)
        qi[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], vid));
      const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]),
                                           _mm256_packs_epi32(qi[2], qi[3]));
      _mm256_storeu_si256(
          reinterpret_cast<__m256i *>(q + size_t(j) * in + 32 * b),
          _mm256_permutevar8x32_epi32(p, order));
      const int32_t s0 = HSumI256(_mm256_add_epi32(qi[0], qi[1]));
      const int32_t s1 = HSumI256(_mm256_add_epi32(qi[2], qi[3]));
      QActBlock &ab = out[size_t(j) * nb + b];
      ab.dx = d;
      ab.qsum[0] = s0;
      ab.qsum[1] = s1;
      ab.dxs[0] = d * float(s0);
      ab.dxs[1] = d * float(s1);
      ab.dxs32 = d * float(s0 + s1);
    }
  }
}

} // namespace mnemo::kernels::detail
