// Paged attention over KV blocks of kBlockTokens positions, and KV writes through block tables.
#pragma once

#include <cstdint>

#include "base/block.h"
#include "base/dtype.h"

namespace mnemo::kernels {

// One layer of a paged KV pool.
struct PagedKvLayer {
  void* base;      // [n_blocks, 2 (K, V), n_kv_heads, kBlockTokens, head_dim] of dtype
  DType dtype;     // F32 (exact), F16 or BF16
  int n_kv_heads;  // number of KV heads
  int head_dim;    // elements per head
};

// Stores k and v rows for n tokens: token t goes to block block_table[pos[t] / kBlockTokens],
// slot pos[t] % kBlockTokens, converted to kv.dtype. k, v: [n, n_kv_heads, head_dim].
void KvWrite(const PagedKvLayer& kv, const int32_t* block_table, const int32_t* pos, int n,
             const float* k, const float* v);

// One sequence of a batched attention call.
struct AttnSeq {
  const int32_t* block_table;  // [ceil(n_ctx / kBlockTokens)] block ids in the pool
  int n_ctx;                   // keys at positions [0, n_ctx) are valid
  int q_begin;                 // first query row of this sequence in q / q_pos / out
  int n_q;                     // number of query rows
};

// out[r] = softmax(q[r] . K[0..p]^T * scale) V[0..p] for every query row r at position p = q_pos[r]
// of its sequence (causal by absolute position: keys at positions <= min(p, n_ctx - 1)).
// Query head h reads KV head h / (n_heads / n_kv_heads) (GQA).
// q, out: [rows, n_heads, head_dim]. Online softmax over key tiles: memory is O(tile), never
// [n_q x n_ctx]. Parallel over (sequence, kv head, query tile) with NumThreads() threads.
void PagedAttention(const float* q, const int32_t* q_pos, const AttnSeq* seqs, int n_seqs,
                    const PagedKvLayer& kv, int n_heads, float scale, float* out);

}  // namespace mnemo::kernels
