// Carries out the cache manager's copies between tiers on its own thread: T0 <-> T1 memory copies
// and T2 disk reads and writes, and copies whose body the engine supplies (tasks, e.g. composing a
// session from another's KV). Swap-ins for the running step have priority over everything else
// and are pipelined by layer: layer l of every block of a group lands before layer l + 1, and the
// forward pass waits only for the layer it is about to read.
//
// Order: a swap-in group starts as soon as the copy in progress (one op or task) ends, ahead of
// every queued op and task; ops and tasks run in submission order. So a group submitted before a
// task has landed when the task starts.
//
// Threading: Submit*/TakeCompleted are called by the engine thread; SwapInGroup::WaitLayer by the
// thread running the forward pass (the engine thread). The pools' blocks named by an op must not
// be touched by anyone else until the op completes (the cache manager guarantees it).
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <unordered_set>
#include <utility>
#include <vector>

#include "kv/cache_manager.h"
#include "kv/disk_tier.h"
#include "kv/kv_storage.h"
#include "kv/remote_tier.h"

namespace mnemo {

// The swap-ins of one engine step.
class SwapInGroup {
 public:
  // Blocks until layer l of every block in the group is in T0.
  void WaitLayer(int l);
  // Seconds the caller spent blocked in WaitLayer.
  double waited_seconds() const { return waited_; }
  // Seconds from the start of the first copy to the end of the last.
  double copy_seconds() const { return copy_seconds_.load(); }
  int n_ops() const { return static_cast<int>(ops_.size()); }
  // True when every layer has landed (WaitLayer would not block).
  bool done();

 private:
  friend class TransferEngine;
  std::vector<TransferOp> ops_;
  int n_layers_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  int layers_done_ = 0;           // guarded by mu_
  double waited_ = 0;             // touched by the waiting thread only
  std::atomic<double> copy_seconds_{0};
};

// A copy the caller supplies as a function (see TransferEngine::SubmitTask).
class TransferTask {
 public:
  // True once the function has run; ok() is then its result.
  bool done() const;
  bool ok() const;

 private:
  friend class TransferEngine;
  std::function<bool()> fn_;
  mutable std::mutex mu_;
  bool done_ = false;  // guarded by mu_
  bool ok_ = false;    // guarded by mu_
};

// What the transfer thread is about to copy, for a test hook that slows or orders copies.
struct CopyPoint {
  enum class Kind {
    kSwapInLayer,  // layer `layer` of every op of a swap-in group (ops: the group's)
    kOp,           // one background op, every layer (ops: that op)
    kTask,         // a task (ops: empty)
  };
  Kind kind = Kind::kOp;
  int layer = -1;
  const std::vector<TransferOp>* ops = nullptr;
};

struct TransferStats {
  int64_t bytes_in = 0;        // bytes copied into T0
  int64_t bytes_out = 0;       // bytes copied out of T0
  int64_t bytes_disk_w = 0;    // bytes written to T2
  int64_t bytes_disk_r = 0;    // bytes read from T2
};

class TransferEngine {
 public:
  // t1 and t2 may be null when those tiers are off, and remote when there is no remote tier. The
  // pools and the remote tier must outlive the engine.
  TransferEngine(KvStorage* t0, KvStorage* t1, DiskTier* t2, RemoteTier* remote = nullptr);
  ~TransferEngine();
  TransferEngine(const TransferEngine&) = delete;
  TransferEngine& operator=(const TransferEngine&) = delete;

  // Starts the swap-ins (all T1 -> T0) of one step ahead of any queued work.
  std::shared_ptr<SwapInGroup> SubmitSwapIns(const std::vector<TransferOp>& ops);
  // Queues background copies. disk_ids[i] names the chunk of ops[i] for T2 headers (ignored when
  // the op does not involve T2). puts[i], when set, names the full chunk ops[i] reads for the
  // remote tier: once the op has copied it out of its source block, the block is offered as a put
  // (RemoteTier::Offer: a copy into its queue; the network I/O is the remote tier's). An op with
  // dst kNone (a copy out of the tiers, CacheManager::PlanCopiesOut) is that offer alone, reported
  // ok unless the put was dropped.
  void Submit(const std::vector<TransferOp>& ops, const std::vector<DiskSlotId>& disk_ids,
              const std::vector<std::optional<RemoteChunkId>>& puts = {});
  // (op id, ok) of every op finished since the last call, swap-in groups included.
  std::vector<std::pair<uint64_t, bool>> TakeCompleted();
  // Queues fn to run on the transfer thread behind the queued ops (after any swap-in group
  // submitted before it). fn must touch only blocks the caller holds for it (e.g. pinned
  // sessions') and return false on failure. The task is not reported by TakeCompleted (it has no
  // op id); the listener fires after it, and the returned handle says when it has run.
  std::shared_ptr<TransferTask> SubmitTask(std::function<bool()> fn);
  // Blocks until every submitted op and task has finished.
  void WaitIdle();
  // Blocks until the ops named (submitted by Submit or SubmitSwapIns; ids of ops never submitted
  // or already finished are ignored) have finished, not the copies queued behind them.
  void WaitFor(std::span<const uint64_t> op_ids);
  // fn runs on the transfer thread after each batch of finished ops is ready for TakeCompleted
  // (e.g. to wake the engine thread). Set it before submitting anything; it must not call back
  // into this engine.
  void SetListener(std::function<void()> fn) { listener_ = std::move(fn); }
  // Tests: fn runs on the transfer thread before each copy (CopyPoint says which) and may block to
  // slow copies down or to observe their order. Set it before submitting anything.
  void SetCopyHook(std::function<void(const CopyPoint&)> fn) { hook_ = std::move(fn); }
  TransferStats stats() const;

 private:
  struct Job {
    TransferOp op;
    DiskSlotId id;
    std::optional<RemoteChunkId> put;  // offer the source block to the remote tier after the copy
    std::shared_ptr<TransferTask> task;  // set: run this task instead of op
  };
  void Run();
  void RunGroup(SwapInGroup& g);
  bool RunJob(const Job& j);
  KvStorage* storage(Tier t) const { return t == Tier::kT0 ? t0_ : t1_; }

  KvStorage* t0_;
  KvStorage* t1_;
  DiskTier* t2_;
  RemoteTier* remote_;
  std::vector<char> staging_;  // [n_layers * layer_block_bytes] one block, for disk I/O

  mutable std::mutex mu_;
  std::condition_variable cv_;       // work arrived, or stop
  std::condition_variable idle_cv_;  // work finished
  std::deque<std::shared_ptr<SwapInGroup>> groups_;
  std::deque<Job> jobs_;
  std::vector<std::pair<uint64_t, bool>> completed_;
  int busy_ = 0;  // items taken off the queues but not finished
  std::unordered_set<uint64_t> unfinished_;  // ids of submitted ops not finished yet
  bool stop_ = false;
  TransferStats stats_;
  std::function<void()> listener_;  // set before the first op, then read by the transfer thread only
  std::function<void(const CopyPoint&)> hook_;  // likewise
  std::thread thread_;
};

}  // namespace mnemo
