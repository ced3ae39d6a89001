#include "context/embedding.h"

#include <algorithm>
#include <atomic>
#include <cmath>

namespace mnemo::context {
namespace {

// Stamps are unique across IdfStats instances so a cache never mistakes one snapshot for another.
std::atomic<uint64_t> g_next_stamp{1};

}  // namespace

void IdfStats::AddDocument(std::span<const int32_t> tokens) {
  std::vector<int32_t> distinct(tokens.begin(), tokens.end());
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  for (int32_t t : distinct) ++df_[t];
  ++documents_;
}

void IdfStats::Publish() {
  published_df_ = df_;
  published_n_ = documents_;
  stamp_ = g_next_stamp.fetch_add(1, std::memory_order_relaxed);
}

bool IdfStats::MaybePublish(double growth) {
  MNEMO_CHECK_MSG(growth >= 1.0, "IdfStats::MaybePublish: growth must be >= 1");
  const bool first = stamp_ == 0 && documents_ > 0;
  const bool grown = stamp_ != 0 && documents_ > published_n_ &&
                     static_cast<double>(documents_) >= growth * published_n_;
  if (!first && !grown) return false;
  Publish();
  return true;
}

float IdfStats::Idf(int32_t token) const {
  auto it = published_df_.find(token);
  const int df = it == published_df_.end() ? 0 : it->second;
  return static_cast<float>(std::log((published_n_ + 1.0) / (df + 1.0)) + 1.0);
}

IdfEmbedder::IdfEmbedder(EmbeddingLookup lookup, int dim, const IdfStats* stats)
    : lookup_(std::move(lookup)), dim_(dim), stats_(stats), row_(dim > 0 ? dim : 0) {
  MNEMO_CHECK_MSG(dim > 0, "IdfEmbedder: dim must be positive");
  MNEMO_CHECK_MSG(static_cast<bool>(lookup_), "IdfEmbedder: empty lookup");
}

std::vector<float> IdfEmbedder::Embed(std::span<const int32_t> tokens) {
  std::vector<double> acc(dim_, 0.0);  // [dim]
  std::vector<int32_t> sorted(tokens.begin(), tokens.end());
  std::sort(sorted.begin(), sorted.end());
  double total_weight = 0;
  for (size_t i = 0; i < sorted.size();) {
    size_t j = i;
    while (j < sorted.size() && sorted[j] == sorted[i]) ++j;
    const double w = static_cast<double>(j - i) * (stats_ ? stats_->Idf(sorted[i]) : 1.0f);
    lookup_(sorted[i], row_.data());
    for (int d = 0; d < dim_; ++d) acc[d] += w * row_[d];
    total_weight += w;
    i = j;
  }
  std::vector<float> out(dim_, 0.0f);  // [dim]
  if (total_weight > 0) {
    for (int d = 0; d < dim_; ++d) out[d] = static_cast<float>(acc[d] / total_weight);
  }
  return out;
}

FunctionEmbedder::FunctionEmbedder(Fn fn, int dim, uint64_t stamp)
    : fn_(std::move(fn)), dim_(dim), stamp_(stamp) {
  MNEMO_CHECK_MSG(dim > 0, "FunctionEmbedder: dim must be positive");
  MNEMO_CHECK_MSG(static_cast<bool>(fn_), "FunctionEmbedder: empty function");
}

std::vector<float> FunctionEmbedder::Embed(std::span<const int32_t> tokens) {
  if (tokens.empty()) return std::vector<float>(dim_, 0.0f);
  auto r = fn_(tokens);
  if (!r.ok()) {
    last_error_ = r.error().message;
    return {};
  }
  return std::move(r.value());
}

double CosineSimilarity(std::span<const float> a, std::span<const float> b) {
  MNEMO_CHECK_MSG(a.size() == b.size(), "CosineSimilarity: length mismatch");
  double dot = 0, na = 0, nb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    dot += static_cast<double>(a[i]) * b[i];
    na += static_cast<double>(a[i]) * a[i];
    nb += static_cast<double>(b[i]) * b[i];
  }
  if (na <= 0 || nb <= 0) return 0.0;
  return std::clamp(dot / std::sqrt(na * nb), -1.0, 1.0);
}

}  // namespace mnemo::context
