// Turn embeddings for the relevance score: an Embedder maps a token sequence to a vector, and turns
// are compared with the new user message by cosine similarity.
//
// The default IdfEmbedder costs no model pass: it is the IDF-weighted mean of the model's own
// input token embeddings (rows of the token embedding table, through a lookup the engine provides):
//
//   e(turn) = sum_t c_t * idf(t) * E[t]  /  sum_t c_t * idf(t)
//   idf(t)  = ln((N + 1) / (df(t) + 1)) + 1              (smoothed IDF, >= 1)
//
// with t over the turn's distinct tokens, c_t its occurrences in the turn, E[t] its embedding row,
// N the number of documents (turns) counted by an IdfStats and df(t) the number of them
// containing t. Words every turn shares (chat-template markers, "the") weigh 1; rare ones up to
// ln((N+1)/2) + 1.
//
// Where the IDF statistics come from (decision): from a running corpus counter the CALLER owns, an
// IdfStats, fed with each completed turn (per session, or one per model shared by all sessions for
// better statistics). Cached turn embeddings must stay comparable with each other, so the counter
// publishes snapshots: counting goes on continuously, the embedder sees only the last published
// snapshot, and each publication has a process-unique stamp that invalidates cached embeddings
// (see TurnCache in scoring.h). MaybePublish() publishes when the document count has grown by a
// factor (2 by default) since the last publication, so each turn is re-embedded O(log N) times over
// a conversation and all turns are always embedded with the same IDF.
//
// Threading: none of these classes is thread-safe; the engine thread owns them.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/status.h"

namespace mnemo::context {

// Writes row `token` of the model's token embedding table, as F32, to out[0, dim). Provided by the
// engine; it must accept every token id that appears in the session log.
using EmbeddingLookup = std::function<void(int32_t token, float* out)>;

// Maps tokens to a fixed-size vector; cosine similarity between two outputs measures relevance.
class Embedder {
 public:
  virtual ~Embedder() = default;
  // Returns [dim()] values; an empty input gives the zero vector.
  virtual std::vector<float> Embed(std::span<const int32_t> tokens) = 0;
  // Length of every embedding.
  virtual int dim() const = 0;
  // Identifies the embedding function's current state: two calls with the same tokens and the same
  // stamp give the same vector. Cached embeddings with another stamp are recomputed.
  virtual uint64_t stamp() const { return 0; }
};

// Document frequencies of tokens over a corpus of documents (turns), with published snapshots.
class IdfStats {
 public:
  // Counts one document: each distinct token of `tokens` once. Not visible to Idf() until
  // published.
  void AddDocument(std::span<const int32_t> tokens);
  // Makes everything counted so far visible to Idf() and takes a new, process-unique stamp.
  void Publish();
  // Publishes when nothing is published yet and documents were counted, or when the document count
  // reached growth * the published count (growth >= 1). Returns whether it published.
  bool MaybePublish(double growth = 2.0);
  // Smoothed IDF of `token` from the published snapshot: ln((N+1)/(df+1)) + 1; 1 when nothing is
  // published (every token then weighs the same).
  float Idf(int32_t token) const;

  int documents() const { return documents_; }              // counted so far
  int published_documents() const { return published_n_; }  // N of the snapshot Idf() reads
  uint64_t stamp() const { return stamp_; }                 // 0 until the first Publish()

 private:
  std::unordered_map<int32_t, int> df_;            // token -> documents containing it (all counted)
  std::unordered_map<int32_t, int> published_df_;  // snapshot read by Idf()
  int documents_ = 0;                              // documents counted
  int published_n_ = 0;                            // documents in the snapshot
  uint64_t stamp_ = 0;                             // snapshot identity
};

// The IDF-weighted mean of token embedding rows (formula above). Each Embed() call looks up every
// distinct token of its input once (dim floats each) and costs O(tokens log tokens + distinct *
// dim).
class IdfEmbedder final : public Embedder {
 public:
  // lookup: the token embedding table; dim: its row length (> 0, checked); stats: may be null (all
  // tokens weigh 1: a plain mean) and must outlive the embedder when given.
  IdfEmbedder(EmbeddingLookup lookup, int dim, const IdfStats* stats = nullptr);

  std::vector<float> Embed(std::span<const int32_t> tokens) override;
  int dim() const override { return dim_; }
  uint64_t stamp() const override { return stats_ ? stats_->stamp() : 0; }

 private:
  EmbeddingLookup lookup_;
  int dim_;                 // embedding length
  const IdfStats* stats_;   // not owned; may be null
  std::vector<float> row_;  // [dim] scratch for one looked-up row
};

// An embedding computed by a function the caller provides, e.g. the model's hidden state at a
// middle layer mean-pooled over the tokens (the service runs it on the engine thread through
// Engine::Probe). A failed call gives an empty vector (ScoreTurns then reports the length error)
// and keeps its message in last_error().
class FunctionEmbedder final : public Embedder {
 public:
  using Fn = std::function<Result<std::vector<float>>(std::span<const int32_t> tokens)>;
  // dim > 0 (checked); stamp: tells this function's vectors from other embedders' in a TurnCache
  // (IdfStats stamps count up from 1, so use one with the top bit set).
  FunctionEmbedder(Fn fn, int dim, uint64_t stamp);

  std::vector<float> Embed(std::span<const int32_t> tokens) override;
  int dim() const override { return dim_; }
  uint64_t stamp() const override { return stamp_; }
  const std::string& last_error() const { return last_error_; }

 private:
  Fn fn_;
  int dim_;
  uint64_t stamp_;
  std::string last_error_;
};

// Cosine similarity of two equal-length vectors in [-1, 1] (accumulated in double); 0 when either
// is the zero vector.
double CosineSimilarity(std::span<const float> a, std::span<const float> b);

}  // namespace mnemo::context
