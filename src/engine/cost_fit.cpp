#include "engine/cost_fit.h"

#include <algorithm>
#include <cmath>

#include "base/status.h"

namespace mnemo {
namespace {

// Features of a sample, in parameter order.
std::array<double, 4> Features(const StepSample& s) {
  return {1.0, static_cast<double>(s.tokens), s.pairs, static_cast<double>(s.sampled)};
}

std::array<double, 4> AsArray(const StepCostParams& p) { return {p.step, p.per_token, p.per_pair, p.per_row}; }

}  // namespace

StepCostFit::StepCostFit(StepCostParams prior, double prior_weight, double forget)
    : prior_(prior), prior_weight_(prior_weight), forget_(forget), params_(prior) {
  MNEMO_CHECK(prior.step >= 0 && prior.per_token > 0 && prior.per_pair >= 0 && prior.per_row >= 0);
  MNEMO_CHECK(prior_weight > 0 && forget > 0 && forget <= 1);
}

void StepCostFit::Add(const StepSample& s) {
  if (!(s.seconds > 0) || !std::isfinite(s.seconds) || s.tokens <= 0) return;
  const auto x = Features(s);
  for (int i = 0; i < kN; i++) {
    for (int j = 0; j < kN; j++) xx_[i][j] = forget_ * xx_[i][j] + x[i] * x[j];
    xy_[i] = forget_ * xy_[i] + x[i] * s.seconds;
  }
  yy_ = forget_ * yy_ + s.seconds * s.seconds;
  w_ = forget_ * w_ + 1;
  samples_++;
  Solve();
}

double StepCostFit::rel_rms() const {
  if (w_ <= 0 || xy_[0] <= 0) return 0;
  const auto t = AsArray(params_);
  double rss = yy_;
  for (int i = 0; i < kN; i++) {
    rss -= 2 * t[i] * xy_[i];
    for (int j = 0; j < kN; j++) rss += t[i] * xx_[i][j] * t[j];
  }
  const double mean_y = xy_[0] / w_;  // feature 0 is the constant 1
  return std::sqrt(std::max(rss, 0.0) / w_) / mean_y;
}

void StepCostFit::Solve() {
  // Minimises Σ w (y - θ·x)² + Σ_i m_i (θ_i - θ0_i)² with θ >= 0. The prior's weight m_i is k
  // samples of feature i at its mean square (scale-free), k = prior_weight² / (prior_weight + n)
  // after n samples: prior_weight at the start, fading like 1/n. A fixed k would keep biasing the
  // weakly identified directions (the features are strongly correlated: a long chunk has many
  // tokens and many pairs): with k = 4 against ~500 remembered steps, exact timings still came
  // out 50% off in b. A feature never seen non-zero keeps its prior value.
  const auto p0 = AsArray(prior_);
  const double k = prior_weight_ * prior_weight_ / (prior_weight_ + static_cast<double>(samples_));
  double m[kN];
  for (int i = 0; i < kN; i++) m[i] = xx_[i][i] > 0 ? k * xx_[i][i] / w_ : 1.0;
  bool free_param[kN] = {true, true, true, true};
  double theta[kN] = {};
  for (int round = 0; round < kN; round++) {
    // The normal equations over the free parameters (fixed ones are 0 and drop out), Jacobi-
    // scaled: the features span ~10 orders of magnitude (1 against Σ (p + 1) ~ 1e6).
    int idx[kN], n = 0;
    for (int i = 0; i < kN; i++) {
      if (free_param[i]) idx[n++] = i;
    }
    double a[kN][kN + 1], scale[kN];
    for (int r = 0; r < n; r++) scale[r] = 1.0 / std::sqrt(xx_[idx[r]][idx[r]] + m[idx[r]]);
    for (int r = 0; r < n; r++) {
      const int i = idx[r];
      for (int c = 0; c < n; c++) a[r][c] = (xx_[i][idx[c]] + (i == idx[c] ? m[i] : 0)) * scale[r] * scale[c];
      a[r][n] = (xy_[i] + m[i] * p0[i]) * scale[r];
    }
    // Gaussian elimination with partial pivoting (the scaled matrix is SPD; pivoting is cheap
    // insurance against round-off on nearly collinear features).
    for (int col = 0; col < n; col++) {
      int piv = col;
      for (int r = col + 1; r < n; r++) {
        if (std::fabs(a[r][col]) > std::fabs(a[piv][col])) piv = r;
      }
      std::swap(a[col], a[piv]);
      for (int r = col + 1; r < n; r++) {
        const double f = a[r][col] / a[col][col];
        for (int c = col; c <= n; c++) a[r][c] -= f * a[col][c];
      }
    }
    double z[kN];
    for (int r = n - 1; r >= 0; r--) {
      double v = a[r][n];
      for (int c = r + 1; c < n; c++) v -= a[r][c] * z[c];
      z[r] = v / a[r][r];
    }
    for (int i = 0; i < kN; i++) theta[i] = 0;
    for (int r = 0; r < n; r++) theta[idx[r]] = z[r] * scale[r];
    // Active set: pin the most negative parameter at 0 and solve again.
    int worst = -1;
    for (int i = 0; i < kN; i++) {
      if (free_param[i] && theta[i] < 0 && (worst < 0 || theta[i] < theta[worst])) worst = i;
    }
    if (worst < 0) break;
    free_param[worst] = false;
    theta[worst] = 0;
  }
  for (int i = 0; i < kN; i++) theta[i] = std::max(theta[i], 0.0);
  // A per-token cost of exactly 0 would make every chunk's price depend on attention alone (and
  // an empty chunk free): keep a floor of a millionth of the prior.
  params_ = StepCostParams{theta[0], std::max(theta[1], prior_.per_token * 1e-6), theta[2], theta[3]};
}

}  // namespace mnemo
