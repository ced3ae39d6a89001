// CacheManager's transfers: starting a copy between tiers, copy-on-write copies for forks and
// truncations, handing the queue to the transfer engine, landing what it reports, and the copies
// planned for the remote and disk tiers (fills, copies out, the flush at shutdown). The state
// each copy moves a chunk through is in chunk_state.h.
#include <algorithm>

#include "base/status.h"
#include "kv/cache_manager.h"

namespace mnemo {

uint64_t CacheManager::StartOp(int32_t rec, Tier dst, int32_t dst_block, bool queue) {
  ChunkRec& c = recs_[rec];
  auto [id, f] = in_flight_.Emplace();
  TransferOp op;
  op.id = id;
  op.src = c.tier;
  op.src_block = c.block;
  op.dst = dst;
  op.dst_block = dst_block;
  NameOwner(op, rec);
  c.op = op.id;
  *f = InFlight{op, rec};
  CountOp(op);
  if (queue) queued_.push_back(op);
  Transition(rec, dst > op.src ? ChunkState::kDemoting : ChunkState::kLoading);
  return op.id;
}

void CacheManager::NameOwner(TransferOp& op, int32_t rec) {
  ChunkRec& c = recs_[rec];
  if (op.src == Tier::kT2 && c.disk_session >= 0) {
    op.session = c.disk_session;
    op.chunk = c.disk_chunk;
    return;
  }
  if (!c.owners.empty()) {  // any owner: each holds it at the same chunk index
    op.session = c.owners.front();
    op.chunk = c.begin / kBlockTokens;
  }
  if (op.dst == Tier::kT2) {
    c.disk_session = op.session;
    c.disk_chunk = op.chunk;
  }
}

void CacheManager::CountOp(const TransferOp& op) {
  if (op.src == Tier::kT0 && op.dst != Tier::kT0) stats_.swap_outs++;
  if (op.src == Tier::kT1 && op.dst == Tier::kT0) stats_.swap_ins++;
  if (op.dst == Tier::kT2) stats_.disk_writes++;
  if (op.src == Tier::kT2) stats_.disk_reads++;
}

std::optional<TransferOp> CacheManager::CopyChunk(int32_t from, int32_t to, SessionId owner, int chunk,
                                                  bool sync_ok, double now) {
  MNEMO_CHECK(recs_[to].state == ChunkState::kEmpty);
  const Tier src = recs_[from].tier;
  // No KV to copy (yet: another owner may be recomputing it): recomputed in any case.
  if (src == Tier::kNone || recs_[from].state == ChunkState::kFilling) return std::nullopt;
  // A background copy needs a source that stays where it is until the copy lands: no transfer in
  // flight, or a demotion out of T0 that can be revived (its result discarded, the T0 copy kept).
  // A synchronous one reads the source now, which is valid until any transfer moving it is done.
  const bool revive = Revivable(recs_[from]);
  const bool stable = recs_[from].state == ChunkState::kResident || revive;
  const bool sync = sync_ok && (src == Tier::kT0 || src == Tier::kT1);
  if (stable || sync) {
    recs_[from].readers++;  // not a victim while room is made
    Sync(from);
    Tier dst = Tier::kT0;
    int32_t b = t0_.Allocate();
    if (b < 0 && EvictFromT0(1, now) > 0) b = t0_.Allocate();
    if (b < 0 && stable && config_.t1_blocks > 0) {
      dst = Tier::kT1;
      b = AllocateIn(Tier::kT1, now);
    }
    if (b < 0 && stable && config_.t2_blocks > 0 && src != Tier::kT2) {
      dst = Tier::kT2;
      b = AllocateIn(Tier::kT2, now);
    }
    recs_[from].readers--;
    Sync(from);
    if (b >= 0 && dst == Tier::kT0 && sync) {  // the caller copies now
      stats_.cow_copies++;
      recs_[to].tier = Tier::kT0;
      recs_[to].block = b;
      Transition(to, ChunkState::kResident);
      return TransferOp{0, src, recs_[from].block, Tier::kT0, b, owner, chunk};
    }
    if (b >= 0) {  // a background copy; `to` gets the block when it lands
      stats_.cow_copies++;
      if (revive && recs_[from].state == ChunkState::kDemoting) Transition(from, ChunkState::kRevived);
      recs_[from].readers++;
      auto [id, f] = in_flight_.Emplace();
      TransferOp op{id, src, recs_[from].block, dst, b, owner, chunk};
      if (src == Tier::kT2) NameOwner(op, from);  // the slot's header names from's owner
      if (dst == Tier::kT2) {
        recs_[to].disk_session = owner;
        recs_[to].disk_chunk = chunk;
      }
      recs_[to].op = op.id;
      *f = InFlight{op, to, from};
      CountOp(op);
      queued_.push_back(op);
      Sync(from);
      Transition(to, ChunkState::kCopyTarget);
      return std::nullopt;
    }
  }
  stats_.cow_recomputes++;
  return std::nullopt;
}

std::vector<TransferOp> CacheManager::TakeTransfers() {
  // One allocation for the copy; queued_ keeps its capacity (swapping it out made the next
  // Maintain's 64 demotions grow it from nothing: 7 allocations).
  std::vector<TransferOp> out(queued_.begin(), queued_.end());
  queued_.clear();
  return out;
}

void CacheManager::OnTransferDone(uint64_t op_id, bool ok) {
  const InFlight& f = in_flight_.At(op_id);
  const TransferOp op = f.op;
  const int32_t id = f.rec;
  const int32_t copy_of = f.copy_of;
  const bool fill = f.fill;
  const bool out = f.out;
  in_flight_.Erase(op_id);
  ChunkRec& c = recs_[id];
  if (out) {  // a copy out of the tiers read the block; its data stays where it is
    c.readers--;
    if (!ok) c.copied_out = false;  // not taken (e.g. a full queue): a later call may try again
    MaybeRecycle(id);
    return;
  }
  c.op = 0;
  if (fill) {  // data from outside the tiers landed in the block reserved for it, or did not
    if (ok) {
      c.tier = op.dst;
      c.block = op.dst_block;
      c.from_remote = true;
      c.copied_out = true;  // it came from outside: no need to send it back
      stats_.fills++;
      Transition(id, ChunkState::kResident);
    } else {
      pool(op.dst).Free(op.dst_block);
      stats_.failed_fills++;
      Transition(id, ChunkState::kEmpty);
    }
    MaybeRecycle(id);
    return;
  }
  if (copy_of >= 0) {  // a copy-on-write copy: the source keeps its data, `id` gets the new block
    recs_[copy_of].readers--;
    if (ok) {
      c.tier = op.dst;
      c.block = op.dst_block;
      c.from_disk = op.src == Tier::kT2;
      Transition(id, ChunkState::kResident);
    } else {
      pool(op.dst).Free(op.dst_block);
      stats_.failed_reads += op.src == Tier::kT2;
      stats_.cow_recomputes++;
      Transition(id, ChunkState::kEmpty);
    }
    MaybeRecycle(copy_of);
    MaybeRecycle(id);
    return;
  }
  if (c.state == ChunkState::kRevived) {  // a demotion whose source is in use again: keep the source
    pool(op.dst).Free(op.dst_block);
    Transition(id, ChunkState::kResident);
  } else if (ok) {
    pool(op.src).Free(op.src_block);
    c.tier = op.dst;
    c.block = op.dst_block;
    if (op.src == Tier::kT2) c.from_disk = true;
    Transition(id, ChunkState::kResident);
  } else {
    pool(op.dst).Free(op.dst_block);
    // Unreadable disk data is never used; a failed disk write loses nothing that the raw tokens
    // cannot rebuild. Otherwise the data stays where it was.
    stats_.failed_reads += op.src == Tier::kT2;
    if (op.src == Tier::kT2 || (op.dst == Tier::kT2 && c.pins == 0)) {
      FreeData(id);
      stats_.drops++;
    } else {
      Transition(id, ChunkState::kResident);
    }
  }
  MaybeRecycle(id);
}

std::vector<TransferOp> CacheManager::PlanFills(SessionId s, const std::vector<int>& chunks, double now) {
  std::vector<TransferOp> ops;
  SessionRec& S = sessions_.at(s);
  MNEMO_CHECK(!S.acquired);
  clock_ = std::max(clock_, now);
  const int held = BlocksFor(S.kv_tokens);
  // Chunks past s's KV extend it only from a chunk boundary: a partial last chunk would otherwise
  // claim positions it never held.
  const bool may_extend = S.kv_tokens % kBlockTokens == 0;
  int extend_to = S.kv_tokens;
  for (int c : chunks) {
    if (c >= held && may_extend) extend_to = std::max(extend_to, (c + 1) * kBlockTokens);
  }
  if (extend_to > S.kv_tokens) RestoreLength(s, extend_to);
  // The session's chunks are neither victims nor dropped while blocks are found for the others.
  for (int32_t id : S.chunks) {
    recs_[id].pins++;
    Sync(id);
  }
  std::vector<int32_t> planned;
  for (int c : chunks) {
    if (c < 0 || c >= static_cast<int>(S.chunks.size())) continue;
    const int32_t id = S.chunks[c];
    ChunkRec& r = recs_[id];
    if (r.state != ChunkState::kEmpty || r.length != kBlockTokens) continue;  // has KV, or is moving
    Tier dst = Tier::kT0;
    int32_t b = t0_.Allocate();
    if (b < 0 && config_.t1_blocks > 0) {
      dst = Tier::kT1;
      b = AllocateIn(Tier::kT1, now);
    }
    if (b < 0) break;  // no room now: the rest are recomputed
    auto [op_id, f] = in_flight_.Emplace();
    TransferOp op{op_id, Tier::kNone, -1, dst, b, s, c};
    r.op = op.id;
    *f = InFlight{op, id, -1, /*fill=*/true};
    Transition(id, ChunkState::kCopyTarget);
    ops.push_back(op);
  }
  for (int32_t id : S.chunks) {
    recs_[id].pins--;
    Sync(id);
  }
  return ops;
}

std::vector<CacheManager::RestingChunk> CacheManager::RestingFullChunks(SessionId s) const {
  std::vector<RestingChunk> out;
  const SessionRec& S = sessions_.at(s);
  for (size_t i = 0; i < S.chunks.size(); i++) {
    const ChunkRec& c = recs_[S.chunks[i]];
    if (c.state == ChunkState::kResident && c.length == kBlockTokens && (c.tier == Tier::kT0 || c.tier == Tier::kT1)) {
      out.push_back({static_cast<int>(i), c.tier, c.block});
    }
  }
  return out;
}

std::vector<TransferOp> CacheManager::PlanCopiesOut(SessionId s, int n_tokens) {
  std::vector<TransferOp> ops;
  const SessionRec& S = sessions_.at(s);
  const int n_chunks = std::min(static_cast<int>(S.chunks.size()), std::min(n_tokens, S.kv_tokens) / kBlockTokens);
  for (int i = 0; i < n_chunks; i++) {
    const int32_t id = S.chunks[i];
    ChunkRec& c = recs_[id];
    if (c.copied_out || c.state != ChunkState::kResident || c.tier != Tier::kT0 || c.length != kBlockTokens) continue;
    auto [op_id, f] = in_flight_.Emplace();
    const TransferOp op{op_id, Tier::kT0, c.block, Tier::kNone, -1, s, i};
    *f = InFlight{op, id, -1, /*fill=*/false, /*out=*/true};
    c.readers++;
    c.copied_out = true;
    Sync(id);
    stats_.copies_out++;
    ops.push_back(op);
  }
  return ops;
}

void CacheManager::PlanFlushToDisk() {
  if (config_.t2_blocks == 0) return;
  for (int32_t id = 0; id < static_cast<int32_t>(recs_.size()); id++) {
    ChunkRec& c = recs_[id];
    if (c.state != ChunkState::kResident || c.refs == 0 || c.pins > 0 || c.readers > 0 ||
        (c.tier != Tier::kT0 && c.tier != Tier::kT1)) {
      continue;
    }
    int32_t b = t2_.Allocate();
    if (b < 0) return;
    StartOp(id, Tier::kT2, b, true);
  }
}

}  // namespace mnemo
