// Packing of ggml block types into the panel records of gemv_quant.h, and the portable
// (scalar) activation quantiser and kernel that define the arithmetic the AVX-512 ones reproduce.
// The bit layouts read here are ggml's (base/quant_blocks.h); tests check every type against
// ToF32, which decodes them independently.
#include "kernels/cpu/gemv_quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "base/quant_blocks.h"
#include "base/status.h"

namespace mnemo::kernels::detail {
namespace {

// One source block (= one group) of one output row, unpacked: the stored codes, the f16 header
// words and the two sub-scale bytes of each 32-sub-block (see QFormatOf).
struct Unpacked {
  uint8_t code[kQKK];   // [group]
  uint16_t h0 = 0, h1 = 0;
  uint8_t sub[8][2] = {};  // [group / 32][k]
};

// Nibble j of a 16-byte legacy qs array in element order: elements 0..15 low, 16..31 high.
inline uint8_t LegacyNibble(const uint8_t* qs, int e) { return e < 16 ? qs[e] & 15 : qs[e - 16] >> 4; }

// Q4_K / Q5_K 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes.
inline void ScaleMinK4(int j, const uint8_t* q, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 15) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

void Unpack(DType t, const uint8_t* blk, Unpacked* u) {
  switch (t) {
    case DType::Q4_0: case DType::IQ4_NL: {
      auto* b = reinterpret_cast<const BlockQ4_0*>(blk);  // IQ4_NL has the same layout
      u->h0 = b->d;
      for (int e = 0; e < kQK; e++) u->code[e] = LegacyNibble(b->qs, e);
      return;
    }
    case DType::Q4_1: {
      auto* b = reinterpret_cast<const BlockQ4_1*>(blk);
      u->h0 = b->d;
      u->h1 = b->m;
      for (int e = 0; e < kQK; e++) u->code[e] = LegacyNibble(b->qs, e);
      return;
    }
    case DType::Q5_0: case DType::Q5_1: {
      const uint8_t *qh, *qs;
      if (t == DType::Q5_0) {
        auto* b = reinterpret_cast<const BlockQ5_0*>(blk);
        u->h0 = b->d, qh = b->qh, qs = b->qs;
      } else {
        auto* b = reinterpret_cast<const BlockQ5_1*>(blk);
        u->h0 = b->d, u->h1 = b->m, qh = b->qh, qs = b->qs;
      }
      uint32_t h;
      std::memcpy(&h, qh, 4);
      for (int e = 0; e < kQK; e++) u->code[e] = uint8_t(LegacyNibble(qs, e) | ((h >> e) & 1) << 4);
      return;
    }
    case DType::Q2_K: {
      auto* b = reinterpret_cast<const BlockQ2_K*>(blk);
      u->h0 = b->d;
      u->h1 = b->dmin;
      for (int e = 0; e < kQKK; e++) {
        const int h = e / 128, j = (e % 128) / 32, l = e % 32;
        u->code[e] = (b->qs[32 * h + l] >> (2 * j)) & 3;
      }
      for (int i = 0; i < 16; i++) u->sub[i / 2][i % 2] = b->scales[i];
      return;
    }
    case DType::Q3_K: {
      auto* b = reinterpret_cast<const BlockQ3_K*>(blk);
      u->h0 = b->d;
      for (int e = 0; e < kQKK; e++) {
        const int h = e / 128, j = (e % 128) / 32, l = e % 32;
        const int low = (b->qs[32 * h + l] >> (2 * j)) & 3;
        const int hi = (b->hmask[l] >> (4 * h + j)) & 1;
        u->code[e] = uint8_t(low | hi << 2);
      }
      for (int i = 0; i < 16; i++) {
        const int low = i < 8 ? b->scales[i] & 15 : b->scales[i - 8] >> 4;
        const int hi = (b->scales[8 + i % 4] >> (2 * (i / 4))) & 3;
        u->sub[i / 2][i % 2] = uint8_t(int8_t((low | hi << 4) - 32));
      }
      return;
    }
    case DType::Q4_K: case DType::Q5_K: {
      const uint8_t *scales, *qs, *qh = nullptr;
      if (t == DType::Q4_K) {
        auto* b = reinterpret_cast<const BlockQ4_K*>(blk);
        u->h0 = b->d, u->h1 = b->dmin, scales = b->scales, qs = b->qs;
      } else {
        auto* b = reinterpret_cast<const BlockQ5_K*>(blk);
        u->h0 = b->d, u->h1 = b->dmin, scales = b->scales, qs = b->qs, qh = b->qh;
      }
      for (int e = 0; e < kQKK; e++) {
        const int p = e / 64, hi = (e % 64) / 32, l = e % 32;
        int c = hi ? qs[32 * p + l] >> 4 : qs[32 * p + l] & 15;
        if (qh != nullptr) c |= ((qh[l] >> (2 * p + hi)) & 1) << 4;
        u->code[e] = uint8_t(c);
      }
      for (int j = 0; j < 8; j++) ScaleMinK4(j, scales, &u->sub[j][0], &u->sub[j][1]);
      return;
    }
    case DType::Q6_K: {
      auto* b = reinterpret_cast<const BlockQ6_K*>(blk);
      u->h0 = b->d;
      for (int e = 0; e < kQKK; e++) {
        const int h = e / 128, quarter = (e % 128) / 32, l = e % 32;
        const uint8_t ql = b->ql[64 * h + 32 * (quarter % 2) + l];
        const int low = quarter < 2 ? ql & 15 : ql >> 4;
        const int hi = (b->qh[32 * h + l] >> (2 * quarter)) & 3;
        u->code[e] = uint8_t(low | hi << 4);
      }
      for (int i = 0; i < 16; i++) u->sub[i / 2][i % 2] = uint8_t(b->scales[i]);
      return;
    }
    case DType::IQ4_XS: {
      auto* b = reinterpret_cast<const BlockIQ4_XS*>(blk);
      u->h0 = b->d;
      for (int ib = 0; ib < 8; ib++) {
        for (int l = 0; l < 32; l++) u->code[32 * ib + l] = LegacyNibble(b->qs + 16 * ib, l);
        const int ls = ((b->scales_l[ib / 2] >> (4 * (ib % 2))) & 15) | ((b->scales_h >> (2 * ib)) & 3) << 4;
        u->sub[ib][0] = uint8_t(int8_t(ls - 32));
      }
      return;
    }
    default:
      MNEMO_CHECK_MSG(false, std::string("PackQ: no panel format for ") + DTypeName(t));
  }
}

// Byte offset of VNNI position (quad r, lane i) data for each plane, relative to the sub-block's
// quant planes (after the sub-scales).
struct PlaneOffsets {
  int nib, two, hbit;
};
PlaneOffsets Planes(const QFormat& f) {
  PlaneOffsets p;
  p.nib = 0;
  p.two = f.nib ? 256 : 0;
  p.hbit = p.two + (f.two ? 128 : 0);
  return p;
}

// Reads the code of VNNI position i (0..63) of quad r from a sub-block's planes q (PackQ writes
// them).
uint8_t GetCode(const QFormat& f, const uint8_t* q, int r, int i) {
  const PlaneOffsets p = Planes(f);
  int c = 0, shift = 0;
  if (f.nib) {
    c = (q[p.nib + 64 * (r % 4) + i] >> (r < 4 ? 0 : 4)) & 15;
    shift = 4;
  }
  if (f.two) {
    c |= ((q[p.two + 64 * (r / 4) + i] >> (2 * (r % 4))) & 3) << shift;
    shift += 2;
  }
  if (f.hbit) c |= ((q[p.hbit + 8 * r + i / 8] >> (i % 8)) & 1) << shift;
  return uint8_t(c);
}

// Writes the 32 codes of one output's sub-block into the planes q: code k sits at VNNI quad
// r = k / 4, lane 4 i + k % 4 (GetCode reads it back). One instance per plane set, so the inner
// loop has no branches on the format.
template <bool kNib, bool kTwo, bool kHbit>
void PutCodes(uint8_t* q, const PlaneOffsets& po, int i, const uint8_t* code) {
  for (int k = 0; k < 32; k++) {
    const int r = k / 4, lane = 4 * i + k % 4;
    int c = code[k];
    if constexpr (kNib) {
      q[po.nib + 64 * (r % 4) + lane] |= uint8_t((c & 15) << (r < 4 ? 0 : 4));
      c >>= 4;
    }
    if constexpr (kTwo) {
      q[po.two + 64 * (r / 4) + lane] |= uint8_t((c & 3) << (2 * (r % 4)));
      c >>= 2;
    }
    if constexpr (kHbit) q[po.hbit + 8 * r + lane / 8] |= uint8_t((c & 1) << (lane % 8));
  }
}
using PutCodesFn = void (*)(uint8_t*, const PlaneOffsets&, int, const uint8_t*);
PutCodesFn PutCodesFor(const QFormat& f) {
  static constexpr PutCodesFn kTable[8] = {PutCodes<false, false, false>, PutCodes<false, false, true>,
                                          PutCodes<false, true, false>,  PutCodes<false, true, true>,
                                          PutCodes<true, false, false>,  PutCodes<true, false, true>,
                                          PutCodes<true, true, false>,   PutCodes<true, true, true>};
  return kTable[(f.nib ? 4 : 0) + (f.two ? 2 : 0) + (f.hbit ? 1 : 0)];
}

}  // namespace

QPacked QShape(DType t, int out, int in) {
  MNEMO_CHECK(HasQFormat(t));
  QPacked s;
  s.type = t;
  s.f = QFormatOf(t);
  s.out = out;
  s.in = in;
  s.out_pad = (out + kQPanelOut - 1) / kQPanelOut * kQPanelOut;
  MNEMO_CHECK(in % s.f.group == 0);
  return s;
}

void PackQ(const void* src, const QPacked& s, uint8_t* dst) {
  // The format's fields in locals: stores through uint8_t* may alias anything reached through a
  // reference, which would be reloaded at every byte written.
  const QFormat f = s.f;
  const PlaneOffsets po = Planes(f);
  const int groups = s.in / f.group, sbs = f.group / 32;
  const size_t row_bytes = DTypeBytes(s.type, s.in);
  const int block_bytes = DTypeBlockBytes(s.type);
  const int record_bytes = f.RecordBytes(), header_bytes = f.HeaderBytes(), sub_block_bytes = f.SubBlockBytes();
  const int sub_bytes = f.sub_bytes;
  const bool hdr1 = f.has_hdr1;
  const PutCodesFn put_codes = PutCodesFor(f);
  const int panels = s.out_pad / kQPanelOut;
  const DType type = s.type;
  const int out = s.out;
#pragma omp parallel
  {
    // Each record is built in a zeroed local buffer and copied once: the destination is written
    // once (no zeroing pass over it first), and padded outputs stay zero.
    std::vector<uint8_t> buf(static_cast<size_t>(record_bytes));  // [RecordBytes]
    Unpacked u;
#pragma omp for schedule(static)
    for (int p = 0; p < panels; p++) {
      for (int g = 0; g < groups; g++) {
        uint8_t* rec = buf.data();
        std::memset(rec, 0, static_cast<size_t>(record_bytes));
        for (int i = 0; i < kQPanelOut; i++) {
          const int o = p * kQPanelOut + i;
          if (o >= out) break;
          Unpack(type, static_cast<const uint8_t*>(src) + size_t(o) * row_bytes + size_t(g) * block_bytes, &u);
          std::memcpy(rec + 2 * i, &u.h0, 2);
          if (hdr1) std::memcpy(rec + 32 + 2 * i, &u.h1, 2);
          for (int sb = 0; sb < sbs; sb++) {
            uint8_t* sub = rec + header_bytes + sb * sub_block_bytes;
            for (int k = 0; k < sub_bytes / 16; k++) sub[16 * k + i] = u.sub[sb][k];
            uint8_t* q = sub + sub_bytes;
            put_codes(q, po, i, u.code + 32 * sb);
          }
        }
        std::memcpy(dst + (size_t(p) * groups + g) * record_bytes, rec, static_cast<size_t>(record_bytes));
      }
    }
  }
}

void QuantizeActS8Ref(const float* x, int n, int in, int8_t* q, QActBlock* out) {
  const int nb = in / 32;
  for (int j = 0; j < n; j++) {
    for (int b = 0; b < nb; b++) {
      const float* xb = x + size_t(j) * in + 32 * b;
      float amax = 0;
      for (int k = 0; k < 32; k++) amax = std::max(amax, std::fabs(xb[k]));
      const float id = amax > 0 ? 127.0f / amax : 0.0f;
      const float d = amax / 127.0f;
      int sum[2] = {0, 0};
      for (int k = 0; k < 32; k++) {
        const int v = int(std::nearbyint(xb[k] * id));
        q[size_t(j) * in + 32 * b + k] = int8_t(v);
        sum[k / 16] += v;
      }
      QActBlock& ab = out[size_t(j) * nb + b];
      ab.dx = d;
      ab.qsum[0] = sum[0];
      ab.qsum[1] = sum[1];
      ab.dxs[0] = d * float(sum[0]);
      ab.dxs[1] = d * float(sum[1]);
      ab.dxs32 = d * float(sum[0] + sum[1]);
    }
  }
}

void GemvQRef(const uint8_t* w, const QPacked& s, const QActs& x, int n, int o0, int o1, float* y,
              int ldy) {
  const QFormat& f = s.f;
  const DType t = s.type;
  const int groups = s.in / f.group, sbs = f.group / 32, nb = s.in / 32;
  const bool iq4 = t == DType::IQ4_NL || t == DType::IQ4_XS;
  for (int o = o0; o < o1; o++) {
    const int p = o / kQPanelOut, i = o % kQPanelOut;
    for (int j = 0; j < n; j++) {
      float acc = 0;
      for (int g = 0; g < groups; g++) {
        const uint8_t* rec = w + (size_t(p) * groups + g) * f.RecordBytes();
        uint16_t h0, h1 = 0;
        std::memcpy(&h0, rec + 2 * i, 2);
        if (f.has_hdr1) std::memcpy(&h1, rec + 32 + 2 * i, 2);
        const float d = F16ToF32(h0), d1 = F16ToF32(h1);
        for (int sb = 0; sb < sbs; sb++) {
          const uint8_t* sub = rec + f.HeaderBytes() + sb * f.SubBlockBytes();
          const uint8_t* q = sub + f.sub_bytes;
          const uint8_t b0 = f.sub_bytes ? sub[i] : 0, b1 = f.sub_bytes == 32 ? sub[16 + i] : 0;
          float sc[2], off[2];
          switch (t) {
            case DType::Q4_0: sc[0] = sc[1] = d, off[0] = off[1] = -8 * d; break;
            case DType::Q5_0: sc[0] = sc[1] = d, off[0] = off[1] = -16 * d; break;
            case DType::IQ4_NL: sc[0] = sc[1] = d, off[0] = off[1] = -128 * d; break;
            case DType::Q4_1: case DType::Q5_1: sc[0] = sc[1] = d, off[0] = off[1] = d1; break;
            case DType::Q4_K: case DType::Q5_K:
              sc[0] = sc[1] = d * float(b0), off[0] = off[1] = -d1 * float(b1);
              break;
            case DType::Q6_K: case DType::Q3_K:
              sc[0] = d * float(int8_t(b0)), sc[1] = d * float(int8_t(b1));
              off[0] = sc[0] * (t == DType::Q6_K ? -32 : -4), off[1] = sc[1] * (t == DType::Q6_K ? -32 : -4);
              break;
            case DType::Q2_K:
              sc[0] = d * float(b0 & 15), off[0] = -d1 * float(b0 >> 4);
              sc[1] = d * float(b1 & 15), off[1] = -d1 * float(b1 >> 4);
              break;
            case DType::IQ4_XS: sc[0] = sc[1] = d * float(int8_t(b0)), off[0] = off[1] = -128 * sc[0]; break;
            default: MNEMO_CHECK(false);
          }
          const int kb = g * sbs + sb;
          const int8_t* xq = x.q + size_t(j) * s.in + 32 * kb;
          int dot[2] = {0, 0};
          for (int k = 0; k < 32; k++) {
            const uint8_t c = GetCode(f, q, k / 4, 4 * i + k % 4);
            const int u = iq4 ? kIq4nlValues[c] + 128 : c;
            dot[k / 16] += u * xq[k];
          }
          const QActBlock& ab = x.b[size_t(j) * nb + kb];
          acc += ab.dx * (sc[0] * float(dot[0]) + sc[1] * float(dot[1])) + off[0] * ab.dxs[0] +
                 off[1] * ab.dxs[1];
        }
      }
      y[size_t(j) * ldy + o] = acc;
    }
  }
}

}  // namespace mnemo::kernels::detail
