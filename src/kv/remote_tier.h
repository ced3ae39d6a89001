// T3, optional: a KV tier shared by every replica of a model, in Redis (--kv-remote). A cache
// only: what it holds may vanish at any time (TTL, maxmemory eviction, a restart) and the raw
// token log stays the truth, so every failure here means "recompute", never an error.
//
// Full 32-token chunks, content-addressed (remote_codec.h): a chunk is put soon after the turn
// that computed it ends, or when it leaves T0 (a demotion, a disk write), and fetched when a turn
// would otherwise recompute it (engine/remote_fetch.h decides when that pays). One worker thread
// owns the connection and does all network I/O, so neither the engine thread nor the transfer
// thread ever waits on the network:
//  - puts: Offer copies the block into a queue bounded in bytes and returns; a full queue drops
//    the put (counted). Puts already made (a recent-key set) are not made again. The transfer
//    thread offers the chunks it copies out of T0 (demotions, disk writes) and, soon after a turn
//    ends, its session's full chunks that were never offered (write-behind: CacheManager::
//    PlanCopiesOut), so a replica killed without a shutdown has put what its turns computed.
//  - fetches: Fetch queues fills of reserved blocks; the worker GETs them in one pipeline (one
//    round trip), checks each value (a bad or truncated one is a miss), copies the KV into the
//    block and reports (op, ok) through TakeCompleted and the listener. Fetches go before puts.
// Timeouts bound every wait (connect, each command); after a failure the tier is "down": fetches
// fail at once and puts are dropped until a reconnection, tried every retry_s, succeeds. Going
// down and coming back are logged once each.
//
// Thread-safety: every public method may be called from any thread. The KvStorage blocks named by
// a fill must not be touched by anyone else until it is reported (the cache manager reserves them).
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <utility>
#include <vector>

#include "base/status.h"
#include "kv/kv_storage.h"
#include "kv/redis_client.h"
#include "kv/remote_codec.h"

namespace mnemo {

struct RemoteTierConfig {
  std::string url;                          // redis://HOST[:PORT][/DB]
  double connect_timeout_s = 0.1;           // a connection attempt
  double command_timeout_s = 0.25;          // each command (a pipeline's replies each)
  double retry_s = 2;                       // while down, one connection attempt per this long
  int ttl_s = 86400;                        // each value expires after this (EX); Redis's maxmemory
                                            // policy (allkeys-lru) may evict it earlier
  size_t max_queued_bytes = size_t(64) << 20;  // puts waiting beyond this are dropped
};

// A fetch: chunk `id`'s KV into block `block` of `dst` (every layer).
struct RemoteFill {
  uint64_t op = 0;  // reported back with the result
  RemoteChunkId id;
  KvStorage* dst = nullptr;
  int32_t block = -1;
};

// What Offer did with a put.
enum class RemoteOffer {
  kQueued,   // copied into the put queue
  kKnown,    // put (or queued) recently: not again
  kDropped,  // not queued: the queue full, or the tier down
};

struct RemoteStats {
  int64_t gets = 0;            // chunks asked for
  int64_t hits = 0;            // ... found and verified: their KV was used
  int64_t misses = 0;          // ... absent
  int64_t rejected = 0;        // ... present but failing verification (corrupt, truncated, another chunk)
  int64_t failed = 0;          // ... not asked: the tier was down or the command failed
  int64_t bytes_read = 0;      // value bytes of the hits
  int64_t puts = 0;            // chunks stored
  int64_t puts_dropped = 0;    // puts dropped: queue full, or the tier down
  int64_t puts_failed = 0;     // puts Redis refused
  int64_t bytes_written = 0;   // value bytes stored
  bool available = true;       // not known to be down
  double rtt_s = 0;            // measured round trip (PING at connect)
  double bytes_per_s = 0;      // measured fetch throughput
};

class RemoteTier {
 public:
  // Parses the URL (kInvalidArgument) and starts the worker; connects on first use.
  static Result<std::unique_ptr<RemoteTier>> Create(const RemoteTierConfig& config, const RemoteKvSpace& space);
  // Stops the worker; puts still queued are dropped (Drain first to send them).
  ~RemoteTier();
  RemoteTier(const RemoteTier&) = delete;
  RemoteTier& operator=(const RemoteTier&) = delete;

  const RemoteKvSpace& space() const { return space_; }
  const RemoteTierConfig& config() const { return config_; }

  // Queues fills; each is reported once by TakeCompleted.
  void Fetch(std::vector<RemoteFill> fills);
  // (op, ok) of every fill finished since the last call.
  std::vector<std::pair<uint64_t, bool>> TakeCompleted();
  // fn runs on the worker after fills finish (e.g. to wake the engine). Set before any Fetch.
  void SetListener(std::function<void()> fn) { listener_ = std::move(fn); }

  // Queues a put of block `block` of src as chunk id (copying it, every layer), unless it was put
  // (or queued) already or is dropped: the queue full for wait_s, or the tier down (counted in
  // stats().puts_dropped). Cost: one block copy when queued, else none.
  RemoteOffer Offer(const RemoteChunkId& id, KvStorage& src, int32_t block, double wait_s = 0);
  // Blocks until every queued put is sent (or dropped), or timeout_s passes.
  void Drain(double timeout_s);

  // False while the tier is known to be down (fetches would fail at once).
  bool available() const { return available_.load(); }
  RemoteStats stats() const;

 private:
  struct Put {
    RemoteChunkId id;
    std::string value;  // header space + payload, sealed by the worker
  };
  RemoteTier(const RemoteTierConfig& config, const RemoteKvSpace& space, RedisUrl url);
  void Run();
  // The connection, (re)connecting when the retry time allows; null when down.
  RedisConnection* Connection();
  void MarkDown(const Error& e);
  void RunFills(std::vector<RemoteFill>& fills);
  void RunPuts(std::vector<Put>& puts);
  // Puts that never reached Redis are no longer "put recently": a later offer of the same chunk
  // (a demotion, a shutdown) is taken. Call with mu_ held.
  void ForgetLocked(const Put& p);

  const RemoteTierConfig config_;
  const RemoteKvSpace space_;
  const RedisUrl url_;
  std::function<void()> listener_;  // set before the first Fetch, then read by the worker only

  // Worker-only.
  std::unique_ptr<RedisConnection> conn_;
  double retry_at_ = 0;  // steady clock seconds: no connection attempt before
  bool logged_down_ = false;

  mutable std::mutex mu_;
  std::condition_variable cv_;       // work arrived, or stop
  std::condition_variable idle_cv_;  // puts sent, or room in the queue
  std::deque<RemoteFill> fills_;
  std::deque<Put> puts_;
  size_t queued_bytes_ = 0;
  int busy_puts_ = 0;                // puts taken off the queue, not finished
  std::vector<std::pair<uint64_t, bool>> completed_;
  std::unordered_set<uint64_t> recent_;  // chunks put (or queued) recently, by hash; not those dropped
  std::deque<uint64_t> recent_order_;    // oldest first; bounded
  RemoteStats stats_;
  bool stop_ = false;
  std::atomic<bool> available_{true};
  std::thread thread_;
};

}  // namespace mnemo
