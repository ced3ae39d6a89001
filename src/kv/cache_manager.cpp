// CacheManager: chunk records and their states, sessions (fork, truncate), admission, growth,
// release and eviction. Its transfers are in cache_transfers.cpp, its checks in
// cache_invariants.cpp.
#include "kv/cache_manager.h"

#include <algorithm>
#include <cmath>

#include "base/status.h"

namespace mnemo {

const char* TierName(Tier t) {
  switch (t) {
    case Tier::kT0: return "t0";
    case Tier::kT1: return "t1";
    case Tier::kT2: return "t2";
    case Tier::kNone: return "none";
  }
  return "?";
}

CacheManager::CacheManager(const CacheConfig& config, std::unique_ptr<EvictionPolicy> policy)
    : config_(config),
      policy_(std::move(policy)),
      reserve_blocks_(static_cast<int32_t>(std::ceil(config.t0_blocks * config.reserve_fraction))),
      t0_(config.t0_blocks),
      t1_(config.t1_blocks),
      t2_(config.t2_blocks) {
  MNEMO_CHECK(config.t0_blocks > 0 && config.reserve_fraction >= 0 && config.reserve_fraction < 1);
}

BlockAllocator& CacheManager::pool(Tier t) {
  MNEMO_CHECK(t != Tier::kNone);
  return t == Tier::kT0 ? t0_ : t == Tier::kT1 ? t1_ : t2_;
}

int32_t CacheManager::capacity(Tier t) const {
  return t == Tier::kT0 ? config_.t0_blocks : t == Tier::kT1 ? config_.t1_blocks
                                            : t == Tier::kT2 ? config_.t2_blocks : 0;
}

int32_t CacheManager::used_blocks(Tier t) const {
  const BlockAllocator& a = t == Tier::kT0 ? t0_ : t == Tier::kT1 ? t1_ : t2_;
  return a.capacity() - a.num_free();
}

int32_t CacheManager::NewRec(int begin, SessionId owner) {
  int32_t id;
  if (!free_recs_.empty()) {
    id = free_recs_.back();
    free_recs_.pop_back();
    std::vector<SessionId> owners = std::move(recs_[id].owners);  // keeps its capacity: no allocation
    recs_[id] = ChunkRec{};
    recs_[id].owners = std::move(owners);
  } else {
    id = static_cast<int32_t>(recs_.size());
    recs_.emplace_back();
  }
  recs_[id].begin = begin;
  recs_[id].refs = 1;
  recs_[id].owners.assign(1, owner);
  Transition(id, ChunkState::kEmpty);
  return id;
}

void CacheManager::FreeData(int32_t id) {
  ChunkRec& c = recs_[id];
  if (c.tier != Tier::kNone) pool(c.tier).Free(c.block);
  c.tier = Tier::kNone;
  c.block = -1;
  if (c.state == ChunkState::kEmpty) {
    Sync(id);
  } else {
    Transition(id, ChunkState::kEmpty);
  }
}

void CacheManager::MaybeRecycle(int32_t id) {
  ChunkRec& c = recs_[id];
  Sync(id);
  if (c.refs > 0 || c.op != 0 || c.readers > 0) return;  // still held, or a transfer in flight uses it
  FreeData(id);
  Transition(id, ChunkState::kFree);
  free_recs_.push_back(id);
}

void CacheManager::Transition(int32_t id, ChunkState to) {
  ChunkRec& c = recs_[id];
  CheckChunkTransition(c.state, to);
  transitions_[static_cast<int>(c.state)][static_cast<int>(to)]++;
  c.state = to;
  if (to == ChunkState::kEmpty) c.from_disk = c.from_remote = c.copied_out = false;  // no data, so it came from nowhere
  MNEMO_CHECK_MSG(StateFits(id), std::string("chunk record fields do not fit state ") + ChunkStateName(to));
  Sync(id);
}

bool CacheManager::StateFits(int32_t id) const {
  const ChunkRec& c = recs_[id];
  const bool no_block = c.tier == Tier::kNone && c.block == -1;
  const bool has_block = c.tier != Tier::kNone && c.block >= 0 && c.block < capacity(c.tier);
  const InFlight* f = nullptr;
  if (c.op != 0) {
    f = in_flight_.Find(c.op);
    if (f == nullptr || f->rec != id) return false;
  }
  // A move reads its own record's block: down (a larger tier number) or up.
  const bool move = f && f->copy_of < 0 && !f->fill && f->op.src == c.tier && f->op.src_block == c.block;
  switch (c.state) {
    case ChunkState::kFree:
      return no_block && !f && c.refs == 0 && c.pins == 0 && c.readers == 0 && c.owners.empty() && !c.from_disk &&
             !c.from_remote && !c.copied_out;
    case ChunkState::kEmpty: return no_block && !f && c.readers == 0 && !c.from_disk && !c.from_remote && !c.copied_out;
    case ChunkState::kFilling: return has_block && c.tier == Tier::kT0 && !f && c.pins > 0 && c.readers == 0;
    case ChunkState::kResident: return has_block && !f;
    case ChunkState::kDemoting: return has_block && move && f->op.dst > c.tier;
    case ChunkState::kRevived: return has_block && move && c.tier == Tier::kT0 && f->op.dst > c.tier;
    case ChunkState::kLoading: return has_block && move && f->op.dst < c.tier;
    case ChunkState::kCopyTarget: return no_block && f && (f->copy_of >= 0 || f->fill);
  }
  return false;
}

void CacheManager::Unref(int32_t id, SessionId owner) {
  ChunkRec& c = recs_[id];
  MNEMO_CHECK(c.refs > 0);
  c.refs--;
  auto it = std::find(c.owners.begin(), c.owners.end(), owner);
  MNEMO_CHECK(it != c.owners.end());
  c.owners.erase(it);
  MaybeRecycle(id);
}

bool CacheManager::Evictable(const ChunkRec& c) {
  return c.state == ChunkState::kResident && c.refs > 0 && c.pins == 0 && c.readers == 0;
}

void CacheManager::Sync(int32_t id) {
  ChunkRec& c = recs_[id];
  const bool pinned = c.refs > 0 && c.pins > 0;
  if (pinned != c.pin_counted) {
    pinned_ += pinned ? 1 : -1;
    c.pin_counted = pinned;
  }
  if (!Evictable(c)) {
    index_.Unfile(id);
    return;
  }
  const int tier = static_cast<int>(c.tier);
  const double w = Weight(c);
  if (index_.FiledAs(id, tier, w, c.last_active)) return;
  index_.Unfile(id);
  index_.File(id, tier, w, c.last_active);
}

void CacheManager::SetCostModel(const CostModel& cost) {
  policy_->SetCostModel(cost);
  for (int32_t id = 0; id < static_cast<int32_t>(recs_.size()); id++) Sync(id);
}

int32_t CacheManager::PickVictim(Tier t, double now) const {
  return index_.Pick(static_cast<int>(t), now, *policy_);
}

void CacheManager::Touch(SessionRec& s, double now) {
  clock_ = std::max(clock_, now);
  s.last_active = now;
  for (int32_t id : s.chunks) {
    recs_[id].last_active = std::max(recs_[id].last_active, now);
    Sync(id);
  }
}

void CacheManager::MarkActive(SessionId s, double now) {
  auto it = sessions_.find(s);
  if (it != sessions_.end()) Touch(it->second, now);
}

void CacheManager::AddSession(SessionId s, double now) {
  MNEMO_CHECK(!HasSession(s));
  sessions_[s].last_active = now;
}

void CacheManager::RemoveSession(SessionId s) {
  auto it = sessions_.find(s);
  if (it == sessions_.end()) return;
  MNEMO_CHECK(!it->second.acquired);
  for (int32_t id : it->second.chunks) Unref(id, s);
  sessions_.erase(it);
}

std::optional<TransferOp> CacheManager::Fork(SessionId src, SessionId dst, int n_tokens, double now) {
  SessionRec& a = sessions_.at(src);
  MNEMO_CHECK(!HasSession(dst) && n_tokens >= 0 && n_tokens <= a.kv_tokens);
  SessionRec& b = sessions_[dst];
  const int full = n_tokens / kBlockTokens;
  for (int i = 0; i < full; i++) {
    b.chunks.push_back(a.chunks[i]);
    recs_[a.chunks[i]].refs++;
    recs_[a.chunks[i]].owners.push_back(dst);
  }
  b.kv_tokens = n_tokens;
  Touch(b, now);
  std::optional<TransferOp> copy;
  if (n_tokens % kBlockTokens) {  // the partial chunk is dst's own: a copy of src's, or recomputed
    const int32_t from = a.chunks[full];
    const int32_t id = NewRec(full * kBlockTokens, dst);
    recs_[id].length = n_tokens % kBlockTokens;
    recs_[id].last_active = now;
    b.chunks.push_back(id);
    copy = CopyChunk(from, id, dst, full, /*sync_ok=*/true, now);
  }
  return copy;
}

void CacheManager::Truncate(SessionId s, int n_tokens, double now) {
  SessionRec& S = sessions_.at(s);
  MNEMO_CHECK(!S.acquired && n_tokens >= 0);
  clock_ = std::max(clock_, now);
  n_tokens = std::min(n_tokens, S.kv_tokens);
  while (!S.chunks.empty() && recs_[S.chunks.back()].begin >= n_tokens) {
    Unref(S.chunks.back(), s);
    S.chunks.pop_back();
  }
  S.kv_tokens = n_tokens;
  UnshareLast(s, S, now);
  SetLengths(S);
}

void CacheManager::SetLengths(SessionRec& S) {
  for (int32_t id : S.chunks) {
    ChunkRec& c = recs_[id];
    c.length = std::min(kBlockTokens, S.kv_tokens - c.begin);
    if (c.length < kBlockTokens) c.copied_out = false;
  }
}

void CacheManager::UnshareLast(SessionId s, SessionRec& S, double now) {
  if (S.chunks.empty() || S.kv_tokens % kBlockTokens == 0) return;
  const int chunk = static_cast<int>(S.chunks.size()) - 1;
  const int32_t shared = S.chunks[chunk];
  if (recs_[shared].refs <= 1) return;
  MNEMO_CHECK(recs_[shared].begin + kBlockTokens > S.kv_tokens);
  const int32_t own = NewRec(recs_[shared].begin, s);
  recs_[own].length = S.kv_tokens - recs_[own].begin;
  recs_[own].last_active = std::max(S.last_active, recs_[shared].last_active);
  S.chunks[chunk] = own;
  CopyChunk(shared, own, s, chunk, /*sync_ok=*/false, now);
  Unref(shared, s);
  Sync(own);
}

void CacheManager::Invalidate(SessionId s, int chunk) {
  SessionRec& S = sessions_.at(s);
  MNEMO_CHECK(!S.acquired && chunk >= 0 && chunk < static_cast<int>(S.chunks.size()));
  int32_t& id = S.chunks[chunk];
  // The chunk's data is not valid KV, for any of its owners: they all recompute it. Only when a
  // transfer or an acquired owner uses it (and, if recomputing it, will make it valid) does s
  // alone get a fresh record.
  const ChunkState st = recs_[id].state;
  if (recs_[id].pins > 0 || recs_[id].readers > 0 || (st != ChunkState::kEmpty && st != ChunkState::kResident)) {
    const int begin = recs_[id].begin, length = recs_[id].length;
    Unref(id, s);
    id = NewRec(begin, s);
    recs_[id].length = length;
    return;
  }
  FreeData(id);
}

void CacheManager::RestoreLength(SessionId s, int n_tokens) {
  SessionRec& S = sessions_.at(s);
  MNEMO_CHECK(!S.acquired);
  S.kv_tokens = std::max(S.kv_tokens, n_tokens);
  while (static_cast<int>(S.chunks.size()) < BlocksFor(S.kv_tokens)) {
    int32_t id = NewRec(static_cast<int>(S.chunks.size()) * kBlockTokens, s);
    recs_[id].last_active = S.last_active;  // as active as its session
    S.chunks.push_back(id);
  }
  SetLengths(S);
}

void CacheManager::RestoreChunk(SessionId s, int chunk, Tier tier, int32_t block, int n_tokens) {
  RestoreLength(s, n_tokens);
  SessionRec& S = sessions_.at(s);
  MNEMO_CHECK(chunk < static_cast<int>(S.chunks.size()));
  ChunkRec& c = recs_[S.chunks[chunk]];
  MNEMO_CHECK(c.state == ChunkState::kEmpty && pool(tier).Take(block));
  c.tier = tier;
  c.block = block;
  if (tier == Tier::kT2) {
    c.disk_session = s;
    c.disk_chunk = chunk;
  }
  Transition(S.chunks[chunk], ChunkState::kResident);
}

std::vector<Tier> CacheManager::Residency(SessionId s) const {
  std::vector<Tier> r;
  for (int32_t id : sessions_.at(s).chunks) r.push_back(recs_[id].tier);
  return r;
}

int CacheManager::kv_tokens(SessionId s) const { return sessions_.at(s).kv_tokens; }

bool CacheManager::acquired(SessionId s) const {
  auto it = sessions_.find(s);
  return it != sessions_.end() && it->second.acquired;
}

bool CacheManager::HoldsT0(SessionId s, const std::vector<int32_t>& table) const {
  auto it = sessions_.find(s);
  if (it == sessions_.end() || !it->second.acquired || table.size() > it->second.chunks.size()) return false;
  for (size_t i = 0; i < table.size(); i++) {
    const ChunkRec& c = recs_[it->second.chunks[i]];
    if (c.pins <= 0) return false;
    if (c.tier == Tier::kT0 && c.block == table[i]) continue;
    const InFlight* f = c.op ? in_flight_.Find(c.op) : nullptr;
    if (f == nullptr || f->op.dst != Tier::kT0 || f->op.dst_block != table[i]) return false;
  }
  return true;
}

int32_t CacheManager::AllocateIn(Tier t, double now) {
  BlockAllocator& a = pool(t);
  int32_t b = a.Allocate();
  if (b >= 0) return b;
  const int32_t v = PickVictim(t, now);
  if (v < 0) return -1;
  stats_.evictions[static_cast<int>(t)]++;
  if (t == Tier::kT1 && config_.t2_blocks > 0) {  // spill to disk; the T1 block frees later
    int32_t d = AllocateIn(Tier::kT2, now);
    if (d >= 0) {
      StartOp(v, Tier::kT2, d, true);
      return -1;
    }
  }
  FreeData(v);  // only the raw tokens remain
  stats_.drops++;
  return a.Allocate();
}

int CacheManager::EvictFromT0(int n, double now) {
  int freed_now = 0;
  for (int i = 0; i < n; i++) {
    const int32_t id = PickVictim(Tier::kT0, now);  // each one leaves the index (a copy, or dropped)
    if (id < 0) break;
    // Its record is read after T1's victim is dropped: start the (likely) cache miss now, so the
    // two overlap (at 262k records, the two record misses were a fifth of an eviction's time).
    __builtin_prefetch(&recs_[id]);
    stats_.evictions[0]++;
    int32_t b = config_.t1_blocks > 0 ? AllocateIn(Tier::kT1, now) : -1;
    if (b >= 0) {
      StartOp(id, Tier::kT1, b, true);
      continue;
    }
    b = config_.t2_blocks > 0 ? AllocateIn(Tier::kT2, now) : -1;
    if (b >= 0) {
      StartOp(id, Tier::kT2, b, true);
      continue;
    }
    FreeData(id);
    stats_.drops++;
    freed_now++;
  }
  return freed_now;
}

int CacheManager::PinnedT0Blocks() const { return pinned_; }

CacheManager::Room CacheManager::RoomFor(const SessionRec& S, int n_tokens) const {
  Room r;
  r.need_blocks = std::max(0, BlocksFor(n_tokens) - static_cast<int>(S.chunks.size()));
  for (int32_t id : S.chunks) {
    const ChunkRec& c = recs_[id];
    r.already_pinned += c.pins > 0;
    const InFlight* f = c.op != 0 ? &in_flight_.At(c.op) : nullptr;
    // A chunk loading into T0 has its block reserved already; anything else not in T0 needs one.
    if (c.tier != Tier::kT0 && !(f && f->op.dst == Tier::kT0)) r.need_blocks++;
    // A copy reads it (e.g. for a fork): let it land first, unless it is a full T0 chunk, which
    // admission pins where it is and nobody writes (a copy out of the tiers reads those).
    if (c.readers > 0 && !(c.tier == Tier::kT0 && c.length == kBlockTokens)) r.wait = true;
    if (c.state == ChunkState::kResident && c.tier == Tier::kT2) r.wait = true;  // must be loaded first
    // A demotion out of T0 can be revived; loads, spills and copies must land first.
    if (f && !Revivable(c)) r.wait = true;
  }
  return r;
}

void CacheManager::StartLoads(SessionRec& S, double now) {
  for (int32_t id : S.chunks) {
    ChunkRec& c = recs_[id];
    if (c.state != ChunkState::kResident || c.tier != Tier::kT2 || c.readers > 0) continue;
    Tier dst = Tier::kT0;
    int32_t b = t0_.Allocate();
    if (b < 0 && config_.t1_blocks > 0) {
      dst = Tier::kT1;
      b = AllocateIn(Tier::kT1, now);
    }
    if (b >= 0) StartOp(id, dst, b, true);
  }
}

int CacheManager::PendingDemotions() const {
  int n = 0;
  in_flight_.ForEach([&](uint64_t, const InFlight& f) {
    const ChunkRec& c = recs_[f.rec];
    n += c.state == ChunkState::kDemoting && c.tier == Tier::kT0 && c.pins == 0;
  });
  return n;
}

std::vector<uint64_t> CacheManager::T0FreeingOps() const {
  std::vector<uint64_t> ops;
  in_flight_.ForEach([&](uint64_t id, const InFlight& f) {
    const ChunkRec& c = recs_[f.rec];
    if (c.state == ChunkState::kDemoting && c.tier == Tier::kT0 && c.pins == 0) ops.push_back(id);
  });
  std::sort(ops.begin(), ops.end());
  return ops;
}

void CacheManager::CountHit(ChunkRec& c, int tier, int valid, Acquired* out) {
  if (c.from_remote) {
    out->remote_tokens += valid;
  } else {
    out->hit_tokens[c.from_disk ? 2 : tier] += valid;
  }
  c.from_disk = c.from_remote = false;
}

Admission CacheManager::Acquire(SessionId s, int n_tokens, double now, Acquired* out) {
  SessionRec& S = sessions_.at(s);
  MNEMO_CHECK(!S.acquired && n_tokens >= S.kv_tokens);
  const int n_chunks = BlocksFor(n_tokens);
  if (n_chunks > admission_blocks()) return Admission::kImpossible;
  Touch(S, now);
  const Room room = RoomFor(S, n_tokens);
  // Running turns hold T0: making room now would evict what they will release anyway.
  if (PinnedT0Blocks() + n_chunks - room.already_pinned > admission_blocks()) return Admission::kLater;
  if (room.wait || t0_.num_free() < room.need_blocks) {
    want_ = Want{s, n_tokens};
    return Admission::kLater;
  }
  if (want_.session == s) want_ = Want{};

  // Everything fits: pin and map every chunk to a T0 block.
  *out = Acquired{};
  S.acquired = true;
  out->block_table.resize(n_chunks);
  for (int i = 0; i < n_chunks; i++) {
    if (i >= static_cast<int>(S.chunks.size())) S.chunks.push_back(NewRec(i * kBlockTokens, s));
    const int32_t id = S.chunks[i];
    ChunkRec& c = recs_[id];
    c.pins++;
    const int valid = std::clamp(S.kv_tokens - c.begin, 0, kBlockTokens);
    switch (c.tier) {
      case Tier::kT0:
        // Keep using the T0 copy; the demotion's result is discarded.
        if (c.state == ChunkState::kDemoting) Transition(id, ChunkState::kRevived);
        out->block_table[i] = c.block;
        if (c.state == ChunkState::kFilling) {  // another owner is recomputing it: never read it half-written, recompute too
          if (valid > 0) out->recompute.push_back(i);
          break;
        }
        CountHit(c, 0, valid, out);
        break;
      case Tier::kT1: {
        int32_t b = t0_.Allocate();
        MNEMO_CHECK(b >= 0);
        uint64_t op = StartOp(id, Tier::kT0, b, false);
        out->swap_ins.push_back(in_flight_.At(op).op);
        out->block_table[i] = b;
        CountHit(c, 1, valid, out);
        break;
      }
      case Tier::kT2:
        MNEMO_CHECK(false);  // waited for above
        break;
      case Tier::kNone:  // kEmpty: a copy that fills it was waited for above
        c.block = t0_.Allocate();
        MNEMO_CHECK(c.block >= 0);
        c.tier = Tier::kT0;
        out->block_table[i] = c.block;
        if (valid > 0) out->recompute.push_back(i);
        Transition(id, valid > 0 ? ChunkState::kFilling : ChunkState::kResident);
        break;
    }
    Sync(id);
  }
  return Admission::kOk;
}

bool CacheManager::Grow(SessionId s, int n_tokens, std::vector<int32_t>* table) {
  SessionRec& S = sessions_.at(s);
  MNEMO_CHECK(S.acquired);
  while (static_cast<int>(S.chunks.size()) < BlocksFor(n_tokens)) {
    int32_t b = t0_.Allocate();
    if (b < 0) {
      // Demotions in flight free blocks soon (a retry once they land gets them): evict only for
      // the blocks they will not cover, as upkeep does for a waiting admission. Evicting one
      // more at every try once demoted 1, 2, 3... chunks for a decode lacking one block.
      const int short_by = BlocksFor(n_tokens) - static_cast<int>(S.chunks.size()) - PendingDemotions();
      if (short_by > 0 && EvictFromT0(short_by, clock_) > 0) b = t0_.Allocate();
    }
    if (b < 0) return false;
    int32_t id = NewRec(static_cast<int>(S.chunks.size()) * kBlockTokens, s);
    recs_[id].tier = Tier::kT0;
    recs_[id].block = b;
    recs_[id].pins = 1;
    recs_[id].last_active = S.last_active;
    Transition(id, ChunkState::kResident);
    S.chunks.push_back(id);
    table->push_back(b);
  }
  return true;
}

void CacheManager::Release(SessionId s, int kv_tokens, double now) {
  SessionRec& S = sessions_.at(s);
  MNEMO_CHECK(S.acquired);
  S.acquired = false;
  for (int32_t id : S.chunks) {
    recs_[id].pins--;
    Sync(id);
  }
  // A chunk s was recomputing holds KV below kv_tokens only. Its other owners would take it as
  // whole, so a shared one that s did not finish (a suspension) cannot stay theirs: when nobody
  // else is recomputing it, s keeps the block and what it computed, and the others recompute.
  for (size_t i = 0; i < S.chunks.size(); i++) {
    const int32_t id = S.chunks[i];
    if (recs_[id].state != ChunkState::kFilling) continue;
    const int begin = recs_[id].begin;
    if (kv_tokens >= begin + kBlockTokens || recs_[id].refs == 1) {
      Transition(id, ChunkState::kResident);  // complete, or s's alone
    } else if (recs_[id].pins == 0) {
      if (kv_tokens > begin) {  // s's own record takes the block and what s computed
        const int32_t own = NewRec(begin, s);
        std::swap(recs_[own].tier, recs_[id].tier);
        std::swap(recs_[own].block, recs_[id].block);
        recs_[own].last_active = recs_[id].last_active;
        Transition(own, ChunkState::kResident);
        Transition(id, ChunkState::kEmpty);
        S.chunks[i] = own;
        Unref(id, s);
      } else {
        FreeData(id);
      }
    } else if (kv_tokens > begin) {  // another owner is still recomputing it: leave it to them
      S.chunks[i] = NewRec(begin, s);
      Unref(id, s);
      stats_.cow_recomputes++;
    }
  }
  while (!S.chunks.empty() && recs_[S.chunks.back()].begin >= kv_tokens) {
    Unref(S.chunks.back(), s);
    S.chunks.pop_back();
  }
  S.kv_tokens = kv_tokens;
  UnshareLast(s, S, now);  // a shared chunk that s did not recompute but stops inside
  SetLengths(S);
  Touch(S, now);
}

void CacheManager::Suspend(SessionId s, int kv_tokens, double now) {
  Release(s, kv_tokens, now);
  SessionRec& S = sessions_.at(s);
  for (int32_t id : S.chunks) {
    ChunkRec& c = recs_[id];
    if (c.state != ChunkState::kResident || c.tier != Tier::kT0 || c.pins > 0 || c.readers > 0) continue;
    stats_.evictions[0]++;
    int32_t b = config_.t1_blocks > 0 ? AllocateIn(Tier::kT1, now) : -1;
    if (b < 0 && config_.t2_blocks > 0) {
      b = AllocateIn(Tier::kT2, now);
      if (b >= 0) {
        StartOp(id, Tier::kT2, b, true);
        continue;
      }
    }
    if (b >= 0) {
      StartOp(id, Tier::kT1, b, true);
    } else {
      FreeData(id);
      stats_.drops++;
    }
  }
}

void CacheManager::Maintain(int32_t free_target, double now) {
  clock_ = std::max(clock_, now);
  int target = free_target;
  auto w = want_.session >= 0 ? sessions_.find(want_.session) : sessions_.end();
  if (w != sessions_.end() && !w->second.acquired && want_.n_tokens >= w->second.kv_tokens) {
    SessionRec& W = w->second;
    // The waiting session's own chunks are neither victims nor counted as room being made (a
    // demotion of one of them is revived when it is admitted).
    for (int32_t id : W.chunks) {
      recs_[id].pins++;
      Sync(id);
    }
    StartLoads(W, now);
    target = std::max(target, RoomFor(W, want_.n_tokens).need_blocks);
    const int short_by = target - t0_.num_free() - PendingDemotions();
    if (short_by > 0) EvictFromT0(short_by, now);
    for (int32_t id : W.chunks) {
      recs_[id].pins--;
      Sync(id);
    }
  } else {
    const int short_by = target - t0_.num_free() - PendingDemotions();
    if (short_by > 0) EvictFromT0(short_by, now);
  }
  want_ = Want{};
  if (config_.t1_blocks > 0 && config_.t2_blocks > 0) {
    const int t1_target = std::max(1, config_.t1_blocks / 16);
    int spilling = 0;
    in_flight_.ForEach([&](uint64_t, const InFlight& f) { spilling += f.op.src == Tier::kT1 && f.op.dst == Tier::kT2; });
    for (int n = t1_target - t1_.num_free() - spilling; n > 0; n--) {
      const int32_t id = PickVictim(Tier::kT1, now);
      if (id < 0) break;
      int32_t d = AllocateIn(Tier::kT2, now);  // evicts from T2 only: id stays the T1 victim
      if (d < 0) break;
      stats_.evictions[1]++;
      StartOp(id, Tier::kT2, d, true);
    }
  }
}

}  // namespace mnemo
