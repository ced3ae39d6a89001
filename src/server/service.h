// The conversation service between the HTTP API and the engine: turns a request into the session
// that holds its conversation and the new tokens to append, submits them as one turn, and commits
// finished turns to the store before their response completes.
//
// Finding the session. A chat request whose history ends with a reply this service generated
// (previous_response_id and conversations name the session and the turn; stateless chat finds the
// session whose last prompt renders exactly as the history before that reply) continues that
// session's exact token log: the reply's generated tokens are kept as the model produced them,
// and only the text after them is tokenized (turn_append.h). The conversation continues in the
// same session, forking only when the history was really edited or it branches from an older
// turn. Otherwise (first turns, raw prompts, sessions reloaded from the store, templates that are
// not prefix-stable) the request is rendered and tokenized whole, and the session whose log shares
// the longest token prefix is continued, or forked copy-on-write where they diverge.
//
// A session with a turn running is never continued by another request, but its committed log
// (what it held before that turn) is forked like an idle session's: concurrent continuations of
// one conversation (an agent's parallel calls on one history) each start from the cached history,
// not from nothing. The running turn's tokens are not in that log, and the engine checks that the
// log still begins with the tokens the fork was planned on (Engine::ForkSession).
//
// Sessions on a shared store (PostgreSQL, several replicas: issue 14). A replica holds only the
// sessions it was asked for: none at start, a session named by a request (previous_response_id's
// chain, a conversation) is loaded from the store then. Before a turn continues or forks a stored
// session, one probe (Store::GetSessionVersion) compares this copy with the store: equal, it is
// used; the stored log grew past it (another replica served the conversation meanwhile), the
// missing turns are appended to the engine's log and computed with the new turn, keeping the KV of
// what this copy had; cut and regrown, or deleted, the copy is rebuilt from the stored tokens (KV
// from the tiers whose identity matches, else recomputed) or forgotten. The commit then expects
// the stored log as this copy saw it (compare-and-set), and a commit that loses drops the copy, so
// the next turn reloads it. A stateless chat history (or raw prompt) names no session: when no
// session held here continues it, the store's prefix index (Store::FindPrefix) names the stored
// session sharing its longest run of full chunks, which is loaded and matched token by token as
// any held session is (continued when the history extends its whole log, else forked where they
// part). With a store of one writer (SQLite) every session is loaded at start, and none is
// probed nor looked up: the store cannot change behind this process.
//
// Thread-safety: every method may be called from any HTTP handler thread.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "chat/chat_template.h"
#include "context/scoring.h"
#include "server/api_error.h"
#include "server/prefix_index.h"
#include "server/turn_window.h"
#include "engine/engine.h"
#include "grammar/grammar_cache.h"
#include "store/store.h"
#include "tokenizer/tokenizer.h"

namespace mnemo {

// Where a turn's context comes from when the caller knows it.
struct SessionHint {
  std::string key;             // client session key (X-Session-Id), or ""
  int64_t session = -1;        // engine session of a previous response / conversation, or -1
  int64_t end_token = -1;      // ... and the log length it ended at
  int reply_message = -1;      // messages[reply_message] is that response's reply (-1: the last assistant message)
};

// Selective context (ConvKV) for one request: which turns of a long history the model still sees.
struct ContextRequest {
  double budget = 0;               // 0: off; >= 1: history tokens; in (0, 1): share of the history
  std::string mode = "reuse";      // "reuse" (cached KV of kept turns, re-rotated) or "exact"
  std::string preset = "default";  // scoring weights: default, factual, sequential, analytical
  int keep_last = 1;               // newest turns always kept (context::SelectionOptions)
  std::string method = "score";    // ranking (context::ParseSelectionMethod): score (3-factor),
                                   // relevance, recency, recent-only, random
  std::string relevance = "keyword";  // relevance factor (context::ParseRelevanceKind): keyword,
                                      // embedding, centred, whitened, hidden, attention
  uint64_t seed = 0;               // method "random" only
  double relevance_temperature = context::ScoringOptions{}.relevance_temperature;  // keyword
                                   // relevance sharpening (not in the HTTP API; bench convkv)
  bool scores = false;             // report every turn's score (include "mnemo_context.scores")
};

// What the model saw, reported back as `mnemo_context`.
struct ContextReport {
  bool applied = false;
  std::vector<int> kept_turns, dropped_turns;  // turn indices (0 = system prompt)
  int64_t kept_tokens = 0, dropped_tokens = 0;
  std::string mode;
  bool has_scores = false;   // ContextRequest::scores: `scores` below is filled
  std::vector<context::TurnScore> scores;  // [turns] per turn, turn order (0 = system prompt)
  std::string method, relevance;           // how the turns were ranked
  double scoring_ms = 0;                   // time spent scoring the turns (segmentation included)
  int n_turns = 0;                         // turns of the history (kept + dropped)
  std::vector<int> turn_tokens;            // [n_turns] tokens of each turn (with has_scores)
  int64_t probe_tokens = 0;                // positions the model ran to score the turns
                                           // (hidden: turns not yet embedded + the message;
                                           // attention: the whole history + the message)
};

class TurnLock;

struct TurnSpec {
  std::string owner;                  // API key hash ("" without auth)
  std::vector<ChatMessage> messages;  // the whole conversation to render (chat APIs)
  std::optional<std::string> prompt;  // raw prompt instead of messages (/v1/completions)
  SessionHint hint;
  TurnRequest request;                // generation parameters; session and append are filled in
  ContextRequest context;             // selective context, off unless budget > 0
  std::vector<bool> pinned;           // per message: a turn holding a pinned message is kept
  // Responses API: the turn continues (or starts) a previous_response_id chain, rendered with these
  // instructions. The service then remembers the stored response it makes, so that the turn naming
  // it next can skip the chain walk (StartAfterResponse).
  bool chain = false;
  std::optional<std::string> instructions;
  // More template variables (`tools` for templates that render tools: server/tools.h). Turns with
  // them skip the window fast paths (a window's prompt hash covers only the messages) and are
  // continued by comparing whole renderings (PlanAppend), which cover the variables too.
  std::shared_ptr<const jinja::Dict> template_extra;
  // A turn lock the caller took before reading the history (Service::LockStored: a conversation's
  // items); the turn keeps it to its commit when it continues that session.
  std::shared_ptr<TurnLock> lock;
};

// A turn lock (Store::TryLockTurn): a stored session's on a shared store, taken before a turn that
// continues the session probes it, or a conversation's (Service::LockStored, any store), released
// when the turn commits or fails (Service::Commit), or
// else when the last copy of its StartedTurn goes. n > 1 choices share their prompt's lock
// (Service::StartChoices): each choice is one more holder, and the lock goes with the last
// holder's Release, so that no other replica's turn lands between the prompt's commit and the
// choices'. Thread-safe.
class TurnLock {
 public:
  TurnLock(Store* store, int64_t id) : store_(store), id_(id) {}
  ~TurnLock() { Unlock(); }
  TurnLock(const TurnLock&) = delete;
  TurnLock& operator=(const TurnLock&) = delete;
  int64_t id() const { return id_; }
  void Hold() { holders_++; }  // one more holder (a choice), who calls Release once
  void Release() {  // one holder done: the last unlocks; calls past that do nothing
    if (holders_.fetch_sub(1) == 1) Unlock();
  }

 private:
  void Unlock() {
    if (!released_.exchange(true)) store_->UnlockTurn(id_);
  }
  Store* store_;
  int64_t id_;
  std::atomic<int> holders_{1};
  std::atomic<bool> released_{false};
};

struct StartedTurn {
  std::shared_ptr<TurnHandle> handle;
  std::shared_ptr<TurnLock> lock;  // the session's turn lock, when a shared store took one
  int64_t session = -1;       // engine session the turn runs on
  bool new_session = false;   // created for this turn (not yet in the store)
  std::optional<int64_t> fork_of;   // forked from this session at fork_at
  int64_t fork_at = 0;
  std::optional<int64_t> truncated_to;  // the session was truncated here first
  int prompt_tokens = 0;      // rendered context length
  ContextReport context;      // selective context, when applied
  std::shared_ptr<const TurnWindow> window;  // the prompt's messages, summarised (chat turns)
  bool chain = false;                        // TurnSpec::chain (and no context selection applied)
  std::optional<std::string> instructions;   // TurnSpec::instructions
  bool windowed = false;      // rendered from a window (tests: the whole history was not rendered)
  // The prompt of a request with n > 1 choices, computed alone (max_tokens 0): once committed, its
  // session stays reserved (busy) for Service::StartChoices.
  bool prefill = false;
  bool choice = false;  // one of those choices (Service::StartChoices): its context is the prompt's turn's
};

// The seed of choice i of a request with `seed`: the seed itself for choice 0, unrelated streams
// (splitmix64) for the others, so that a seeded request reproduces all of its choices.
uint64_t ChoiceSeed(uint64_t seed, int i);
// best_of: the candidates' indices by their cumulative logprob (their generated tokens', and the
// end-of-generation token's of one that ended: TurnResult::end_logprob), highest first (lower
// index on ties; NaN ranks as -infinity).
std::vector<int> RankCandidates(const std::vector<double>& logprob);
// Makes req the turn that computes the prompt of a request with n > 1 choices: nothing generated
// (max_tokens 0), nothing to constrain or report.
void AsPrefill(TurnRequest* req);

struct ServiceConfig {
  std::string model_name;        // the id served in /v1/models and responses
  // Chat and completion responses' system_fingerprint: names the model file and the numerics that
  // decide its outputs (apps/cmd_serve.cpp), so that a client can tell when a seed may no longer
  // reproduce an answer.
  std::string system_fingerprint;
  int min_reuse_tokens = 16;     // a shared prefix shorter than this starts a new session
  std::function<void(int32_t, float*)> embed;  // row of the token embedding table (selective context)
  int embed_dim = 0;             // its width
  ContextRequest default_context;  // applied when a request names no budget
  // What token ids mean for this server: a hash of the vocabulary and chat template (0 = unchecked).
  // Stored sessions made under another identity (the server restarted on another model with the
  // same --db) are deleted at start instead of restored: their token logs would be another
  // vocabulary's ids, and their KV another model's. Responses and conversations stay and continue
  // from their text. On a shared store (PostgreSQL) other replicas may be serving those sessions:
  // Create then fails (kFailedPrecondition) and changes nothing.
  uint64_t token_identity = 0;
  // Shared store: a turn continuing a session that another replica runs a turn on waits this long
  // for that turn's commit (its turn lock), then continues from it; past this, 409 session_conflict.
  double turn_lock_wait_s = 10;
  bool render_windows = true;      // fast paths that render a window (turn_window.h), when the template allows
  // Model-internal relevance (context_relevance "hidden" / "attention", through Engine::Probe):
  int hidden_layer = -1;           // block whose output is pooled; -1: n_layers / 2
  int attention_layers = 0;        // attention averaged over blocks [0, this); 0: all. Fewer
                                   // blocks cost less: the probe stops after the last one.
};

// The tables keyword relevance needs (context::ScoringOptions::fold and word_kind) for a
// tokenizer: each token's lower-case twin (or itself), and whether it starts a word (its text
// begins with a space marker: SPM U+2581, GPT-2 U+0120, or a space), continues one, or is in none
// (punctuation, ASCII punctuation bytes, control tokens). O(vocab).
void KeywordTables(const Tokenizer& tokenizer, std::vector<int32_t>* fold, std::vector<int8_t>* word_kind);

// What reading a request needs of the model being served, without its engine: the tokenizer, the
// chat template, compiled grammars (structured outputs, forced tool calls) and the rendering of a
// turn's context to tokens. Service is one (adding the engine, the store and the sessions); the
// request fuzz target (tests/fuzz) makes one from a vocabulary alone.
//
// Thread-safety: every method may be called from any thread.
class ServedModel {
 public:
  ServedModel(const Tokenizer& tokenizer, ChatTemplate chat_template)
      : tok_(tokenizer), template_(std::move(chat_template)) {}

  const Tokenizer& tokenizer() const { return tok_; }
  const ChatTemplate& chat_template() const { return template_; }
  // Renders the turn's context to tokens (BOS and template markers included).
  ApiResult<std::vector<int32_t>> Render(const TurnSpec& spec) const;
  // The shared automaton for grammar text over this tokenizer (the vocabulary trie is built on
  // first use). Errors: kInvalidArgument with the parser's reason.
  Result<std::shared_ptr<grammar::Automaton>> Grammar(const std::string& text);

 protected:
  // The rendering of spec.messages (with the generation prompt) or the raw prompt.
  ApiResult<std::string> RenderText(const TurnSpec& spec) const;
  std::vector<int32_t> Encode(const TurnSpec& spec, const std::string& text) const;

  const Tokenizer& tok_;
  ChatTemplate template_;

 private:
  std::mutex grammar_mu_;
  std::unique_ptr<grammar::GrammarCache> grammars_;  // built on first use (the trie costs O(vocab))
};

class Service : public ServedModel {
 public:
  // store may be null (nothing persisted). Loads the stored sessions into the engine, unless the
  // store is shared (they load on demand then).
  static Result<std::unique_ptr<Service>> Create(Engine& engine, const Tokenizer& tokenizer,
                                                 ChatTemplate chat_template, Store* store,
                                                 const ServiceConfig& config);

  const ServiceConfig& config() const { return config_; }
  // Told of every probe of a shared store (SyncSession, FreshInStore): what it found ("fresh",
  // "stale", "loaded", "delta", "rebuilt", "absent") and how long the probe took, in seconds. Set
  // before serving (ApiServer counts them in /metrics).
  using SyncObserver = std::function<void(const char* result, double probe_seconds)>;
  void SetSyncObserver(SyncObserver fn) { on_sync_ = std::move(fn); }
  // Told of every turn lock taken (LockTurn): "free", "waited" (another turn held it), "timeout"
  // (it still did after ServiceConfig::turn_lock_wait_s: the
  // request got 409) or "unavailable" (the store could not be asked: the turn went on without), and
  // how long the request waited, in seconds.
  using LockObserver = std::function<void(const char* result, double wait_seconds)>;
  void SetLockObserver(LockObserver fn) { on_lock_ = std::move(fn); }
  // Told of every change notice from another replica that changed this replica's copy of a
  // session (OnStoreChange): "stale" (the stored log grew: the next turn appends the stored
  // turns) or "dropped" (cut or deleted: the copy is forgotten), and the notice's delivery
  // latency, in seconds (from the writer's clock: the same host's, or NTP's accuracy apart).
  using NoticeObserver = std::function<void(const char* action, double latency_seconds)>;
  void SetNoticeObserver(NoticeObserver fn) {
    std::lock_guard<std::mutex> lock(mu_);
    on_notice_ = std::move(fn);
  }
  // Told each time the store's change listener begins listening (at start, and after each
  // reconnect), with the number of idle copies marked stale because notices may have been lost.
  using ResyncObserver = std::function<void(size_t marked)>;
  void SetResyncObserver(ResyncObserver fn) {
    std::lock_guard<std::mutex> lock(mu_);
    on_resync_ = std::move(fn);
  }
  ~Service();
  Engine& engine() { return engine_; }
  Store* store() { return store_; }

  // Picks or makes the session and submits the turn (selecting turns first when the request, or
  // the server default, sets a context budget, or when truncation must shorten the context).
  ApiResult<StartedTurn> Start(TurnSpec spec);
  // Conversations API: takes the turn lock `id` names (a stored session's, or a conversation's
  // with no session yet: ConversationLockId), waiting for the turn holding it (on another replica,
  // or another request of this one) to commit, before the caller reads the conversation's items,
  // so that a turn that waited reads the other turn's items and continues after them; pass it in
  // TurnSpec::lock. Any store: SQLite's lock serialises a conversation's turns within this
  // process, PostgreSQL's across replicas. Null when there is no lock to take (no store, or the
  // store could not be asked). Errors: 409 session_conflict past ServiceConfig::turn_lock_wait_s.
  ApiResult<std::shared_ptr<TurnLock>> LockStored(int64_t id);
  // The Responses API's fast path: the turn after stored response `response_id` of spec.owner,
  // spec.messages holding only the new input items' messages and spec.instructions the request's.
  // Applies when the response is the latest turn of a live, idle session, made with the same
  // instructions, no response deleted since, no selective context, and a template that renders
  // windows (turn_window.h): renders the window around the reply and appends, without reading the
  // chain. nullopt: not applicable (nothing changed): walk the chain and call Start. Otherwise the
  // same turn (tokens, session, cached tokens) as Start with the whole history would give.
  // Cost: O(the new turn), whatever the conversation's length.
  std::optional<ApiResult<StartedTurn>> StartAfterResponse(TurnSpec spec, const std::string& response_id);
  // A response was deleted: chains through it now end there, so no session of the owner stands
  // for a chain any more (the next turns walk it).
  void ForgetResponses(const std::string& owner);
  // Selective context: replaces spec.messages by the kept turns (and, in reuse mode, composes a
  // session from the cached KV and points spec.hint at it). Returns what was kept.
  ApiResult<ContextReport> SelectContext(TurnSpec& spec, double budget);
  // n > 1 choices (chat and completions). Start a turn with max_tokens 0 and StartedTurn::prefill
  // set, commit it (its session then stays reserved), then call this: it forks that session n - 1
  // times at its end (copy-on-write: the prompt's KV is computed once and shared) and starts one
  // turn per choice with `request` (its append, session and seed replaced): choice 0 continues the
  // session itself, choice i > 0 its own fork, with seed ChoiceSeed(seed, i). Each choice's turn is
  // then committed as any other (Commit), and its session holds that choice's conversation: a
  // follow-up that resends the history with choice i's reply continues choice i's session (the
  // reply's own tokens, nothing recomputed). Waits on the engine (one call per fork). On an error
  // nothing is left: started choices are cancelled and discarded, the forks dropped, the session
  // freed. Errors: the engine's (a session that expired meanwhile, shutdown). The prompt's turn
  // lock (a shared store), which its Commit hands on, is held by every choice until the last one
  // commits, and released on an error.
  ApiResult<std::vector<StartedTurn>> StartChoices(const StartedTurn& prefill, const TurnRequest& request, int n,
                                                   const std::string& owner);
  // After the turn's kDone: commits a finished turn (and the optional response / conversation
  // update, and the request's de-duplication record) durably, or forgets a cancelled one. Returns
  // the conversation item ids added. With `request`, a record of the same owner and request id
  // committed first makes the commit fail (409 already_exists) with nothing stored.
  ApiResult<std::vector<std::string>> Commit(const StartedTurn& t, const TurnResult& r,
                                             std::optional<StoredResponse> response,
                                             std::optional<ConversationUpdate> conversation,
                                             const std::string& owner,
                                             std::optional<StoredRequest> request = std::nullopt);

  struct SessionView {
    int64_t id;
    std::string owner;
    std::string key;  // client session key, if any
  };
  std::vector<SessionView> Sessions(const std::string& owner);
  Status DeleteSession(int64_t id, const std::string& owner);

 private:
  // synced: a session brought in step with the store for this turn already (-1: none); depth:
  // how many times the plan was made again after a stale copy was brought in step.
  // lock: the turn lock taken for the session planned before (kept when the plan continues it again).
  ApiResult<StartedTurn> StartRendered(TurnSpec spec, int64_t synced = -1, int depth = 0,
                                       std::shared_ptr<TurnLock> lock = nullptr);
  // Takes turn lock id (Store::TryLockTurn), polling while another turn (another replica's, or,
  // on any store, another request's of this one) holds it, at most ServiceConfig::turn_lock_wait_s;
  // *waited tells whether it had to wait (the
  // session then moved: the caller probes it). Null when there is no lock to take (no store, or
  // the store could not be asked: the compare-and-set still guards the commit). Start and the
  // fast paths take it on a shared store only: on one process the busy mark does its work.
  // Errors: kAborted when the wait ran out. Runs on the request's thread, never the engine's.
  Result<std::shared_ptr<TurnLock>> LockTurn(int64_t id, bool* waited);
  // A change notice from another replica (Store::Watch, the store's listener thread): a copy held
  // here at an older version is marked stale (appended elsewhere) or dropped (cut, deleted). A
  // copy with a turn running here is left to that turn's commit. When the listener (re)starts
  // listening (SessionChange::resync) every idle copy is marked stale: notices may have been lost.
  void OnStoreChange(const SessionChange& c);
  // What SyncSession found.
  enum class Sync {
    kSkipped,  // not probed: no shared store, a session the store does not hold yet, or one
               // with a turn running here (its commit checks the store instead)
    kFresh,    // this copy is the stored log
    kLoaded,   // this replica did not hold it: loaded from the store
    kDelta,    // the stored log grew past this copy: the missing turns were appended
    kRebuilt,  // the stored log was cut since this copy was read: rebuilt from the stored tokens
    kAbsent,   // the store does not hold it (deleted): the local copy, if any, is forgotten
  };
  // Brings this replica's copy of stored session id in step with a shared store (see the header
  // comment); with `load`, loads it when this replica does not hold it and it is owner's. Cost: one
  // primary-key probe when the copy is fresh; a stale one also reads the session's log.
  Sync SyncSession(int64_t id, const std::string& owner, bool load);
  // The stored session of owner whose log shares more full chunks with tokens (the request's whole
  // rendering; or, when none does, a short log's whole) than `held` tokens, the most this
  // replica's own sessions share (Store::FindPrefix: the prefix index), or -1. What it names is
  // only a candidate: once loaded, the longest-prefix match compares its tokens. Cost: hashing the
  // tokens once (and at most 31 short prefixes), one statement.
  int64_t FindStored(const std::string& owner, std::span<const int32_t> tokens, size_t held);
  // Whether stored session id, as this replica holds it, is still the stored log: one probe. True
  // when nothing can be probed (no shared store, not stored, the store unreachable: its commit
  // then fails and drops the copy).
  bool FreshInStore(int64_t id);
  // Adopts a stored session into the engine and the mirror. Callers hold no lock.
  Status Adopt(StoredSession&& ss);
  // Whether the store probes sessions before turns (a shared store).
  bool Probes() const { return store_ && store_->shared(); }
  // Continues session `source`'s latest turn, whose prompt summary is its Entry::window, with the
  // reply and the new messages `more` (the shared part of both fast paths). nullopt: not
  // applicable, nothing changed.
  // client_reply: the reply message as the client sent it back (null: the session's own reply text).
  std::optional<ApiResult<StartedTurn>> StartWindowed(TurnSpec& spec, int64_t source, const MessageHash& prompt_hash,
                                                      const ChatMessage* client_reply, std::span<const ChatMessage> more);
  // Stateless chat's fast path: the session whose latest prompt hashes as the messages before the
  // request's last reply. Cost: hashing the history's bytes once, plus the new turn.
  std::optional<ApiResult<StartedTurn>> StartResent(TurnSpec& spec);
  // How to append the request to the session holding its history up to the last reply, if any.
  struct AppendPlan {
    int64_t source = -1;        // the session
    uint64_t version = 0;       // its Entry::version the plan was made for
    uint64_t cuts = 0;          // and its Entry::cuts (a fork at `cut` stays valid while they hold)
    bool in_place = false;      // continue the source itself (truncated to `cut`), else fork it there
    size_t cut = 0;             // log tokens kept
    std::vector<int32_t> append;  // the new turn's tokens after them
  };
  std::optional<AppendPlan> PlanAppend(const TurnSpec& spec, const std::string& text);
  // The owner's idle session sharing the longest prefix with tokens (-1 if none) and that prefix
  // (what selective context composes from: a busy session cannot be read from).
  std::pair<int64_t, size_t> BestSession(const std::string& owner, const std::vector<int32_t>& tokens);
  std::pair<int64_t, size_t> BestSessionLocked(const std::string& owner, const std::vector<int32_t>& tokens);

  Service(Engine& e, const Tokenizer& t, ChatTemplate ct, Store* s, ServiceConfig c)
      : ServedModel(t, std::move(ct)), engine_(e), store_(s), config_(std::move(c)) {}

  // A turn appended through the chat template: where its reply lies in the log and what the
  // client got. The log [0, prompt_end) stands for Entry::text [0, text_end).
  struct TurnMark {
    size_t prompt_end = 0;  // log position of the reply's first token
    size_t end = 0;         // log length after the turn
    size_t text_end = 0;    // bytes of the rendering that the log before the reply stands for
    std::string reply;      // the reply text the client got
  };
  struct Entry {
    std::string owner;
    std::string key;              // client session key, "" if none
    std::vector<int32_t> tokens;  // mirror of the session's committed log
    bool busy = false;            // a turn runs on it: other requests may fork its log, never continue it
    bool stored = false;          // the store holds it (its stored log begins with `tokens`): a fork of
                                  // it can be stored (Store::ForkSession). False for a session made for
                                  // a turn that has not committed yet (new, forked, composed)
    uint64_t version = 0;         // bumped whenever the log changes
    uint64_t cuts = 0;            // bumped whenever the log is cut (its prefix may then be regrown
                                  // with other tokens); appends and turn starts leave it
    std::vector<int32_t> unstored_prefix;  // a composed session's log, not yet in the store
    std::optional<int64_t> store_truncate;  // the engine's log was cut here; the store's not yet
    // The stored log's SessionVersion when this copy last agreed with it (load or commit): a
    // shared store is probed against it before a turn (SyncSession).
    int64_t store_length = 0;
    int64_t store_cuts = 0;
    // Another replica's notice said the stored log grew past store_length, or notices may have
    // been lost (the listener listens again): the next turn brings the copy in step (SyncSession's
    // probe; a copy the store bears out is kept as it is, the mark dropped).
    bool stale = false;
    std::string text;             // the rendering of the latest templated turn; "" when unknown
    std::vector<TurnMark> marks;  // templated turns whose text is a prefix of `text`, in log order
    // The latest turn's prompt messages, summarised, when its mark is marks.back() (fast paths):
    // found by prompt hash (prompts_), and by response (responses_) when it made a stored response
    // of a previous_response_id chain.
    std::shared_ptr<const TurnWindow> window;
    std::string prompt_key;      // key in prompts_, or ""
    std::string response_key;    // key in responses_, or ""
    std::optional<std::string> instructions;  // that response's request instructions
  };
  // Drops e's fast-path keys (prompts_, responses_) and window. Callers hold mu_.
  void UnlinkLocked(int64_t id, Entry& e);
  // The marks of `e` that stay valid when its log is cut to n tokens and its text becomes `text`.
  static std::vector<TurnMark> MarksWithin(const Entry& e, size_t n, const std::string& text);
  // Brings index_ in step with sessions_[id] after its log or busy flag changed; the log's first
  // `kept` tokens are as the index last saw them (cost: the tokens after `kept`). Callers hold mu_.
  void IndexLocked(int64_t id, size_t kept);
  // The turn planned on session id did not start: the session is idle again (no-op when it is
  // gone). Callers hold mu_.
  void ReleaseLocked(int64_t id);
  // Whether a fork of e could be committed: always without a store, else once the store holds e.
  bool Forkable(const Entry& e) const { return !store_ || e.stored; }
  // What requests may make of e (PrefixIndex::Use): continue or fork it when idle; while a turn
  // runs on it, fork what it committed, if that can be stored.
  PrefixIndex::Use UseOf(const Entry& e) const {
    if (!e.busy) return PrefixIndex::Use::kContinue;
    return Forkable(e) ? PrefixIndex::Use::kFork : PrefixIndex::Use::kNone;
  }
  // Forgets session id (and its client key). Callers hold mu_.
  void ForgetLocked(int64_t id);
  // Forgets the sessions the engine expired (session TTL, max sessions). Callers hold mu_.
  void DropExpiredLocked();

  Engine& engine_;
  Store* store_;
  ServiceConfig config_;
  // Selective context's per-conversation state: IDF statistics and turn embeddings, kept across
  // turns so that each turn is embedded once. Keyed by owner and the conversation's first turn.
  struct ContextState;
  std::mutex ctx_mu_;
  std::unordered_map<std::string, std::shared_ptr<ContextState>> context_;

  std::vector<int32_t> fold_;      // [vocab] token -> its lower-case form's id, or itself (keyword relevance)
  std::vector<int8_t> word_kind_;  // [vocab] 1 starts a word, 0 continues one, -1 in none (keyword relevance)

  std::mutex mu_;
  std::unordered_map<int64_t, Entry> sessions_;                     // by engine session id
  std::unordered_map<std::string, int64_t> keys_;                   // owner + '\n' + key -> session
  PrefixIndex index_;  // sessions_' logs, owners and busy flags, for the longest-prefix match
  std::unordered_map<std::string, int64_t> prompts_;    // owner + '\n' + prompt hash -> session (Entry::window)
  std::unordered_map<std::string, int64_t> responses_;  // owner + '\n' + response id -> session
  bool windows_ = false;  // the template renders windows (TemplateRendersWindows)
  SyncObserver on_sync_;  // SetSyncObserver
  LockObserver on_lock_;  // SetLockObserver
  NoticeObserver on_notice_;  // SetNoticeObserver (guarded by mu_: notices arrive from the start)
  ResyncObserver on_resync_;  // SetResyncObserver (guarded by mu_, as on_notice_)
  std::atomic<int> resyncs_{0};  // times the store's listener began listening (OnStoreChange)
};

}  // namespace mnemo
