// Selective context, reuse mode: composing a session from another's cached KV.
//
// The engine thread only plans: ComposeSession queues a Composition, and each step advances the
// oldest one through its phases without blocking: acquire the source (kLater waits for its disk
// loads and for room, like an admission), acquire the destination, then hand the row copies
// (keys re-rotated) to the transfer thread as one task behind the source's swap-ins. Running
// turns keep decoding meanwhile; the caller of ComposeSession waits on its own thread.
#include <cstring>
#include <future>

#include "base/log.h"
#include "engine/engine.h"
#include "engine/running.h"
#include "kernels/cpu/ops.h"

namespace mnemo {

// What the copy task reads and writes. Built by the engine thread before the task is submitted;
// the task writes only `filled`, which the engine thread reads once the task is done.
struct ComposeCopy {
  KvStorage* t0 = nullptr;
  const Model* model = nullptr;
  std::vector<int32_t> src_table;  // [chunks of src] T0 block per chunk (pinned by the composition)
  std::vector<int32_t> dst_table;  // [chunks of dst] likewise
  std::vector<bool> src_valid;     // [src_kv] positions whose KV is really there
  int n = 0;                       // dst positions
  std::vector<KvRun> runs;
  std::vector<bool> filled;        // [n] dst positions written
};

namespace {
// Copies K (re-rotated by dst_pos - src_pos) and V rows, layer by layer, head by head. Runs on the
// transfer thread. Cost: O(copied positions · layers · kv heads · head_dim), plus one RoPE per row.
bool CopyRuns(ComposeCopy& c) {
  const KvShape& shape = c.t0->shape();
  const size_t row = DTypeBytes(shape.dtype, shape.head_dim);
  const size_t v_base = row * size_t(shape.n_kv_heads) * kBlockTokens;  // V follows K in a block's layer
  const int src_kv = static_cast<int>(c.src_valid.size());
  std::vector<float> k(shape.head_dim);  // [head_dim] one key row in f32
  for (const KvRun& run : c.runs) {
    for (int i = 0; i < run.len; i++) {
      const int o = run.src_pos + i, p = run.dst_pos + i;
      if (o < 0 || o >= src_kv || !c.src_valid[o] || p < 0 || p >= c.n) continue;
      const int32_t delta = p - o;
      for (int l = 0; l < shape.n_layers; l++) {
        auto* from = static_cast<const char*>(c.t0->block(l, c.src_table[o / kBlockTokens]));
        auto* to = static_cast<char*>(c.t0->block(l, c.dst_table[p / kBlockTokens]));
        for (int h = 0; h < shape.n_kv_heads; h++) {
          const size_t k_off = row * ((size_t(h) * kBlockTokens) + o % kBlockTokens);
          const size_t k_dst = row * ((size_t(h) * kBlockTokens) + p % kBlockTokens);
          ToF32(shape.dtype, from + k_off, k.data(), shape.head_dim);
          c.model->ReRotateKeys(l, k.data(), 1, delta);
          FromF32(shape.dtype, k.data(), to + k_dst, shape.head_dim);
          std::memcpy(to + v_base + k_dst, from + v_base + k_off, row);
        }
      }
      c.filled[p] = true;
    }
  }
  return true;
}
}  // namespace

Result<SessionId> Engine::ComposeSession(SessionId src, std::vector<int32_t> tokens, const std::vector<KvRun>& runs) {
  auto minted = MintSessionId();
  if (!minted.ok()) return minted.error();
  Result<SessionId> out = Stopped();
  std::future<Result<SessionId>> pending;
  const bool called = Call([&] {
    auto it = sessions_.find(src);
    if (it == sessions_.end()) {
      out = MakeError(StatusCode::kNotFound, "unknown session %lld", static_cast<long long>(src));
      return;
    }
    if (it->second.busy) {
      out = MakeError(StatusCode::kFailedPrecondition, "session %lld has a turn in progress", static_cast<long long>(src));
      return;
    }
    const int n = static_cast<int>(tokens.size());
    if (n == 0 || n >= max_context_) {
      out = MakeError(StatusCode::kInvalidArgument, "a composed context must hold 1 to %d tokens", max_context_ - 1);
      return;
    }
    auto c = std::make_unique<Composition>();
    c->src = src;
    c->dst = minted->has_value() ? **minted : next_session_++;
    c->runs = runs;
    it->second.composing++;
    Session& d = sessions_[c->dst];
    d.id = c->dst;
    d.shares_kv = false;  // approximate KV (re-rotated, computed against another context)
    MarkLive(c->dst, true);
    d.tokens = std::move(tokens);
    d.turns.push_back(Turn{0, n, n});
    d.created = d.last_active = Now();
    d.busy = true;  // nobody knows its id yet; this keeps expiry off it
    cache_->AddSession(c->dst, d.last_active);
    pending = c->result.get_future();
    compositions_.push_back(std::move(c));
  });
  if (!called || !pending.valid()) return out;
  return pending.get();  // on the caller's thread: the engine thread goes on stepping
}

void Engine::EndComposition(Composition& c, Result<SessionId> r) {
  Session& s = sessions_.at(c.src);
  const int n = static_cast<int>(sessions_.at(c.dst).tokens.size());
  if (c.phase != Composition::Phase::kAcquireSrc) {
    cache_->Release(c.src, c.src_kv, Now());
    for (int ch : c.a.recompute) cache_->Invalidate(c.src, ch);  // acquired for recompute, never computed
  }
  if (r.ok()) {
    cache_->Release(c.dst, n, Now());
    for (int ch = 0; ch * kBlockTokens < n; ch++) {  // chunks not wholly copied are recomputed
      for (int p = ch * kBlockTokens; p < std::min(n, (ch + 1) * kBlockTokens); p++) {
        if (!c.copy->filled[p]) {
          cache_->Invalidate(c.dst, ch);
          break;
        }
      }
    }
    sessions_.at(c.dst).busy = false;
  } else {
    if (c.phase == Composition::Phase::kCopying) cache_->Release(c.dst, 0, Now());
    cache_->RemoveSession(c.dst);
    sessions_.erase(c.dst);
    MarkLive(c.dst, false);
    spdlog::debug("session {}: composition failed: {}", c.src, r.error().message);
  }
  s.composing--;
  c.result.set_value(std::move(r));
}

bool Engine::AdvanceComposition(Composition& c, double now) {
  const int n = static_cast<int>(sessions_.at(c.dst).tokens.size());
  // kLater waits (upkeep makes the room and starts disk loads; the loop wakes when copies land or
  // turns finish) unless nothing is in flight or running: then upkeep's drops have had two steps
  // to make room, and none will come.
  auto later = [&](int positions) {
    if (cache_->transfers_in_flight() || !running_.empty()) {
      c.stalls = 0;
      return false;
    }
    if (++c.stalls < 3) return false;
    EndComposition(c, MakeError(StatusCode::kResourceExhausted,
                                "the KV of %d positions cannot be brought into the compute tier now", positions));
    return true;
  };
  if (c.phase == Composition::Phase::kAcquireSrc) {
    c.src_kv = cache_->kv_tokens(c.src);
    Admission ad = cache_->Acquire(c.src, c.src_kv, now, &c.a);
    if (ad == Admission::kLater) return later(c.src_kv);
    if (ad == Admission::kImpossible) {
      EndComposition(c, MakeError(StatusCode::kResourceExhausted,
                                  "the KV of %d positions cannot be brought into the compute tier", c.src_kv));
      return true;
    }
    // Submitted before the copy task, so landed when it starts (transfer.h: order).
    transfer_->SubmitSwapIns(c.a.swap_ins);
    c.phase = Composition::Phase::kAcquireDst;
    c.stalls = 0;
  }
  if (c.phase == Composition::Phase::kAcquireDst) {
    CacheManager::Acquired b;
    Admission ad = cache_->Acquire(c.dst, n, now, &b);
    if (ad == Admission::kLater) return later(n);
    if (ad == Admission::kImpossible) {
      EndComposition(c, MakeError(StatusCode::kResourceExhausted,
                                  "a composed context of %d positions cannot fit in the compute tier", n));
      return true;
    }
    auto copy = std::make_shared<ComposeCopy>();
    copy->t0 = t0_.get();
    copy->model = &model_;
    copy->src_table = c.a.block_table;
    copy->dst_table = std::move(b.block_table);
    copy->src_valid.assign(c.src_kv, true);
    for (int ch : c.a.recompute) {
      for (int p = ch * kBlockTokens; p < std::min(c.src_kv, (ch + 1) * kBlockTokens); p++) copy->src_valid[p] = false;
    }
    copy->n = n;
    copy->runs = std::move(c.runs);
    copy->filled.assign(n, false);
    c.copy = copy;
    c.task = transfer_->SubmitTask([copy] { return CopyRuns(*copy); });
    c.phase = Composition::Phase::kCopying;
  }
  if (!c.task->done()) return false;  // the transfer thread's listener wakes the loop when it is
  EndComposition(c, c.dst);
  return true;
}

void Engine::AdvanceCompositions(double now) {
  // One at a time, oldest first: two compositions may read the same source, which is acquired by
  // one at a time.
  while (!compositions_.empty() && AdvanceComposition(*compositions_.front(), now)) compositions_.pop_front();
}

bool Engine::CompositionWaitsForRoom() const {
  return !compositions_.empty() && compositions_.front()->phase != Composition::Phase::kCopying;
}

void Engine::AbortCompositions() {
  transfer_->WaitIdle();  // no task may still write into a destination that is about to go
  for (auto& c : compositions_) EndComposition(*c, Stopped());
  compositions_.clear();
}

}  // namespace mnemo
