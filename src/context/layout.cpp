#include "context/layout.h"

namespace mnemo::context {

std::vector<int32_t> Layout::OldPositions() const {
  std::vector<int32_t> pos;  // [n_tokens]
  pos.reserve(n_tokens);
  for (const LayoutSpan& s : spans) {
    for (int p = s.old_begin; p < s.old_end; ++p) pos.push_back(p);
  }
  return pos;
}

Result<Layout> ComputeLayout(std::span<const TurnSpan> turns, std::span<const int> kept) {
  MNEMO_TRY(ValidateTurns(turns, turns.empty() ? 0 : turns.back().end));
  const int n_turns = static_cast<int>(turns.size());
  Layout layout;
  layout.spans.reserve(kept.size());
  int prev = -1;
  layout.first_gap = static_cast<int>(kept.size());
  for (int i : kept) {
    if (i <= prev || i >= n_turns) {
      return MakeError("context: kept turn %d is out of range or out of order (%d turns)", i,
                       n_turns);
    }
    prev = i;
    LayoutSpan s;
    s.turn = i;
    s.old_begin = turns[i].begin;
    s.old_end = turns[i].end;
    s.new_begin = layout.n_tokens;
    s.new_end = layout.n_tokens + turns[i].size();
    layout.n_tokens = s.new_end;
    if (s.delta() != 0) {
      if (layout.first_gap == static_cast<int>(kept.size())) {
        layout.first_gap = static_cast<int>(layout.spans.size());
      }
      layout.moved_tokens += s.size();
    }
    layout.spans.push_back(s);
  }
  layout.exact_prefix_tokens = layout.first_gap < static_cast<int>(layout.spans.size())
                                   ? layout.spans[layout.first_gap].new_begin
                                   : layout.n_tokens;
  return layout;
}

Result<std::vector<int32_t>> GatherTokens(std::span<const int32_t> log, const Layout& layout) {
  std::vector<int32_t> out;  // [n_tokens]
  out.reserve(layout.n_tokens);
  for (const LayoutSpan& s : layout.spans) {
    if (s.old_begin < 0 || s.old_end < s.old_begin || s.old_end > static_cast<int>(log.size())) {
      return MakeError("context: span [%d, %d) is outside the %zu-token log", s.old_begin,
                       s.old_end, log.size());
    }
    out.insert(out.end(), log.begin() + s.old_begin, log.begin() + s.old_end);
  }
  return out;
}

}  // namespace mnemo::context
