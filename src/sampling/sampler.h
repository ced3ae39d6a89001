// Token sampling from logits: penalties, top-k, top-p, min-p, temperature, seeded draw.
//
// The chain follows llama.cpp's default order:
//   penalties -> top-k -> top-p -> min-p -> temperature -> draw.
// top-p and min-p are judged on the T = 1 probabilities of the top-k survivors (temperature comes
// after them, as in llama.cpp), so temperature changes how the kept tokens are weighted, never
// which tokens are kept. Both keep a prefix of the tokens sorted by (logit desc, id asc), and at
// least one token.
//
// Threading: a Sampler is owned by one request and called from one thread at a time.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "base/rng.h"
#include "base/status.h"

namespace mnemo {

// A token and its (penalized) logit. Tokens are ranked by higher logit first, lower id on ties.
struct TokenLogit {
  float logit;  // natural-log-scale score
  int32_t id;   // token id
};

struct SamplingParams {
  float temperature = 1.0f;         // >= 0; 0 = greedy (argmax after penalties, lowest id on ties)
  int32_t top_k = 0;                // keep the k most likely tokens; 0 = off (k >= n_vocab is off too)
  float top_p = 1.0f;               // in (0, 1]; keep the smallest prefix with mass >= top_p; 1 = off
  float min_p = 0.0f;               // in [0, 1]; keep tokens with p >= min_p * p_max; 0 = off
  float repetition_penalty = 1.0f;  // > 0; CTRL/llama.cpp: positive logits /= r, negative *= r; 1 = off
  float frequency_penalty = 0.0f;   // in [-2, 2]; OpenAI: logit -= count * frequency_penalty
  float presence_penalty = 0.0f;    // in [-2, 2]; OpenAI: logit -= (count > 0) * presence_penalty
  int32_t penalty_last_n = 64;      // penalties look at the last N history tokens; -1 = all, 0 = none
  uint64_t seed = 0;                // Rng seed: the same seed, logits and history give the same tokens
  // OpenAI's logit_bias: added to a token's logit before the penalties; ids in [0, n_vocab) (checked
  // by Sampler::Create), biases in [-100, 100]. -100 in practice bans a token, +100 forces it.
  std::vector<std::pair<int32_t, float>> logit_bias;

  // Rejects values outside the ranges above (and NaN) with a message naming the field.
  Status Validate() const;
};

// Samples one token per call. Holds per-vocab scratch buffers (reused, no allocation per call after
// the first) and its own Rng, so a seed reproduces a whole generation.
// Cost per call is O(n_vocab) whatever the filters: top-k and top-p find their cut with a
// histogram over logit buckets (or a heap for small k) and sort only the tokens of the one bucket
// the cut falls in; nothing sorts the vocabulary. A grammar's mask that keeps few tokens (at most
// a quarter of the vocabulary) makes it O(allowed tokens + n_vocab / 64).
class Sampler {
 public:
  // `params` must pass Validate() (checked: call Create() to get an Error instead); n_vocab > 0.
  Sampler(const SamplingParams& params, int n_vocab);
  static Result<Sampler> Create(const SamplingParams& params, int n_vocab);

  Sampler(Sampler&&) = default;
  Sampler& operator=(Sampler&&) = default;
  Sampler(const Sampler&) = delete;  // owns vocab-sized buffers and a stream position
  Sampler& operator=(const Sampler&) = delete;

  // logits: [n_vocab] raw model output for the next token (size checked). NaN counts as -inf,
  // +inf as the largest float. history: prompt and generated tokens so far, oldest first; the last
  // penalty_last_n of them drive the penalties (ids outside [0, n_vocab) are ignored).
  // allowed: empty, or [ceil(n_vocab / 64)] bits (bit i of word i / 64 set = token i may be
  // drawn; a grammar's mask, grammar/automaton.h): every other token counts as -inf before any
  // filter, so penalties, top-k/p and temperature act among the allowed tokens only. When every
  // allowed token's logit is -inf, the lowest allowed id is returned (never a refused one).
  // Returns a token id in [0, n_vocab).
  int32_t Sample(std::span<const float> logits, std::span<const int32_t> history,
                 std::span<const uint64_t> allowed = {});

  // The logits Sample() would work from: sanitized, penalties applied. [n_vocab], valid until the
  // next call. Does not advance the Rng. For tests, and for reporting penalized logprobs.
  std::span<const float> PenalizedLogits(std::span<const float> logits,
                                         std::span<const int32_t> history,
                                         std::span<const uint64_t> allowed = {});

  const SamplingParams& params() const { return params_; }
  int n_vocab() const { return n_vocab_; }

 private:
  // ApplyPenalties, then refused tokens (a non-empty `allowed`) become -inf.
  void PrepareLogits(std::span<const float> logits, std::span<const int32_t> history,
                     std::span<const uint64_t> allowed);
  // Copies logits into work_ (sanitized) and applies the penalties over the history window.
  void ApplyPenalties(std::span<const float> logits, std::span<const int32_t> history);
  // logit_bias and the penalties, on work_ in place.
  void ApplyBiasAndPenalties(std::span<const int32_t> history);
  // When `allowed` keeps at most n_vocab / kSparseShare tokens (and at least one): cand_ = those
  // tokens in id order with their logits as PrepareLogits would leave them, and returns their
  // count; else -1, nothing done. O(allowed tokens + n_vocab / 64).
  int32_t AllowedCandidates(std::span<const float> logits, std::span<const int32_t> history,
                            std::span<const uint64_t> allowed);
  // cand_ = the k best tokens of work_, in heap order. For small k.
  void HeapTopK(int32_t k);
  // Draws from softmax((l - max_logit) / T) over all of work_ (all = true) or over cand_.
  int32_t Draw(bool all, float max_logit);

  SamplingParams params_;
  int n_vocab_;
  Rng rng_;
  std::vector<float> work_;               // [n_vocab] logits after sanitizing and penalties
  std::vector<int32_t> counts_;           // [n_vocab] occurrences in the penalty window; 0 between calls
  std::vector<TokenLogit> cand_;          // [<= n_vocab] the candidate set once it is narrowed
  std::vector<TokenLogit> bucket_cand_;   // [<= n_vocab] tokens of the bucket a cut falls in
  std::vector<double> bucket_measure_;    // [kBuckets] token count or probability mass per bucket
  std::vector<float> weights_;            // [<= n_vocab] unnormalized final probabilities
  std::vector<double> block_sums_;        // [ceil(n_vocab / kDrawBlock)] sums of weights_ blocks
};

// A token and its natural-log probability.
struct TokenLogprob {
  int32_t id;
  float logprob;
};

// One generated position's logprobs (OpenAI's `logprobs`): under the model's own distribution,
// log-softmax of the raw logits at temperature 1, before logit_bias, penalties, temperature,
// top-k / top-p / min-p and any grammar mask (what OpenAI reports, and vLLM by default), so that a
// token's logprob does not depend on how it was drawn.
struct PositionLogprobs {
  TokenLogprob chosen;            // the token generated here
  std::vector<TokenLogprob> top;  // [<= top_n] the most likely tokens, most likely first (lower id on ties)
};

// The part of PositionLogprobs that needs the whole row, taken before anything edits the row
// (the engine masks end-of-generation tokens in place). log_z = log Σ_i exp(logit_i), so that
// logprob(i) = logit_i - log_z; NaN logits count as -inf. top_n in [0, 20] (larger is clamped);
// `top` is reused (no allocation per call after the first). Cost: O(n_vocab): one max, one
// exp pass, one insertion pass keeping top_n.
struct LogprobScan {
  double log_z = 0;
  std::vector<TokenLogprob> top;
  // The position's logprobs once the token is known; raw_logit: its logit in the row scanned.
  PositionLogprobs For(int32_t id, float raw_logit) const;
};
void ScanLogprobs(std::span<const float> logits, int top_n, LogprobScan* out);
inline constexpr int kMaxTopLogprobs = 20;

// Numerically stable log-softmax: out[i] = x[i] - log(sum_j exp(x[j])), accumulated in double.
// out may alias logits. If every logit is -inf the distribution is undefined and out is all -inf.
void LogSoftmax(std::span<const float> logits, std::span<float> out);
std::vector<float> LogSoftmax(std::span<const float> logits);
// Softmax probabilities (sum 1), same conventions; all -inf gives all 0.
void Softmax(std::span<const float> logits, std::span<float> out);

}  // namespace mnemo
