// The PostgreSQL store: opening (pool, schema), sessions, session ids and the atomic commit of a
// turn. Responses and conversations are in pg_objects.cpp.
#include "store/pg_store.h"

#include <algorithm>
#include <limits>

#include "base/log.h"
#include "store/pg_conn.h"
#include "store/pg_listen.h"
#include "store/store_internal.h"

namespace mnemo {

using pg::Conn;
using pg::Param;
using pg::Rows;
using pg::Stmt;
using pg::Tx;
using store_internal::DecodeTokens;
using store_internal::EncodeTokens;

namespace {
long long LL(int64_t v) { return static_cast<long long>(v); }

// pg_advisory_xact_lock key ("mnem"): replicas starting together migrate one at a time.
constexpr int64_t kMigrationLock = 0x6d6e656d;
// pg_advisory_xact_lock key ("mnid"): ClaimTokenIdentity's check and write are one decision.
constexpr int64_t kIdentityLock = 0x6d6e6964;

// The schema at version kBaseVersion, as SQLite's migrations leave it (types are PostgreSQL's:
// bigint positions and ids, bytea token logs of little-endian int32, double precision seconds).
// PostgreSQL stores start at version 2: the SQLite history's v1 -> v2 step predates them.
constexpr int64_t kBaseVersion = 2;
constexpr const char* kSchema = R"sql(
CREATE TABLE mnemo_meta(
  key text PRIMARY KEY,
  value bigint NOT NULL
);
CREATE SEQUENCE mnemo_session_ids;
CREATE TABLE sessions(
  id bigint PRIMARY KEY,
  owner text NOT NULL,
  created_at double precision NOT NULL,
  updated_at double precision NOT NULL,
  n_tokens bigint NOT NULL
);
CREATE TABLE turns(
  session_id bigint NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
  turn_begin bigint NOT NULL,
  prompt_end bigint NOT NULL,
  turn_end bigint NOT NULL,
  complete boolean NOT NULL,
  tokens bytea NOT NULL,
  PRIMARY KEY(session_id, turn_begin)
);
CREATE TABLE conversations(
  id text PRIMARY KEY,
  owner text NOT NULL,
  created_at double precision NOT NULL,
  metadata_json text NOT NULL,
  session_id bigint REFERENCES sessions(id) ON DELETE SET NULL,
  end_token bigint
);
CREATE INDEX conversations_by_session ON conversations(session_id);
CREATE TABLE conversation_items(
  id text NOT NULL,
  conversation_id text NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
  position bigint NOT NULL,
  item_json text NOT NULL,
  created_at double precision NOT NULL,
  PRIMARY KEY(conversation_id, id),
  UNIQUE(conversation_id, position)
);
CREATE TABLE responses(
  id text PRIMARY KEY,
  owner text NOT NULL,
  session_id bigint REFERENCES sessions(id) ON DELETE SET NULL,
  end_token bigint NOT NULL,
  created_at double precision NOT NULL,
  model text NOT NULL,
  status text NOT NULL,
  previous_response_id text,
  conversation_id text REFERENCES conversations(id) ON DELETE SET NULL,
  request_json text NOT NULL,
  input_items_json text NOT NULL,
  output_json text NOT NULL,
  usage_json text NOT NULL
);
CREATE INDEX responses_by_session ON responses(session_id);
CREATE INDEX responses_by_conversation ON responses(conversation_id);
)sql";

// kUpgrades[v - kBaseVersion] takes the schema from version v to v + 1 (as SQLite's migrations).
const char* const kUpgrades[] = {
    // v2 -> v3: request-id de-duplication (X-Mnemo-Request-Id).
    R"sql(
CREATE TABLE request_records(
  owner text NOT NULL,
  request_id text NOT NULL,
  body_hash text NOT NULL,
  status integer NOT NULL,
  body text NOT NULL,
  created_at double precision NOT NULL,
  expires_at double precision NOT NULL,
  PRIMARY KEY(owner, request_id)
);
CREATE INDEX request_records_by_expiry ON request_records(expires_at);
)sql",
    // v3 -> v4: each session counts the truncations that dropped tokens (SessionVersion).
    R"sql(
ALTER TABLE sessions ADD COLUMN cuts bigint NOT NULL DEFAULT 0;
)sql",
    // v4 -> v5: the prefix index (store.h): each session's marks, a chained hash of its owner and
    // tokens at every full chunk (n_tokens a multiple of 32). Migrate marks the stored sessions.
    R"sql(
CREATE TABLE session_prefixes(
  session_id bigint NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
  n_tokens bigint NOT NULL,
  hash bigint NOT NULL,
  PRIMARY KEY(session_id, n_tokens)
);
CREATE INDEX session_prefixes_by_hash ON session_prefixes(hash, session_id);
)sql",
};
static_assert(kBaseVersion + std::size(kUpgrades) == Store::kSchemaVersion);

// A PostgreSQL array literal of bigints ("{1,-2,3}"), for a text parameter cast to bigint[].
std::string BigintArray(std::span<const uint64_t> v) {
  std::string out = "{";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(static_cast<int64_t>(v[i]));
  }
  return out + "}";
}

// A session's row, locked, with what marking its log needs (the prefix index, store.h): owner,
// n_tokens, the last full mark's n_tokens and hash (short marks are no links of the chain), and
// the tokens from that mark up to position $2.
// $3 false: the row alone (the mark columns NULL), when the turn completes no chunk.
constexpr pg::Stmt kLockForMarks{"lock_for_marks",
    "SELECT s.owner, s.n_tokens, m.n_tokens, m.hash, CASE WHEN $3::boolean THEN "
    "  (SELECT string_agg(substring(t.tokens from (greatest(coalesce(m.n_tokens, 0) - t.turn_begin, 0) * 4 + 1)::int),"
    "     ''::bytea ORDER BY t.turn_begin) FROM turns t "
    "   WHERE t.session_id=$1 AND t.turn_end>coalesce(m.n_tokens, 0) AND t.turn_begin<$2::bigint) END "
    "FROM sessions s LEFT JOIN LATERAL (SELECT n_tokens, hash FROM session_prefixes "
    "  WHERE session_id=s.id AND n_tokens % 32 = 0 AND $3::boolean ORDER BY n_tokens DESC LIMIT 1) m ON true "
    "WHERE s.id=$1 FOR UPDATE OF s"};

// Adds the marks of a log of n tokens past its last mark, from a kLockForMarks row. `last`: the
// log's final tokens when the caller has them (a turn appended at position `at`; at < 0: none
// held, the row then holds every token after the mark). Cost: one insert, when a chunk completed.
Status AddMarks(Conn& c, int64_t id, const Rows& head, int64_t n, int64_t at, std::span<const int32_t> last) {
  const int64_t m = head.IsNull(0, 2) ? 0 : head.Int(0, 2);  // marked up to here
  const uint64_t seed = head.IsNull(0, 2) ? PrefixSeed(head.Text(0, 0)) : static_cast<uint64_t>(head.Int(0, 3));
  if (!store_internal::HasMarksToAdd(m, n)) return {};
  const int64_t read_end = at >= 0 ? at : n;
  std::vector<int32_t> tail;  // tokens [m, n)
  tail.reserve(n - m);
  if (!head.IsNull(0, 4)) {
    auto blob = head.Bytes(0, 4);
    if (blob) DecodeTokens(*blob, tail);
  }
  if (read_end < m || static_cast<int64_t>(tail.size()) < read_end - m ||
      (at >= 0 && at + static_cast<int64_t>(last.size()) != n)) {
    return MakeError(StatusCode::kDataLoss, "session %lld is corrupt: its turns do not hold tokens [%lld, %lld)",
                     LL(id), LL(m), LL(n));
  }
  tail.resize(read_end - m);
  if (at >= 0) tail.insert(tail.end(), last.begin() + std::max<int64_t>(m - at, 0), last.end());
  if (n < kPrefixChunk) {  // a short log; ON CONFLICT: a fork at its source's short mark copied it
    return c.Run(Stmt{"add_short_mark",
                      "INSERT INTO session_prefixes(session_id, n_tokens, hash) VALUES($1, $2, $3) "
                      "ON CONFLICT DO NOTHING"},
                 {id, n, static_cast<int64_t>(ShortPrefixHashes(seed, tail).back())});
  }
  const std::vector<uint64_t> marks = PrefixHashes(seed, tail);
  return c.Run(
      Stmt{"add_marks",
           "INSERT INTO session_prefixes(session_id, n_tokens, hash) "
           "SELECT $1, $2::bigint + k * 32, h FROM unnest($3::bigint[]) WITH ORDINALITY AS u(h, k)"},
      {id, m, BigintArray(marks)});
}

// Marks session id's whole log past its last mark (a fork, a store opened at schema 4), in the
// caller's transaction. Cost: two statements.
Status MarkPrefixes(Conn& c, int64_t id) {
  auto head = c.Exec(kLockForMarks, {id, std::numeric_limits<int64_t>::max(), "true"});
  if (!head) return head.error();
  if (head->size() == 0) return MakeError("unknown session %lld", LL(id));
  return AddMarks(c, id, *head, head->Int(0, 1), -1, {});
}

// v4 -> v5: marks every stored session's log. Cost: reading every log once.
Status MarkStoredSessions(Conn& c) {
  auto ids = c.Exec("SELECT id FROM sessions ORDER BY id");
  if (!ids) return ids.error();
  for (int i = 0; i < ids->size(); ++i) MNEMO_TRY(MarkPrefixes(c, ids->Int(i, 0)));
  return {};
}

Status Migrate(Conn& c, const std::string& where) {
  auto tx = Tx::Begin(c);
  if (!tx) return tx.error();
  MNEMO_TRY(c.Run("SELECT pg_advisory_xact_lock($1)", {kMigrationLock}));
  MNEMO_TRY(c.Run(
      "CREATE TABLE IF NOT EXISTS mnemo_schema_version(version integer PRIMARY KEY, applied_at double precision NOT NULL)"));
  auto v = c.QueryInt("SELECT max(version) FROM mnemo_schema_version");
  if (!v) return v.error();
  int64_t version = v->value_or(0);
  if (version > Store::kSchemaVersion) {
    return MakeError("store %s has schema version %lld, newer than this build's %d", where.c_str(), LL(version),
                     Store::kSchemaVersion);
  }
  if (version == 0) {
    MNEMO_TRY(c.Script(kSchema));
    version = kBaseVersion;
    MNEMO_TRY(c.Run("INSERT INTO mnemo_schema_version(version, applied_at) VALUES($1, $2)", {version, UnixNow()}));
  }
  for (; version < Store::kSchemaVersion; ++version) {
    MNEMO_TRY(c.Script(kUpgrades[version - kBaseVersion]));
    if (version + 1 == 5) MNEMO_TRY(MarkStoredSessions(c));
    MNEMO_TRY(c.Run("INSERT INTO mnemo_schema_version(version, applied_at) VALUES($1, $2)", {version + 1, UnixNow()}));
  }
  return tx->Commit();
}

// "postgresql://user:secret@host/db" -> "postgresql://user:***@host/db" (for logs and errors).
std::string Redact(const std::string& url) {
  const size_t scheme = url.find("://");
  if (scheme == std::string::npos) return url;
  const size_t at = url.find('@', scheme + 3);
  const size_t colon = url.find(':', scheme + 3);
  if (at == std::string::npos || colon == std::string::npos || colon > at) return url;
  return url.substr(0, colon + 1) + "***" + url.substr(at);
}

// Session row columns: id, owner, created_at, updated_at, n_tokens (read by the caller), cuts.
StoredSession SessionFromRow(const Rows& r, int row) {
  StoredSession s;
  s.id = r.Int(row, 0);
  s.owner = r.Text(row, 1);
  s.created_at = r.Double(row, 2);
  s.updated_at = r.Double(row, 3);
  s.cuts = r.Int(row, 5);
  return s;
}

// Appends one turn row (columns from first_col: turn_begin, prompt_end, turn_end, complete,
// tokens) to s, checking that turns tile the log.
Status AddTurnRow(const Rows& r, int row, int c, StoredSession& s) {
  StoredTurn t{r.Int(row, c), r.Int(row, c + 1), r.Int(row, c + 2), r.Text(row, c + 3) == "t"};
  const size_t before = s.tokens.size();
  auto blob = r.Bytes(row, c + 4);
  if (!blob || t.begin != static_cast<int64_t>(before) || t.prompt_end < t.begin || t.end < t.prompt_end ||
      !DecodeTokens(*blob, s.tokens) || static_cast<int64_t>(s.tokens.size()) != t.end) {
    return MakeError(StatusCode::kDataLoss, "session %lld is corrupt: turn [%lld, %lld) does not follow position %zu",
                     LL(s.id), LL(t.begin), LL(t.end), before);
  }
  s.turns.push_back(t);
  return {};
}

Status CheckLength(const StoredSession& s, int64_t n_tokens) {
  if (static_cast<int64_t>(s.tokens.size()) == n_tokens) return {};
  return MakeError(StatusCode::kDataLoss, "session %lld is corrupt: %zu tokens in turns, %lld recorded", LL(s.id),
                   s.tokens.size(), LL(n_tokens));
}

constexpr const char* kSnapshot = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY";
}  // namespace

Result<std::unique_ptr<Store>> PgStore::Open(const std::string& url, const StoreOptions& options) {
  if (options.pg_connections < 1 || options.pg_connections > 64) {
    return MakeError(StatusCode::kInvalidArgument, "PostgreSQL pool size must be in [1, 64], not %d",
                     options.pg_connections);
  }
  std::unique_ptr<PgStore> store(new PgStore());
  store->path_ = Redact(url);
  // Statement and lock timeouts bound how long a stuck server or a held row lock can keep a
  // request; a turn's commit takes milliseconds.
  std::string setup = "SET statement_timeout = '30s'; SET lock_timeout = '10s'; SET client_min_messages = warning";
  if (options.durability == Durability::kNormal) setup += "; SET synchronous_commit = off";
  store->pool_ = std::make_unique<pg::Pool>(url, options.pg_connections, options.pg_connect_timeout_s, setup);
  store->url_ = url;
  store->setup_ = setup;
  store->connect_timeout_s_ = options.pg_connect_timeout_s;
  store->origin_ = NewId("");
  Status st = store->pool_->With([&](Conn& c) { return Migrate(c, store->path_); });
  if (!st.ok()) return Error{st.error().message + " (store " + store->path_ + ")", st.code()};
  return std::unique_ptr<Store>(std::move(store));
}

PgStore::~PgStore() = default;

Status PgStore::WriteTx(const std::function<Status(Conn&)>& fn) {
  return pool_->With([&](Conn& c) -> Status {
    auto tx = Tx::Begin(c);
    if (!tx) return tx.error();
    MNEMO_TRY(fn(c));
    return tx->Commit();
  });
}

Result<int64_t> PgStore::NewSessionId() {
  std::lock_guard lock(ids_mu_);
  if (ids_.empty()) {
    Status st = pool_->With([&](Conn& c) -> Status {
      auto r = c.Exec(Stmt{"new_session_ids", "SELECT nextval('mnemo_session_ids') FROM generate_series(1, $1::int)"},
                      {kIdBlock});
      if (!r) return r.error();
      for (int i = 0; i < r->size(); ++i) ids_.push_back(r->Int(i, 0));
      return {};
    });
    if (!st.ok()) return st.error();
  }
  int64_t id = ids_.front();
  ids_.pop_front();
  return id;
}

// ---- write bodies (inside the caller's transaction) ----

Result<int64_t> PgStore::LockSession(Conn& c, int64_t id) {
  auto v = c.QueryInt(Stmt{"lock_session", "SELECT n_tokens FROM sessions WHERE id=$1 FOR UPDATE"}, {id});
  if (!v) return v.error();
  if (!v->has_value()) return MakeError("unknown session %lld", LL(id));
  return **v;
}

Status PgStore::CreateSessionTx(Conn& c, int64_t id, const std::string& owner, double now) {
  if (id <= 0) return MakeError("session ids must be positive, not %lld", LL(id));
  auto exists = c.QueryInt(Stmt{"session_exists", "SELECT 1 FROM sessions WHERE id=$1"}, {id});
  if (!exists) return exists.error();
  if (exists->has_value()) return MakeError("session %lld exists", LL(id));
  MNEMO_TRY(c.Run(Stmt{"insert_session",
                       "INSERT INTO sessions(id, owner, created_at, updated_at, n_tokens) VALUES($1, $2, $3, $3, 0)"},
                  {id, owner, now}));
  // The high-water mark MaxSessionId reports, transactional as in SQLite (the sequence is not:
  // nextval and setval survive a rollback).
  MNEMO_TRY(c.Run(
      Stmt{"max_session_id",
           "INSERT INTO mnemo_meta(key, value) VALUES('max_session_id', $1) "
           "ON CONFLICT(key) DO UPDATE SET value=greatest(mnemo_meta.value, excluded.value)"},
      {id}));
  // An id chosen by the caller (not drawn from the sequence) moves the sequence past it, so
  // NewSessionId never hands it out again.
  return c.Run(
      Stmt{"session_id_past",
           "SELECT setval('mnemo_session_ids', $1::bigint) FROM mnemo_session_ids "
           "WHERE $1::bigint > last_value OR NOT is_called"},
      {id});
}

Status PgStore::AppendTurnTx(Conn& c, int64_t id, int64_t begin, int64_t prompt_end,
                             std::span<const int32_t> tokens, bool complete, double now) {
  const int64_t end = begin + static_cast<int64_t>(tokens.size());
  if (tokens.empty()) return MakeError("session %lld: a turn needs at least one token", LL(id));
  if (prompt_end < begin || prompt_end > end) {
    return MakeError("session %lld: turn prompt_end %lld outside [%lld, %lld]", LL(id), LL(prompt_end), LL(begin),
                     LL(end));
  }
  // The row lock orders this append against other replicas'; a turn that completes a chunk (or
  // leaves a short log) reads what marking it needs in the same round trip (one that completes
  // none has no mark to add, and any mark missing before it is added when one does).
  const bool marks = store_internal::HasMarksToAdd(begin, end);
  auto head = c.Exec(kLockForMarks, {id, begin, marks ? "true" : "false"});
  if (!head) return head.error();
  if (head->size() == 0) return MakeError("unknown session %lld", LL(id));
  const int64_t len = head->Int(0, 1);
  if (len != begin) {
    return MakeError(StatusCode::kAborted, "session %lld has %lld tokens: a turn must begin there, not at %lld",
                     LL(id), LL(len), LL(begin));
  }
  std::vector<uint8_t> blob = EncodeTokens(tokens);  // [4 * n_tokens] bytes
  MNEMO_TRY(c.Run(
      Stmt{"insert_turn",
           "INSERT INTO turns(session_id, turn_begin, prompt_end, turn_end, complete, tokens) "
           "VALUES($1, $2, $3, $4, $5, $6)"},
      {id, begin, prompt_end, end, complete ? "true" : "false", Param::Bytes(blob)}));
  MNEMO_TRY(c.Run(Stmt{"session_length", "UPDATE sessions SET n_tokens=$2, updated_at=$3 WHERE id=$1"},
                  {id, end, now}));
  return marks ? AddMarks(c, id, *head, end, begin, tokens) : Status::Ok();
}

Status PgStore::TruncateSessionTx(Conn& c, int64_t id, int64_t n, double now) {
  auto len = LockSession(c, id);
  if (!len) return len.error();
  if (n < 0 || n > *len) {
    return MakeError("cannot truncate session %lld (%lld tokens) to %lld tokens", LL(id), LL(*len), LL(n));
  }
  if (n == *len) return {};
  // substring on a bytea counts bytes: keep the straddling turn's first (n - turn_begin) tokens.
  const char* const kSteps[] = {
      "UPDATE turns SET prompt_end=least(prompt_end, $2::bigint), turn_end=$2::bigint, complete=false, "
      "tokens=substring(tokens from 1 for (($2::bigint - turn_begin) * 4)::int) "
      "WHERE session_id=$1 AND turn_begin<$2::bigint AND turn_end>$2::bigint",
      "DELETE FROM turns WHERE session_id=$1 AND turn_begin>=$2::bigint",
      "UPDATE responses SET session_id=NULL WHERE session_id=$1 AND end_token>$2::bigint",
      "UPDATE conversations SET session_id=NULL, end_token=NULL WHERE session_id=$1 AND end_token>$2::bigint",
      "DELETE FROM session_prefixes WHERE session_id=$1 AND n_tokens>$2::bigint",
  };
  for (const char* sql : kSteps) MNEMO_TRY(c.Run(sql, {id, n}));
  return c.Run("UPDATE sessions SET n_tokens=$2, updated_at=$3, cuts=cuts+1 WHERE id=$1", {id, n, now});
}

// ---- sessions ----

Status PgStore::CreateSession(int64_t id, const std::string& owner) {
  return WriteTx([&](Conn& c) { return CreateSessionTx(c, id, owner, UnixNow()); });
}

Status PgStore::AppendTurn(int64_t id, int64_t begin, int64_t prompt_end, std::span<const int32_t> tokens,
                           bool complete) {
  return WriteTx([&](Conn& c) -> Status {
    MNEMO_TRY(AppendTurnTx(c, id, begin, prompt_end, tokens, complete, UnixNow()));
    return NotifyTx(c, id);
  });
}

Status PgStore::TruncateSession(int64_t id, int64_t n_tokens) {
  return WriteTx([&](Conn& c) -> Status {
    MNEMO_TRY(TruncateSessionTx(c, id, n_tokens, UnixNow()));
    return NotifyTx(c, id);
  });
}

Status PgStore::ForkSession(int64_t src, int64_t dst, int64_t n, const std::string& owner) {
  return WriteTx([&](Conn& c) -> Status {
    auto len = LockSession(c, src);
    if (!len) return len.error();
    if (n < 0 || n > *len) {
      return MakeError("cannot fork %lld tokens of session %lld (%lld tokens)", LL(n), LL(src), LL(*len));
    }
    MNEMO_TRY(CreateSessionTx(c, dst, owner, UnixNow()));
    MNEMO_TRY(c.Run(
        "INSERT INTO turns(session_id, turn_begin, prompt_end, turn_end, complete, tokens) "
        "SELECT $3, turn_begin, prompt_end, turn_end, complete, tokens FROM turns "
        "WHERE session_id=$1 AND turn_begin<$2::bigint",
        {src, n, dst}));
    MNEMO_TRY(c.Run(
        "UPDATE turns SET prompt_end=least(prompt_end, $2::bigint), turn_end=$2::bigint, complete=false, "
        "tokens=substring(tokens from 1 for (($2::bigint - turn_begin) * 4)::int) "
        "WHERE session_id=$1 AND turn_begin<$2::bigint AND turn_end>$2::bigint",
        {dst, n}));
    MNEMO_TRY(c.Run("UPDATE sessions SET n_tokens=$2 WHERE id=$1", {dst, n}));
    // The marks within the fork, when the chain's seed (the owner) is the same; else its own chain.
    MNEMO_TRY(c.Run(
        "INSERT INTO session_prefixes(session_id, n_tokens, hash) SELECT $3, n_tokens, hash FROM session_prefixes "
        "WHERE session_id=$1 AND n_tokens<=$2::bigint "
        "AND (SELECT owner FROM sessions WHERE id=$1) = (SELECT owner FROM sessions WHERE id=$3)",
        {src, n, dst}));
    return MarkPrefixes(c, dst);
  });
}

Status PgStore::DeleteSession(int64_t id) {
  return WriteTx([&](Conn& c) -> Status {
    auto r = c.Exec("DELETE FROM sessions WHERE id=$1", {id});
    if (!r) return r.error();
    if (r->affected() == 0) return MakeError("unknown session %lld", LL(id));
    return NotifyTx(c, id);
  });
}

Result<StoredSession> PgStore::LoadSession(int64_t id) {
  StoredSession s;
  Status st = pool_->With([&](Conn& c) -> Status {
    auto tx = Tx::Begin(c, kSnapshot);
    if (!tx) return tx.error();
    auto r = c.Exec("SELECT id, owner, created_at, updated_at, n_tokens, cuts FROM sessions WHERE id=$1", {id});
    if (!r) return r.error();
    if (r->size() == 0) return MakeError("unknown session %lld", LL(id));
    s = SessionFromRow(*r, 0);
    const int64_t n_tokens = r->Int(0, 4);
    s.tokens.reserve(n_tokens);
    auto t = c.Exec(
        "SELECT turn_begin, prompt_end, turn_end, complete, tokens FROM turns WHERE session_id=$1 "
        "ORDER BY turn_begin",
        {id});
    if (!t) return t.error();
    for (int i = 0; i < t->size(); ++i) MNEMO_TRY(AddTurnRow(*t, i, 0, s));
    return CheckLength(s, n_tokens);
  });
  if (!st.ok()) return st.error();
  return s;
}

Result<std::optional<SessionVersion>> PgStore::GetSessionVersion(int64_t id) {
  std::optional<SessionVersion> v;
  Status st = pool_->With([&](Conn& c) -> Status {
    auto r = c.Exec(Stmt{"session_version", "SELECT n_tokens, cuts FROM sessions WHERE id=$1"}, {id});
    if (!r) return r.error();
    if (r->size() > 0) v = SessionVersion{r->Int(0, 0), r->Int(0, 1)};
    return {};
  });
  if (!st.ok()) return st.error();
  return v;
}

Status PgStore::ForEachSession(const std::function<Status(StoredSession&&)>& fn) {
  // fn's own Error is returned as is and must not be retried as a connection failure.
  std::optional<Status> fn_failed;
  bool started = false;
  Status st = pool_->With([&](Conn& c) -> Status {
    if (started) return MakeError(StatusCode::kUnavailable, "PostgreSQL connection lost during a session scan");
    auto tx = Tx::Begin(c, kSnapshot);
    if (!tx) return tx.error();
    auto ss = c.Exec("SELECT id, owner, created_at, updated_at, n_tokens, cuts FROM sessions ORDER BY id");
    if (!ss) return ss.error();
    // Turns through a cursor, a batch at a time: memory holds one batch, not every token log.
    MNEMO_TRY(c.Run(
        "DECLARE mnemo_turns NO SCROLL CURSOR FOR SELECT session_id, turn_begin, prompt_end, turn_end, complete, "
        "tokens FROM turns ORDER BY session_id, turn_begin"));
    std::optional<Rows> batch;
    int at = 0;
    auto next_turn = [&]() -> Result<bool> {  // positions (batch, at) on the next turn row
      if (batch && at + 1 < batch->size()) {
        ++at;
        return true;
      }
      auto b = c.Exec("FETCH 512 FROM mnemo_turns");
      if (!b) return b.error();
      batch.emplace(std::move(*b));
      at = 0;
      return batch->size() > 0;
    };
    auto have = next_turn();
    if (!have) return have.error();
    for (int i = 0; i < ss->size(); ++i) {
      StoredSession s = SessionFromRow(*ss, i);
      const int64_t n_tokens = ss->Int(i, 4);
      s.tokens.reserve(n_tokens);
      while (*have && batch->Int(at, 0) <= s.id) {
        if (batch->Int(at, 0) == s.id) MNEMO_TRY(AddTurnRow(*batch, at, 1, s));
        have = next_turn();
        if (!have) return have.error();
      }
      MNEMO_TRY(CheckLength(s, n_tokens));
      started = true;  // fn has seen a session: a retry would call it twice
      Status f = fn(std::move(s));
      if (!f.ok()) {
        fn_failed = f;
        return f;
      }
    }
    return tx->Commit();
  });
  if (fn_failed) return *fn_failed;
  return st;
}

Result<int64_t> PgStore::MaxSessionId() {
  std::optional<int64_t> v;
  Status st = pool_->With([&](Conn& c) -> Status {
    auto r = c.QueryInt(
        "SELECT greatest((SELECT value FROM mnemo_meta WHERE key='max_session_id'), "
        "(SELECT max(id) FROM sessions), 0)");
    if (!r) return r.error();
    v = *r;
    return {};
  });
  if (!st.ok()) return st.error();
  return v.value_or(0);
}

Result<std::optional<int64_t>> PgStore::TokenIdentity() {
  std::optional<int64_t> v;
  Status st = pool_->With([&](Conn& c) -> Status {
    auto r = c.QueryInt("SELECT value FROM mnemo_meta WHERE key='token_identity'");
    if (!r) return r.error();
    v = *r;
    return {};
  });
  if (!st.ok()) return st.error();
  return v;
}

Status PgStore::SetTokenIdentity(int64_t identity) {
  return WriteTx([&](Conn& c) {
    return c.Run(
        "INSERT INTO mnemo_meta(key, value) VALUES('token_identity', $1) "
        "ON CONFLICT(key) DO UPDATE SET value=excluded.value",
        {identity});
  });
}

Result<int64_t> PgStore::DeleteAllSessions() {
  int64_t n = 0;
  Status st = WriteTx([&](Conn& c) -> Status {
    auto r = c.Exec("DELETE FROM sessions");
    if (!r) return r.error();
    n = r->affected();
    return {};
  });
  if (!st.ok()) return st.error();
  return n;
}

Result<bool> PgStore::HasSessions() {
  bool any = false;
  Status st = pool_->With([&](Conn& c) -> Status {
    auto r = c.QueryInt("SELECT count(*) FROM (SELECT 1 FROM sessions LIMIT 1) AS s");
    if (!r) return r.error();
    any = r->value_or(0) > 0;
    return {};
  });
  if (!st.ok()) return st.error();
  return any;
}

Result<Store::IdentityClaim> PgStore::ClaimTokenIdentity(int64_t identity) {
  IdentityClaim claim = IdentityClaim::kSame;
  Status st = WriteTx([&](Conn& c) -> Status {
    // One claimant at a time: the check and the write below are one decision.
    MNEMO_TRY(c.Run("SELECT pg_advisory_xact_lock($1)", {kIdentityLock}));
    auto current = c.QueryInt("SELECT value FROM mnemo_meta WHERE key='token_identity'");
    if (!current) return current.error();
    if (*current && **current == identity) {
      claim = IdentityClaim::kSame;
      return {};
    }
    if (*current) {
      auto any = c.QueryInt("SELECT count(*) FROM (SELECT 1 FROM sessions LIMIT 1) AS s");
      if (!any) return any.error();
      if (any->value_or(0) > 0) {
        claim = IdentityClaim::kHeldByOther;
        return {};
      }
    }
    claim = IdentityClaim::kClaimed;
    return c.Run(
        "INSERT INTO mnemo_meta(key, value) VALUES('token_identity', $1) "
        "ON CONFLICT(key) DO UPDATE SET value=excluded.value",
        {identity});
  });
  if (!st.ok()) return st.error();
  return claim;
}

// ---- the prefix index ----

Result<std::optional<PrefixMatch>> PgStore::FindPrefix(const std::string& owner, std::span<const uint64_t> hashes,
                                                        std::span<const uint64_t> short_hashes) {
  std::optional<PrefixMatch> found;
  if (hashes.empty() && short_hashes.empty()) return found;
  // One list, longest first: the full chunks' marks at k * 32 tokens, then the short ones at p.
  std::vector<uint64_t> all(hashes.begin(), hashes.end());
  std::vector<uint64_t> lengths;
  for (size_t k = 1; k <= hashes.size(); ++k) lengths.push_back(k * kPrefixChunk);
  all.insert(all.end(), short_hashes.begin(), short_hashes.end());
  for (size_t p = 1; p <= short_hashes.size(); ++p) lengths.push_back(p);
  Status st = pool_->With([&](Conn& c) -> Status {
    // The chunks from the longest down, one probe of (hash, session_id) each, the highest id
    // first: the plan is a nested loop over the sorted chunks under the LIMIT, so it stops at the
    // first chunk that matches (one probe when the whole history is a stored log; an unsorted
    // join probed every chunk, 1.3 of its 1.7 ms for 50 chunks). No join in the probe: joined
    // with sessions to check the owner, the planner scanned all sessions when its statistics
    // were fresh. The owner is checked on the one session found instead (seeds differ per owner,
    // so another owner's session is found only by a 64-bit collision, and is then refused).
    auto r = c.Exec(
        Stmt{"find_prefix",
             "SELECT p.session_id, q.n, (SELECT n_tokens FROM sessions WHERE id=p.session_id AND owner=$1) "
             "FROM (SELECT h, n FROM unnest($2::bigint[], $3::bigint[]) AS u(h, n) ORDER BY n DESC) q "
             "CROSS JOIN LATERAL (SELECT session_id FROM session_prefixes WHERE hash=q.h "
             "  ORDER BY session_id DESC LIMIT 1) p "
             "ORDER BY q.n DESC LIMIT 1"},
        {owner, BigintArray(all), BigintArray(lengths)});
    if (!r) return r.error();
    if (r->size() > 0 && !r->IsNull(0, 2)) found = PrefixMatch{r->Int(0, 0), r->Int(0, 1), r->Int(0, 2)};
    return {};
  });
  if (!st.ok()) return st.error();
  return found;
}

// ---- the durable end of a turn ----

Result<std::vector<std::string>> PgStore::CommitTurn(const TurnCommit& t) {
  std::vector<std::string> ids;
  Status st = WriteTx([&](Conn& c) -> Status {
    const double now = UnixNow();
    // First: a request answered already is the common reason to refuse, and costs one probe.
    if (t.request) MNEMO_TRY(PutRequestTx(c, *t.request, now));
    if (t.create_session) MNEMO_TRY(CreateSessionTx(c, t.session_id, t.owner, now));
    if (t.expected_length) {
      auto len = LockSession(c, t.session_id);
      if (!len) return len.error();
      if (*len != *t.expected_length) {
        return MakeError(StatusCode::kAborted, "session %lld has %lld tokens, not the %lld this writer expected",
                         LL(t.session_id), LL(*len), LL(*t.expected_length));
      }
    }
    if (t.expected_cuts) {
      MNEMO_TRY(LockSession(c, t.session_id));
      auto cuts = c.QueryInt(Stmt{"session_cuts", "SELECT cuts FROM sessions WHERE id=$1"}, {t.session_id});
      if (!cuts) return cuts.error();
      if (cuts->value_or(-1) != *t.expected_cuts) {
        return MakeError(StatusCode::kAborted, "session %lld was cut %lld times, not the %lld this writer expected",
                         LL(t.session_id), LL(cuts->value_or(-1)), LL(*t.expected_cuts));
      }
    }
    // The conversation's compare-and-set before this commit's own cut, which clears pointers past
    // it (this conversation's too, when the cut drops its previous turn's last tokens).
    if (t.conversation && t.conversation->expected) {
      auto r = c.Exec(Stmt{"conversation_pointer",
                           "SELECT session_id, end_token FROM conversations WHERE id=$1 FOR UPDATE"},
                      {t.conversation->conversation_id});
      if (!r) return r.error();
      if (r->size() == 0) {
        return MakeError("unknown conversation '%s'", t.conversation->conversation_id.c_str());
      }
      ConversationPointer now_at;
      if (!r->IsNull(0, 0)) now_at.session_id = r->Int(0, 0);
      if (!r->IsNull(0, 1)) now_at.end_token = r->Int(0, 1);
      if (now_at != *t.conversation->expected) {
        return MakeError(StatusCode::kAborted, "conversation '%s' moved on since this writer read it",
                         t.conversation->conversation_id.c_str());
      }
    }
    if (t.truncate_to) MNEMO_TRY(TruncateSessionTx(c, t.session_id, *t.truncate_to, now));
    MNEMO_TRY(AppendTurnTx(c, t.session_id, t.begin, t.prompt_end, t.tokens, t.complete, now));
    const int64_t end = t.begin + static_cast<int64_t>(t.tokens.size());
    if (t.response) {
      StoredResponse r = *t.response;
      r.session_id = t.session_id;
      r.end_token = end;
      if (r.created_at == 0) r.created_at = now;
      MNEMO_TRY(PutResponseTx(c, r));
    }
    ids.clear();
    if (t.conversation) {
      auto added = AddItemsTx(c, t.conversation->conversation_id, t.conversation->items, now);
      if (!added) return added.error();
      ids = std::move(*added);
      if (t.conversation->set_session) {
        MNEMO_TRY(c.Run(Stmt{"conversation_session",
                             "UPDATE conversations SET session_id=$2, end_token=$3 WHERE id=$1"},
                        {t.conversation->conversation_id, t.session_id, end}));
      }
    }
    // A session created here is held by no other replica: nothing to tell.
    return t.create_session ? Status::Ok() : NotifyTx(c, t.session_id);
  });
  if (!st.ok()) return st.error();
  return ids;
}

}  // namespace mnemo
