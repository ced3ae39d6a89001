// A turn request and the stream of events it produces. The request side is filled by the caller
// (server, chat, bench); events are pushed by the engine thread and read by the caller's thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "grammar/automaton.h"
#include "kv/cache_manager.h"
#include "sampling/sampler.h"
#include "sampling/stop.h"

namespace mnemo {

struct TurnRequest {
  SessionId session = -1;            // an existing session
  std::vector<int32_t> append;       // the turn's new prompt tokens (e.g. rendered user message)
  int max_tokens = 256;              // generated tokens at most
  int min_tokens = 0;                // EOS / stop tokens are ignored before this many
  SamplingParams sampling;           // validated by Submit
  std::vector<std::string> stop;     // stop strings (not emitted)
  CallStart call_start;              // where a tool call begins: stop strings do not apply from there
  std::vector<int32_t> stop_tokens;  // extra stop token ids
  bool ignore_eos = false;           // keep going past end-of-generation tokens
  bool keep_stop_token = false;      // append a sampled stop token to the session log
  bool capture_logits = false;       // return the logits of the first generated token (tests)
  // -1: off. 0..kMaxTopLogprobs: each generated token's kText event carries its logprob and this
  // many most likely alternatives (PositionLogprobs: the model's raw distribution). Costs an
  // O(vocab) pass per generated token, only when on.
  int logprobs = -1;
  // Constrained decoding: every generated token keeps the output inside this grammar (built over
  // the engine's tokenizer), and the grammar closes the output in time for max_tokens and the
  // context (automaton.h). The turn ends with kStop once the grammar admits nothing but the end
  // of generation, whatever ignore_eos and min_tokens say. Null: unconstrained.
  std::shared_ptr<grammar::Automaton> grammar;
};

// Where the positions of a turn's context came from.
struct TokenSources {
  int64_t t0 = 0;          // KV already in T0
  int64_t t1 = 0;          // swapped in from host RAM
  int64_t t2 = 0;          // read from disk
  int64_t recomputed = 0;  // history positions whose KV was gone (recomputed)
  int64_t fresh = 0;       // positions never computed before (new prompt tokens)
  int64_t remote = 0;      // KV fetched from the remote tier (--kv-remote) instead of computed
  int64_t cached() const { return t0 + t1 + t2 + remote; }
};

// Why a turn ended.
enum class FinishReason : uint8_t {
  kNone,       // not finished
  kStop,       // an end-of-generation token, a stop token or a stop string
  kLength,     // max_tokens or the context length reached
  kCancelled,  // the caller cancelled, or the engine shut down
  kError,      // TurnResult::error says why
};

// "stop", "length", "cancelled", "error" (the OpenAI finish_reason strings); "" for kNone.
inline const char* FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kError: return "error";
    case FinishReason::kNone: break;
  }
  return "";
}

// A turn that ended with stop or length is committed to the session's log; others are discarded.
inline bool Completed(FinishReason r) { return r == FinishReason::kStop || r == FinishReason::kLength; }

struct TurnResult {
  FinishReason finish_reason = FinishReason::kNone;
  Error error;                      // when kError; its code says why (kOutOfRange: the context cannot fit the KV cache)
  std::vector<int32_t> tokens;      // generated ids (a final stop token included)
  std::string text;                 // generated text without the stop string
  int prompt_tokens = 0;            // context positions this turn attended over before generating
  TokenSources sources;             // how those positions were served
  double queue_seconds = 0;         // submit -> admitted (or -> ended, for a turn never admitted)
  bool admitted = false;            // reached the batch at least once
  double ttft_seconds = 0;          // submit -> first generated token
  double total_seconds = 0;         // submit -> done
  int suspensions = 0;              // times the request was suspended for memory
  int64_t recomputed_positions = 0; // positions recomputed over all admissions (sources.recomputed
                                    // counts the first only; a suspension can lose KV again)
  double recomputed_pairs = 0;      // Σ (p + 1) over them: attention (query, key) pairs, so that
                                    // a + b·pairs prices them deterministically for any cost model
  double recompute_seconds = 0;     // forward-pass time spent recomputing positions whose KV was gone
                                    // (dropped or evicted history, and KV lost to a suspension):
                                    // each step's measured time shared among its tokens by the
                                    // calibrated cost of their positions (engine/cost_fit.h)
  double grammar_seconds = 0;       // engine-thread time in the grammar matcher (masks and accepts)
  double sampling_seconds = 0;      // engine-thread time in the sampler (penalties, mask, draw)
  std::vector<float> first_logits;  // [vocab] when capture_logits
  // With TurnRequest::logprobs >= 0, the logprob of the token that ended the turn without being
  // reported in a kText event (an end-of-generation or stop token), as PositionLogprobs::chosen
  // gives it; nullopt when none did (cut at max_tokens, a stop string, a grammar that closed).
  // best_of charges it to a candidate that chose to end.
  std::optional<float> end_logprob;
  int log_begin = 0;                // the session log length before this turn
  std::vector<int32_t> log_append;  // tokens this turn appended to the log (empty unless committed)
};

struct TurnEvent {
  enum Kind { kText, kDone } kind = kText;
  int32_t token = -1;   // kText: the token just generated (-1: text flushed at the end, no token)
  std::optional<PositionLogprobs> logprobs;  // kText with a token, when TurnRequest::logprobs >= 0
  std::string text;     // kText: text that became final (may be empty)
  TurnResult result;    // kDone
};

// The caller's end of a request. Thread-safe.
class TurnHandle {
 public:
  // Blocks until the next event. After kDone, returns false.
  bool Next(TurnEvent* ev);
  // Asks the engine to stop generating (e.g. the client went away); a kDone with
  // FinishReason::kCancelled follows.
  void Cancel();
  bool cancelled() const;
  // Waits for the end and returns the result (collecting all text).
  TurnResult Wait();
  // Blocks until the engine first admitted the turn to the batch (true) or ended it before that
  // (false: a kDone is next, e.g. an error for a turn that waited past the queue bound). Reads no
  // event: a caller can wait here before it commits to a streamed answer's status.
  bool WaitAdmitted();

  // Without a waiting thread (the HTTP server's answers): TryNext takes the next event if there is
  // one; Admission says whether the turn was admitted, is waiting, or ended before admission.
  // SetNotify's fn runs after every Push and MarkAdmitted, on the engine's thread (and once at
  // once, on the caller's, when something already happened): it must only schedule work
  // elsewhere, never block. Clearing it (nullptr) breaks the cycle a closure over the handle makes.
  bool TryNext(TurnEvent* ev);
  enum class Admission { kWaiting, kAdmitted, kEndedBefore };
  Admission AdmissionState() const;
  void SetNotify(std::function<void()> fn);

  // Engine side.
  void Push(TurnEvent ev);
  void MarkAdmitted();

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<TurnEvent> events_;
  bool cancelled_ = false;
  bool done_ = false;  // kDone was read
  bool admitted_ = false;  // MarkAdmitted was called
  bool ended_ = false;     // kDone was pushed
  std::shared_ptr<std::function<void()>> notify_;  // copied under mu_, called outside it
};

}  // namespace mnemo
