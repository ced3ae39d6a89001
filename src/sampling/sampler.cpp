#include "sampling/sampler.h"

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <limits>
#include <string>

namespace mnemo {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Heap selection for top-k up to this k: one pass that rarely touches the heap.
constexpr int32_t kHeapTopKMax = 512;
// Candidate sets up to this size are simply sorted for top-p; larger ones use logit buckets.
constexpr size_t kSortMax = 1024;
// Equal-width logit buckets for the top-k / top-p cut on large sets.
constexpr int kBuckets = 2048;
// A mask that allows at most n_vocab / kSparseShare tokens is sampled over those tokens alone
// (32,000 logits: 1.4 us for 40 tokens, 25 us for 8,000, 55 us for the whole pass; past about
// half the vocabulary the whole pass is cheaper).
constexpr int32_t kSparseShare = 4;
// The draw finds its block of this many weights from block sums, then scans only that block.
constexpr size_t kDrawBlock = 1024;
// Independent accumulators, so that reductions vectorize without reassociating a single sum.
constexpr int kLanes = 16;
// A cut that keeps every token: nothing ranks below it.
constexpr TokenLogit kKeepAll{kNegInf, std::numeric_limits<int32_t>::max()};

// Higher logit first, lower id on ties: a strict total order, so every cut is deterministic.
bool Better(const TokenLogit& a, const TokenLogit& b) {
  return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

// exp(x) for x <= 0 (x = -inf allowed), relative error < 3e-7, exactly 0 below -87. Our own rather
// than libm's: it vectorizes, and it gives the same bits on every machine and libm version, so a
// seed reproduces the same tokens everywhere. Range reduction x = n ln2 + r, |r| <= ln2/2, degree-6
// Taylor polynomial for e^r, 2^n built in the exponent bits (1.5 * 2^23 is the rounding trick).
inline float ExpNonPos(float x) {
  const float xc = x > -88.0f ? x : -88.0f;  // keeps -inf out and the exponent below in range
  const float t = xc * 1.44269504088896341f + 12582912.0f;
  const float n = t - 12582912.0f;
  const float r = (xc - n * 0.693145751953125f) - n * 1.428606765330187045e-06f;
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t e = std::bit_cast<int32_t>(t) - std::bit_cast<int32_t>(12582912.0f);
  const float v = p * std::bit_cast<float>((e + 127) << 23);
  return x < -87.0f ? 0.0f : v;
}

float MaxValue(const float* x, size_t n) {
  float lane[kLanes];
  std::fill(lane, lane + kLanes, kNegInf);
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) lane[j] = x[i + j] > lane[j] ? x[i + j] : lane[j];
  float m = kNegInf;
  for (int j = 0; j < kLanes; ++j) m = lane[j] > m ? lane[j] : m;
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

// Smallest logit that is not -inf (+inf if there is none).
float MinFinite(const float* x, size_t n) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  float lane[kLanes];
  std::fill(lane, lane + kLanes, kInf);
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j)
      lane[j] = x[i + j] < lane[j] && x[i + j] != kNegInf ? x[i + j] : lane[j];
  float m = kInf;
  for (int j = 0; j < kLanes; ++j) m = lane[j] < m ? lane[j] : m;
  for (; i < n; ++i) m = x[i] < m && x[i] != kNegInf ? x[i] : m;
  return m;
}

// Sum of x[0..n) in kLanes float lanes, added up in double.
double Sum(const float* x, size_t n) {
  float lane[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) lane[j] += x[i + j];
  double s = 0.0;
  for (int j = 0; j < kLanes; ++j) s += lane[j];
  for (; i < n; ++i) s += x[i];
  return s;
}

// The candidate set: all of work_ (cand == nullptr, ids are indices) or an explicit list.
struct View {
  const float* logits;      // [n] when cand is null
  const TokenLogit* cand;   // [n] or null
  size_t n;                 // number of tokens
  float logit(size_t i) const { return cand ? cand[i].logit : logits[i]; }
  int32_t id(size_t i) const { return cand ? cand[i].id : static_cast<int32_t>(i); }
};

// out[i] = exp((logit_i - max_logit) / t). Separate loops so that each vectorizes.
void ComputeWeights(const View& v, float max_logit, float t, float* out) {
  if (v.cand) {
    for (size_t i = 0; i < v.n; ++i) out[i] = ExpNonPos((v.cand[i].logit - max_logit) / t);
  } else {
    for (size_t i = 0; i < v.n; ++i) out[i] = ExpNonPos((v.logits[i] - max_logit) / t);
  }
}

// Finds where a best-first prefix ends without sorting the set. Tokens are binned by logit into
// kBuckets equal-width buckets over [lo, max_logit] (below lo: the bottom bucket); the budget is
// spent from the top bucket down, and only the bucket where it runs out is collected and sorted.
// Each token weighs weight[i] (mass mode, top-p: target = budget * total weight) or 1 (weight
// null, top-k: target = budget). Returns the last token of the shortest prefix reaching the
// target, or kKeepAll when rounding leaves the whole set short of it.
TokenLogit BucketCut(const View& v, const float* weight, double budget, float lo, float max_logit,
                     std::vector<double>& measure, std::vector<TokenLogit>& in_bucket) {
  measure.assign(kBuckets, 0.0);
  const float scale = max_logit > lo ? static_cast<float>(kBuckets - 1) / (max_logit - lo) : 0.0f;
  // Monotone in l, so buckets hold contiguous ranks and ties share a bucket.
  auto bucket = [&](float l) {
    float f = (l - lo) * scale;
    f = f > 0.0f ? f : 0.0f;  // also catches -inf and NaN (-inf * 0)
    f = f < kBuckets - 1 ? f : kBuckets - 1;
    return static_cast<int>(f);
  };
  for (size_t i = 0; i < v.n; ++i) measure[bucket(v.logit(i))] += weight ? weight[i] : 1.0;
  double total = 0.0;
  for (double m : measure) total += m;
  const double target = weight ? budget * total : budget;
  double above = 0.0;
  int cut = -1;
  for (int b = kBuckets - 1; b >= 0; --b) {
    if (above + measure[b] >= target) {
      cut = b;
      break;
    }
    above += measure[b];
  }
  if (cut < 0) return kKeepAll;
  in_bucket.clear();
  for (size_t i = 0; i < v.n; ++i) {
    const float l = v.logit(i);
    if (bucket(l) == cut) in_bucket.push_back({l, v.id(i)});
  }
  std::sort(in_bucket.begin(), in_bucket.end(), Better);
  double cum = above;
  for (const TokenLogit& t : in_bucket) {
    cum += weight ? ExpNonPos(t.logit - max_logit) : 1.0;
    if (cum >= target) return t;
  }
  return in_bucket.back();
}

}  // namespace

Status SamplingParams::Validate() const {
  if (!std::isfinite(temperature) || temperature < 0.0f)
    return MakeError("temperature must be a finite number >= 0 (0 = greedy), got %g", temperature);
  if (top_k < 0) return MakeError("top_k must be >= 0 (0 = off), got %d", top_k);
  if (!(top_p > 0.0f && top_p <= 1.0f))  // also rejects NaN
    return MakeError("top_p must be in (0, 1] (1 = off), got %g", top_p);
  if (!(min_p >= 0.0f && min_p <= 1.0f))
    return MakeError("min_p must be in [0, 1] (0 = off), got %g", min_p);
  if (!std::isfinite(repetition_penalty) || repetition_penalty <= 0.0f)
    return MakeError("repetition_penalty must be a finite number > 0 (1 = off), got %g",
                     repetition_penalty);
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f))
    return MakeError("frequency_penalty must be in [-2, 2], got %g", frequency_penalty);
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f))
    return MakeError("presence_penalty must be in [-2, 2], got %g", presence_penalty);
  if (penalty_last_n < -1)
    return MakeError("penalty_last_n must be >= -1 (-1 = whole history, 0 = off), got %d",
                     penalty_last_n);
  for (const auto& [id, bias] : logit_bias) {
    if (id < 0) return MakeError("logit_bias token ids must be >= 0, got %d", id);
    if (!(bias >= -100.0f && bias <= 100.0f))
      return MakeError("logit_bias values must be in [-100, 100], got %g for token %d", bias, id);
  }
  return Status::Ok();
}

Sampler::Sampler(const SamplingParams& params, int n_vocab)
    : params_(params), n_vocab_(n_vocab), rng_(params.seed) {
  Status st = params.Validate();
  MNEMO_CHECK_MSG(st.ok(), st.error().message);
  MNEMO_CHECK(n_vocab > 0);
  work_.resize(n_vocab);
  counts_.assign(n_vocab, 0);
  cand_.reserve(n_vocab);
  bucket_cand_.reserve(n_vocab);
  bucket_measure_.reserve(kBuckets);
  weights_.reserve(n_vocab);
  block_sums_.reserve((n_vocab + kDrawBlock - 1) / kDrawBlock);
}

Result<Sampler> Sampler::Create(const SamplingParams& params, int n_vocab) {
  MNEMO_TRY(params.Validate());
  if (n_vocab <= 0) return MakeError("n_vocab must be > 0, got %d", n_vocab);
  for (const auto& lb : params.logit_bias) {
    if (lb.first >= n_vocab) return MakeError("logit_bias token id %d is outside the vocabulary (%d)", lb.first, n_vocab);
  }
  return Sampler(params, n_vocab);
}

void Sampler::PrepareLogits(std::span<const float> logits, std::span<const int32_t> history,
                            std::span<const uint64_t> allowed) {
  ApplyPenalties(logits, history);
  if (allowed.empty()) return;
  MNEMO_CHECK(allowed.size() * 64 >= static_cast<size_t>(n_vocab_));
  float* w = work_.data();
  // Word by word: a grammar's mask is mostly all-refused or all-allowed words.
  for (int base = 0; base < n_vocab_; base += 64) {
    const uint64_t bits = allowed[base >> 6];
    const int end = std::min(base + 64, n_vocab_);
    if (bits == ~uint64_t{0}) continue;
    if (bits == 0) {
      std::fill(w + base, w + end, kNegInf);
      continue;
    }
    for (int i = base; i < end; ++i)
      if (!((bits >> (i - base)) & 1)) w[i] = kNegInf;
  }
}

void Sampler::ApplyPenalties(std::span<const float> logits, std::span<const int32_t> history) {
  float* w = work_.data();
  for (int i = 0; i < n_vocab_; ++i) {
    float x = logits[i];
    // NaN would break the strict weak order of the selection; +inf would make exp(l - max) NaN.
    w[i] = std::isnan(x) ? kNegInf : std::min(x, FLT_MAX);
  }
  ApplyBiasAndPenalties(history);
}

void Sampler::ApplyBiasAndPenalties(std::span<const int32_t> history) {
  float* w = work_.data();
  const SamplingParams& p = params_;
  for (const auto& [id, bias] : p.logit_bias) {
    if (id < n_vocab_ && w[id] != kNegInf) w[id] += bias;  // ids are checked by Create; skip rather than trust
  }
  const bool rep = p.repetition_penalty != 1.0f;
  const bool freq = p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f;
  if ((!rep && !freq) || p.penalty_last_n == 0 || history.empty()) return;

  size_t n = history.size();
  if (p.penalty_last_n > 0) n = std::min(n, static_cast<size_t>(p.penalty_last_n));
  std::span<const int32_t> window = history.subspan(history.size() - n);
  for (int32_t t : window)
    if (t >= 0 && t < n_vocab_) ++counts_[t];
  // Second pass: each distinct token is penalized once (at its first occurrence in the window),
  // and its count is reset so counts_ is all zero again for the next call.
  for (int32_t t : window) {
    if (t < 0 || t >= n_vocab_ || counts_[t] == 0) continue;
    const int32_t count = counts_[t];
    counts_[t] = 0;
    float& l = w[t];
    if (rep) l = l > 0.0f ? l / p.repetition_penalty : l * p.repetition_penalty;
    if (freq) l -= static_cast<float>(count) * p.frequency_penalty + p.presence_penalty;
  }
}

void Sampler::HeapTopK(int32_t k) {
  // Max-heap under Better, i.e. the worst kept token on top.
  const float* w = work_.data();
  cand_.clear();
  for (int32_t i = 0; i < k; ++i) cand_.push_back({w[i], i});
  std::make_heap(cand_.begin(), cand_.end(), Better);
  for (int32_t i = k; i < n_vocab_; ++i) {
    const TokenLogit c{w[i], i};
    if (!Better(c, cand_.front())) continue;
    std::pop_heap(cand_.begin(), cand_.end(), Better);
    cand_.back() = c;
    std::push_heap(cand_.begin(), cand_.end(), Better);
  }
}

int32_t Sampler::Draw(bool all, float max_logit) {
  const View v{work_.data(), all ? nullptr : cand_.data(), all ? work_.size() : cand_.size()};
  weights_.resize(v.n);
  // Dividing by T (not multiplying by 1/T): a tiny T would make 1/T inf and 0 * inf NaN.
  ComputeWeights(v, max_logit, params_.temperature, weights_.data());
  const size_t n_blocks = (v.n + kDrawBlock - 1) / kDrawBlock;
  block_sums_.resize(n_blocks);
  double total = 0.0;
  for (size_t b = 0; b < n_blocks; ++b) {
    const size_t begin = b * kDrawBlock;
    block_sums_[b] = Sum(weights_.data() + begin, std::min(kDrawBlock, v.n - begin));
    total += block_sums_[b];
  }
  double u = rng_.UniformDouble() * total;
  size_t b = 0;
  while (b + 1 < n_blocks && u >= block_sums_[b]) u -= block_sums_[b++];
  const size_t begin = b * kDrawBlock, end = std::min(v.n, begin + kDrawBlock);
  double cum = 0.0;
  size_t last = begin;  // last token with weight in the block: where rounding gaps go
  for (size_t i = begin; i < end; ++i) {
    if (weights_[i] <= 0.0f) continue;
    cum += weights_[i];
    last = i;
    if (u < cum) return v.id(i);
  }
  return v.id(last);
}

std::span<const float> Sampler::PenalizedLogits(std::span<const float> logits,
                                                std::span<const int32_t> history,
                                                std::span<const uint64_t> allowed) {
  MNEMO_CHECK_MSG(static_cast<int>(logits.size()) == n_vocab_,
                  "logits size " + std::to_string(logits.size()) + " != n_vocab " +
                      std::to_string(n_vocab_));
  PrepareLogits(logits, history, allowed);
  return work_;
}

int32_t Sampler::AllowedCandidates(std::span<const float> logits, std::span<const int32_t> history,
                                   std::span<const uint64_t> allowed) {
  MNEMO_CHECK(allowed.size() * 64 >= static_cast<size_t>(n_vocab_));
  const size_t words = (static_cast<size_t>(n_vocab_) + 63) / 64;
  int32_t n = 0;
  for (size_t i = 0; i < words; ++i) n += std::popcount(allowed[i]);
  if (n == 0 || n > n_vocab_ / kSparseShare) return -1;
  // The same values the whole pass would give these tokens: sanitized, then bias and penalties
  // (which may also write to refused tokens' stale entries of work_; nothing reads those).
  float* w = work_.data();
  cand_.clear();
  for (size_t i = 0; i < words; ++i) {
    for (uint64_t bits = allowed[i]; bits; bits &= bits - 1) {
      const int32_t id = static_cast<int32_t>(i * 64) + std::countr_zero(bits);
      if (id >= n_vocab_) break;
      const float x = logits[id];
      w[id] = std::isnan(x) ? kNegInf : std::min(x, FLT_MAX);
      cand_.push_back({0.0f, id});
    }
  }
  ApplyBiasAndPenalties(history);
  for (TokenLogit& c : cand_) c.logit = w[c.id];
  return static_cast<int32_t>(cand_.size());
}

int32_t Sampler::Sample(std::span<const float> logits, std::span<const int32_t> history,
                        std::span<const uint64_t> allowed) {
  MNEMO_CHECK_MSG(static_cast<int>(logits.size()) == n_vocab_,
                  "logits size " + std::to_string(logits.size()) + " != n_vocab " +
                      std::to_string(n_vocab_));
  const SamplingParams& p = params_;
  // The candidate set: all of work_ (all), or cand_ once a filter (or a sparse mask) narrows it.
  bool all = true;
  float max_logit;
  int32_t best;
  if (!allowed.empty() && AllowedCandidates(logits, history, allowed) > 0) {
    // A grammar's mask that keeps few tokens (a number's digits, a key's next bytes): the passes
    // below run over those alone, in id order. Sampling over 32,000 logits is ~50 us of a 0.6 ms
    // decode step on a 25M model (AMD EPYC, one thread).
    all = false;
    max_logit = kNegInf;
    best = cand_[0].id;  // every allowed logit -inf: the lowest allowed id
    for (const TokenLogit& c : cand_) {
      if (c.logit > max_logit) {
        max_logit = c.logit;
        best = c.id;
      }
    }
    if (p.temperature == 0.0f || p.top_k == 1 || max_logit == kNegInf) return best;
    if (p.top_k > 0 && static_cast<size_t>(p.top_k) < cand_.size()) {
      std::nth_element(cand_.begin(), cand_.begin() + (p.top_k - 1), cand_.end(), Better);
      cand_.resize(p.top_k);
    }
  } else {
    PrepareLogits(logits, history, allowed);
    const float* w = work_.data();
    // Argmax, lowest id on ties: the greedy answer, and the only sensible one when every logit
    // is -inf. top_k = 1 keeps exactly this token whatever the temperature.
    max_logit = MaxValue(w, n_vocab_);
    best = static_cast<int32_t>(std::find(w, w + n_vocab_, max_logit) - w);
    if (max_logit == kNegInf && !allowed.empty()) {
      for (int32_t i = 0; i < n_vocab_; ++i)
        if ((allowed[i >> 6] >> (i & 63)) & 1) return i;
    }
    if (p.temperature == 0.0f || p.top_k == 1 || max_logit == kNegInf) return best;
  }
  const float* w = work_.data();
  if (all && p.top_k > 0 && p.top_k < n_vocab_) {
    if (p.top_k <= kHeapTopKMax) {
      HeapTopK(p.top_k);
    } else {
      // Bucket range: down to the lowest finite logit, but not so far that a mask value like
      // -1e30 squeezes every real logit into one bucket (lower tokens share the bottom bucket).
      const float lo = std::max(MinFinite(w, n_vocab_), max_logit - 1000.0f);
      const TokenLogit cut = BucketCut(View{w, nullptr, work_.size()}, nullptr, p.top_k, lo,
                                       max_logit, bucket_measure_, bucket_cand_);
      cand_.clear();
      for (int32_t i = 0; i < n_vocab_; ++i)
        if (!Better(cut, {w[i], i})) cand_.push_back({w[i], i});
    }
    all = false;
  }

  // top-p (on the T = 1 distribution of the top-k survivors) and min-p each keep a best-first
  // prefix, so together they keep the shorter one: find the top-p cut, then drop every token
  // ranked below it or under the min-p threshold in one pass.
  TokenLogit cut = kKeepAll;
  if (p.top_p < 1.0f) {
    if (!all && cand_.size() <= kSortMax) {
      std::sort(cand_.begin(), cand_.end(), Better);
      double z = 0.0;
      for (const TokenLogit& c : cand_) z += ExpNonPos(c.logit - max_logit);
      const double target = static_cast<double>(p.top_p) * z;
      double cum = 0.0;
      for (const TokenLogit& c : cand_) {
        cum += ExpNonPos(c.logit - max_logit);
        if (cum >= target) {
          cut = c;
          break;
        }
      }
    } else {
      const View v{w, all ? nullptr : cand_.data(), all ? work_.size() : cand_.size()};
      weights_.resize(v.n);
      ComputeWeights(v, max_logit, 1.0f, weights_.data());
      // Below max - 88 every weight is exactly 0, so those logits need no buckets of their own.
      cut = BucketCut(v, weights_.data(), p.top_p, max_logit - 88.0f, max_logit, bucket_measure_,
                      bucket_cand_);
    }
  }
  if (cut.id != kKeepAll.id || p.min_p > 0.0f) {
    // p_i >= min_p * p_max  <=>  l_i >= l_max + ln(min_p); the best token always passes
    // (min_p = 0 gives -inf: no threshold).
    const float min_logit = max_logit + std::log(p.min_p);
    auto keep = [&](const TokenLogit& c) { return !Better(cut, c) && c.logit >= min_logit; };
    if (all) {
      cand_.clear();
      for (int32_t i = 0; i < n_vocab_; ++i)
        if (keep({w[i], i})) cand_.push_back({w[i], i});
      all = false;
    } else {
      std::erase_if(cand_, [&](const TokenLogit& c) { return !keep(c); });
    }
  }
  // The candidate order (id order, heap order or sorted) is deterministic, so a seed maps to the
  // same token every run.
  return Draw(all, max_logit);
}

void ScanLogprobs(std::span<const float> logits, int top_n, LogprobScan* out) {
  const size_t n = logits.size();
  const float* x = logits.data();
  top_n = std::clamp(top_n, 0, kMaxTopLogprobs);
  out->top.clear();
  // As the sampler sanitizes: NaN is -inf, +inf the largest float. NaN never wins a comparison,
  // so the max and the top need no pass of their own for it; in the sum a NaN weighs exp(-88)
  // (ExpNonPos's floor), nothing next to the best token's 1. A row with +inf takes the slow path.
  float m = MaxValue(x, n);
  const bool has_inf = m == std::numeric_limits<float>::infinity();
  auto clean = [](float v) { return std::isnan(v) ? kNegInf : std::min(v, FLT_MAX); };
  if (has_inf) m = FLT_MAX;
  if (m == kNegInf) {  // no token is possible: every logprob is -inf
    out->log_z = std::numeric_limits<double>::infinity();
    return;
  }
  float lane[kLanes] = {};
  size_t i = 0;
  if (has_inf) {
    for (; i < n; ++i) lane[0] += ExpNonPos(clean(x[i]) - m);
  } else {
    for (; i + kLanes <= n; i += kLanes)
      for (int j = 0; j < kLanes; ++j) lane[j] += ExpNonPos(x[i + j] - m);
    for (; i < n; ++i) lane[0] += ExpNonPos(x[i] - m);
  }
  double z = 0.0;
  for (int j = 0; j < kLanes; ++j) z += lane[j];
  out->log_z = static_cast<double>(m) + std::log(z);
  if (top_n == 0) return;
  // The best top_n in Better order, by insertion (logits in `logprob` until the end): almost every
  // token fails the one comparison with the worst kept.
  std::vector<TokenLogprob>& top = out->top;
  auto better = [](const TokenLogprob& a, const TokenLogprob& b) {
    return Better({a.logprob, a.id}, {b.logprob, b.id});
  };
  float worst = kNegInf;  // the worst kept once top_n are kept (ties are decided by Better)
  for (size_t k = 0; k < n; ++k) {
    if (!(x[k] >= worst)) continue;  // below, or NaN
    const TokenLogprob c{static_cast<int32_t>(k), clean(x[k])};
    if (static_cast<int>(top.size()) == top_n) {
      if (!better(c, top.back())) continue;
      top.pop_back();
    }
    top.insert(std::upper_bound(top.begin(), top.end(), c, better), c);
    if (static_cast<int>(top.size()) == top_n) worst = top.back().logprob;
  }
  for (TokenLogprob& t : top) t.logprob = static_cast<float>(static_cast<double>(t.logprob) - out->log_z);
}

PositionLogprobs LogprobScan::For(int32_t id, float raw_logit) const {
  const float v = std::isnan(raw_logit) ? kNegInf : std::min(raw_logit, FLT_MAX);
  return PositionLogprobs{{id, static_cast<float>(static_cast<double>(v) - log_z)}, top};
}

void LogSoftmax(std::span<const float> logits, std::span<float> out) {
  MNEMO_CHECK(out.size() == logits.size());
  if (logits.empty()) return;
  const float m = *std::max_element(logits.begin(), logits.end());
  if (m == kNegInf) {
    std::fill(out.begin(), out.end(), kNegInf);
    return;
  }
  double sum = 0.0;
  for (float x : logits) sum += std::exp(static_cast<double>(x) - m);
  const double lse = m + std::log(sum);
  for (size_t i = 0; i < logits.size(); ++i)
    out[i] = static_cast<float>(static_cast<double>(logits[i]) - lse);
}

std::vector<float> LogSoftmax(std::span<const float> logits) {
  std::vector<float> out(logits.size());
  LogSoftmax(logits, out);
  return out;
}

void Softmax(std::span<const float> logits, std::span<float> out) {
  MNEMO_CHECK(out.size() == logits.size());
  if (logits.empty()) return;
  const float m = *std::max_element(logits.begin(), logits.end());
  if (m == kNegInf) {
    std::fill(out.begin(), out.end(), 0.0f);
    return;
  }
  double sum = 0.0;
  for (float x : logits) sum += std::exp(static_cast<double>(x) - m);
  const double inv = 1.0 / sum;
  for (size_t i = 0; i < logits.size(); ++i)
    out[i] = static_cast<float>(std::exp(static_cast<double>(logits[i]) - m) * inv);
}

}  // namespace mnemo
