// A turn while the engine holds it (private to the engine's .cpp files).
#pragma once

#include <optional>

#include "engine/engine.h"
#include "sampling/stop.h"

namespace mnemo {

struct Engine::Running {
  TurnRequest req;
  std::shared_ptr<TurnHandle> handle;
  Session* session = nullptr;     // stable: sessions live in an unordered_map
  std::vector<int32_t> seq;       // session log + appended tokens + generated tokens
  int prompt_len = 0;             // seq size before generation
  bool admitted = false;          // holds T0 blocks (between Acquire and Release/Suspend)
  bool counted = false;           // token sources recorded (first admission only)
  std::vector<int32_t> table;     // T0 block per chunk while admitted
  std::vector<int32_t> queries;   // positions to feed before the next sample, ascending
  size_t next_query = 0;          // queries[0, next_query) are fed
  size_t n_recompute = 0;         // queries[0, n_recompute) recompute KV that was gone
  bool tail_unfed = false;        // seq.back() was sampled and not fed yet
  uint64_t order = 0;             // admission order (suspension picks the youngest)
  std::optional<Sampler> sampler;
  std::optional<StreamDecoder> decoder;
  std::optional<StopMatcher> stop;
  TurnResult result;
  double submitted = 0;           // engine clock
  bool decoding() const { return admitted && next_query == queries.size(); }
  // Positions [0, valid) hold KV.
  int kv_valid() const {
    if (!admitted) return -1;
    if (next_query < queries.size()) return queries[next_query];
    return static_cast<int>(seq.size()) - (tail_unfed ? 1 : 0);
  }
};

}  // namespace mnemo
