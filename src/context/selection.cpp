#include "context/selection.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <string>

#include "base/rng.h"

namespace mnemo::context {
namespace {

constexpr std::pair<SelectionMethod, std::string_view> kMethodNames[] = {
    {SelectionMethod::kScore, "score"},     {SelectionMethod::kRelevance, "relevance"},
    {SelectionMethod::kRecency, "recency"}, {SelectionMethod::kRecentOnly, "recent-only"},
    {SelectionMethod::kRandom, "random"},
};

// Candidates (ascending indices) reordered into the order the method offers them to the budget.
void OrderCandidates(std::vector<int>& cand, std::span<const TurnScore> scores,
                     const SelectionOptions& options) {
  switch (options.method) {
    case SelectionMethod::kScore:
    case SelectionMethod::kRelevance: {
      const bool by_total = options.method == SelectionMethod::kScore;
      auto key = [&](int i) { return by_total ? scores[i].total : scores[i].relevance; };
      std::sort(cand.begin(), cand.end(), [&](int a, int b) {
        const double ka = key(a), kb = key(b);
        if (ka != kb) return ka > kb;
        return a > b;  // ties: newer turn first
      });
      break;
    }
    case SelectionMethod::kRecency:
    case SelectionMethod::kRecentOnly:
      std::reverse(cand.begin(), cand.end());
      break;
    case SelectionMethod::kRandom: {
      Rng rng(options.seed);
      for (size_t i = cand.size(); i > 1; --i) {  // Fisher-Yates, from the back
        const size_t j = static_cast<size_t>(rng.Next() % i);
        std::swap(cand[i - 1], cand[j]);
      }
      break;
    }
  }
}

}  // namespace

std::string_view SelectionMethodName(SelectionMethod m) {
  for (const auto& [method, name] : kMethodNames) {
    if (method == m) return name;
  }
  return "unknown";
}

Result<SelectionMethod> ParseSelectionMethod(std::string_view name) {
  for (const auto& [method, n] : kMethodNames) {
    if (n == name) return method;
  }
  return MakeError(
      "context: unknown selection method '%.*s' (score, relevance, recency, "
      "recent-only, random)",
      static_cast<int>(name.size()), name.data());
}

Result<int> ResolveBudget(double budget, int history_tokens) {
  if (history_tokens < 0) return MakeError("context: negative history size %d", history_tokens);
  if (!std::isfinite(budget) || budget <= 0) {
    return MakeError("context: budget %g must be a token count >= 1 or a fraction in (0, 1)",
                     budget);
  }
  if (budget >= 1) {
    if (budget > static_cast<double>(INT_MAX)) {
      return MakeError("context: budget %g tokens is too large", budget);
    }
    return static_cast<int>(std::floor(budget));
  }
  return static_cast<int>(std::floor(budget * history_tokens));
}

Result<Selection> SelectTurns(std::span<const TurnSpan> turns, std::span<const TurnScore> scores,
                              int budget_tokens, const SelectionOptions& options) {
  const int n_turns = static_cast<int>(turns.size());
  MNEMO_TRY(ValidateTurns(turns, turns.empty() ? 0 : turns.back().end));
  if (budget_tokens < 0) return MakeError("context: budget %d tokens is negative", budget_tokens);
  if (options.keep_last < 0)
    return MakeError("context: keep_last %d is negative", options.keep_last);
  const bool needs_scores =
      options.method == SelectionMethod::kScore || options.method == SelectionMethod::kRelevance;
  if (needs_scores) {
    if (static_cast<int>(scores.size()) != n_turns) {
      return MakeError("context: %zu scores for %d turns", scores.size(), n_turns);
    }
    for (int i = 0; i < n_turns; ++i) {
      if (!std::isfinite(scores[i].total) || !std::isfinite(scores[i].relevance)) {
        return MakeError("context: turn %d has a non-finite score", i);
      }
    }
  }

  Selection sel;
  sel.budget_tokens = budget_tokens;
  std::vector<char> keep(n_turns, 0);
  const int first_last = std::max(0, n_turns - options.keep_last);
  for (int i = 0; i < n_turns; ++i) {
    if (i == 0 || i >= first_last || turns[i].pinned) {
      keep[i] = 1;
      sel.mandatory_tokens += turns[i].size();
    }
  }

  if (sel.mandatory_tokens > budget_tokens) {
    if (options.strict) {
      return MakeError(
          "context: budget %d tokens cannot hold the system prompt, the last %d turns "
          "and the pinned turns (%d tokens)",
          budget_tokens, options.keep_last, sel.mandatory_tokens);
    }
    sel.overflow_tokens = sel.mandatory_tokens - budget_tokens;
  } else {
    std::vector<int> cand;  // [n_candidates] turn indices
    for (int i = 0; i < n_turns; ++i) {
      if (!keep[i]) cand.push_back(i);
    }
    OrderCandidates(cand, scores, options);
    int left = budget_tokens - sel.mandatory_tokens;
    for (int i : cand) {
      if (turns[i].size() <= left) {
        keep[i] = 1;
        left -= turns[i].size();
      } else if (options.method == SelectionMethod::kRecentOnly) {
        break;
      }
    }
  }

  for (int i = 0; i < n_turns; ++i) {
    if (keep[i]) {
      sel.kept.push_back(i);
      sel.kept_tokens += turns[i].size();
    } else {
      sel.dropped.push_back(i);
      sel.dropped_tokens += turns[i].size();
    }
  }
  return sel;
}

}  // namespace mnemo::context
