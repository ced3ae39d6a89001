#include "kv/cache_manager.h"

#include <algorithm>
#include <cmath>

#include "base/status.h"

namespace mnemo {
namespace {
int ChunksFor(int n_tokens) { return (n_tokens + kBlockTokens - 1) / kBlockTokens; }
}  // namespace

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
  while (static_cast<int>(S.chunks.size()) < ChunksFor(S.kv_tokens)) {
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
  r.need_blocks = std::max(0, ChunksFor(n_tokens) - static_cast<int>(S.chunks.size()));
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
  const int n_chunks = ChunksFor(n_tokens);
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
  while (static_cast<int>(S.chunks.size()) < ChunksFor(n_tokens)) {
    int32_t b = t0_.Allocate();
    if (b < 0) {
      // Demotions in flight free blocks soon (a retry once they land gets them): evict only for
      // the blocks they will not cover, as upkeep does for a waiting admission. Evicting one
      // more at every try once demoted 1, 2, 3... chunks for a decode lacking one block.
      const int short_by = ChunksFor(n_tokens) - static_cast<int>(S.chunks.size()) - PendingDemotions();
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
  const int held = ChunksFor(S.kv_tokens);
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
    if (static_cast<int>(S.chunks.size()) != ChunksFor(S.kv_tokens) && !S.acquired) return false;
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
