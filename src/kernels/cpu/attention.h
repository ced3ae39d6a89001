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

// Per-call options of PagedAttention; the defaults give plain causal attention.
struct AttnOptions {
  // Sliding window in tokens: > 0, a query at position p sees only keys at positions in
  // (p - window, p] (a key at p - window is hidden: llama.cpp's LLAMA_SWA_TYPE_STANDARD mask);
  // 0, every key at positions <= p.
  int window = 0;
  // Attention-logit soft-cap: > 0, every score s = q . k * scale becomes softcap * tanh(s / softcap)
  // before the mask and the softmax (Gemma 2); 0, none.
  float softcap = 0.0f;
};

// out[r] = softmax(q[r] . K^T * scale) V over the keys visible to query row r at position
// p = q_pos[r] of its sequence: positions <= min(p, n_ctx - 1) (causal by absolute position), and
// > p - opt.window with a sliding window. Query head h reads KV head h / (n_heads / n_kv_heads) (GQA).
// q, out: [rows, n_heads, head_dim]. Online softmax over key tiles: memory is O(tile), never
// [n_q x n_ctx]. Blocks holding no key visible to any query of a task are skipped, their
// block_table entries never read (a window's cost is O(window), not O(p)). Parallel over
// (sequence, kv head, query tile) with NumThreads() threads. A query that sees no key (possible
// only with n_ctx <= 0) gets zeros.
void PagedAttention(const float* q, const int32_t* q_pos, const AttnSeq* seqs, int n_seqs,
                    const PagedKvLayer& kv, int n_heads, float scale, float* out,
                    const AttnOptions& opt = {});

}  // namespace mnemo::kernels
