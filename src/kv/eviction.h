// Eviction policies: which cached chunk to demote first. A policy maps a candidate to a key; the
// candidate with the smallest key goes first.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "base/status.h"

namespace mnemo {

// Recompute cost of a chunk: linear in its length (the projections) plus attention over every
// earlier position (causal: grows with the start s). Units are the caller's: FLOPs from the
// model's shapes, or seconds once the engine has calibrated it from its step timings
// (engine/cost_fit.h). Only the ratio per_token_ctx / per_token orders chunks.
struct CostModel {
  double per_token = 1.0;      // cost of pushing one token through the linear layers
  double per_token_ctx = 0.0;  // cost per (query token, key position) pair in attention

  // Cost of recomputing positions [s, s + l).
  double Cost(int s, int l) const {
    return per_token * l + per_token_ctx * (double(l) * s + 0.5 * double(l) * (l + 1));
  }
};

// What a policy sees of one evictable chunk.
struct EvictionCandidate {
  int chunk_index;     // position / kBlockTokens of the chunk's first token
  int begin;           // first position
  int length;          // valid positions in the chunk
  double idle_s;       // seconds since the owning session was last active (>= 0)
  double last_active;  // time the owning session was last active (seconds, engine clock)
};

// A policy orders chunks in two parts, so that the cache can index candidates instead of scanning
// them: Weight orders chunks idle since the same time (it must not depend on time, so that order
// never changes while they stay idle), and Value orders any two chunks now. Value must be
// nondecreasing in weight and nonincreasing in idle time: then the lightest chunk of the group
// idle longest bounds every unseen group from below (see CacheManager::PickVictim).
class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;
  virtual const char* name() const = 0;
  virtual double Weight(int chunk_index, int begin) const = 0;
  virtual double Value(double weight, double idle_s, double last_active) const = 0;
  // Smaller keys are evicted first. Ties in the first element break on the second (the weight).
  std::pair<double, double> Key(const EvictionCandidate& c) const {
    const double w = Weight(c.chunk_index, c.begin);
    return {Value(w, c.idle_s, c.last_active), w};
  }
  // A new recompute cost model (the engine's calibration). Changes the weight of every chunk of a
  // cost-aware policy at once: the cache manager re-files them all (CacheManager::SetCostModel).
  // The engine calls it rarely (when the calibrated b/a moves by 25%). Default: costs are ignored.
  virtual void SetCostModel(const CostModel&) {}
  // Which Value this is, so that a hot loop can call it inline (VictimIndex::Pick) instead of
  // through the vtable; kOther: only through Value.
  enum class Kind { kPensieve, kLru, kOther };
  virtual Kind kind() const { return Kind::kOther; }
};

// Pensieve: retention value V = Cost(s, l) / T_idle, lowest first, so leading chunks (cheap to
// recompute) of idle sessions go before the tails of active ones. A partial chunk is priced as a
// full one (l = kBlockTokens), so a session's partial tail goes after its leading chunks.
class PensievePolicy : public EvictionPolicy {
 public:
  explicit PensievePolicy(CostModel cost) : cost_(cost) {}
  const char* name() const override { return "pensieve"; }
  double Weight(int chunk_index, int begin) const override;
  double Value(double weight, double idle_s, double) const override { return ValueOf(weight, idle_s); }
  void SetCostModel(const CostModel& cost) override { cost_ = cost; }
  Kind kind() const override { return Kind::kPensieve; }
  static double ValueOf(double weight, double idle_s) {
    // A session touched this instant still gets a finite value. The floor is far below the gaps
    // between engine events (a 1 ms floor made every session released within the last millisecond
    // tie, and the tie went to whichever record came first, e.g. a chunk just shared by a fork).
    return weight / (idle_s < 1e-6 ? 1e-6 : idle_s);  // std::max(idle_s, 1e-6)
  }
  const CostModel& cost_model() const { return cost_; }

 private:
  CostModel cost_;
};

// Baseline: least recently used session first; within it, the last chunk first (as a prefix
// cache frees a sequence's blocks from the tail).
class LruPolicy : public EvictionPolicy {
 public:
  const char* name() const override { return "lru"; }
  double Weight(int chunk_index, int) const override { return -double(chunk_index); }
  double Value(double, double, double last_active) const override { return ValueOf(last_active); }
  Kind kind() const override { return Kind::kLru; }
  static double ValueOf(double last_active) { return last_active; }
};

// "pensieve" or "lru".
Result<std::unique_ptr<EvictionPolicy>> MakeEvictionPolicy(const std::string& name, CostModel cost);

}  // namespace mnemo
