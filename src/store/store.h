// The durable store: sessions (raw token logs and turns), Responses API objects and Conversations
// API objects, in one SQLite database file.
//
// Durability contract: once a write call (CommitTurn, AppendTurn, Put..., ...) returns OK, its
// effects survive kill -9 of the process, and with Durability::kFull (the default) also a power
// loss or OS crash. Every write call is one transaction: on an Error nothing of it is applied.
//
// Durability choice: the database runs in WAL mode. A commit appends its pages to the -wal file
// with write(2) before returning, so even without fsync the data is in the OS page cache and a
// kill -9 of this process cannot lose it. kFull adds synchronous=FULL: the WAL is fsynced at every
// commit (one fsync per CommitTurn: ~3.5 ms mean on the dev VM's disk, against ~0.3 ms without;
// small next to a turn's generation time) so an OS crash or power loss cannot lose it
// either; kNormal (synchronous=NORMAL) fsyncs only at checkpoints: faster, still kill -9 safe, but a
// power loss may drop the last commits (the database stays consistent).
//
// Threads: every method may be called from any thread. The store holds two connections: one for
// writes and one for reads, each behind its own mutex. Writes are serialized; reads run beside a
// write (WAL readers never wait for the writer) and see every write that returned before they began.
//
// Owners: objects carry an owner string (the API key's hash, "" when auth is off). Lookups by
// (id, owner) treat another owner's object as absent, so callers can answer 404 without leaking
// which ids exist. Session methods take no owner: sessions are the engine's, their ids never leave
// the server.
//
// "Not found" is a value, not an Error: Get* return std::nullopt, Delete*/Update* return false.
// An Error means bad input (a broken invariant) or a database failure.
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

namespace sqlite {
class Db;
}

// A fresh id: prefix + 32 lowercase hex digits (128 bits from the kernel's CSPRNG, getrandom(2)).
std::string NewId(std::string_view prefix);

// Wall clock, unix seconds (what the store writes into created_at / updated_at).
double UnixNow();

enum class Durability {
  kFull,    // fsync the WAL at every commit: survives kill -9 and power loss
  kNormal,  // fsync at checkpoints only: survives kill -9; a power loss may drop recent commits
};

struct StoreOptions {
  Durability durability = Durability::kFull;
  int busy_timeout_ms = 5000;     // wait this long for a lock held by another process
  bool check_integrity = true;    // PRAGMA quick_check at open (linear in the file size)
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

// ---- the atomic commit of a finished turn ----

// What a conversation gains when a turn is committed into it.
struct ConversationUpdate {
  std::string conversation_id;  // must exist
  std::vector<NewItem> items;   // appended in order (the turn's input and output items)
  bool set_session = true;      // point the conversation at (session_id, turn end)
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
  // The response object; CommitTurn fills in its session_id and end_token (= begin + tokens.size()).
  std::optional<StoredResponse> response;
  std::optional<ConversationUpdate> conversation;
};

class Store {
 public:
  // Opens or creates the database at path and migrates its schema to the current version. Errors:
  // unwritable path or file, a file that is not a SQLite database, a corrupt database, a SQLite
  // database that is not a mnemo store, or one written by a newer mnemo.
  static Result<std::unique_ptr<Store>> Open(const std::string& path, const StoreOptions& options = {});
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  static constexpr int kSchemaVersion = 2;
  const std::string& path() const { return path_; }

  // ---- sessions ----
  // Errors: id exists, id <= 0.
  Status CreateSession(int64_t id, const std::string& owner);
  // Appends one turn: tokens are positions [begin, begin + tokens.size()). Errors: unknown
  // session, begin != current log length, empty tokens, prompt_end outside [begin, end].
  Status AppendTurn(int64_t id, int64_t begin, int64_t prompt_end, std::span<const int32_t> tokens,
                    bool complete);
  // Drops tokens and turns at positions >= n_tokens; a turn straddling n_tokens is cut there (and
  // marked incomplete). Responses and conversations pointing into the dropped part lose their
  // session pointer (session_id becomes empty). Errors: unknown session, n_tokens > length or < 0.
  Status TruncateSession(int64_t id, int64_t n_tokens);
  // A new session dst holding the first n_tokens of src (turns cut as in TruncateSession).
  Status ForkSession(int64_t src, int64_t dst, int64_t n_tokens, const std::string& owner);
  // Deletes the session; responses and conversations pointing at it lose their session pointer.
  // Error when unknown.
  Status DeleteSession(int64_t id);
  Result<StoredSession> LoadSession(int64_t id);  // Error when unknown
  // Calls fn for every session in id order, from one consistent snapshot; stops at fn's first
  // Error and returns it. Holds the read connection for the whole scan: fn must not call the
  // store's read methods (writes from fn are fine but are not seen by the scan).
  Status ForEachSession(const std::function<Status(StoredSession&&)>& fn);
  Result<std::vector<StoredSession>> LoadSessions();  // all of them, in id order
  // The highest session id ever created (deleted ones included), 0 when none: new ids must be above.
  Result<int64_t> MaxSessionId();
  // What the stored token logs mean: a hash of the vocabulary and chat template they were made with
  // (Service), nullopt in a store that has none yet. Sessions made under another identity are
  // token ids of another vocabulary and must not be restored.
  Result<std::optional<int64_t>> TokenIdentity();
  Status SetTokenIdentity(int64_t identity);
  // Deletes every session (as DeleteSession does each); returns how many there were.
  Result<int64_t> DeleteAllSessions();

  // ---- the durable end of a turn ----
  // Applies c in one transaction: optional session creation, optional truncation, the turn's
  // append, the response row, the conversation's items and session pointer. Returns the ids of
  // the conversation items added (empty without a conversation). Durable when it returns OK.
  Result<std::vector<std::string>> CommitTurn(const TurnCommit& c);

  // ---- responses ----
  // Inserts r (r.created_at == 0 means now). Errors: id exists, unknown session or conversation.
  Status PutResponse(const StoredResponse& r);
  Result<std::optional<StoredResponse>> GetResponse(const std::string& id, const std::string& owner);
  // The previous_response_id chain from id back, newest first, at most max_links responses: what
  // following GetResponse hop by hop gives, in one query (a recursive CTE over the primary key). It
  // ends at the first link that is absent (deleted, or another owner's); empty when id itself is.
  // Links carry what a next turn needs (ResponseLink), not the request or usage JSON.
  // Cost: one statement, O(links) primary-key probes.
  Result<std::vector<ResponseLink>> GetResponseChain(const std::string& id, const std::string& owner, int max_links);
  Result<bool> DeleteResponse(const std::string& id, const std::string& owner);
  // Pages through the response's input items (input_items_json, a JSON array); an item's id is
  // its "id" member ("" if it has none, such items cannot serve as `after`). nullopt when the
  // response is absent. Errors: `after` names no item of the list, malformed stored JSON.
  Result<std::optional<ItemPage>> ListInputItems(const std::string& id, const std::string& owner,
                                                 const ListOptions& options);

  // ---- conversations ----
  // Inserts c (c.id "" gets NewId("conv_"); created_at 0 means now) with its initial items;
  // returns the stored conversation and fills *item_ids (if given) with the items' ids.
  Result<StoredConversation> CreateConversation(StoredConversation c, std::span<const NewItem> items,
                                                std::vector<std::string>* item_ids = nullptr);
  Result<std::optional<StoredConversation>> GetConversation(const std::string& id,
                                                            const std::string& owner);
  Result<bool> UpdateConversationMetadata(const std::string& id, const std::string& owner,
                                          const std::string& metadata_json);
  Result<bool> DeleteConversation(const std::string& id, const std::string& owner);  // and its items
  // Appends items after the last one; nullopt when the conversation is absent.
  Result<std::optional<std::vector<std::string>>> AddConversationItems(const std::string& id,
                                                                       const std::string& owner,
                                                                       std::span<const NewItem> items);
  // nullopt when the conversation is absent. Errors: `after` names no item of the conversation.
  Result<std::optional<ItemPage>> ListConversationItems(const std::string& id, const std::string& owner,
                                                        const ListOptions& options);
  Result<std::optional<StoredItem>> GetConversationItem(const std::string& id, const std::string& owner,
                                                        const std::string& item_id);
  Result<bool> DeleteConversationItem(const std::string& id, const std::string& owner,
                                      const std::string& item_id);
  // Points the conversation at (session_id, end_token), or clears the pointer (session_id empty).
  // Returns false when the conversation is absent. Errors: unknown session.
  Result<bool> SetConversationSession(const std::string& id, std::optional<int64_t> session_id,
                                      std::optional<int64_t> end_token);

 private:
  Store() = default;
  // Bodies of the write operations; the caller holds write_mu_ and an open write transaction.
  Status CreateSessionTx(int64_t id, const std::string& owner, double now);
  Status AppendTurnTx(int64_t id, int64_t begin, int64_t prompt_end, std::span<const int32_t> tokens,
                      bool complete, double now);
  Status TruncateSessionTx(int64_t id, int64_t n_tokens, double now);
  Status PutResponseTx(const StoredResponse& r);
  Result<std::vector<std::string>> AddItemsTx(const std::string& conversation_id,
                                              std::span<const NewItem> items, double now);
  Result<int64_t> SessionLength(sqlite::Db& db, int64_t id);  // Error when unknown
  Status LoadTurns(sqlite::Db& db, int64_t id, StoredSession& s);

  std::string path_;
  std::mutex write_mu_;                 // guards writer_
  std::unique_ptr<sqlite::Db> writer_;  // every write goes through this connection
  std::mutex read_mu_;                  // guards reader_
  std::unique_ptr<sqlite::Db> reader_;  // query_only connection for reads
};

}  // namespace mnemo
