// Sessions on a shared store (issue 14): loading a stored session on demand, and the per-turn probe
// that brings this replica's copy in step with the store (service.h's header comment).
#include <algorithm>
#include <chrono>
#include <thread>

#include "base/log.h"
#include "server/service.h"

namespace mnemo {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::vector<Turn> EngineTurns(const std::vector<StoredTurn>& stored, int64_t from) {
  std::vector<Turn> turns;
  for (const StoredTurn& t : stored) {
    if (t.begin >= from) turns.push_back(Turn{int(t.begin), int(t.prompt_end), int(t.end)});
  }
  return turns;
}

// What a turn lock's id names, for logs: a session, or a conversation that has none yet.
std::string LockName(int64_t id) {
  return id > 0 ? "session " + std::to_string(id) : "a conversation's first turn";
}

}  // namespace

Status Service::Adopt(StoredSession&& ss) {
  for (int32_t t : ss.tokens) {
    if (t < 0 || t >= tok_.n_vocab()) {
      return MakeError(StatusCode::kDataLoss, "stored session %lld holds token ids outside the vocabulary",
                       static_cast<long long>(ss.id));
    }
  }
  MNEMO_TRY(engine_.RestoreSession(ss.id, ss.tokens, EngineTurns(ss.turns, 0)));
  std::lock_guard<std::mutex> lock(mu_);
  Entry& e = sessions_[ss.id];
  e.owner = ss.owner;
  e.store_length = static_cast<int64_t>(ss.tokens.size());
  e.store_cuts = ss.cuts;
  e.tokens = std::move(ss.tokens);
  e.stored = true;
  IndexLocked(ss.id, 0);
  return Status::Ok();
}

bool Service::FreshInStore(int64_t id) {
  if (!Probes()) return true;
  int64_t length = 0, cuts = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sessions_.find(id);
    if (it == sessions_.end() || !it->second.stored) return true;
    if (it->second.stale) return false;  // another replica said so (OnStoreChange): no probe
    length = it->second.store_length;
    cuts = it->second.store_cuts;
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto v = store_->GetSessionVersion(id);
  if (!v.ok()) {
    spdlog::warn("session {}: cannot compare with the store ({}): {}", id, StatusCodeName(v.error().code),
                 v.error().message);
    return true;
  }
  const bool fresh = v->has_value() && (*v)->n_tokens == length && (*v)->cuts == cuts;
  if (on_sync_) on_sync_(fresh ? "fresh" : "stale", SecondsSince(t0));
  return fresh;
}

int64_t Service::FindStored(const std::string& owner, std::span<const int32_t> tokens, size_t held) {
  if (tokens.empty()) return -1;
  const auto t0 = std::chrono::steady_clock::now();
  // The short marks too: a history under a chunk (or one whose session is) has no full chunk.
  const uint64_t seed = PrefixSeed(owner);
  auto m = store_->FindPrefix(owner, PrefixHashes(seed, tokens), ShortPrefixHashes(seed, tokens));
  if (!m.ok()) {  // the turn goes on with what this replica holds
    spdlog::warn("cannot look the request's history up in the store's prefix index ({}): {}",
                 StatusCodeName(m.error().code), m.error().message);
    return -1;
  }
  if (!m->has_value() || static_cast<size_t>((*m)->n_tokens) <= held) return -1;
  spdlog::info("session {}: its stored log shares {} of the request's {} tokens (this replica's best {}; looked up "
               "in {:.3f} ms)",
               (*m)->session_id, (*m)->n_tokens, tokens.size(), held, SecondsSince(t0) * 1e3);
  return (*m)->session_id;
}

Service::Sync Service::SyncSession(int64_t id, const std::string& owner, bool load) {
  if (!Probes() || id <= 0) return Sync::kSkipped;
  bool held = false;
  uint64_t version = 0;
  int64_t length = 0, cuts = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    DropExpiredLocked();
    auto it = sessions_.find(id);
    if (it != sessions_.end()) {
      const Entry& e = it->second;
      if (!e.stored || e.busy) return Sync::kSkipped;
      held = true;
      version = e.version;
      length = e.store_length;
      cuts = e.store_cuts;
    }
  }
  if (!held && !load) return Sync::kSkipped;
  const auto t0 = std::chrono::steady_clock::now();
  auto v = store_->GetSessionVersion(id);
  const double probe_s = SecondsSince(t0);
  auto report = [&](Sync kind) {
    static const char* const kNames[] = {"skipped", "fresh", "loaded", "delta", "rebuilt", "absent"};
    if (on_sync_ && kind != Sync::kSkipped) on_sync_(kNames[static_cast<int>(kind)], probe_s);
    return kind;
  };
  if (!v.ok()) {  // the turn goes on with what this replica holds; a commit on a stale copy fails
    spdlog::warn("session {}: cannot compare with the store ({}): {}", id, StatusCodeName(v.error().code),
                 v.error().message);
    return Sync::kSkipped;
  }
  auto forget = [&] {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ForgetLocked(id);
    }
    engine_.DiscardSession(id);
  };
  if (!v->has_value()) {
    if (!held) return report(Sync::kAbsent);
    bool idle = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = sessions_.find(id);
      idle = it != sessions_.end() && it->second.version == version && !it->second.busy;
      if (idle) ForgetLocked(id);
    }
    if (idle) {
      engine_.DiscardSession(id);
      spdlog::info("session {}: deleted from the store: local copy dropped", id);
    }
    return report(Sync::kAbsent);
  }
  const SessionVersion stored = **v;
  if (held && stored.n_tokens == length && stored.cuts == cuts) {
    std::lock_guard<std::mutex> lock(mu_);  // a stale mark the store does not bear out is dropped
    auto it = sessions_.find(id);
    if (it != sessions_.end() && it->second.version == version) it->second.stale = false;
    return report(Sync::kFresh);
  }

  // Stale or not held: claim the entry (busy) while its log changes, so no turn starts on it.
  std::vector<int32_t> local;
  bool pending_cut = false;
  if (held) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sessions_.find(id);
    if (it == sessions_.end() || it->second.version != version || it->second.busy) return Sync::kSkipped;
    Entry& e = it->second;
    e.busy = true;
    index_.SetUse(id, UseOf(e));
    local = e.tokens;
    pending_cut = e.store_truncate.has_value() || !e.unstored_prefix.empty();
  }
  auto ss = store_->LoadSession(id);
  if (!ss.ok()) {
    spdlog::warn("session {}: cannot load it from the store ({}): {}", id, StatusCodeName(ss.error().code),
                 ss.error().message);
    if (held) forget();  // the copy is stale: the next turn loads it again
    return Sync::kSkipped;
  }
  if (!held) {
    if (ss->owner != owner) return Sync::kSkipped;  // another owner's: never this request's
    const int64_t n = static_cast<int64_t>(ss->tokens.size());
    Status a = Adopt(std::move(*ss));
    if (!a.ok()) {
      // Loaded meanwhile by a concurrent request (kAlreadyExists), or not loadable.
      if (a.code() != StatusCode::kAlreadyExists) spdlog::warn("session {}: not loaded: {}", id, a.error().message);
      return Sync::kSkipped;
    }
    spdlog::info("session {}: loaded from the store ({} tokens)", id, n);
    return report(Sync::kLoaded);
  }

  // The copy is a prefix of the stored log when no cut happened since it was read (appends only
  // grow the log) and it holds nothing the store has not seen; the tokens are compared as well.
  const size_t n_local = local.size();
  const bool prefix = ss->cuts == cuts && !pending_cut && n_local == static_cast<size_t>(length) &&
                      ss->tokens.size() >= n_local && std::equal(local.begin(), local.end(), ss->tokens.begin());
  const int64_t n_stored = static_cast<int64_t>(ss->tokens.size());
  if (prefix) {
    Status x = engine_.ExtendSession(id, std::span<const int32_t>(ss->tokens).subspan(n_local),
                                     EngineTurns(ss->turns, static_cast<int64_t>(n_local)));
    if (!x.ok()) {
      spdlog::warn("session {}: cannot append the stored turns: {}; local copy dropped", id, x.error().message);
      forget();
      return Sync::kSkipped;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      Entry& e = sessions_.at(id);
      UnlinkLocked(id, e);  // its latest turn is another replica's now: no fast path continues it
      e.tokens = std::move(ss->tokens);
      e.version++;
      e.store_length = n_stored;
      e.store_cuts = ss->cuts;
      e.stale = false;
      e.busy = false;
      IndexLocked(id, n_local);
    }
    spdlog::info("session {}: {} stored tokens appended (the store had {}, this replica {})", id,
                 n_stored - static_cast<int64_t>(n_local), n_stored, n_local);
    return report(Sync::kDelta);
  }
  // Diverged: rebuilt from the stored log, as a restart restores it.
  std::string key;  // its client session key (X-Session-Id) stays with it
  {
    std::lock_guard<std::mutex> lock(mu_);
    key = sessions_.at(id).key;
    ForgetLocked(id);
  }
  Status d = engine_.DeleteSession(id);
  if (!d.ok() && d.code() != StatusCode::kNotFound) {
    spdlog::warn("session {}: cannot drop the diverged copy: {}", id, d.error().message);
    return Sync::kSkipped;
  }
  const std::string session_owner = ss->owner;
  Status a = Adopt(std::move(*ss));
  if (!a.ok()) {
    spdlog::warn("session {}: not rebuilt: {}", id, a.error().message);
    return Sync::kSkipped;
  }
  if (!key.empty()) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sessions_.find(id);
    if (it != sessions_.end() && !keys_.count(session_owner + '\n' + key)) {
      it->second.key = key;
      keys_[session_owner + '\n' + key] = id;
    }
  }
  spdlog::info("session {}: diverged from the store (cuts {} -> {}, length {} -> {}): rebuilt from its {} stored tokens",
               id, cuts, stored.cuts, length, stored.n_tokens, n_stored);
  return report(Sync::kRebuilt);
}

Result<std::shared_ptr<TurnLock>> Service::LockTurn(int64_t id, bool* waited) {
  *waited = false;
  if (!store_) return std::shared_ptr<TurnLock>();
  const auto t0 = std::chrono::steady_clock::now();
  const auto deadline = t0 + std::chrono::duration<double>(config_.turn_lock_wait_s);
  // Polled: a try is one round trip on the store's lock connection, which a blocking wait would
  // hold for every other turn of this replica. 2 ms doubling to 20 ms: a turn that ends soon is
  // seen soon, a long one costs ~50 tries a second.
  auto pause = std::chrono::microseconds(2000);
  for (;;) {
    auto got = store_->TryLockTurn(id);
    if (!got.ok()) {
      spdlog::warn("{}: cannot take its turn lock ({}): {}; the turn goes on without it", LockName(id),
                   StatusCodeName(got.error().code), got.error().message);
      if (on_lock_) on_lock_("unavailable", SecondsSince(t0));
      return std::shared_ptr<TurnLock>();
    }
    if (*got) {
      const double s = SecondsSince(t0);
      if (*waited) spdlog::info("{}: waited {:.3f} s for a turn that held its lock", LockName(id), s);
      if (on_lock_) on_lock_(*waited ? "waited" : "free", s);
      return std::make_shared<TurnLock>(store_, id);
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      const double s = SecondsSince(t0);
      if (on_lock_) on_lock_("timeout", s);
      spdlog::info("{}: another turn still held its lock after {:.3f} s: refused", LockName(id), s);
      return MakeError(StatusCode::kAborted,
                       "this conversation has a turn in progress on this or another replica, which did not finish "
                       "within %.1f s; retry once it has",
                       config_.turn_lock_wait_s);
    }
    *waited = true;
    std::this_thread::sleep_for(std::min(pause, std::chrono::duration_cast<std::chrono::microseconds>(deadline - now)));
    pause = std::min(pause * 2, std::chrono::microseconds(20000));
  }
}

ApiResult<std::shared_ptr<TurnLock>> Service::LockStored(int64_t id) {
  bool waited = false;
  auto l = LockTurn(id, &waited);
  if (!l.ok()) return ToApiError(l.error());
  return std::move(*l);
}

void Service::OnStoreChange(const SessionChange& c) {
  if (c.resync) {
    // The notices sent while the listener was not listening are lost: every idle copy is marked
    // to be brought in step on its next turn (a probe, which drops the mark when the store bears
    // the copy out). One with a turn running is left to that turn's commit (compare-and-set).
    size_t marked = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& [id, e] : sessions_) {
        if (!e.stored || e.busy) continue;
        e.stale = true;
        marked++;
      }
      resyncs_++;
      if (on_resync_) on_resync_(marked);
    }
    if (resyncs_ > 1 || marked > 0) {
      spdlog::warn("store notifications: listening {}; notices sent meanwhile may be lost: {} local copies of stored "
                   "sessions marked to be checked against the store on their next turn",
                   resyncs_ > 1 ? "again" : "from now", marked);
    }
    return;
  }
  bool drop = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sessions_.find(c.id);
    if (it == sessions_.end() || !it->second.stored || it->second.busy) return;
    Entry& e = it->second;
    // Versions only grow (appends grow the length, cuts the cut count): news older than this copy,
    // or about it, changes nothing.
    if (c.version && (c.version->cuts < e.store_cuts ||
                      (c.version->cuts == e.store_cuts && c.version->n_tokens <= e.store_length))) {
      return;
    }
    const char* action = "stale";
    if (c.version && c.version->cuts == e.store_cuts) {
      // Appended elsewhere: this copy is a prefix of the stored log, and its KV stays useful.
      e.stale = true;
      UnlinkLocked(c.id, e);  // its latest turn is not the conversation's latest: no fast path
    } else {
      // Cut or deleted elsewhere: what it holds past the cut is no one's any more.
      ForgetLocked(c.id);
      drop = true;
      action = "dropped";
    }
    spdlog::debug("session {}: another replica {} it: local copy {}", c.id,
                  !c.version ? "deleted" : drop ? "cut" : "appended to", action);
    if (on_notice_) on_notice_(action, std::max(0.0, UnixNow() - c.sent_at));
  }
  if (drop) engine_.DiscardSession(c.id);
}

}  // namespace mnemo
