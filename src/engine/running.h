// A turn, and a composition, while the engine holds them (private to the engine's .cpp files).
#pragma once

#include <future>
#include <memory>
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
  bool remote_checked = false;    // remote fetches considered (once, before the first admission)
  std::optional<Sampler> sampler;
  std::optional<StreamDecoder> decoder;
  std::optional<StopMatcher> stop;
  std::optional<grammar::Matcher> matcher;  // when req.grammar
  grammar::TokenMask mask;                  // [ceil(vocab / 64)] the matcher's mask of this step
  LogprobScan logprob_scan;                 // this step's row, scanned (when req.logprobs >= 0)
  std::optional<PositionLogprobs> logprobs;  // the sampled token's, for EmitToken's event
  TurnResult result;
  double submitted = 0;           // engine clock
  double queued_at = 0;           // when it last entered waiting_ (submitted, or suspended)
  bool decoding() const { return admitted && next_query == queries.size(); }
  // Positions [0, valid) hold KV.
  int kv_valid() const {
    if (!admitted) return -1;
    if (next_query < queries.size()) return queries[next_query];
    return static_cast<int>(seq.size()) - (tail_unfed ? 1 : 0);
  }
};

struct ComposeCopy;  // compose.cpp: what the transfer thread's copy task reads and writes

// A selective-context composition (Engine::ComposeSession), advanced by the engine's steps.
struct Engine::Composition {
  enum class Phase { kAcquireSrc, kAcquireDst, kCopying };
  Phase phase = Phase::kAcquireSrc;
  SessionId src = -1, dst = -1;
  int src_kv = 0;                        // src's positions with KV, acquired
  std::vector<KvRun> runs;
  CacheManager::Acquired a;              // src's acquisition (from kAcquireDst on)
  std::shared_ptr<ComposeCopy> copy;     // (kCopying)
  std::shared_ptr<TransferTask> task;    // (kCopying)
  int stalls = 0;                        // consecutive kLater with nothing in flight or running
  std::promise<Result<SessionId>> result;
};

}  // namespace mnemo
