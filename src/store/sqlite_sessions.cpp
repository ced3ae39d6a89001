// Sessions (raw token logs and turns) and the atomic commit of a finished turn.
#include <mutex>

#include "store/sqlite_db.h"
#include "store/sqlite_store.h"
#include "store/store_internal.h"

namespace mnemo {

using sqlite::Db;
using sqlite::Transaction;
using store_internal::DecodeTokens;
using store_internal::EncodeTokens;

namespace {
long long LL(int64_t v) { return static_cast<long long>(v); }

// Session row columns: id, owner, created_at, updated_at, n_tokens, cuts.
StoredSession SessionFromRow(const sqlite::Stmt& st) {
  StoredSession s;
  s.id = st.Int(0);
  s.owner = st.Text(1);
  s.created_at = st.Double(2);
  s.updated_at = st.Double(3);
  s.cuts = st.Int(5);
  return s;
}

// Appends one turn row (columns: turn_begin, prompt_end, turn_end, complete, tokens) to s,
// checking that turns tile the log.
Status AddTurnRow(const sqlite::Stmt& st, int first_col, StoredSession& s) {
  StoredTurn t{st.Int(first_col), st.Int(first_col + 1), st.Int(first_col + 2), st.Int(first_col + 3) != 0};
  size_t before = s.tokens.size();
  if (t.begin != static_cast<int64_t>(before) || t.prompt_end < t.begin || t.end < t.prompt_end ||
      !DecodeTokens(st.Blob(first_col + 4), s.tokens) ||
      static_cast<int64_t>(s.tokens.size()) != t.end) {
    return MakeError("session %lld is corrupt: turn [%lld, %lld) does not follow position %zu", LL(s.id),
                     LL(t.begin), LL(t.end), before);
  }
  s.turns.push_back(t);
  return {};
}
}  // namespace

// ---- write bodies (write_mu_ held, write transaction open) ----

Result<int64_t> SqliteStore::SessionLength(Db& db, int64_t id) {
  auto st = db.Prepare("SELECT n_tokens FROM sessions WHERE id=?1");
  if (!st) return st.error();
  st->Bind(1, id);
  auto row = st->Step();
  if (!row) return row.error();
  if (!*row) return MakeError("unknown session %lld", LL(id));
  return st->Int(0);
}

Status SqliteStore::CreateSessionTx(int64_t id, const std::string& owner, double now) {
  if (id <= 0) return MakeError("session ids must be positive, not %lld", LL(id));
  auto exists = writer_->Prepare("SELECT 1 FROM sessions WHERE id=?1");
  if (!exists) return exists.error();
  auto row = exists->Bind(1, id).Step();
  if (!row) return row.error();
  if (*row) return MakeError("session %lld exists", LL(id));
  auto ins = writer_->Prepare(
      "INSERT INTO sessions(id, owner, created_at, updated_at, n_tokens) VALUES(?1, ?2, ?3, ?3, 0)");
  if (!ins) return ins.error();
  MNEMO_TRY(ins->Bind(1, id).Bind(2, owner).Bind(3, now).Run());
  auto hw = writer_->Prepare(
      "INSERT INTO meta(key, value) VALUES('max_session_id', ?1) "
      "ON CONFLICT(key) DO UPDATE SET value=max(value, excluded.value)");
  if (!hw) return hw.error();
  return hw->Bind(1, id).Run();
}

Status SqliteStore::AppendTurnTx(int64_t id, int64_t begin, int64_t prompt_end, std::span<const int32_t> tokens,
                           bool complete, double now) {
  int64_t end = begin + static_cast<int64_t>(tokens.size());
  if (tokens.empty()) return MakeError("session %lld: a turn needs at least one token", LL(id));
  if (prompt_end < begin || prompt_end > end) {
    return MakeError("session %lld: turn prompt_end %lld outside [%lld, %lld]", LL(id), LL(prompt_end),
                     LL(begin), LL(end));
  }
  auto len = SessionLength(*writer_, id);
  if (!len) return len.error();
  if (*len != begin) {  // the compare-and-set of a turn: another writer moved the session first
    return MakeError(StatusCode::kAborted, "session %lld has %lld tokens: a turn must begin there, not at %lld",
                     LL(id), LL(*len), LL(begin));
  }
  auto ins = writer_->Prepare(
      "INSERT INTO turns(session_id, turn_begin, prompt_end, turn_end, complete, tokens) "
      "VALUES(?1, ?2, ?3, ?4, ?5, ?6)");
  if (!ins) return ins.error();
  std::vector<uint8_t> blob = EncodeTokens(tokens);  // [4 * n_tokens] bytes
  MNEMO_TRY(ins->Bind(1, id).Bind(2, begin).Bind(3, prompt_end).Bind(4, end).Bind(5, int64_t{complete})
                .BindBlob(6, blob)
                .Run());
  auto upd = writer_->Prepare("UPDATE sessions SET n_tokens=?2, updated_at=?3 WHERE id=?1");
  if (!upd) return upd.error();
  MNEMO_TRY(upd->Bind(1, id).Bind(2, end).Bind(3, now).Run());
  // A turn that completes no chunk has no mark to add (one missing before it is added when one
  // does), unless it leaves a short log (marked at its length).
  if (!store_internal::HasMarksToAdd(begin, end)) return {};
  return sqlite::MarkPrefixes(*writer_, id, tokens);
}

Status SqliteStore::TruncateSessionTx(int64_t id, int64_t n, double now) {
  auto len = SessionLength(*writer_, id);
  if (!len) return len.error();
  if (n < 0 || n > *len) {
    return MakeError("cannot truncate session %lld (%lld tokens) to %lld tokens", LL(id), LL(*len), LL(n));
  }
  if (n == *len) return {};
  // substr on a BLOB counts bytes: keep the straddling turn's first (n - turn_begin) tokens.
  const char* const kSteps[] = {
      "UPDATE turns SET prompt_end=min(prompt_end, ?2), turn_end=?2, complete=0, "
      "tokens=substr(tokens, 1, (?2 - turn_begin) * 4) "
      "WHERE session_id=?1 AND turn_begin<?2 AND turn_end>?2",
      "DELETE FROM turns WHERE session_id=?1 AND turn_begin>=?2",
      "UPDATE responses SET session_id=NULL WHERE session_id=?1 AND end_token>?2",
      "UPDATE conversations SET session_id=NULL, end_token=NULL WHERE session_id=?1 AND end_token>?2",
      "DELETE FROM session_prefixes WHERE session_id=?1 AND n_tokens>?2",
  };
  for (const char* sql : kSteps) {
    auto st = writer_->Prepare(sql);
    if (!st) return st.error();
    MNEMO_TRY(st->Bind(1, id).Bind(2, n).Run());
  }
  auto upd = writer_->Prepare("UPDATE sessions SET n_tokens=?2, updated_at=?3, cuts=cuts+1 WHERE id=?1");
  if (!upd) return upd.error();
  return upd->Bind(1, id).Bind(2, n).Bind(3, now).Run();
}

// ---- sessions ----

Status SqliteStore::CreateSession(int64_t id, const std::string& owner) {
  std::lock_guard lock(write_mu_);
  auto tx = Transaction::Begin(*writer_, Transaction::Kind::kWrite);
  if (!tx) return tx.error();
  MNEMO_TRY(CreateSessionTx(id, owner, UnixNow()));
  return tx->Commit();
}

Status SqliteStore::AppendTurn(int64_t id, int64_t begin, int64_t prompt_end, std::span<const int32_t> tokens,
                         bool complete) {
  std::lock_guard lock(write_mu_);
  auto tx = Transaction::Begin(*writer_, Transaction::Kind::kWrite);
  if (!tx) return tx.error();
  MNEMO_TRY(AppendTurnTx(id, begin, prompt_end, tokens, complete, UnixNow()));
  return tx->Commit();
}

Status SqliteStore::TruncateSession(int64_t id, int64_t n_tokens) {
  std::lock_guard lock(write_mu_);
  auto tx = Transaction::Begin(*writer_, Transaction::Kind::kWrite);
  if (!tx) return tx.error();
  MNEMO_TRY(TruncateSessionTx(id, n_tokens, UnixNow()));
  return tx->Commit();
}

Status SqliteStore::ForkSession(int64_t src, int64_t dst, int64_t n, const std::string& owner) {
  std::lock_guard lock(write_mu_);
  auto tx = Transaction::Begin(*writer_, Transaction::Kind::kWrite);
  if (!tx) return tx.error();
  double now = UnixNow();
  auto len = SessionLength(*writer_, src);
  if (!len) return len.error();
  if (n < 0 || n > *len) {
    return MakeError("cannot fork %lld tokens of session %lld (%lld tokens)", LL(n), LL(src), LL(*len));
  }
  MNEMO_TRY(CreateSessionTx(dst, owner, now));
  const char* const kSteps[] = {
      "INSERT INTO turns(session_id, turn_begin, prompt_end, turn_end, complete, tokens) "
      "SELECT ?3, turn_begin, prompt_end, turn_end, complete, tokens FROM turns "
      "WHERE session_id=?1 AND turn_begin<?2",
      "UPDATE turns SET prompt_end=min(prompt_end, ?2), turn_end=?2, complete=0, "
      "tokens=substr(tokens, 1, (?2 - turn_begin) * 4) "
      "WHERE session_id=?3 AND turn_begin<?2 AND turn_end>?2",
      "UPDATE sessions SET n_tokens=?2 WHERE id=?3",  // ?1 unused: SQLite allows gaps
      // The marks within the fork, when the chain's seed (the owner) is the same.
      "INSERT INTO session_prefixes(session_id, n_tokens, hash) SELECT ?3, n_tokens, hash FROM session_prefixes "
      "WHERE session_id=?1 AND n_tokens<=?2 "
      "AND (SELECT owner FROM sessions WHERE id=?1) = (SELECT owner FROM sessions WHERE id=?3)",
  };
  for (const char* sql : kSteps) {
    auto st = writer_->Prepare(sql);
    if (!st) return st.error();
    MNEMO_TRY(st->Bind(1, src).Bind(2, n).Bind(3, dst).Run());
  }
  MNEMO_TRY(sqlite::MarkPrefixes(*writer_, dst, {}));  // another owner's fork: its own chain
  return tx->Commit();
}

Status SqliteStore::DeleteSession(int64_t id) {
  std::lock_guard lock(write_mu_);
  auto tx = Transaction::Begin(*writer_, Transaction::Kind::kWrite);
  if (!tx) return tx.error();
  auto del = writer_->Prepare("DELETE FROM sessions WHERE id=?1");
  if (!del) return del.error();
  MNEMO_TRY(del->Bind(1, id).Run());
  if (writer_->changes() == 0) return MakeError("unknown session %lld", LL(id));
  return tx->Commit();
}

Status SqliteStore::LoadTurns(Db& db, int64_t id, StoredSession& s) {
  auto st = db.Prepare(
      "SELECT turn_begin, prompt_end, turn_end, complete, tokens FROM turns "
      "WHERE session_id=?1 ORDER BY turn_begin");
  if (!st) return st.error();
  st->Bind(1, id);
  for (;;) {
    auto row = st->Step();
    if (!row) return row.error();
    if (!*row) return {};
    MNEMO_TRY(AddTurnRow(*st, 0, s));
  }
}

Result<StoredSession> SqliteStore::LoadSession(int64_t id) {
  std::lock_guard lock(read_mu_);
  auto tx = Transaction::Begin(*reader_, Transaction::Kind::kRead);
  if (!tx) return tx.error();
  auto st = reader_->Prepare("SELECT id, owner, created_at, updated_at, n_tokens, cuts FROM sessions WHERE id=?1");
  if (!st) return st.error();
  auto row = st->Bind(1, id).Step();
  if (!row) return row.error();
  if (!*row) return MakeError("unknown session %lld", LL(id));
  StoredSession s = SessionFromRow(*st);
  int64_t n_tokens = st->Int(4);
  s.tokens.reserve(n_tokens);
  MNEMO_TRY(LoadTurns(*reader_, id, s));
  if (static_cast<int64_t>(s.tokens.size()) != n_tokens) {
    return MakeError("session %lld is corrupt: %zu tokens in turns, %lld recorded", LL(id), s.tokens.size(),
                     LL(n_tokens));
  }
  return s;
}

Result<std::optional<SessionVersion>> SqliteStore::GetSessionVersion(int64_t id) {
  std::lock_guard lock(read_mu_);
  auto st = reader_->Prepare("SELECT n_tokens, cuts FROM sessions WHERE id=?1");
  if (!st) return st.error();
  auto row = st->Bind(1, id).Step();
  if (!row) return row.error();
  if (!*row) return std::optional<SessionVersion>();
  return std::optional<SessionVersion>(SessionVersion{st->Int(0), st->Int(1)});
}

Status SqliteStore::ForEachSession(const std::function<Status(StoredSession&&)>& fn) {
  std::lock_guard lock(read_mu_);
  auto tx = Transaction::Begin(*reader_, Transaction::Kind::kRead);
  if (!tx) return tx.error();
  // A merge join of two ordered scans: one pass over each table, whatever the number of sessions.
  auto ss = reader_->Prepare("SELECT id, owner, created_at, updated_at, n_tokens, cuts FROM sessions ORDER BY id");
  if (!ss) return ss.error();
  auto ts = reader_->Prepare(
      "SELECT session_id, turn_begin, prompt_end, turn_end, complete, tokens FROM turns "
      "ORDER BY session_id, turn_begin");
  if (!ts) return ts.error();
  auto turn_row = ts->Step();
  if (!turn_row) return turn_row.error();
  for (;;) {
    auto row = ss->Step();
    if (!row) return row.error();
    if (!*row) break;
    StoredSession s = SessionFromRow(*ss);
    int64_t n_tokens = ss->Int(4);
    s.tokens.reserve(n_tokens);
    // Turns of sessions that no longer exist cannot occur (foreign key), but skip them anyway.
    while (*turn_row && ts->Int(0) <= s.id) {
      if (ts->Int(0) == s.id) MNEMO_TRY(AddTurnRow(*ts, 1, s));
      turn_row = ts->Step();
      if (!turn_row) return turn_row.error();
    }
    if (static_cast<int64_t>(s.tokens.size()) != n_tokens) {
      return MakeError("session %lld is corrupt: %zu tokens in turns, %lld recorded", LL(s.id),
                       s.tokens.size(), LL(n_tokens));
    }
    MNEMO_TRY(fn(std::move(s)));
  }
  return {};
}

Result<int64_t> SqliteStore::MaxSessionId() {
  std::lock_guard lock(read_mu_);
  auto v = reader_->QueryInt(
      "SELECT max(coalesce((SELECT value FROM meta WHERE key='max_session_id'), 0), "
      "coalesce((SELECT max(id) FROM sessions), 0))");
  if (!v) return v.error();
  return v->value_or(0);
}

Result<std::optional<int64_t>> SqliteStore::TokenIdentity() {
  std::lock_guard lock(read_mu_);
  return reader_->QueryInt("SELECT value FROM meta WHERE key='token_identity'");
}

Status SqliteStore::SetTokenIdentity(int64_t identity) {
  std::lock_guard lock(write_mu_);
  auto st = writer_->Prepare(
      "INSERT INTO meta(key, value) VALUES('token_identity', ?1) ON CONFLICT(key) DO UPDATE SET value=excluded.value");
  if (!st) return st.error();
  return st->Bind(1, identity).Run();
}

Result<bool> SqliteStore::HasSessions() {
  std::lock_guard lock(read_mu_);
  auto v = reader_->QueryInt("SELECT EXISTS(SELECT 1 FROM sessions)");
  if (!v) return v.error();
  return v->value_or(0) != 0;
}

Result<int64_t> SqliteStore::DeleteAllSessions() {
  std::lock_guard lock(write_mu_);
  auto tx = Transaction::Begin(*writer_, Transaction::Kind::kWrite);
  if (!tx) return tx.error();
  MNEMO_TRY(writer_->Exec("DELETE FROM sessions"));
  const int64_t n = writer_->changes();
  MNEMO_TRY(tx->Commit());
  return n;
}

// ---- the durable end of a turn ----

Result<std::vector<std::string>> SqliteStore::CommitTurn(const TurnCommit& c) {
  std::lock_guard lock(write_mu_);
  auto tx = Transaction::Begin(*writer_, Transaction::Kind::kWrite);
  if (!tx) return tx.error();
  double now = UnixNow();
  // First: a request answered already is the common reason to refuse, and costs one probe.
  if (c.request) MNEMO_TRY(PutRequestTx(*c.request, now));
  if (c.create_session) MNEMO_TRY(CreateSessionTx(c.session_id, c.owner, now));
  if (c.expected_length) {
    auto len = SessionLength(*writer_, c.session_id);
    if (!len) return len.error();
    if (*len != *c.expected_length) {
      return MakeError(StatusCode::kAborted, "session %lld has %lld tokens, not the %lld this writer expected",
                       LL(c.session_id), LL(*len), LL(*c.expected_length));
    }
  }
  if (c.expected_cuts) {
    auto st = writer_->Prepare("SELECT cuts FROM sessions WHERE id=?1");
    if (!st) return st.error();
    auto row = st->Bind(1, c.session_id).Step();
    if (!row) return row.error();
    if (!*row) return MakeError("unknown session %lld", LL(c.session_id));
    if (st->Int(0) != *c.expected_cuts) {
      return MakeError(StatusCode::kAborted, "session %lld was cut %lld times, not the %lld this writer expected",
                       LL(c.session_id), LL(st->Int(0)), LL(*c.expected_cuts));
    }
  }
  // The conversation's compare-and-set reads the pointer before this commit's own cut: the cut
  // below clears pointers past it, this conversation's included (its previous turn ended past the
  // cut when the cut drops that turn's last tokens), which read afterwards failed every such turn.
  if (c.conversation && c.conversation->expected) {
    auto st = writer_->Prepare("SELECT session_id, end_token FROM conversations WHERE id=?1");
    if (!st) return st.error();
    auto row = st->Bind(1, c.conversation->conversation_id).Step();
    if (!row) return row.error();
    if (!*row) return MakeError("unknown conversation '%s'", c.conversation->conversation_id.c_str());
    ConversationPointer now_at;
    if (!st->IsNull(0)) now_at.session_id = st->Int(0);
    if (!st->IsNull(1)) now_at.end_token = st->Int(1);
    if (now_at != *c.conversation->expected) {
      return MakeError(StatusCode::kAborted, "conversation '%s' moved on since this writer read it",
                       c.conversation->conversation_id.c_str());
    }
  }
  if (c.truncate_to) MNEMO_TRY(TruncateSessionTx(c.session_id, *c.truncate_to, now));
  MNEMO_TRY(AppendTurnTx(c.session_id, c.begin, c.prompt_end, c.tokens, c.complete, now));
  int64_t end = c.begin + static_cast<int64_t>(c.tokens.size());
  if (c.response) {
    StoredResponse r = *c.response;
    r.session_id = c.session_id;
    r.end_token = end;
    if (r.created_at == 0) r.created_at = now;
    MNEMO_TRY(PutResponseTx(r));
  }
  std::vector<std::string> ids;
  if (c.conversation) {
    auto added = AddItemsTx(c.conversation->conversation_id, c.conversation->items, now);
    if (!added) return added.error();
    ids = std::move(*added);
    if (c.conversation->set_session) {
      auto upd = writer_->Prepare("UPDATE conversations SET session_id=?2, end_token=?3 WHERE id=?1");
      if (!upd) return upd.error();
      MNEMO_TRY(upd->Bind(1, c.conversation->conversation_id).Bind(2, c.session_id).Bind(3, end).Run());
    }
  }
  MNEMO_TRY(tx->Commit());
  return ids;
}

}  // namespace mnemo
