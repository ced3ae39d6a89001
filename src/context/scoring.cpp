#include "context/scoring.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <unordered_map>

namespace mnemo::context {
namespace {

struct Preset {
  std::string_view name;
  ScoreWeights weights;
};
constexpr std::array<Preset, 4> kPresets = {{
    {"default", {0.4, 0.4, 0.2}},
    {"factual", {0.2, 0.6, 0.2}},
    {"sequential", {0.6, 0.2, 0.2}},
    {"analytical", {0.2, 0.3, 0.5}},
}};
constexpr std::array<std::string_view, 4> kPresetNames = {"default", "factual", "sequential",
                                                          "analytical"};
constexpr std::pair<RelevanceKind, std::string_view> kRelevanceNames[] = {
    {RelevanceKind::kKeyword, "keyword"},
    {RelevanceKind::kEmbedding, "embedding"},
    {RelevanceKind::kCentred, "centred"},
    {RelevanceKind::kWhitened, "whitened"},
    {RelevanceKind::kHidden, "hidden"},
    {RelevanceKind::kAttention, "attention"},
};

// Distinct words of `tokens`, as hashes of their folded token ids, ascending (scoring.h: keyword).
std::vector<int64_t> WordSet(std::span<const int32_t> tokens, const ScoringOptions& o) {
  auto folded = [&](int32_t t) {
    return t >= 0 && static_cast<size_t>(t) < o.fold.size() ? o.fold[t] : t;
  };
  auto kind = [&](int32_t t) -> int {
    if (o.word_kind.empty()) return 1;
    return t >= 0 && static_cast<size_t>(t) < o.word_kind.size() ? o.word_kind[t] : 1;
  };
  std::vector<int64_t> out;
  std::vector<int32_t> word;  // folded ids of the word being read
  auto flush = [&] {
    if (!word.empty()) out.push_back(static_cast<int64_t>(HashTokens(word)));
    word.clear();
  };
  for (int32_t t : tokens) {
    const int k = kind(t);
    if (k < 0) {
      flush();
      continue;
    }
    if (k > 0) flush();
    word.push_back(folded(t));
  }
  flush();
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// (e^(x/t) - 1) / (e^(1/t) - 1) for x in [0, 1], t > 0, written so that no term overflows for a
// small t: e^((x-1)/t) (1 - e^(-x/t)) / (1 - e^(-1/t)). 0 -> 0, 1 -> 1, increasing.
double Sharpen(double x, double t) {
  return std::exp((x - 1) / t) * -std::expm1(-x / t) / -std::expm1(-1 / t);
}

// Keyword relevance of every turn (formula in scoring.h). turn_sets: [T] folded distinct tokens of
// each turn; query_set: the query's; temperature: ScoringOptions::relevance_temperature.
std::vector<double> KeywordRelevance(const std::vector<std::vector<int64_t>>& turn_sets,
                                     const std::vector<int64_t>& query_set, double temperature) {
  const int n_turns = static_cast<int>(turn_sets.size());
  std::unordered_map<int64_t, int> df;  // query word -> history turns containing it
  for (int64_t t : query_set) df[t] = 0;
  for (const auto& set : turn_sets) {
    for (int64_t t : set) {
      auto it = df.find(t);
      if (it != df.end()) ++it->second;
    }
  }
  std::unordered_map<int64_t, double> w;  // query word -> weight
  double total = 0;
  for (const auto& [t, d] : df) {
    if (d == 0) continue;
    const double wt = std::log((n_turns + 1.0) / (d + 1.0));
    w[t] = wt;
    total += wt;
  }
  std::vector<double> rel(n_turns, 0.0);
  if (total <= 0) return rel;
  for (int i = 0; i < n_turns; ++i) {
    double sum = 0;
    for (int64_t t : turn_sets[i]) {
      auto it = w.find(t);
      if (it != w.end()) sum += it->second;
    }
    rel[i] = std::clamp(sum / total, 0.0, 1.0);
  }
  // Relative to the best turn: the share alone is small when the query has several weighty words
  // one turn cannot all hold, and the 3-factor mix then lets recency outvote the one turn that
  // matches best (measured: docs/benchmarks-convkv.md).
  double best = 0;
  for (double r : rel) best = std::max(best, r);
  if (best > 0) {
    for (double& r : rel) r /= best;
  }
  // The share is linear in matched words, but a question is answered by one turn: a distractor
  // that shares "dog called" with "What is my dog called?" holds 77% of the fact turn's share and,
  // with recency weighing as much as relevance, a few exchanges' recency lead outvoted the fact
  // (docs/benchmarks-convkv.md). Sharpening makes the mix follow a decisive relevance lead and
  // leaves recency and information to order the turns that match alike. Monotone: ranking by
  // relevance alone is unchanged.
  if (temperature > 0) {
    for (double& r : rel) r = Sharpen(r, temperature);
  }
  return rel;
}

}  // namespace

Status ValidateWeights(const ScoreWeights& w) {
  const std::array<std::pair<const char*, double>, 3> parts = {
      {{"recency", w.recency}, {"relevance", w.relevance}, {"information", w.information}}};
  for (const auto& [name, v] : parts) {
    if (!std::isfinite(v) || v < 0) {
      return MakeError("context: weight %s = %g must be a finite number >= 0", name, v);
    }
  }
  const double sum = w.recency + w.relevance + w.information;
  if (std::fabs(sum - 1.0) > 1e-6) {
    return MakeError(
        "context: weights recency %g + relevance %g + information %g sum to %.9g, not 1", w.recency,
        w.relevance, w.information, sum);
  }
  return Status::Ok();
}

Result<ScoreWeights> WeightPreset(std::string_view name) {
  for (const Preset& p : kPresets) {
    if (p.name == name) return p.weights;
  }
  return MakeError(
      "context: unknown weight preset '%.*s' (default, factual, sequential, analytical)",
      static_cast<int>(name.size()), name.data());
}

std::span<const std::string_view> WeightPresetNames() { return kPresetNames; }

std::string_view RelevanceKindName(RelevanceKind k) {
  for (const auto& [kind, name] : kRelevanceNames) {
    if (kind == k) return name;
  }
  return "unknown";
}

Result<RelevanceKind> ParseRelevanceKind(std::string_view name) {
  for (const auto& [kind, n] : kRelevanceNames) {
    if (n == name) return kind;
  }
  return MakeError("context: unknown relevance '%.*s' (keyword, embedding, centred, whitened, hidden, attention)",
                   static_cast<int>(name.size()), name.data());
}

Status ScoringOptions::Validate() const {
  MNEMO_TRY(ValidateWeights(weights));
  if (!std::isfinite(recency_tau) || recency_tau <= 0) {
    return MakeError("context: recency_tau = %g must be finite and > 0", recency_tau);
  }
  if (!std::isfinite(relevance_temperature) || relevance_temperature < 0) {
    return MakeError("context: relevance_temperature = %g must be finite and >= 0", relevance_temperature);
  }
  if (!(novelty_share >= 0 && novelty_share <= 1)) {
    return MakeError("context: novelty_share = %g must be in [0, 1]", novelty_share);
  }
  return Status::Ok();
}

double RecencyScore(int distance, double tau) {
  MNEMO_CHECK(distance >= 1 && tau > 0);
  return std::exp(-(distance - 1) / tau);
}

std::vector<TokenCount> TokenHistogram(std::span<const int32_t> tokens) {
  std::vector<int32_t> sorted(tokens.begin(), tokens.end());
  std::sort(sorted.begin(), sorted.end());
  std::vector<TokenCount> h;
  for (size_t i = 0; i < sorted.size();) {
    size_t j = i;
    while (j < sorted.size() && sorted[j] == sorted[i]) ++j;
    h.push_back({sorted[i], static_cast<int32_t>(j - i)});
    i = j;
  }
  return h;
}

double Diversity(std::span<const TokenCount> histogram) {
  int64_t n = 0;
  for (const TokenCount& c : histogram) n += c.count;
  if (n < 2) return 0.0;
  double h = 0;
  for (const TokenCount& c : histogram) {
    const double p = static_cast<double>(c.count) / n;
    h -= p * std::log(p);
  }
  return std::clamp(h / std::log(static_cast<double>(n)), 0.0, 1.0);
}

size_t TurnCache::KeyHash::operator()(const Key& k) const {
  uint64_t h = k.hash ^ (static_cast<uint64_t>(static_cast<uint32_t>(k.begin)) << 32 |
                         static_cast<uint32_t>(k.end)) *
                            0x9e3779b97f4a7c15ull;
  return static_cast<size_t>(h ^ (h >> 29));
}

Result<const TurnFeatures*> TurnCache::Get(int begin, int end, std::span<const int32_t> tokens,
                                           Embedder& embedder) {
  MNEMO_CHECK(end - begin == static_cast<int>(tokens.size()));
  const Key key{begin, end, HashTokens(tokens)};
  auto [it, inserted] = entries_.try_emplace(key);
  Entry& e = it->second;
  TurnFeatures& f = e.features;
  if (inserted) {
    f.histogram = TokenHistogram(tokens);
    f.n_tokens = static_cast<int>(tokens.size());
    f.diversity = Diversity(f.histogram);
  }
  e.used = true;
  const uint64_t stamp = embedder.stamp();
  if (inserted || f.stamp != stamp || static_cast<int>(f.embedding.size()) != embedder.dim()) {
    std::vector<float> v = embedder.Embed(tokens);
    ++stats_.embeds;
    if (static_cast<int>(v.size()) != embedder.dim()) {
      entries_.erase(it);
      return MakeError("context: embedder returned %zu values, expected dim %d", v.size(),
                       embedder.dim());
    }
    f.embedding = std::move(v);
    f.stamp = stamp;
  } else {
    ++stats_.hits;
  }
  return &f;
}

void TurnCache::Sweep() {
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (!it->second.used) {
      it = entries_.erase(it);
      ++stats_.swept;
    } else {
      it->second.used = false;
      ++it;
    }
  }
}

Result<std::vector<TurnScore>> ScoreTurns(std::span<const int32_t> log,
                                          std::span<const TurnSpan> turns,
                                          std::span<const int32_t> query, Embedder& embedder,
                                          const ScoringOptions& options, TurnCache* cache) {
  MNEMO_TRY(options.Validate());
  MNEMO_TRY(ValidateTurns(turns, static_cast<int>(log.size())));
  if (embedder.dim() <= 0) return MakeError("context: embedder dim %d must be > 0", embedder.dim());
  if (options.relevance == RelevanceKind::kAttention && !query.empty() && options.attention_mass.size() != log.size()) {
    return MakeError("context: attention relevance needs %zu attention masses (one per history position), got %zu",
                     log.size(), options.attention_mass.size());
  }

  TurnCache local;
  TurnCache& c = cache ? *cache : local;
  const int n_turns = static_cast<int>(turns.size());
  std::vector<const TurnFeatures*> features(n_turns);
  for (int i = 0; i < n_turns; ++i) {
    auto f =
        c.Get(turns[i].begin, turns[i].end, log.subspan(turns[i].begin, turns[i].size()), embedder);
    if (!f.ok()) return f.error();
    features[i] = *f;
  }
  // Sweeping now would not invalidate `features`: every entry they point at was just used.
  c.Sweep();

  // Relevance of each turn to the query (formulas in scoring.h).
  std::vector<double> relevance(n_turns, 0.0);  // [T]
  if (!query.empty() && options.relevance == RelevanceKind::kKeyword) {
    std::vector<std::vector<int64_t>> sets(n_turns);  // [T] distinct words of each turn
    for (int i = 0; i < n_turns; ++i) sets[i] = WordSet(log.subspan(turns[i].begin, turns[i].size()), options);
    relevance = KeywordRelevance(sets, WordSet(query, options), options.relevance_temperature);
  } else if (!query.empty() && options.relevance == RelevanceKind::kAttention) {
    // The scale is the best turn but the newest: that one sits next to the message and draws
    // attention by locality whatever it says (the largest mass in every CI recall case, 1.3-3x
    // the fact's), which would squeeze every older turn's relevance. It is clamped to 1.
    double best = 0;
    for (int i = 0; i < n_turns; ++i) {
      double a = 0;
      for (int p = std::max(1, turns[i].begin); p < turns[i].end; ++p) a += options.attention_mass[p];
      relevance[i] = std::isfinite(a) ? std::max(0.0, a) : 0.0;
      if (i + 1 < n_turns || n_turns == 1) best = std::max(best, relevance[i]);
    }
    for (double& r : relevance) r = best > 0 ? std::min(1.0, r / best) : 0.0;
  } else if (!query.empty()) {
    std::vector<float> q = embedder.Embed(query);  // [dim]
    const int dim = embedder.dim();
    if (static_cast<int>(q.size()) != dim) {
      return MakeError("context: embedder returned %zu values for the query, expected dim %d",
                       q.size(), dim);
    }
    std::vector<std::vector<float>> e(n_turns);  // [T][dim] (empty for empty turns)
    for (int i = 0; i < n_turns; ++i) {
      if (features[i]->n_tokens > 0) e[i] = features[i]->embedding;
    }
    if (options.relevance != RelevanceKind::kEmbedding) {
      // Centre on the mean of the non-empty turns; whitened also divides by the per-dimension
      // standard deviation (a dimension with none carries no information and is zeroed).
      std::vector<double> mean(dim, 0.0), var(dim, 0.0);  // [dim]
      int n = 0;
      for (const auto& v : e) {
        if (v.empty()) continue;
        ++n;
        for (int d = 0; d < dim; ++d) mean[d] += v[d];
      }
      if (n > 0) {
        for (double& m : mean) m /= n;
        for (const auto& v : e) {
          if (v.empty()) continue;
          for (int d = 0; d < dim; ++d) var[d] += (v[d] - mean[d]) * (v[d] - mean[d]);
        }
        const bool whiten = options.relevance == RelevanceKind::kWhitened;
        auto transform = [&](std::vector<float>& v) {
          for (int d = 0; d < dim; ++d) {
            const double sd = std::sqrt(var[d] / n);
            double x = v[d] - mean[d];
            if (whiten) x = sd > 1e-12 ? x / sd : 0.0;
            v[d] = static_cast<float>(x);
          }
        };
        for (auto& v : e) {
          if (!v.empty()) transform(v);
        }
        transform(q);
      }
    }
    for (int i = 0; i < n_turns; ++i) {
      if (e[i].empty()) continue;
      const double cos = CosineSimilarity(e[i], q);
      relevance[i] = std::isfinite(cos) ? std::max(0.0, cos) : 0.0;
    }
  }

  // Document frequency of each token over the history's turns.
  std::unordered_map<int32_t, int> df;
  for (const TurnFeatures* f : features) {
    for (const TokenCount& t : f->histogram) ++df[t.token];
  }

  const ScoreWeights& w = options.weights;
  std::vector<TurnScore> scores(n_turns);
  for (int i = 0; i < n_turns; ++i) {
    const TurnFeatures& f = *features[i];
    TurnScore& s = scores[i];
    s.recency = RecencyScore(n_turns - i, options.recency_tau);
    s.relevance = f.n_tokens > 0 ? relevance[i] : 0.0;
    s.diversity = f.diversity;
    if (f.histogram.empty()) {
      s.novelty = 0;
    } else if (n_turns == 1) {
      s.novelty = 1;
    } else {
      double sum = 0;
      for (const TokenCount& t : f.histogram) sum += 1.0 - (df[t.token] - 1.0) / (n_turns - 1.0);
      s.novelty = std::clamp(sum / f.histogram.size(), 0.0, 1.0);
    }
    s.information = (1 - options.novelty_share) * s.diversity + options.novelty_share * s.novelty;
    s.total = w.recency * s.recency + w.relevance * s.relevance + w.information * s.information;
  }
  return scores;
}

}  // namespace mnemo::context
