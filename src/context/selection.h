// Budgeted turn selection for selective context (ConvKV), and the baselines it is evaluated
// against.
//
// Every method first keeps the mandatory set: turn 0 (the system prompt), the last `keep_last`
// turns and the pinned turns. The rest of the budget then goes to the other turns (candidates) in
// an order set by the method:
//
//   kScore       candidates by descending TurnScore::total (the ConvKV selection)
//   kRelevance   by descending TurnScore::relevance (baseline)
//   kRecency     newest first (baseline; equals ranking by recency, whatever tau)
//   kRecentOnly  newest first, stopping at the first candidate that does not fit: a plain
//                truncation that keeps a contiguous suffix of the history (baseline)
//   kRandom      a seeded random order (baseline; the same seed gives the same selection)
//
// Filling is first-fit: a candidate that does not fit in what is left of the budget is skipped and
// the next one is tried (so a high-scoring long turn does not stop shorter ones from being kept);
// only kRecentOnly stops instead. Ties in the ranking key go to the newer turn (higher index).
// Afterwards, every dropped candidate is larger than the budget left over (for kRecentOnly: once
// one candidate did not fit, every older candidate is dropped).
//
// The budget counts the kept turns' tokens (the history the model will see), not the new user
// message nor the tokens to generate: the caller subtracts those first if its limit covers them.
//
// Degenerate budget (decision): when the mandatory set alone exceeds the budget, the selection
// keeps exactly the mandatory set and drops everything else, and reports the excess in
// overflow_tokens (> 0) so the caller can log it or refuse. Rationale: the budget is a soft,
// lossy-mode target, and failing a conversation mid-way because its newest turns grew long would
// be worse than exceeding it by the turns the model cannot do without. With
// SelectionOptions::strict the same case is an Error instead (for an API that prefers a 400).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "context/scoring.h"
#include "context/turns.h"

namespace mnemo::context {

enum class SelectionMethod { kScore, kRelevance, kRecency, kRecentOnly, kRandom };

// Names: "score", "relevance", "recency", "recent-only", "random".
std::string_view SelectionMethodName(SelectionMethod m);
Result<SelectionMethod> ParseSelectionMethod(std::string_view name);

struct SelectionOptions {
  SelectionMethod method = SelectionMethod::kScore;  // ranking of the candidates
  // Newest turns always kept; >= 0. Default 1 (the exchange just before the new message): on the
  // recall model at a 50% budget, keeping 2 left too little budget for the turn the question
  // needs (3-factor accuracy 0.640 against 0.777 with 1; docs/benchmarks-convkv.md). ConvKV's
  // own preset, 2, stays available (`context_keep_last`).
  int keep_last = 1;
  uint64_t seed = 0;                                 // kRandom only
  bool strict = false;                               // mandatory set over budget -> Error
};

struct Selection {
  std::vector<int> kept;     // turn indices, ascending (turn 0 always among them)
  std::vector<int> dropped;  // turn indices, ascending; kept + dropped = all turns
  int kept_tokens = 0;       // tokens of the kept turns
  int dropped_tokens = 0;    // tokens of the dropped turns
  int budget_tokens = 0;     // the budget the selection was made for
  int mandatory_tokens = 0;  // tokens of system + last keep_last + pinned turns
  int overflow_tokens = 0;   // kept_tokens - budget_tokens when the mandatory set alone exceeds
                             // the budget (degenerate case); 0 otherwise
};

// Resolves a user budget against a history of `history_tokens` tokens: a value >= 1 is an absolute
// token count (fractional part dropped), a value in (0, 1) a fraction of the history, rounded down.
// Errors: NaN, infinity, a value <= 0, a count beyond INT_MAX. Note 1 means one token, not 100%.
Result<int> ResolveBudget(double budget, int history_tokens);

// Selects the turns to keep within `budget_tokens` (>= 0).
//   turns:  a history (ValidateTurns over [0, TotalTokens)); pins are read from TurnSpan::pinned.
//   scores: one per turn for kScore and kRelevance (finite values); ignored (may be empty) by the
//           other methods.
// Errors: invalid turns, budget or keep_last; missing or non-finite scores; with strict, a
// mandatory set over the budget.
Result<Selection> SelectTurns(std::span<const TurnSpan> turns, std::span<const TurnScore> scores,
                              int budget_tokens, const SelectionOptions& options = {});

}  // namespace mnemo::context
