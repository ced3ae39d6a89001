// Turns of a conversation as selective context (ConvKV) sees them: token spans of the session's raw
// token log. This layer knows no model, engine or KV cache; the engine converts its own turns with
// SegmentTurns and maps the decisions back.
//
// Conventions used throughout src/context:
//   - Positions are indices into the session's raw token log (prompt and generated tokens in
//   order).
//   - A history is a vector<TurnSpan> that tiles [0, n): turns[0].begin == 0, each turn begins
//   where
//     the previous one ends, turns.back().end == n. Turns may be empty (begin == end).
//   - turns[0] is the system prompt (possibly empty when the conversation has none); every later
//     turn is one exchange: a user message with the assistant reply.
//   - The new user message the model is about to answer is NOT a turn of the history: it is the
//     query that relevance is measured against, and the engine appends it after the kept turns.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"

namespace mnemo::context {

struct TurnSpan {
  int begin = 0;                            // first position of the turn in the session log
  int end = 0;                              // one past the last position (half-open)
  bool pinned = false;                      // the caller asked to keep this turn whatever its score
  int size() const { return end - begin; }  // tokens
};

// The engine's view of one exchange (mirror of engine/session.h's Turn, which this layer does not
// include): its prompt (rendered user message) then its generated reply.
struct TurnBounds {
  int begin = 0;       // first position of the turn's prompt tokens
  int prompt_end = 0;  // first generated position
  int end = 0;         // one past the last position
};

// Checks that `turns` tiles [0, n_tokens) in order (see the conventions above) and is non-empty.
Status ValidateTurns(std::span<const TurnSpan> turns, int n_tokens);

// Builds the history of selective context from the engine's turns.
//   engine_turns: in order, tiling [0, n_tokens) (each begin <= prompt_end <= end).
//   system_end:   tokens [0, system_end) are the system prompt (with BOS and any template
//   preamble);
//                 0 when there is none. It must not go past the end of the first engine turn (or
//                 n_tokens when there are no turns): the engine usually renders the system prompt
//                 into its first turn's prompt, so that turn is split in two; an engine turn left
//                 empty by the split (a system-only first turn) is dropped.
//   pinned:       indices into the RESULT (0 = system prompt, 1 = first exchange, ...) to pin.
// Returns turn 0 = [0, system_end) (possibly empty), then one TurnSpan per engine turn.
// Errors: malformed engine turns, system_end out of range, a pin out of range.
Result<std::vector<TurnSpan>> SegmentTurns(std::span<const TurnBounds> engine_turns, int n_tokens,
                                           int system_end, std::span<const int> pinned = {});

// Sum of the turns' sizes.
int TotalTokens(std::span<const TurnSpan> turns);

// 64-bit hash of a token sequence (order-sensitive, seeded splitmix-style mixing): the content part
// of the per-turn cache key. Not cryptographic; equal sequences give equal hashes on every
// platform.
uint64_t HashTokens(std::span<const int32_t> tokens);

}  // namespace mnemo::context
