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

#include "store/store.h"

namespace mnemo {

namespace pg {
class Conn;
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
  Result<std::optional<PrefixMatch>> FindPrefix(const std::string& owner, std::span<const uint64_t> hashes) override;
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

  std::unique_ptr<pg::Pool> pool_;
  std::mutex ids_mu_;           // guards ids_
  std::deque<int64_t> ids_;     // session ids drawn from the sequence, not yet handed out
};

}  // namespace mnemo
