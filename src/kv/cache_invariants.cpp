// CacheManager's checks: the victim key found by a full scan (against the index's answer) and
// CheckInvariants, which tests call after every operation.
#include <algorithm>

#include "kv/cache_manager.h"

namespace mnemo {

std::optional<std::pair<double, double>> CacheManager::NextVictimKey(Tier t, double now) const {
  const int32_t id = PickVictim(t, now);
  if (id < 0) return std::nullopt;
  const ChunkRec& c = recs_[id];
  return std::pair<double, double>{policy_->Value(Weight(c), now - c.last_active, c.last_active), Weight(c)};
}

std::optional<std::pair<double, double>> CacheManager::ScanVictimKey(Tier t, double now) const {
  std::optional<std::pair<double, double>> best;
  for (size_t id = 0; id < recs_.size(); id++) {
    const ChunkRec& c = recs_[id];
    if (!Evictable(c) || c.tier != t) continue;
    const EvictionCandidate e{c.begin / kBlockTokens, c.begin, std::max(c.length, 1), now - c.last_active,
                              c.last_active};
    const auto key = policy_->Key(e);
    if (!best || key < *best) best = key;
  }
  return best;
}

bool CacheManager::CheckInvariants() const {
  // Every block of every tier is owned exactly once: by the record whose data it holds, or by the
  // transfer in flight that fills it.
  std::vector<int> owners[3] = {std::vector<int>(config_.t0_blocks), std::vector<int>(config_.t1_blocks),
                                std::vector<int>(config_.t2_blocks)};
  std::vector<bool> recycled(recs_.size(), false);
  for (int32_t id : free_recs_) recycled[id] = true;
  for (size_t id = 0; id < recs_.size(); id++) {
    const ChunkRec& c = recs_[id];
    const bool live = c.refs > 0 || c.op != 0 || c.readers > 0;
    if (live == recycled[id]) return false;  // a record is in use or on the free list, never both or neither
    if ((c.state == ChunkState::kFree) != recycled[id]) return false;  // kFree is exactly the free list
    if (!StateFits(static_cast<int32_t>(id))) return false;  // each state's fields (chunk_state.h)
    if (!live) continue;
    if (c.tier != Tier::kNone) owners[static_cast<int>(c.tier)][c.block]++;
    if (c.refs > 1 && c.length != kBlockTokens) return false;  // only full chunks are shared
    // A pinned chunk is in T0 or on its way there (a swap-in, a revived demotion): never dropped,
    // demoted or waiting for a copy while an acquired owner's batch may read it.
    if (c.refs > 0 && c.pins > 0 && c.state != ChunkState::kResident && c.state != ChunkState::kFilling &&
        c.state != ChunkState::kLoading && c.state != ChunkState::kRevived) {
      return false;
    }
  }
  // The index files exactly the evictable records, under their current tier, weight and time
  // (so Pick answers from the records' state); the pinned count matches.
  size_t evictable = 0;
  int pinned = 0;
  for (size_t id = 0; id < recs_.size(); id++) {
    const ChunkRec& c = recs_[id];
    if (recycled[id]) {
      if (index_.Filed(static_cast<int32_t>(id)) || c.pin_counted) return false;
      continue;
    }
    pinned += c.refs > 0 && c.pins > 0;
    if (c.pin_counted != (c.refs > 0 && c.pins > 0)) return false;
    if (c.refs != static_cast<int>(c.owners.size())) return false;
    const bool e = Evictable(c);
    evictable += e;
    if (e != index_.Filed(static_cast<int32_t>(id))) return false;
    if (e && !index_.FiledAs(static_cast<int32_t>(id), static_cast<int>(c.tier), Weight(c), c.last_active)) {
      return false;
    }
  }
  if (pinned != pinned_) return false;
  if (!index_.Check() || index_.size(0) + index_.size(1) + index_.size(2) != evictable) return false;
  for (const auto& [sid, S] : sessions_) {
    for (int32_t id : S.chunks) {
      const auto& o = recs_[id].owners;
      if (std::find(o.begin(), o.end(), sid) == o.end()) return false;
    }
  }
  std::vector<int> readers(recs_.size(), 0);
  bool ops_ok = true;
  in_flight_.ForEach([&](uint64_t opid, const InFlight& f) {
    const ChunkRec& c = recs_[f.rec];
    if (f.out) {  // a copy out reads a chunk at rest in T0 (full when planned) and writes no block of ours
      readers[f.rec]++;
      if (f.op.id != opid || f.op.dst != Tier::kNone || c.state != ChunkState::kResident || c.tier != Tier::kT0 ||
          c.block != f.op.src_block) {
        ops_ok = false;
      }
      return;
    }
    owners[static_cast<int>(f.op.dst)][f.op.dst_block]++;
    if (c.op != opid || f.op.id != opid) ops_ok = false;
    if (f.copy_of >= 0) {  // a copy fills an empty record from a source that stays put
      const ChunkRec& from = recs_[f.copy_of];
      readers[f.copy_of]++;
      if (c.tier != Tier::kNone || from.tier != f.op.src || from.block != f.op.src_block) ops_ok = false;
      if (from.state != ChunkState::kResident && from.state != ChunkState::kRevived) ops_ok = false;
    } else if (f.fill) {  // a fill: no source block, the record has no data until it lands
      if (c.tier != Tier::kNone || f.op.src != Tier::kNone || c.state != ChunkState::kCopyTarget) ops_ok = false;
    } else if (c.tier != f.op.src || c.block != f.op.src_block) {  // a move reads its record's block
      ops_ok = false;
    }
  });
  if (!ops_ok) return false;
  for (size_t id = 0; id < recs_.size(); id++) {
    if (readers[id] != recs_[id].readers) return false;
  }
  const BlockAllocator* pools[3] = {&t0_, &t1_, &t2_};
  for (int t = 0; t < 3; t++) {
    for (int32_t b = 0; b < pools[t]->capacity(); b++) {
      int want = pools[t]->IsFree(b) ? 0 : 1;
      if (owners[t][b] != want) return false;
    }
  }
  for (const auto& [sid, S] : sessions_) {
    if (static_cast<int>(S.chunks.size()) != BlocksFor(S.kv_tokens) && !S.acquired) return false;
    for (size_t i = 0; i < S.chunks.size(); i++) {
      const ChunkRec& c = recs_[S.chunks[i]];
      if (c.refs <= 0 || c.begin != static_cast<int>(i) * kBlockTokens) return false;
      if (S.acquired && c.pins <= 0) return false;
    }
    // Copy-on-write: the chunk a session writes into next (its partial last one) is its own.
    if (!S.acquired && S.kv_tokens % kBlockTokens != 0 && recs_[S.chunks.back()].refs != 1) return false;
  }
  return true;
}

}  // namespace mnemo
