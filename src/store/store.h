// The durable store: sessions (raw token logs and turns), Responses API objects and Conversations
// API objects. An interface with two backends, chosen by Store::Open's spec:
//   - a file path: SQLite (sqlite_store.h), the single-node default;
//   - "postgresql://..." or "postgres://...": PostgreSQL through libpq (pg_store.h), which several
//     mnemo replicas can share.
// Both keep the same data with the same semantics; the tests run one suite against both.
//
// Durability contract: once a write call (CommitTurn, AppendTurn, Put..., ...) returns OK, its
// effects survive kill -9 of the process (and, with SQLite's Durability::kFull or PostgreSQL's
// default synchronous_commit, a power loss or OS crash). Every write call is one transaction: on
// an Error nothing of it is applied.
//
// Compare-and-set: a turn appends at `begin`, which must equal the session's stored length (and,
// with TurnCommit::expected_length, the length before a truncation must be what the writer
// expected). When another writer (another replica on a shared PostgreSQL store) moved the session
// first, the write fails with StatusCode::kAborted and changes nothing: the loser must re-read.
//
// Threads: every method may be called from any thread (each backend says how it serializes).
//
// Owners: objects carry an owner string (the API key's hash, "" when auth is off). Lookups by
// (id, owner) treat another owner's object as absent, so callers can answer 404 without leaking
// which ids exist. Session methods take no owner: sessions are the engine's, their ids never leave
// the server.
//
// "Not found" is a value, not an Error: Get* return std::nullopt, Delete*/Update* return false.
// An Error means bad input (a broken invariant) or a database failure (kUnavailable while a
// PostgreSQL server cannot be reached).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace mnemo {

// A fresh id: prefix + 32 lowercase hex digits (128 bits from the kernel's CSPRNG, getrandom(2)).
std::string NewId(std::string_view prefix);

// Routing keys in ids (issue 14): a front (HAProxy) hashes a key to pick the replica that holds a
// conversation. An id minted with a key reads prefix + key + "_" + 32 hex digits, e.g.
// "resp_k3f9_<32 hex>": still 128 random bits, and every id of a chain carries the same key, so
// every later turn hashes to the same replica. A key is 1..16 characters of [A-Za-z0-9].
constexpr size_t kMaxAffinityKey = 16;
// prefix + key + "_" + 32 hex, or NewId(prefix) when key is empty. key must be sanitised.
std::string NewId(std::string_view prefix, std::string_view key);
// A client-supplied key made safe: its [A-Za-z0-9] characters, at most the first 16 of them.
std::string SanitizeAffinityKey(std::string_view raw);
// The key an id carries ("" for an id minted without one, or not minted by mnemo).
std::string AffinityKeyOf(std::string_view id);

// The turn lock (Store::TryLockTurn) of a conversation that has no session yet: its first turns
// take it, as later turns take their session's, so that two first turns (on two replicas, or two
// requests on one) do not both start the conversation (issue 14). Negative, so never a session's:
// -1 - (XXH3-64 of the id, top bit cleared).
int64_t ConversationLockId(std::string_view conversation_id);

// Wall clock, unix seconds (what the store writes into created_at / updated_at).
double UnixNow();

enum class Durability {
  kFull,    // fsync the WAL at every commit: survives kill -9 and power loss
  kNormal,  // fsync at checkpoints only: survives kill -9; a power loss may drop recent commits
};

struct StoreOptions {
  Durability durability = Durability::kFull;  // SQLite; PostgreSQL follows the server's settings
  int busy_timeout_ms = 5000;     // SQLite: wait this long for a lock held by another process
  bool check_integrity = true;    // SQLite: PRAGMA quick_check at open (linear in the file size)
  int pg_connections = 4;         // PostgreSQL: connections in the pool (1..64)
  int pg_connect_timeout_s = 5;   // PostgreSQL: give up connecting after this long
};

// ---- sessions ----

struct StoredTurn {
  int64_t begin = 0;       // first position of the turn's prompt tokens in the session log
  int64_t prompt_end = 0;  // first generated position (begin <= prompt_end <= end)
  int64_t end = 0;         // one past the turn's last position
  bool complete = true;    // false: cut short (client disconnect, cancel, or truncated mid-turn)
};

struct StoredSession {
  int64_t id = 0;               // engine session id
  std::string owner;            // API key hash, "" when auth is off
  double created_at = 0;        // unix seconds
  double updated_at = 0;        // unix seconds, last write to the session
  std::vector<int32_t> tokens;  // [n_tokens] raw token log
  std::vector<StoredTurn> turns;  // in order; they tile [0, tokens.size())
  int64_t cuts = 0;             // SessionVersion::cuts
};

// What a replica compares its copy of a session with before a turn (issue 14). Appends only grow
// the log; every truncation that drops tokens bumps `cuts`. So a copy read at (n, cuts) is a
// prefix of the stored log while cuts is unchanged and n_tokens >= n, and has diverged when cuts
// changed (or n_tokens < n).
struct SessionVersion {
  int64_t n_tokens = 0;  // log length
  int64_t cuts = 0;      // truncations that dropped tokens since the session was created
};

// A change another process sharing the store committed to a session (Store::Watch).
struct SessionChange {
  int64_t id = 0;                          // the session (0 with `resync`)
  // The listener began listening (at start, or again after its connection dropped): changes made
  // while it was not listening were not told, so every copy held may be stale (no other field set).
  bool resync = false;
  std::optional<SessionVersion> version;   // as stored after the change; nullopt: deleted
  double sent_at = 0;                      // unix seconds, the writer's clock, just before its commit
};

// ---- the prefix index (issue 14) ----

// A stateless chat request names no session: it resends its history. To find the stored session
// whose log that history continues, on a replica that does not hold it, the store marks every
// session's log at each full chunk of kPrefixChunk tokens with a hash of the owner and of the
// tokens up to there, chained: mark k (0-based, covering tokens [0, 32(k+1))) is
//   h_k = XXH3-64(chunk k's token ids, seed h_{k-1}),   h_{-1} = PrefixSeed(owner).
// Chained, a mark costs hashing its own 32 tokens, so a commit marks only the chunks its turn
// completes. The marks are written in the transaction that changes the log (a turn's append, a
// truncation drops the marks past it, a fork copies those within it) and are never the truth:
// a session found by its marks is compared token by token with the request before it is used, so
// a 64-bit collision can cost a wasted load, never a wrong answer.
constexpr int64_t kPrefixChunk = 32;
// The chain's seed: another owner's identical log has other marks.
uint64_t PrefixSeed(const std::string& owner);
// The marks of the full chunks of `tokens`, which begin right after a mark `seed` (PrefixSeed
// for tokens from position 0): [tokens.size() / kPrefixChunk] hashes. Cost: one XXH3 pass.
std::vector<uint64_t> PrefixHashes(uint64_t seed, std::span<const int32_t> tokens);

// Short logs: a log of n < kPrefixChunk tokens completes no chunk, so a write that leaves it there
// marks it at n instead, with the hash chunk 0 would have over those n tokens:
//   s_n = XXH3-64(tokens [0, n), seed PrefixSeed(owner)).
// So a short chat history (a turn or two of a few words) finds its session after a failover too.
// They are no links of the chain (the first full mark chains from the seed, not from them); like
// the full marks they are dropped by a truncation below them and copied by a fork that keeps them.
// The request's side: [min(tokens.size(), kPrefixChunk - 1)] hashes, s_1, s_2, ... (Cost: hashing
// at most 31 prefixes of at most 31 tokens.)
std::vector<uint64_t> ShortPrefixHashes(uint64_t seed, std::span<const int32_t> tokens);

// The session whose marks match a request's longest (Store::FindPrefix).
struct PrefixMatch {
  int64_t session_id = 0;
  int64_t n_tokens = 0;        // tokens matched: a multiple of kPrefixChunk, or under one (a short mark)
  int64_t session_tokens = 0;  // the session's log length
};

// ---- responses ----

struct StoredResponse {
  std::string id;                                   // "resp_" + 32 hex
  std::string owner;                                // API key hash, "" when auth is off
  std::optional<int64_t> session_id;                // session holding its tokens; empty once that
                                                    // session is deleted or truncated below end_token
  int64_t end_token = 0;                            // session log length right after this response
  double created_at = 0;                            // unix seconds
  std::string model;                                // model name as served
  std::string status;                               // "completed", "incomplete", "failed", ...
  std::optional<std::string> previous_response_id;  // the response it continued, if any
  std::optional<std::string> conversation_id;       // the conversation it belongs to, if any
  std::string request_json;                         // the request body (JSON text)
  std::string input_items_json;                     // JSON array of the input items
  std::string output_json;                          // JSON array of the output items
  std::string usage_json;                           // JSON object of the usage block
};

// One response of a previous_response_id chain: the fields a next turn reads.
struct ResponseLink {
  std::string id;
  std::optional<int64_t> session_id;                // as StoredResponse
  int64_t end_token = 0;                            // as StoredResponse
  std::optional<std::string> previous_response_id;  // the next link back, if any
  std::string input_items_json;                     // JSON array of the input items
  std::string output_json;                          // JSON array of the output items
};

// ---- conversations ----

struct StoredConversation {
  std::string id;                     // "conv_" + 32 hex
  std::string owner;                  // API key hash, "" when auth is off
  double created_at = 0;              // unix seconds
  std::string metadata_json = "{}";   // JSON object
  std::optional<int64_t> session_id;  // session currently holding its tokens, if any
  std::optional<int64_t> end_token;   // that session's log length where the conversation ends
};

// An item to add to a conversation. An empty id gets NewId("msg_") when item_json's "type" is
// "message" (or absent), else NewId("item_"); item_json is stored as given. Item ids are unique
// within their conversation only (another conversation, of any owner, may use the same id); adding
// one the conversation already has fails with kAlreadyExists.
struct NewItem {
  std::string id;         // "msg_..."/"item_...", or "" to have one assigned
  std::string item_json;  // one item (JSON object text)
};

struct StoredItem {
  std::string id;          // item id
  int64_t position = 0;    // order within its list (conversation position / input index)
  std::string item_json;   // the item (JSON object text)
  double created_at = 0;   // unix seconds (input items: their response's created_at)
};

struct ListOptions {
  bool ascending = true;  // order by position
  std::string after;      // cursor: an item id of this list; "" = from the start
  int limit = 20;         // 1..10000 items per page
};

struct ItemPage {
  std::vector<StoredItem> items;
  bool has_more = false;  // more items follow the last one in this order
};

// ---- request-id de-duplication (X-Mnemo-Request-Id, docs/api.md) ----

// What a turn's request was answered with, recorded with the turn in one transaction, so that a
// retry of the request (same owner and request id) is answered from it instead of adding a turn.
// Keyed by (owner, request_id): ids are scoped per owner, like every other id.
struct StoredRequest {
  std::string owner;       // API key hash, "" when auth is off
  std::string request_id;  // the client's id: 1..128 printable ASCII characters
  std::string body_hash;   // hash of what was asked (route and body): tells a retry from a reuse
  int status = 200;        // the answer's HTTP status
  std::string body;        // the answer's body (JSON text)
  double created_at = 0;   // unix seconds; 0 = now
  double expires_at = 0;   // unix seconds; from then on the record is as absent (ExpireRequests deletes it)
};

// ---- the atomic commit of a finished turn ----

// Where a conversation's tokens end: StoredConversation's session_id and end_token (both empty
// before its first turn commits).
struct ConversationPointer {
  std::optional<int64_t> session_id;
  std::optional<int64_t> end_token;
  bool operator==(const ConversationPointer&) const = default;
};

// What a conversation gains when a turn is committed into it.
struct ConversationUpdate {
  std::string conversation_id;  // must exist
  std::vector<NewItem> items;   // appended in order (the turn's input and output items)
  bool set_session = true;      // point the conversation at (session_id, turn end)
  // Compare-and-set: when set, the conversation must still point where this writer read it, else
  // kAborted and nothing of the commit is applied: another turn of the conversation committed in
  // between (the turn lock orders them; this guards a lock lost with its connection, and first
  // turns, which each create a session of their own and so pass the session's compare-and-set).
  std::optional<ConversationPointer> expected;
};

// Everything a finished (or cut-short) turn writes, applied in one transaction by CommitTurn.
struct TurnCommit {
  int64_t session_id = 0;
  bool create_session = false;         // create the session (with owner) first
  std::string owner;                   // the new session's owner (only with create_session)
  std::optional<int64_t> truncate_to;  // branch: truncate the log to this length first
  int64_t begin = 0;                   // == log length (after truncation)
  int64_t prompt_end = 0;              // begin <= prompt_end <= begin + tokens.size()
  std::span<const int32_t> tokens;     // [end - begin] the turn's prompt and generated tokens
  bool complete = true;                // false: cut short
  // Compare-and-set: when set, the session's stored length before truncation must be this, else
  // kAborted (another writer moved the session). begin == stored length is always checked.
  std::optional<int64_t> expected_length;
  // And its cut count (SessionVersion::cuts) must be this: a log cut and regrown to the same
  // length by another writer is not the one this writer appends to. kAborted otherwise.
  std::optional<int64_t> expected_cuts;
  // The response object; CommitTurn fills in its session_id and end_token (= begin + tokens.size()).
  std::optional<StoredResponse> response;
  std::optional<ConversationUpdate> conversation;
  // Recorded with the turn (request-id de-duplication): when a live record of (owner, request_id)
  // exists already (another attempt of the same request committed first, on any replica sharing
  // the store), the commit fails with kAlreadyExists and nothing of it is applied. An expired
  // record of that key is replaced.
  std::optional<StoredRequest> request;
};

class Store {
 public:
  // Opens the store named by spec ("postgresql://..." / "postgres://...": PostgreSQL; anything
  // else: a SQLite file path), creating and migrating its schema to the current version. Errors:
  // SQLite: unwritable path or file, a file that is not a SQLite database, a corrupt database, a
  // SQLite database that is not a mnemo store, or one written by a newer mnemo. PostgreSQL: a
  // malformed URL, a server that cannot be reached (kUnavailable), a schema of a newer mnemo.
  static Result<std::unique_ptr<Store>> Open(const std::string& spec, const StoreOptions& options = {});
  static bool IsPostgresSpec(const std::string& spec);
  virtual ~Store() = default;
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  static constexpr int kSchemaVersion = 5;
  // What the store was opened with, for logs (a PostgreSQL URL without its password).
  const std::string& path() const { return path_; }
  // True when several processes may write the store at once (PostgreSQL): session ids then come
  // from NewSessionId, not from one process's counter.
  virtual bool shared() const { return false; }
  // A session id no other process sharing this store will mint (a PostgreSQL sequence). Errors:
  // a store that is not shared (kFailedPrecondition), the database is unreachable (kUnavailable).
  virtual Result<int64_t> NewSessionId();
  // Whether a commit can be expected to succeed now, checked before a turn's work is spent (the
  // server answers 503 storage_unavailable rather than generate tokens it could not keep). SQLite:
  // kUnavailable when the file system holding the database has under kMinFreeBytes free (a full
  // disk fails every commit). Cost: one statvfs. The message names the path: for logs only.
  static constexpr uint64_t kMinFreeBytes = 16u << 20;
  virtual Status CheckWritable() { return {}; }

  // ---- sessions ----
  // Errors: id exists, id <= 0.
  virtual Status CreateSession(int64_t id, const std::string& owner) = 0;
  // Appends one turn: tokens are positions [begin, begin + tokens.size()). Errors: unknown
  // session, begin != current log length, empty tokens, prompt_end outside [begin, end].
  virtual Status AppendTurn(int64_t id, int64_t begin, int64_t prompt_end, std::span<const int32_t> tokens,
                    bool complete) = 0;
  // Drops tokens and turns at positions >= n_tokens; a turn straddling n_tokens is cut there (and
  // marked incomplete). Responses and conversations pointing into the dropped part lose their
  // session pointer (session_id becomes empty). Errors: unknown session, n_tokens > length or < 0.
  virtual Status TruncateSession(int64_t id, int64_t n_tokens) = 0;
  // A new session dst holding the first n_tokens of src (turns cut as in TruncateSession).
  virtual Status ForkSession(int64_t src, int64_t dst, int64_t n_tokens, const std::string& owner) = 0;
  // Deletes the session; responses and conversations pointing at it lose their session pointer.
  // Error when unknown.
  virtual Status DeleteSession(int64_t id) = 0;
  virtual Result<StoredSession> LoadSession(int64_t id) = 0;  // Error when unknown
  // The session's length and cut count, nullopt when it is absent. Cost: one primary-key probe
  // (what a replica on a shared store pays per turn to know its copy is fresh).
  virtual Result<std::optional<SessionVersion>> GetSessionVersion(int64_t id) = 0;
  // Calls fn for every session in id order, from one consistent snapshot; stops at fn's first
  // Error and returns it. Holds the read connection for the whole scan: fn must not call the
  // store's read methods (writes from fn are fine but are not seen by the scan).
  virtual Status ForEachSession(const std::function<Status(StoredSession&&)>& fn) = 0;
  Result<std::vector<StoredSession>> LoadSessions();  // all of them, in id order (ForEachSession)
  // The highest session id ever created (deleted ones included), 0 when none: new ids must be above.
  virtual Result<int64_t> MaxSessionId() = 0;
  // What the stored token logs mean: a hash of the vocabulary and chat template they were made with
  // (Service), nullopt in a store that has none yet. Sessions made under another identity are
  // token ids of another vocabulary and must not be restored.
  virtual Result<std::optional<int64_t>> TokenIdentity() = 0;
  virtual Status SetTokenIdentity(int64_t identity) = 0;
  // Deletes every session (as DeleteSession does each); returns how many there were.
  virtual Result<int64_t> DeleteAllSessions() = 0;
  // Whether any session is stored. Cost: one index probe.
  virtual Result<bool> HasSessions() = 0;
  // What ClaimTokenIdentity found.
  enum class IdentityClaim {
    kSame,         // the store already had this identity
    kClaimed,      // it had none, or another with no session stored: now it has this one
    kHeldByOther,  // another identity, with sessions stored: nothing changed
  };
  // Makes `identity` the store's token identity unless sessions made under another identity are
  // stored (TokenIdentity). A replica on a shared store must never delete or rewrite another
  // model's sessions: kHeldByOther tells it to stop. PostgreSQL checks and writes in one
  // transaction under an advisory lock, so replicas of two models starting together on an empty
  // store cannot both claim it. (This default: TokenIdentity, HasSessions, SetTokenIdentity, for
  // a store with one writer process.)
  virtual Result<IdentityClaim> ClaimTokenIdentity(int64_t identity);

  // ---- several processes on one store (issue 14) ----
  // A session's turn lock: a replica holds it while a turn continues the stored session, from
  // before its freshness probe until the commit, so that a continuation reaching another replica
  // waits for that commit instead of computing a turn that loses the compare-and-set. true: this
  // process holds it now, until UnlockTurn; false: another process (or another turn of this one)
  // holds it. PostgreSQL: a session-level advisory lock on a connection of its own, which the
  // server releases when that connection drops (a replica killed mid-turn holds nothing). A
  // lock lost with its connection is not re-taken: the compare-and-set stays the guard. This
  // SQLite (one process): the same lock within the process (turns of one conversation on two
  // request threads), held in memory. This default: always true.
  // Cost: one round trip (PostgreSQL), a mutex (SQLite). Errors: kUnavailable.
  // Any id may be locked: ConversationLockId's (negative) name a conversation with no session yet.
  virtual Result<bool> TryLockTurn(int64_t id) { (void)id; return true; }
  virtual void UnlockTurn(int64_t id) { (void)id; }
  // Calls fn, on a thread of the store's, for each change that another process sharing the store
  // commits to a session (a turn, a truncation, a deletion; not a creation or a fork), soon after
  // its commit (PostgreSQL: LISTEN/NOTIFY on channel mnemo_sessions, reconnecting with backoff).
  // A hint, never the truth: changes made while the listener was disconnected are not told; each
  // time it (re)starts listening fn gets a SessionChange with `resync` instead.
  // Watch(nullptr) stops the calls; once it returns, fn runs no more. This default: never calls.
  virtual void Watch(std::function<void(const SessionChange&)> fn) { (void)fn; }
  // Whether Watch's listener is connected and listening (tests wait for it).
  virtual bool Watching() const { return false; }

  // ---- the prefix index (issue 14) ----
  // Of owner's sessions, the one whose marks match the most of `hashes` (PrefixHashes(
  // PrefixSeed(owner), the request's tokens)): the largest k with hashes[k - 1] a mark of that
  // session at k * kPrefixChunk tokens; among sessions matching as many, the highest id. When no
  // chunk matches: the largest p with short_hashes[p - 1] (ShortPrefixHashes) a short mark at p
  // tokens; else nullopt. Another owner's session never matches (its owner is
  // checked, not only its seed; on PostgreSQL a chunk whose newest session belongs to another
  // owner, a 64-bit collision of chains, ends the search with nullopt). Cost: one index probe per
  // mark from the longest down, stopping at the first match (PostgreSQL: in one statement;
  // SQLite: one probe each).
  virtual Result<std::optional<PrefixMatch>> FindPrefix(const std::string& owner, std::span<const uint64_t> hashes,
                                                        std::span<const uint64_t> short_hashes) = 0;

  // ---- the durable end of a turn ----
  // Applies c in one transaction: optional session creation, optional truncation, the turn's
  // append, the response row, the conversation's items and session pointer. Returns the ids of
  // the conversation items added (empty without a conversation). Durable when it returns OK.
  virtual Result<std::vector<std::string>> CommitTurn(const TurnCommit& c) = 0;

  // ---- responses ----
  // Inserts r (r.created_at == 0 means now). Errors: id exists, unknown session or conversation.
  virtual Status PutResponse(const StoredResponse& r) = 0;
  virtual Result<std::optional<StoredResponse>> GetResponse(const std::string& id, const std::string& owner) = 0;
  // The previous_response_id chain from id back, newest first, at most max_links responses: what
  // following GetResponse hop by hop gives, in one query (a recursive CTE over the primary key). It
  // ends at the first link that is absent (deleted, or another owner's); empty when id itself is.
  // Links carry what a next turn needs (ResponseLink), not the request or usage JSON.
  // Cost: one statement, O(links) primary-key probes.
  virtual Result<std::vector<ResponseLink>> GetResponseChain(const std::string& id, const std::string& owner, int max_links) = 0;
  virtual Result<bool> DeleteResponse(const std::string& id, const std::string& owner) = 0;
  // Pages through the response's input items (input_items_json, a JSON array); an item's id is
  // its "id" member ("" if it has none, such items cannot serve as `after`). nullopt when the
  // response is absent. Errors: `after` names no item of the list, malformed stored JSON.
  virtual Result<std::optional<ItemPage>> ListInputItems(const std::string& id, const std::string& owner,
                                                 const ListOptions& options) = 0;

  // ---- request-id de-duplication ----
  // The live record of (owner, request_id) (expires_at still ahead), or nullopt.
  // Cost: one primary-key probe.
  virtual Result<std::optional<StoredRequest>> GetRequest(const std::string& owner, const std::string& request_id) = 0;
  // Deletes the records whose expires_at <= now; returns how many. Cost: an index range scan.
  virtual Result<int64_t> ExpireRequests(double now) = 0;

  // ---- conversations ----
  // Inserts c (c.id "" gets NewId("conv_"); created_at 0 means now) with its initial items;
  // returns the stored conversation and fills *item_ids (if given) with the items' ids.
  virtual Result<StoredConversation> CreateConversation(StoredConversation c, std::span<const NewItem> items,
                                                std::vector<std::string>* item_ids = nullptr) = 0;
  virtual Result<std::optional<StoredConversation>> GetConversation(const std::string& id,
                                                            const std::string& owner) = 0;
  virtual Result<bool> UpdateConversationMetadata(const std::string& id, const std::string& owner,
                                          const std::string& metadata_json) = 0;
  virtual Result<bool> DeleteConversation(const std::string& id, const std::string& owner) = 0;  // and its items
  // Appends items after the last one; nullopt when the conversation is absent.
  virtual Result<std::optional<std::vector<std::string>>> AddConversationItems(const std::string& id,
                                                                       const std::string& owner,
                                                                       std::span<const NewItem> items) = 0;
  // nullopt when the conversation is absent. Errors: `after` names no item of the conversation.
  virtual Result<std::optional<ItemPage>> ListConversationItems(const std::string& id, const std::string& owner,
                                                        const ListOptions& options) = 0;
  virtual Result<std::optional<StoredItem>> GetConversationItem(const std::string& id, const std::string& owner,
                                                        const std::string& item_id) = 0;
  virtual Result<bool> DeleteConversationItem(const std::string& id, const std::string& owner,
                                      const std::string& item_id) = 0;
  // Points the conversation at (session_id, end_token), or clears the pointer (session_id empty).
  // Returns false when the conversation is absent. Errors: unknown session.
  virtual Result<bool> SetConversationSession(const std::string& id, std::optional<int64_t> session_id,
                                      std::optional<int64_t> end_token) = 0;

 protected:
  Store() = default;
  std::string path_;
};

}  // namespace mnemo
