// The compacted layout of a selected context: where each kept turn's tokens move when the dropped
// turns are cut out and positions are renumbered 0..n'-1. Pure data; the engine uses it to reuse
// cached KV (re-rotating RoPE keys by `delta`), to recompute what must be recomputed, and to place
// the new user message at position n'.
//
// Reuse modes the layout serves:
//   - approximate reuse: every kept span's cached KV is reused, keys re-rotated by delta. The
//     values (and pre-RoPE keys) of a moved span were computed while attending to turns now
//     dropped, so the result is close to, not equal to, running the selected context from scratch.
//   - exact: positions [0, exact_prefix_tokens) are identical in the old and new layout and were
//     computed over the same preceding tokens, so their KV is valid as it is; every kept span from
//     spans[first_gap] on must be recomputed. The result then equals running the selected context
//     from scratch (GatherTokens) with no cache.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"
#include "context/turns.h"

namespace mnemo::context {

struct LayoutSpan {
  int turn = 0;       // index of the kept turn in the history
  int old_begin = 0;  // first position in the session log
  int old_end = 0;    // one past the last position in the session log
  int new_begin = 0;  // first position in the compacted context
  int new_end = 0;    // one past the last position in the compacted context
  int delta() const { return new_begin - old_begin; }  // new_pos - old_pos, <= 0 (RoPE re-rotation)
  int size() const { return old_end - old_begin; }     // tokens
};

struct Layout {
  std::vector<LayoutSpan> spans;  // one per kept turn, ascending; new ranges tile [0, n_tokens)
  int n_tokens = 0;               // n': tokens of the compacted context
  int first_gap = 0;              // index into spans of the first span that moved (delta != 0:
                                  // dropped tokens precede it); spans.size() when none moved
  int exact_prefix_tokens = 0;    // positions [0, this) keep their position and their KV in exact
                                  // mode (= spans[first_gap].new_begin, or n_tokens)
  int moved_tokens = 0;           // tokens of the spans with delta != 0

  // [n_tokens] the session-log position of each compacted position.
  std::vector<int32_t> OldPositions() const;
};

// Computes the layout for keeping `kept` (turn indices, strictly ascending, in range) of the
// history `turns` (ValidateTurns over [0, TotalTokens)). Errors: invalid turns or indices.
Result<Layout> ComputeLayout(std::span<const TurnSpan> turns, std::span<const int> kept);

// The compacted context's tokens: log[old_begin, old_end) of every span, in order. `log` must cover
// every span (checked: Error otherwise).
Result<std::vector<int32_t>> GatherTokens(std::span<const int32_t> log, const Layout& layout);

}  // namespace mnemo::context
