// The conversation service between the HTTP API and the engine: renders messages to tokens, finds
// the session whose token log shares the longest prefix with them (continuing it, or forking it
// copy-on-write at the point where they diverge), submits the new tokens as one turn, and commits
// finished turns to the store before their response completes.
//
// Thread-safety: every method may be called from any HTTP handler thread.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "chat/chat_template.h"
#include "engine/engine.h"
#include "store/store.h"
#include "tokenizer/tokenizer.h"

namespace mnemo {

// An API-level error: HTTP status, OpenAI error type and message.
struct ApiError {
  int status = 400;
  std::string type = "invalid_request_error";
  std::string message;
  std::string param;  // the request field at fault, or ""
  std::string code;   // machine-readable code, or ""
};

template <class T>
using ApiResult = std::variant<T, ApiError>;

// Where a turn's context comes from when the caller knows it.
struct SessionHint {
  std::string key;             // client session key (X-Session-Id), or ""
  int64_t session = -1;        // engine session of a previous response / conversation, or -1
  int64_t end_token = -1;      // ... and the log length it ended at
};

// Selective context (ConvKV) for one request: which turns of a long history the model still sees.
struct ContextRequest {
  double budget = 0;               // 0: off; >= 1: history tokens; in (0, 1): share of the history
  std::string mode = "reuse";      // "reuse" (cached KV of kept turns, re-rotated) or "exact"
  std::string preset = "default";  // scoring weights: default, factual, sequential, analytical
  int keep_last = 2;               // newest turns always kept
};

// What the model saw, reported back as `mnemo_context`.
struct ContextReport {
  bool applied = false;
  std::vector<int> kept_turns, dropped_turns;  // turn indices (0 = system prompt)
  int64_t kept_tokens = 0, dropped_tokens = 0;
  std::string mode;
};

struct TurnSpec {
  std::string owner;                  // API key hash ("" without auth)
  std::vector<ChatMessage> messages;  // the whole conversation to render (chat APIs)
  std::optional<std::string> prompt;  // raw prompt instead of messages (/v1/completions)
  SessionHint hint;
  TurnRequest request;                // generation parameters; session and append are filled in
  ContextRequest context;             // selective context, off unless budget > 0
  std::vector<bool> pinned;           // per message: a turn holding a pinned message is kept
};

struct StartedTurn {
  std::shared_ptr<TurnHandle> handle;
  int64_t session = -1;       // engine session the turn runs on
  bool new_session = false;   // created for this turn (not yet in the store)
  std::optional<int64_t> fork_of;   // forked from this session at fork_at
  int64_t fork_at = 0;
  std::optional<int64_t> truncated_to;  // the session was truncated here first
  int prompt_tokens = 0;      // rendered context length
  ContextReport context;      // selective context, when applied
};

struct ServiceConfig {
  std::string model_name;        // the id served in /v1/models and responses
  int min_reuse_tokens = 16;     // a shared prefix shorter than this starts a new session
  std::function<void(int32_t, float*)> embed;  // row of the token embedding table (selective context)
  int embed_dim = 0;             // its width
  ContextRequest default_context;  // applied when a request names no budget
};

class Service {
 public:
  // store may be null (nothing persisted). Loads the stored sessions into the engine.
  static Result<std::unique_ptr<Service>> Create(Engine& engine, const Tokenizer& tokenizer,
                                                 ChatTemplate chat_template, Store* store,
                                                 const ServiceConfig& config);

  const ServiceConfig& config() const { return config_; }
  const Tokenizer& tokenizer() const { return tok_; }
  Engine& engine() { return engine_; }
  Store* store() { return store_; }

  // Renders the turn's context to tokens (BOS and template markers included).
  ApiResult<std::vector<int32_t>> Render(const TurnSpec& spec) const;
  // Picks or makes the session and submits the turn (selecting turns first when the request, or
  // the server default, sets a context budget, or when truncation must shorten the context).
  ApiResult<StartedTurn> Start(TurnSpec spec);
  // Selective context: replaces spec.messages by the kept turns (and, in reuse mode, composes a
  // session from the cached KV and points spec.hint at it). Returns what was kept.
  ApiResult<ContextReport> SelectContext(TurnSpec& spec, double budget);
  // After the turn's kDone: commits a finished turn (and the optional response / conversation
  // update) durably, or forgets a cancelled one. Returns the conversation item ids added.
  ApiResult<std::vector<std::string>> Commit(const StartedTurn& t, const TurnResult& r,
                                             std::optional<StoredResponse> response,
                                             std::optional<ConversationUpdate> conversation,
                                             const std::string& owner);

  struct SessionView {
    int64_t id;
    std::string owner;
    std::string key;  // client session key, if any
  };
  std::vector<SessionView> Sessions(const std::string& owner);
  Status DeleteSession(int64_t id, const std::string& owner);

 private:
  ApiResult<StartedTurn> StartRendered(TurnSpec spec);
  // The owner's idle session sharing the longest prefix with tokens (-1 if none) and that prefix.
  std::pair<int64_t, size_t> BestSession(const std::string& owner, const std::vector<int32_t>& tokens);
  std::pair<int64_t, size_t> BestSessionLocked(const std::string& owner, const std::vector<int32_t>& tokens);

  Service(Engine& e, const Tokenizer& t, ChatTemplate ct, Store* s, ServiceConfig c)
      : engine_(e), tok_(t), template_(std::move(ct)), store_(s), config_(std::move(c)) {}

  struct Entry {
    std::string owner;
    std::string key;              // client session key, "" if none
    std::vector<int32_t> tokens;  // mirror of the session's committed log
    bool busy = false;            // a turn runs on it
    std::vector<int32_t> unstored_prefix;  // a composed session's log, not yet in the store
  };

  Engine& engine_;
  const Tokenizer& tok_;
  ChatTemplate template_;
  Store* store_;
  ServiceConfig config_;
  // Selective context's per-conversation state: IDF statistics and turn embeddings, kept across
  // turns so that each turn is embedded once. Keyed by owner and the conversation's first turn.
  struct ContextState;
  std::mutex ctx_mu_;
  std::unordered_map<std::string, std::shared_ptr<ContextState>> context_;

  std::mutex mu_;
  std::unordered_map<int64_t, Entry> sessions_;                     // by engine session id
  std::unordered_map<std::string, int64_t> keys_;                   // owner + '\n' + key -> session
};

}  // namespace mnemo
