#include "kv/transfer.h"

#include <chrono>
#include <cstring>

namespace mnemo {
namespace {
double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

void SwapInGroup::WaitLayer(int l) {
  std::unique_lock<std::mutex> lock(mu_);
  if (layers_done_ > l) return;
  double t0 = Now();
  cv_.wait(lock, [&] { return layers_done_ > l; });
  waited_ += Now() - t0;
}

bool SwapInGroup::done() {
  std::lock_guard<std::mutex> lock(mu_);
  return layers_done_ >= n_layers_;
}

bool TransferTask::done() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

bool TransferTask::ok() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ok_;
}

TransferEngine::TransferEngine(KvStorage* t0, KvStorage* t1, DiskTier* t2, RemoteTier* remote)
    : t0_(t0), t1_(t1), t2_(t2), remote_(remote), staging_(t0->shape().BlockBytes()) {
  thread_ = std::thread([this] { Run(); });
}

TransferEngine::~TransferEngine() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::shared_ptr<SwapInGroup> TransferEngine::SubmitSwapIns(const std::vector<TransferOp>& ops) {
  auto g = std::make_shared<SwapInGroup>();
  g->ops_ = ops;
  g->n_layers_ = t0_->shape().n_layers;
  if (ops.empty()) {
    g->layers_done_ = g->n_layers_;
    return g;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    groups_.push_back(g);
    for (const TransferOp& op : ops) unfinished_.insert(op.id);
  }
  cv_.notify_all();
  return g;
}

void TransferEngine::Submit(const std::vector<TransferOp>& ops, const std::vector<DiskSlotId>& disk_ids,
                            const std::vector<std::optional<RemoteChunkId>>& puts) {
  if (ops.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < ops.size(); i++) {
      jobs_.push_back({ops[i], i < disk_ids.size() ? disk_ids[i] : DiskSlotId{},
                       i < puts.size() ? puts[i] : std::nullopt, nullptr});
      unfinished_.insert(ops[i].id);
    }
  }
  cv_.notify_all();
}

std::shared_ptr<TransferTask> TransferEngine::SubmitTask(std::function<bool()> fn) {
  auto t = std::make_shared<TransferTask>();
  t->fn_ = std::move(fn);
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back({TransferOp{}, DiskSlotId{}, std::nullopt, t});
  }
  cv_.notify_all();
  return t;
}

std::vector<std::pair<uint64_t, bool>> TransferEngine::TakeCompleted() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::pair<uint64_t, bool>> out;
  out.swap(completed_);
  return out;
}

void TransferEngine::WaitIdle() {
  std::unique_lock<std::mutex> lock(mu_);
  idle_cv_.wait(lock, [&] { return groups_.empty() && jobs_.empty() && busy_ == 0; });
}

void TransferEngine::WaitFor(std::span<const uint64_t> op_ids) {
  std::unique_lock<std::mutex> lock(mu_);
  idle_cv_.wait(lock, [&] {
    for (uint64_t id : op_ids) {
      if (unfinished_.count(id)) return false;
    }
    return true;
  });
}

TransferStats TransferEngine::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void TransferEngine::Run() {
  const std::vector<TransferOp> no_ops;
  for (;;) {
    std::shared_ptr<SwapInGroup> group;
    Job job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !groups_.empty() || !jobs_.empty(); });
      if (stop_ && groups_.empty() && jobs_.empty()) return;
      if (!groups_.empty()) {  // swap-ins first
        group = groups_.front();
        groups_.pop_front();
      } else {
        job = jobs_.front();
        jobs_.pop_front();
      }
      busy_++;
    }
    std::vector<std::pair<uint64_t, bool>> done;
    if (group) {
      RunGroup(*group);
      for (const auto& op : group->ops_) done.push_back({op.id, true});
    } else if (job.task) {
      if (hook_) hook_(CopyPoint{CopyPoint::Kind::kTask, -1, &no_ops});
      const bool ok = job.task->fn_();
      std::lock_guard<std::mutex> lock(job.task->mu_);
      job.task->done_ = true;
      job.task->ok_ = ok;
    } else {
      done.push_back({job.op.id, RunJob(job)});
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      completed_.insert(completed_.end(), done.begin(), done.end());
      for (const auto& d : done) unfinished_.erase(d.first);
      busy_--;
    }
    idle_cv_.notify_all();
    if (listener_) listener_();
  }
}

void TransferEngine::RunGroup(SwapInGroup& g) {
  const size_t lb = t0_->shape().LayerBlockBytes();
  double t0 = Now();
  for (int l = 0; l < g.n_layers_; l++) {
    if (hook_) hook_(CopyPoint{CopyPoint::Kind::kSwapInLayer, l, &g.ops_});
    for (const auto& op : g.ops_) std::memcpy(t0_->block(l, op.dst_block), t1_->block(l, op.src_block), lb);
    {
      std::lock_guard<std::mutex> lock(g.mu_);
      g.layers_done_ = l + 1;
    }
    g.cv_.notify_all();
  }
  g.copy_seconds_ = Now() - t0;
  std::lock_guard<std::mutex> lock(mu_);
  stats_.bytes_in += int64_t(lb) * g.n_layers_ * g.ops_.size();
}

bool TransferEngine::RunJob(const Job& j) {
  const TransferOp& op = j.op;
  if (hook_) {
    const std::vector<TransferOp> one{op};
    hook_(CopyPoint{CopyPoint::Kind::kOp, -1, &one});
  }
  if (op.dst == Tier::kNone) {
    // A copy out of the tiers (CacheManager::PlanCopiesOut): the put's copy is all there is. Not
    // taken (dropped) reports false, so the cache manager may plan it again.
    return j.put && remote_ && remote_->Offer(*j.put, *storage(op.src), op.src_block) != RemoteOffer::kDropped;
  }
  const int n_layers = t0_->shape().n_layers;
  const size_t lb = t0_->shape().LayerBlockBytes();
  bool ok = true;
  if (op.dst == Tier::kT2) {
    KvStorage* src = storage(op.src);
    for (int l = 0; l < n_layers; l++) std::memcpy(staging_.data() + lb * l, src->block(l, op.src_block), lb);
    ok = t2_ && t2_->Write(op.dst_block, j.id, staging_.data()).ok();
  } else if (op.src == Tier::kT2) {
    ok = t2_ && t2_->Read(op.src_block, j.id, staging_.data()).ok();
    if (ok) {
      KvStorage* dst = storage(op.dst);
      for (int l = 0; l < n_layers; l++) std::memcpy(dst->block(l, op.dst_block), staging_.data() + lb * l, lb);
    }
  } else {
    KvStorage* src = storage(op.src);
    KvStorage* dst = storage(op.dst);
    for (int l = 0; l < n_layers; l++) std::memcpy(dst->block(l, op.dst_block), src->block(l, op.src_block), lb);
  }
  // The source block is valid until this op is reported: a put copies it now (a T0 or T1 block).
  if (ok && j.put && remote_ && op.src != Tier::kT2) remote_->Offer(*j.put, *storage(op.src), op.src_block);
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t bytes = int64_t(lb) * n_layers;
  // A copy within T0 (copy-on-write of a fork's partial chunk) moves nothing between tiers.
  if (op.dst == Tier::kT0 && op.src != Tier::kT0) stats_.bytes_in += bytes;
  if (op.src == Tier::kT0 && op.dst != Tier::kT0) stats_.bytes_out += bytes;
  if (op.dst == Tier::kT2) stats_.bytes_disk_w += bytes;
  if (op.src == Tier::kT2) stats_.bytes_disk_r += bytes;
  return ok;
}

}  // namespace mnemo
