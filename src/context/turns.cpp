#include "context/turns.h"

namespace mnemo::context {

Status ValidateTurns(std::span<const TurnSpan> turns, int n_tokens) {
  if (turns.empty())
    return MakeError("context: a history needs at least turn 0 (the system prompt)");
  int pos = 0;
  for (size_t i = 0; i < turns.size(); ++i) {
    const TurnSpan& t = turns[i];
    if (t.begin != pos || t.end < t.begin) {
      return MakeError("context: turn %zu [%d, %d) does not continue at position %d", i, t.begin,
                       t.end, pos);
    }
    pos = t.end;
  }
  if (pos != n_tokens) {
    return MakeError("context: turns end at position %d but the history has %d tokens", pos,
                     n_tokens);
  }
  return Status::Ok();
}

Result<std::vector<TurnSpan>> SegmentTurns(std::span<const TurnBounds> engine_turns, int n_tokens,
                                           int system_end, std::span<const int> pinned) {
  if (n_tokens < 0) return MakeError("context: negative token count %d", n_tokens);
  int pos = 0;
  for (size_t i = 0; i < engine_turns.size(); ++i) {
    const TurnBounds& t = engine_turns[i];
    if (t.begin != pos || t.prompt_end < t.begin || t.end < t.prompt_end) {
      return MakeError(
          "context: engine turn %zu [%d, %d, %d) is malformed or does not continue at %d", i,
          t.begin, t.prompt_end, t.end, pos);
    }
    pos = t.end;
  }
  if (pos != n_tokens) {
    return MakeError("context: engine turns end at %d but the log has %d tokens", pos, n_tokens);
  }
  const int system_limit = engine_turns.empty() ? n_tokens : engine_turns[0].end;
  if (system_end < 0 || system_end > system_limit) {
    return MakeError("context: system prompt end %d outside [0, %d] (the first turn)", system_end,
                     system_limit);
  }

  std::vector<TurnSpan> out;
  out.reserve(engine_turns.size() + 1);
  out.push_back({0, system_end, false});
  for (size_t i = 0; i < engine_turns.size(); ++i) {
    const int begin = i == 0 ? system_end : engine_turns[i].begin;
    if (i == 0 && begin == engine_turns[i].end && system_end > 0) continue;  // system-only turn
    out.push_back({begin, engine_turns[i].end, false});
  }
  for (int p : pinned) {
    if (p < 0 || p >= static_cast<int>(out.size())) {
      return MakeError("context: pinned turn %d out of range (the history has %zu turns)", p,
                       out.size());
    }
    out[p].pinned = true;
  }
  return out;
}

int TotalTokens(std::span<const TurnSpan> turns) {
  int n = 0;
  for (const TurnSpan& t : turns) n += t.size();
  return n;
}

uint64_t HashTokens(std::span<const int32_t> tokens) {
  // Each token is folded in, then the state is mixed (splitmix64 finalizer): order-sensitive and
  // well spread, so (begin, end, hash) collisions between different contents are negligible.
  uint64_t h =
      0x6a09e667f3bcc909ull ^ (static_cast<uint64_t>(tokens.size()) * 0x9e3779b97f4a7c15ull);
  for (int32_t t : tokens) {
    h ^= static_cast<uint32_t>(t);
    h += 0x9e3779b97f4a7c15ull;
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
    h ^= h >> 31;
  }
  return h;
}

}  // namespace mnemo::context
