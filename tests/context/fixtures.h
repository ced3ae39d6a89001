// Test helpers for src/context: a token embedding table of random vectors (the one stand-in this
// model-free layer allows: it plays the model's embedding table) and conversation builders.
#pragma once

#include <cstdint>
#include <vector>

#include "base/rng.h"
#include "context/embedding.h"
#include "context/turns.h"

namespace mnemo::context::testing {

// A [vocab, dim] table of N(0, 1) values (or one-hot rows), with a count of lookups.
class EmbeddingTable {
 public:
  EmbeddingTable(int vocab, int dim, uint64_t seed) : vocab_(vocab), dim_(dim), rows_(vocab * dim) {
    Rng rng(seed);
    for (float& v : rows_) v = static_cast<float>(rng.Normal());
  }
  // Row t = e_t (requires dim >= vocab): distinct tokens are exactly orthogonal.
  static EmbeddingTable OneHot(int vocab) {
    EmbeddingTable t(vocab, vocab, 0);
    for (int i = 0; i < vocab * vocab; ++i) t.rows_[i] = (i % (vocab + 1) == 0) ? 1.0f : 0.0f;
    return t;
  }
  EmbeddingLookup Lookup() {
    return [this](int32_t token, float* out) {
      ++calls_;
      for (int d = 0; d < dim_; ++d) out[d] = rows_[static_cast<size_t>(token) * dim_ + d];
    };
  }
  const float* row(int32_t token) const { return &rows_[static_cast<size_t>(token) * dim_]; }
  int vocab() const { return vocab_; }
  int dim() const { return dim_; }
  int64_t calls() const { return calls_; }

 private:
  int vocab_;
  int dim_;
  std::vector<float> rows_;  // [vocab, dim]
  int64_t calls_ = 0;        // lookups served
};

// A session log built turn by turn.
struct Conversation {
  std::vector<int32_t> log;     // raw token log
  std::vector<TurnSpan> turns;  // tiles the log; turns[0] = system prompt
  void Add(const std::vector<int32_t>& tokens, bool pinned = false) {
    const int b = static_cast<int>(log.size());
    log.insert(log.end(), tokens.begin(), tokens.end());
    turns.push_back({b, static_cast<int>(log.size()), pinned});
  }
};

// `n` tokens drawn uniformly from [lo, hi).
inline std::vector<int32_t> RandomTokens(Rng& rng, int n, int lo, int hi) {
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = lo + static_cast<int32_t>(rng.Next() % static_cast<uint64_t>(hi - lo));
  return t;
}

// A random history of `n_turns` turns (turn 0 included) with sizes in [0, max_size] and ~20% pins.
inline std::vector<TurnSpan> RandomTurns(Rng& rng, int n_turns, int max_size) {
  std::vector<TurnSpan> turns;
  int pos = 0;
  for (int i = 0; i < n_turns; ++i) {
    const int size = static_cast<int>(rng.Next() % static_cast<uint64_t>(max_size + 1));
    turns.push_back({pos, pos + size, rng.Uniform() < 0.2f});
    pos += size;
  }
  return turns;
}

}  // namespace mnemo::context::testing
