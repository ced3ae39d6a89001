// The PostgreSQL backend of the store (libpq, plain parameterised SQL): the shared source of truth
// when several mnemo replicas serve one set of conversations (issue 14).
//
// Beyond the SQLite backend's semantics (store.h):
//   - Compare-and-set commits: CommitTurn and AppendTurn lock the session's row (SELECT ... FOR
//     UPDATE) and check its stored length; a writer that lost the race gets kAborted and nothing
//     of its transaction is applied, so two replicas can never both append to one session.
//   - Cluster-wide session ids: NewSessionId draws from the sequence mnemo_session_ids, so ids
//     minted by different replicas never collide (shared() is true).
//   - The schema is created or migrated at open, under an advisory lock, so replicas starting
//     together do it once.
//   - A session's turn lock (TryLockTurn): a session-level advisory lock on one connection kept
//     for locks alone (advisory locks belong to a connection; the pool hands its connections to
//     any caller), so the server releases a replica's locks when that replica dies.
//   - Change notices (Watch): every write to an existing session NOTIFYs channel mnemo_sessions in
//     its transaction (delivered at commit, never on a rollback) with the payload
//     "<origin> <session id> <n_tokens> <cuts> <unix time>" ("deleted" for n_tokens and cuts once
//     deleted); origin is random per store object, so a store never tells its own changes. A
//     background thread LISTENs on a connection of its own (pg_listen.h).
//   - Connections: a pool of StoreOptions::pg_connections, opened on demand. A connection that
//     dropped (server restart, network) is re-established on next use; while the server is down
//     calls fail with kUnavailable (HTTP 503), never a crash.
//
// Durability: a write returns after PostgreSQL committed it (synchronous_commit=on, the server's
// default: WAL flushed). Durability::kNormal sets synchronous_commit=off on mnemo's connections:
// a crash of the database server may then lose the last commits (never a crash of mnemo).
//
// Threads: every method may be called from any thread; calls run on pooled connections in
// parallel, and PostgreSQL's row locks order the writes.
#pragma once

#include <deque>
#include <memory>
#include <mutex>
#include <set>

#include "store/store.h"

namespace mnemo {

namespace pg {
class Conn;
class Listener;
class Pool;
}  // namespace pg

class PgStore final : public Store {
 public:
  // url: a libpq connection URI, "postgresql://user[:password]@host[:port]/dbname[?options]".
  static Result<std::unique_ptr<Store>> Open(const std::string& url, const StoreOptions& options);
  ~PgStore() override;

  bool shared() const override { return true; }
  // Ids are drawn from the sequence kIdBlock at a time (one round trip per kIdBlock sessions).
  Result<int64_t> NewSessionId() override;
  static constexpr int kIdBlock = 16;

  Status CreateSession(int64_t id, const std::string& owner) override;
  Status AppendTurn(int64_t id, int64_t begin, int64_t prompt_end, std::span<const int32_t> tokens,
                    bool complete) override;
  Status TruncateSession(int64_t id, int64_t n_tokens) override;
  Status ForkSession(int64_t src, int64_t dst, int64_t n_tokens, const std::string& owner) override;
  Status DeleteSession(int64_t id) override;
  Result<StoredSession> LoadSession(int64_t id) override;
  Result<std::optional<SessionVersion>> GetSessionVersion(int64_t id) override;
  Status ForEachSession(const std::function<Status(StoredSession&&)>& fn) override;
  Result<int64_t> MaxSessionId() override;
  Result<std::optional<int64_t>> TokenIdentity() override;
  Status SetTokenIdentity(int64_t identity) override;
  Result<std::optional<PrefixMatch>> FindPrefix(const std::string& owner, std::span<const uint64_t> hashes,
                                                std::span<const uint64_t> short_hashes) override;
  Result<bool> TryLockTurn(int64_t id) override;
  void UnlockTurn(int64_t id) override;
  void Watch(std::function<void(const SessionChange&)> fn) override;
  bool Watching() const override;
  static constexpr const char* kChannel = "mnemo_sessions";
  Result<int64_t> DeleteAllSessions() override;
  Result<bool> HasSessions() override;
  Result<IdentityClaim> ClaimTokenIdentity(int64_t identity) override;
  Result<std::vector<std::string>> CommitTurn(const TurnCommit& c) override;
  Status PutResponse(const StoredResponse& r) override;
  Result<std::optional<StoredResponse>> GetResponse(const std::string& id, const std::string& owner) override;
  Result<std::vector<ResponseLink>> GetResponseChain(const std::string& id, const std::string& owner, int max_links) override;
  Result<bool> DeleteResponse(const std::string& id, const std::string& owner) override;
  Result<std::optional<ItemPage>> ListInputItems(const std::string& id, const std::string& owner,
                                                 const ListOptions& options) override;
  Result<std::optional<StoredRequest>> GetRequest(const std::string& owner, const std::string& request_id) override;
  Result<int64_t> ExpireRequests(double now) override;
  Result<StoredConversation> CreateConversation(StoredConversation c, std::span<const NewItem> items,
                                                std::vector<std::string>* item_ids) override;
  Result<std::optional<StoredConversation>> GetConversation(const std::string& id,
                                                            const std::string& owner) override;
  Result<bool> UpdateConversationMetadata(const std::string& id, const std::string& owner,
                                          const std::string& metadata_json) override;
  Result<bool> DeleteConversation(const std::string& id, const std::string& owner) override;
  Result<std::optional<std::vector<std::string>>> AddConversationItems(const std::string& id,
                                                                       const std::string& owner,
                                                                       std::span<const NewItem> items) override;
  Result<std::optional<ItemPage>> ListConversationItems(const std::string& id, const std::string& owner,
                                                        const ListOptions& options) override;
  Result<std::optional<StoredItem>> GetConversationItem(const std::string& id, const std::string& owner,
                                                        const std::string& item_id) override;
  Result<bool> DeleteConversationItem(const std::string& id, const std::string& owner,
                                      const std::string& item_id) override;
  Result<bool> SetConversationSession(const std::string& id, std::optional<int64_t> session_id,
                                      std::optional<int64_t> end_token) override;

 private:
  PgStore() = default;
  // Bodies of the write operations; they run inside the caller's transaction on c.
  static Status CreateSessionTx(pg::Conn& c, int64_t id, const std::string& owner, double now);
  static Status AppendTurnTx(pg::Conn& c, int64_t id, int64_t begin, int64_t prompt_end,
                             std::span<const int32_t> tokens, bool complete, double now);
  static Status TruncateSessionTx(pg::Conn& c, int64_t id, int64_t n_tokens, double now);
  static Status PutResponseTx(pg::Conn& c, const StoredResponse& r);
  // kAlreadyExists when (owner, request_id) has a live record (also when a concurrent transaction
  // inserts it first: the primary key waits for it); an expired one is replaced.
  static Status PutRequestTx(pg::Conn& c, const StoredRequest& r, double now);
  static Result<std::vector<std::string>> AddItemsTx(pg::Conn& c, const std::string& conversation_id,
                                                     std::span<const NewItem> items, double now);
  // The session's stored length, its row locked FOR UPDATE until the transaction ends.
  static Result<int64_t> LockSession(pg::Conn& c, int64_t id);
  // Runs fn in a read-committed write transaction on a pooled connection.
  Status WriteTx(const std::function<Status(pg::Conn&)>& fn);
  // NOTIFYs the other processes of session id's version as the caller's transaction leaves it
  // (delivered when it commits). Cost: one round trip.
  Status NotifyTx(pg::Conn& c, int64_t id) const;
  // A payload from the channel: calls watch_fn_ unless it is this store's own or malformed.
  void OnNotice(const std::string& payload);

  std::unique_ptr<pg::Pool> pool_;
  std::mutex ids_mu_;           // guards ids_
  std::deque<int64_t> ids_;     // session ids drawn from the sequence, not yet handed out

  std::string url_, setup_;     // what the pool's connections are opened with
  int connect_timeout_s_ = 5;
  std::string origin_;          // names this store object's notices (NewId: 128 random bits)
  std::mutex lock_mu_;          // guards lock_conn_ and locked_; held for a lock's round trip
  std::unique_ptr<pg::Conn> lock_conn_;  // holds the turn locks (opened on first use)
  std::set<int64_t> locked_;    // sessions whose turn lock lock_conn_ holds
  std::mutex watch_mu_;         // guards watch_fn_; held while it runs
  std::function<void(const SessionChange&)> watch_fn_;
  std::unique_ptr<pg::Listener> listener_;  // last: stopped first, before what it calls
};

}  // namespace mnemo
