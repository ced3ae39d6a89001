// Calibration of the recompute cost model from the engine's own step timings, as Pensieve
// profiles its cost model instead of trusting FLOP counts (on a CPU, attention runs far below the
// GEMMs' FLOP rate, so FLOPs misprice late positions).
//
// A forward step over query tokens at positions p_j (j < N, every sequence of the batch), S of
// which have their logits computed, is modelled as taking
//     T = c + a·N + b·Σ_j (p_j + 1) + d·S   seconds:
// a per token (projections, FFN), b per (query, key) pair of causal attention, d per classifier
// row, c per step (thread wake-ups, batch bookkeeping). Recomputing positions [s, s + l) then
// costs a·l + b·(l·s + l(l+1)/2): CostModel{a, b}, the model Pensieve prices chunks with.
//
// The fit is a ridge least squares with exponential forgetting (recent steps count most, so a
// machine that gets busier is followed), pulled toward a prior (e.g. from FLOP counts) with the
// weight of a few steps at first, fading as steps accumulate, so that the first steps cannot
// produce a wild model; parameters are kept
// non-negative. Cost: O(1) per sample (4x4 normal equations), O(1) per estimate.
// Not thread-safe (the engine thread owns it).
#pragma once

#include <array>

#include "kv/eviction.h"

namespace mnemo {

// One timed forward step.
struct StepSample {
  int tokens = 0;       // N: query tokens in the batch (prefill, recompute and decode)
  double pairs = 0;     // Σ (p_j + 1) over those tokens: attention (query, key) pairs
  int sampled = 0;      // S: rows whose logits were computed
  double seconds = 0;   // T: time of the forward pass (waits for swap-ins excluded)
};

struct StepCostParams {
  double step = 0;       // c: seconds per step
  double per_token = 0;  // a: seconds per query token
  double per_pair = 0;   // b: seconds per (query, key) pair
  double per_row = 0;    // d: seconds per classifier row
  // Modelled time of a step.
  double Predict(const StepSample& s) const { return step + per_token * s.tokens + per_pair * s.pairs + per_row * s.sampled; }
  CostModel cost() const { return CostModel{per_token, per_pair}; }
};

class StepCostFit {
 public:
  // prior: the parameters assumed before any step is timed (all >= 0, per_token > 0).
  // prior_weight: how many steps' worth of evidence the prior counts as at first (then fading
  // like prior_weight² / steps seen). forget: each new sample
  // multiplies the weight of the older ones by this (0.998: a memory of about 500 steps).
  explicit StepCostFit(StepCostParams prior, double prior_weight = 4, double forget = 0.998);

  void Add(const StepSample& s);
  // The current estimate: the prior until a step is added.
  const StepCostParams& params() const { return params_; }
  // Steps seen (not discounted).
  long samples() const { return samples_; }
  // Relative RMS of the fitted model over the samples (forgetting-weighted); 0 before any.
  double rel_rms() const;

 private:
  void Solve();

  static constexpr int kN = 4;  // parameters: step, per_token, per_pair, per_row
  StepCostParams prior_;
  double prior_weight_, forget_;
  std::array<std::array<double, kN>, kN> xx_{};  // Σ w x xᵀ
  std::array<double, kN> xy_{};                  // Σ w x y
  double yy_ = 0, w_ = 0;                        // Σ w y², Σ w
  long samples_ = 0;
  StepCostParams params_;
};

}  // namespace mnemo
