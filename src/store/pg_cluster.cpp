// The PostgreSQL store's parts for several replicas at once (issue 14): a session's turn lock
// and the notices of changes to sessions (LISTEN/NOTIFY).
#include <cstdlib>
#include <sstream>

#include "base/log.h"
#include "store/pg_conn.h"
#include "store/pg_listen.h"
#include "store/pg_store.h"

namespace mnemo {

using pg::Conn;
using pg::Stmt;

namespace {
// Advisory lock keys of a session's turn lock: the two-int4 form, a space of its own (the
// one-bigint keys of the migration and identity locks never meet it), ("mntl" ^ the id's high
// half, its low half): one key per id.
int TurnLockKey1(int64_t id) { return static_cast<int>(0x6d6e746c ^ static_cast<uint32_t>(static_cast<uint64_t>(id) >> 32)); }
int TurnLockKey2(int64_t id) { return static_cast<int>(static_cast<uint32_t>(id)); }
}  // namespace

// ---- turn locks ----

Result<bool> PgStore::TryLockTurn(int64_t id) {
  std::lock_guard lock(lock_mu_);
  // Advisory locks nest within a connection: a second turn of this process would get it again.
  if (locked_.count(id)) return false;
  // A connection found dropped only when used (a server restart, a terminated backend) is
  // re-established and the statement run once more, as the pool does.
  for (int attempt = 0;; ++attempt) {
    if (lock_conn_ && lock_conn_->broken()) {
      // The server released every lock the connection held when it dropped; the turns that held
      // them go on, guarded by the compare-and-set only.
      if (!locked_.empty()) {
        spdlog::warn("PostgreSQL store: the turn locks of {} sessions were lost with their connection", locked_.size());
      }
      locked_.clear();
      MNEMO_TRY(lock_conn_->Reconnect());
    }
    if (!lock_conn_) {
      auto c = Conn::Open(url_, connect_timeout_s_, setup_);
      if (!c) return c.error();
      lock_conn_ = std::move(*c);
    }
    auto r = lock_conn_->Exec(Stmt{"try_turn_lock", "SELECT pg_try_advisory_lock($1::int, $2::int)"},
                              {TurnLockKey1(id), TurnLockKey2(id)});
    if (!r) {
      if (attempt == 0 && r.error().code == StatusCode::kUnavailable && lock_conn_->broken()) continue;
      return r.error();
    }
    const bool got = r->size() == 1 && r->Text(0, 0) == "t";
    if (got) locked_.insert(id);
    return got;
  }
}

void PgStore::UnlockTurn(int64_t id) {
  std::lock_guard lock(lock_mu_);
  if (locked_.erase(id) == 0 || !lock_conn_ || lock_conn_->broken()) return;  // not held (any more)
  auto r = lock_conn_->Exec(Stmt{"turn_unlock", "SELECT pg_advisory_unlock($1::int, $2::int)"},
                            {TurnLockKey1(id), TurnLockKey2(id)});
  if (!r) spdlog::warn("session {}: releasing its turn lock failed: {}", id, r.error().message);
}

// ---- change notices ----

Status PgStore::NotifyTx(Conn& c, int64_t id) const {
  return c.Run(
      Stmt{"notify_session",
           "SELECT pg_notify('mnemo_sessions', $1::text || ' ' || $2::bigint || ' ' || "
           "coalesce((SELECT n_tokens || ' ' || cuts FROM sessions WHERE id=$2::bigint), 'deleted') || ' ' || "
           "$3::text)"},
      {origin_, id, UnixNow()});
}

void PgStore::OnNotice(const std::string& payload) {
  std::istringstream in(payload);
  std::string origin, n;
  SessionChange change;
  if (!(in >> origin >> change.id >> n)) return;
  if (origin == origin_) return;  // this store's own commit
  if (n != "deleted") {
    SessionVersion v;
    v.n_tokens = std::strtoll(n.c_str(), nullptr, 10);
    if (!(in >> v.cuts)) return;
    change.version = v;
  }
  if (!(in >> change.sent_at)) return;
  std::lock_guard lock(watch_mu_);
  if (watch_fn_) watch_fn_(change);
}

void PgStore::Watch(std::function<void(const SessionChange&)> fn) {
  const bool start = fn != nullptr;
  {
    std::lock_guard lock(watch_mu_);
    watch_fn_ = std::move(fn);
  }
  // Started once, on the first watcher; it stays (idle) when the watcher goes.
  if (start && !listener_) {
    listener_ = std::make_unique<pg::Listener>(
        url_, connect_timeout_s_, kChannel, [this](const std::string& payload) { OnNotice(payload); },
        [this](bool) {
          SessionChange resync;
          resync.resync = true;
          std::lock_guard lock(watch_mu_);
          if (watch_fn_) watch_fn_(resync);
        });
  }
}

bool PgStore::Watching() const { return listener_ && listener_->listening(); }

}  // namespace mnemo
