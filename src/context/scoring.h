// Turn importance for selective context (ConvKV):
//
//   score(i) = alpha * recency(i) + beta * relevance(i) + gamma * information(i)    in [0, 1]
//
// with alpha, beta, gamma >= 0 summing to 1 and every component in [0, 1]. The components of turn i
// of a history of T turns (turn 0 = system prompt, turn T-1 = the newest exchange):
//
//   recency(i)     = exp(-(d - 1) / tau),  d = T - i the turn distance (the newest turn has d = 1
//                    and recency 1); tau (turns, default 8) sets the decay: a turn 8 exchanges
//                    older than the newest weighs 1/e.
//   relevance(i)   one of (ScoringOptions::relevance; 0 when the turn or the query is empty):
//     keyword        (default) IDF-weighted overlap of the query's distinct words with the turn's,
//                    relative to the best turn's (which gets 1):
//                    k(i) / max_j k(j),  k(i) = sum_{t in q and turn i} w(t) / sum_{t in q, df(t) >= 1} w(t),
//                    w(t) = ln((T + 1) / (df(t) + 1)), df(t) = history turns containing word t.
//                    A word is a run of tokens (ScoringOptions::word_kind: small vocabularies split
//                    "cat" into "_c" "at", and "at" alone would match "What"), each token first
//                    mapped through ScoringOptions::fold (e.g. to its lower-case form); without
//                    word_kind every token is a word. A word every turn has weighs 0; a query word
//                    no turn has is left out (it cannot tell turns apart). 0 when no query word
//                    occurs. That share x is then sharpened (t = ScoringOptions::
//                    relevance_temperature, default 0.1; 0 keeps the share):
//                      relevance = (e^(x/t) - 1) / (e^(1/t) - 1)   (0 -> 0, 1 -> 1, ~ e^((x-1)/t))
//                    i.e. the turn's softmax weight over the turns relative to the best's: a turn
//                    matching 0.1 less of the query than the best counts 1/e as relevant. A
//                    question is answered by one turn; with the linear share, a newer turn sharing
//                    most of its words outranked the older one that answers it once recency was
//                    added (docs/benchmarks-convkv.md, "Combining the factors"). Monotone, so the
//                    relevance-only ranking is the same with or without it.
//     embedding      max(0, cos(e_i, e_q)): cosine similarity between the turn's embedding and the
//                    new user message's (Embedder, see embedding.h). Negative similarity is clamped
//                    to 0: for selection "opposite" is no more useful than "unrelated".
//     centred        max(0, cos(e_i - m, e_q - m)), m = mean embedding of the non-empty turns:
//                    removes the direction all turns share (raw cosines cluster at 0.77-0.91).
//     whitened       as centred, each dimension also divided by its standard deviation over the
//                    non-empty turns (diagonal whitening; dimensions with std 0 are dropped).
//                    Measured on the recall model (docs/benchmarks-convkv.md): keyword keeps the
//                    turn that answers the question far more often than the embedding variants.
//     hidden         as centred, over whatever the embedder gives; the caller passes one that
//                    returns the model's hidden state at a middle layer mean-pooled over the tokens
//                    (each turn run alone from position 0: FunctionEmbedder over Engine::Probe), so a
//                    turn is embedded once per conversation like the IDF embedding.
//     attention      min(1, a(i) / max_{j < T-1} a(j)) (the newest turn is left out of the scale:
//                    it draws attention by locality), a(i) = sum over the turn's positions p > 0 of
//                    ScoringOptions::attention_mass[p]: how much the new message's tokens, run after
//                    the whole history, attend to each turn (Engine::Probe; position 0 is left out:
//                    models park attention there whatever its content, an attention sink). Costs a
//                    prefill of the whole history, which selection is meant to save.
//   information(i) = (1 - s) * diversity(i) + s * novelty(i),   s = novelty_share (default 0.5)
//     diversity(i) = H_i / ln(n_i): the entropy of the turn's token distribution (natural log, over
//                    its distinct tokens with p = count / n_i) normalized by its maximum for n_i
//                    tokens; 1 when all tokens differ, 0 for one token repeated (and for n_i < 2).
//     novelty(i)   = mean over the turn's distinct tokens t of 1 - (df(t) - 1) / (T - 1),
//                    df(t) = the number of history turns containing t (turn i included): 1 for
//                    a token no other turn has, 0 for one every turn has (template markers).
//                    1 when T == 1; 0 for an empty turn.
//
// Cost: every turn's token histogram and embedding is computed once per session and kept in a
// TurnCache; a scoring round then costs one embedding of the new message plus O(sum of distinct
// tokens + T * dim).
//
// Threading: not thread-safe; one TurnCache per session, used by the engine thread.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "context/embedding.h"
#include "context/turns.h"

namespace mnemo::context {

struct ScoreWeights {
  double recency = 0.4;      // alpha: weight of recency
  double relevance = 0.4;    // beta: weight of relevance to the new user message
  double information = 0.2;  // gamma: weight of information content
};

// Each weight finite and >= 0, and their sum 1 within 1e-6.
Status ValidateWeights(const ScoreWeights& w);

// Named presets: "default" (0.4, 0.4, 0.2), "factual" (0.2, 0.6, 0.2), "sequential" (0.6, 0.2,
// 0.2), "analytical" (0.2, 0.3, 0.5) as (recency, relevance, information). Unknown name -> Error.
Result<ScoreWeights> WeightPreset(std::string_view name);
std::span<const std::string_view> WeightPresetNames();

enum class RelevanceKind { kKeyword, kEmbedding, kCentred, kWhitened, kHidden, kAttention };
// "keyword", "embedding", "centred", "whitened", "hidden", "attention"; unknown name -> Error.
std::string_view RelevanceKindName(RelevanceKind k);
Result<RelevanceKind> ParseRelevanceKind(std::string_view name);

struct ScoringOptions {
  ScoreWeights weights;        // must pass ValidateWeights
  RelevanceKind relevance = RelevanceKind::kKeyword;  // how relevance is computed (above)
  std::span<const int32_t> fold;  // keyword only: [vocab] token -> the id it counts as (e.g. its
                                  // lower-case form); ids outside it map to themselves. Not owned.
  std::span<const int8_t> word_kind;  // keyword only: [vocab] 1 = the token starts a word (its
                                      // text begins with a space marker), 0 = it continues the
                                      // current word, -1 = it is in no word (punctuation, control
                                      // tokens). Ids outside it: 1. Empty: every token is a word.
                                      // Not owned.
  std::span<const float> attention_mass;  // attention only: [log.size()] the new message's
                                          // attention on each history position (Engine::Probe's
                                          // attn_mass over the history). Not owned.
  double recency_tau = 8.0;    // turns; finite, > 0
  // keyword only: sharpening of the matched share (formula above); finite, >= 0, 0 = off. 0.1 was
  // chosen on seven recall evaluation sets and checked on six others (docs/benchmarks-convkv.md).
  double relevance_temperature = 0.1;
  double novelty_share = 0.5;  // s in information = (1 - s) * diversity + s * novelty; in [0, 1]

  Status Validate() const;
};

struct TurnScore {
  double recency = 0;      // [0, 1]
  double relevance = 0;    // [0, 1]
  double information = 0;  // [0, 1]
  double diversity = 0;    // [0, 1], part of information
  double novelty = 0;      // [0, 1], part of information
  double total = 0;        // weighted sum, [0, 1]
};

// recency(d) for turn distance d >= 1.
double RecencyScore(int distance, double tau);

struct TokenCount {
  int32_t token;  // token id
  int32_t count;  // occurrences
};

// Sorted-by-token histogram of `tokens`.
std::vector<TokenCount> TokenHistogram(std::span<const int32_t> tokens);
// diversity from a histogram (formula above).
double Diversity(std::span<const TokenCount> histogram);

// What a turn's score needs that depends only on its tokens (and the embedder's state).
struct TurnFeatures {
  std::vector<TokenCount> histogram;  // distinct tokens ascending with counts
  int n_tokens = 0;                   // tokens in the turn
  double diversity = 0;               // Diversity(histogram)
  std::vector<float> embedding;       // [dim] Embedder output
  uint64_t stamp = 0;                 // Embedder::stamp() the embedding was computed under
};

// Per-session cache of turn features, keyed by (begin, end, HashTokens(tokens)): a turn whose span
// and content are unchanged is never re-embedded; a changed span or content is a new key. An entry
// whose embedder stamp differs from the current one keeps its histogram and recomputes only the
// embedding. ScoreTurns sweeps entries the history no longer has, so the cache holds at most one
// entry per turn of the last scored history.
class TurnCache {
 public:
  struct Stats {
    int64_t hits = 0;    // lookups served entirely from the cache
    int64_t embeds = 0;  // Embed() calls for turns (misses and stamp changes)
    int64_t swept = 0;   // entries dropped by Sweep
  };

  // The features of the turn [begin, end) whose tokens are `tokens` (end - begin of them), computed
  // on a miss. The pointer stays valid until the next Sweep or Clear. Errors: the embedder returned
  // a vector whose length is not its dim().
  Result<const TurnFeatures*> Get(int begin, int end, std::span<const int32_t> tokens,
                                  Embedder& embedder);
  // Drops the entries not returned by Get since the previous Sweep.
  void Sweep();
  void Clear() { entries_.clear(); }
  size_t size() const { return entries_.size(); }
  const Stats& stats() const { return stats_; }

 private:
  struct Key {
    int begin, end;  // positions in the session log
    uint64_t hash;   // HashTokens of the turn's tokens
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    size_t operator()(const Key& k) const;
  };
  struct Entry {
    TurnFeatures features;
    bool used = false;  // returned by Get since the last Sweep
  };
  std::unordered_map<Key, Entry, KeyHash> entries_;
  Stats stats_;
};

// Scores every turn of a history for the new user message `query`.
//   log:   the session's raw token log; turns must tile [0, log.size()) (ValidateTurns).
//   query: the new user message's tokens (as rendered; not part of `log`). Empty: relevance 0.
//   cache: the session's cache (swept at the end: entries of turns not in `turns` are dropped), or
//          null to compute everything afresh.
// Returns one TurnScore per turn, in turn order. Errors: invalid turns or options, an embedder
// returning vectors of the wrong length.
Result<std::vector<TurnScore>> ScoreTurns(std::span<const int32_t> log,
                                          std::span<const TurnSpan> turns,
                                          std::span<const int32_t> query, Embedder& embedder,
                                          const ScoringOptions& options,
                                          TurnCache* cache = nullptr);

}  // namespace mnemo::context
