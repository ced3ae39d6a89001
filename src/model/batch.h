// One forward step's input: several sequences, each with a ragged set of query tokens at arbitrary
// positions and a block table through which its KV is read and written.
#pragma once

#include <cstdint>
#include <vector>

namespace mnemo {

struct BatchSeq {
  int q_begin = 0;                   // first row of this sequence in Batch::tokens / positions
  int n_q = 0;                       // number of query tokens this step
  std::vector<int32_t> block_table;  // [ceil(n_ctx / kBlockTokens)] KV block ids, by position / 32
  int n_ctx = 0;                     // after this step's writes, keys at positions [0, n_ctx) are valid
  bool all_logits = false;           // logits for every query row (true) or only for the last one
  bool logits = true;                // false: no logits at all (a prefill chunk before the last)
};

struct Batch {
  std::vector<int32_t> tokens;     // [n_tokens] token ids, sequences back to back
  std::vector<int32_t> positions;  // [n_tokens] absolute position of each token in its sequence
  std::vector<BatchSeq> seqs;      // sequences in row order

  int n_tokens() const { return static_cast<int>(tokens.size()); }
  // Appends a sequence's query tokens; returns its index. block_table and n_ctx set by the caller.
  int Add(const int32_t* toks, const int32_t* pos, int n, bool all_logits);
  // Rows of the logits output, in sequence order: per sequence n_q rows if all_logits, else 1 row
  // (its last query) if logits, else none.
  int n_logit_rows() const;
};

}  // namespace mnemo
