// The SQLite backend of the store: one database file, the single-node default.
//
// Durability choice: the database runs in WAL mode. A commit appends its pages to the -wal file
// with write(2) before returning, so even without fsync the data is in the OS page cache and a
// kill -9 of this process cannot lose it. kFull adds synchronous=FULL: the WAL is fsynced at every
// commit (one fsync per CommitTurn: ~3.5 ms mean on the dev VM's disk, against ~0.3 ms without;
// small next to a turn's generation time) so an OS crash or power loss cannot lose it
// either; kNormal (synchronous=NORMAL) fsyncs only at checkpoints: faster, still kill -9 safe, but a
// power loss may drop the last commits (the database stays consistent).
//
// Threads: the store holds two connections: one for writes and one for reads, each behind its own
// mutex. Writes are serialized; reads run beside a write (WAL readers never wait for the writer)
// and see every write that returned before they began.
//
// Session ids: one process writes the file (SQLite's lock), so the engine's own counter, started
// above MaxSessionId, is unique; shared() is false.
#pragma once

#include <memory>
#include <mutex>
#include <unordered_set>

#include "store/store.h"

namespace mnemo {

namespace sqlite {
class Db;
// Marks session id's log at its full chunks past its last mark (the prefix index, store.h), in
// the caller's write transaction. `last`: the log's final tokens when the caller has them (a turn
// just appended), so that only the partial chunk before them is read back. Cost: one statement,
// plus one read when a chunk is completed, plus one insert per completed chunk.
Status MarkPrefixes(Db& db, int64_t id, std::span<const int32_t> last);
}

class SqliteStore final : public Store {
 public:
  static Result<std::unique_ptr<Store>> Open(const std::string& path, const StoreOptions& options);
  ~SqliteStore() override;

  Status CheckWritable() override;
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
  Result<int64_t> DeleteAllSessions() override;
  Result<bool> HasSessions() override;
  Result<std::optional<PrefixMatch>> FindPrefix(const std::string& owner, std::span<const uint64_t> hashes,
                                                std::span<const uint64_t> short_hashes) override;
  // In memory: one process writes the file, so a lock within it is the whole lock.
  Result<bool> TryLockTurn(int64_t id) override;
  void UnlockTurn(int64_t id) override;
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
  SqliteStore() = default;
  // Bodies of the write operations; the caller holds write_mu_ and an open write transaction.
  Status CreateSessionTx(int64_t id, const std::string& owner, double now);
  Status AppendTurnTx(int64_t id, int64_t begin, int64_t prompt_end, std::span<const int32_t> tokens,
                      bool complete, double now);
  Status TruncateSessionTx(int64_t id, int64_t n_tokens, double now);
  Status PutResponseTx(const StoredResponse& r);
  // kAlreadyExists when (owner, request_id) has a live record; an expired one is replaced.
  Status PutRequestTx(const StoredRequest& r, double now);
  Result<std::vector<std::string>> AddItemsTx(const std::string& conversation_id,
                                              std::span<const NewItem> items, double now);
  Result<int64_t> SessionLength(sqlite::Db& db, int64_t id);  // Error when unknown
  Status LoadTurns(sqlite::Db& db, int64_t id, StoredSession& s);

  std::mutex write_mu_;                 // guards writer_
  std::unique_ptr<sqlite::Db> writer_;  // every write goes through this connection
  std::mutex read_mu_;                  // guards reader_
  std::unique_ptr<sqlite::Db> reader_;  // query_only connection for reads
  std::mutex turn_mu_;                  // guards turn_locked_
  std::unordered_set<int64_t> turn_locked_;  // ids whose turn lock a turn of this process holds
};

}  // namespace mnemo
