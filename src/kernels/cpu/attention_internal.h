// Internal to src/kernels/cpu: the unit of work of PagedAttention and the kernels that run it.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/attention.h"

namespace mnemo::kernels::detail {

// Everything one PagedAttention call shares.
struct AttnArgs {
  const float* q;          // [rows, n_heads, head_dim]
  const int32_t* q_pos;    // [rows]
  const AttnSeq* seqs;     // [n_seqs]
  const PagedKvLayer* kv;  // the layer's pool
  int n_heads;             // query heads
  int group;               // query heads per KV head (n_heads / n_kv_heads)
  float scale;             // applied to q . k
  int window;              // AttnOptions::window (0: none)
  float softcap;           // AttnOptions::softcap (0: none)
  float* out;              // [rows, n_heads, head_dim]
  // BF16 K/V: scores use q * scale rounded to bf16 (every kernel, so results do not depend on
  // which kernel or CPU ran), and with AVX512-BF16 the AVX-512 kernels take q . k with vdpbf16ps
  // straight from the stored bf16 keys. F32 and F16 K/V: scores in f32 throughout.
  bool bf16_dot = false;
};

// One task: the query vectors [v0, v1) of one sequence and one KV head. Vector v is query row
// seq.q_begin + v / group, query head kv_head * group + v % group; all of them read the same K/V.
struct AttnTask {
  int seq;      // index into seqs
  int kv_head;  // KV head
  int v0, v1;   // query vectors, v1 - v0 <= kAttnTileVecs
};
// Vectors per task: one per lane of an AVX-512 register in the wide kernel.
constexpr int kAttnTileVecs = 16;
// Tasks with at most this many vectors (decode) use the narrow kernel (lanes along head_dim).
constexpr int kAttnNarrowVecs = 8;

// First key position visible to a query at position p (AttnOptions::window).
inline int FirstVisibleKey(int p, int window) { return window > 0 ? std::max(0, p - window + 1) : 0; }

// Whether the block of keys [k0, k0 + kBlockTokens) holds a key visible to any of n vectors whose
// visible keys are [first[i], last[i]] (empty when first[i] > last[i]).
inline bool BlockVisible(const int* first, const int* last, int n, int k0) {
  for (int i = 0; i < n; i++) {
    if (first[i] < k0 + kBlockTokens && last[i] >= k0 && first[i] <= last[i]) return true;
  }
  return false;
}

// Pointer to K (which = 0) or V (which = 1) rows of one block and KV head: [kBlockTokens, head_dim].
inline const void* KvBlockPtr(const PagedKvLayer& kv, int32_t block, int which, int kv_head) {
  size_t elem = kv.dtype == DType::F32 ? 4 : 2;
  size_t idx = ((size_t(block) * 2 + which) * kv.n_kv_heads + kv_head) * size_t(kBlockTokens) *
               kv.head_dim;
  return static_cast<const char*>(kv.base) + idx * elem;
}

void AttnTaskRef(const AttnArgs& a, const AttnTask& t);
// head_dim % 16 == 0 and head_dim <= kAttnMaxHeadDimAvx512 only; AVX-512F and F16C.
constexpr int kAttnMaxHeadDimAvx512 = 256;
void AttnTaskAvx512(const AttnArgs& a, const AttnTask& t);
// head_dim % 8 == 0 and head_dim <= kAttnMaxHeadDimAvx2 only; AVX2, FMA and F16C.
constexpr int kAttnMaxHeadDimAvx2 = 256;
void AttnTaskAvx2(const AttnArgs& a, const AttnTask& t);

}  // namespace mnemo::kernels::detail
