// Opening the SQLite store: connections, pragmas, integrity check, schema migrations.
#include "store/sqlite_store.h"

#include <sqlite3.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <filesystem>
#include <vector>

#include "store/sqlite_db.h"

namespace mnemo {

using sqlite::Db;
using sqlite::Transaction;

namespace {

// PRAGMA application_id of a mnemo store ("mnem"): tells our files from other SQLite databases.
constexpr int64_t kApplicationId = 0x6d6e656d;

// Migrations: kMigrations[v] takes the schema from version v to v + 1.
// Columns avoid SQL keywords (begin/end). Positions are token indices in a session's log.
const char* const kMigrations[] = {
    // v0 -> v1
    R"sql(
CREATE TABLE meta(
  key TEXT PRIMARY KEY,
  value INTEGER NOT NULL
);
CREATE TABLE sessions(
  id INTEGER PRIMARY KEY,
  owner TEXT NOT NULL,
  created_at REAL NOT NULL,
  updated_at REAL NOT NULL,
  n_tokens INTEGER NOT NULL
);
-- One row per turn; tokens holds positions [turn_begin, turn_end) as little-endian int32.
CREATE TABLE turns(
  session_id INTEGER NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
  turn_begin INTEGER NOT NULL,
  prompt_end INTEGER NOT NULL,
  turn_end INTEGER NOT NULL,
  complete INTEGER NOT NULL,
  tokens BLOB NOT NULL,
  PRIMARY KEY(session_id, turn_begin)
);
CREATE TABLE conversations(
  id TEXT PRIMARY KEY,
  owner TEXT NOT NULL,
  created_at REAL NOT NULL,
  metadata_json TEXT NOT NULL,
  session_id INTEGER REFERENCES sessions(id) ON DELETE SET NULL,
  end_token INTEGER
);
CREATE INDEX conversations_by_session ON conversations(session_id);
CREATE TABLE conversation_items(
  id TEXT PRIMARY KEY,
  conversation_id TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
  position INTEGER NOT NULL,
  item_json TEXT NOT NULL,
  created_at REAL NOT NULL,
  UNIQUE(conversation_id, position)
);
CREATE TABLE responses(
  id TEXT PRIMARY KEY,
  owner TEXT NOT NULL,
  session_id INTEGER REFERENCES sessions(id) ON DELETE SET NULL,
  end_token INTEGER NOT NULL,
  created_at REAL NOT NULL,
  model TEXT NOT NULL,
  status TEXT NOT NULL,
  previous_response_id TEXT,
  conversation_id TEXT REFERENCES conversations(id) ON DELETE SET NULL,
  request_json TEXT NOT NULL,
  input_items_json TEXT NOT NULL,
  output_json TEXT NOT NULL,
  usage_json TEXT NOT NULL
);
CREATE INDEX responses_by_session ON responses(session_id);
CREATE INDEX responses_by_conversation ON responses(conversation_id);
)sql",
    // v1 -> v2: an item id is unique within its conversation, not across the store, so that a
    // client-chosen id never collides with, nor probes for, another owner's items (issue 13).
    R"sql(
CREATE TABLE conversation_items_v2(
  id TEXT NOT NULL,
  conversation_id TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
  position INTEGER NOT NULL,
  item_json TEXT NOT NULL,
  created_at REAL NOT NULL,
  PRIMARY KEY(conversation_id, id),
  UNIQUE(conversation_id, position)
);
INSERT INTO conversation_items_v2(id, conversation_id, position, item_json, created_at)
  SELECT id, conversation_id, position, item_json, created_at FROM conversation_items;
DROP TABLE conversation_items;
ALTER TABLE conversation_items_v2 RENAME TO conversation_items;
)sql",
    // v2 -> v3: request-id de-duplication (X-Mnemo-Request-Id): each turn's answer, by the
    // client's request id, until it expires.
    R"sql(
CREATE TABLE request_records(
  owner TEXT NOT NULL,
  request_id TEXT NOT NULL,
  body_hash TEXT NOT NULL,
  status INTEGER NOT NULL,
  body TEXT NOT NULL,
  created_at REAL NOT NULL,
  expires_at REAL NOT NULL,
  PRIMARY KEY(owner, request_id)
);
CREATE INDEX request_records_by_expiry ON request_records(expires_at);
)sql",
    // v3 -> v4: each session counts the truncations that dropped tokens (SessionVersion).
    R"sql(
ALTER TABLE sessions ADD COLUMN cuts INTEGER NOT NULL DEFAULT 0;
)sql",
    // v4 -> v5: the prefix index (store.h): each session's marks, a chained hash of its owner and
    // tokens at every full chunk (n_tokens a multiple of 32). The stored sessions are marked by
    // Migrate right after this script.
    R"sql(
CREATE TABLE session_prefixes(
  session_id INTEGER NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
  n_tokens INTEGER NOT NULL,
  hash INTEGER NOT NULL,
  PRIMARY KEY(session_id, n_tokens)
);
CREATE INDEX session_prefixes_by_hash ON session_prefixes(hash, session_id);
)sql",
};
static_assert(std::size(kMigrations) == Store::kSchemaVersion);

// Sets the per-connection pragmas both connections need.
Status Configure(Db& db, const StoreOptions& options) {
  sqlite3_busy_timeout(db.handle(), options.busy_timeout_ms);
  // The first read of the file: a non-database file fails here with "file is not a database".
  auto mode = db.Prepare("PRAGMA journal_mode=WAL");
  if (!mode) return mode.error();
  auto row = mode->Step();
  if (!row) return row.error();
  if (!*row || mode->Text(0) != "wal") {
    return db.Err("cannot switch to WAL mode (journal_mode is '" + (*row ? mode->Text(0) : "") + "')");
  }
  return db.Exec("PRAGMA foreign_keys=ON");
}

// v4 -> v5: marks every stored session's log (the prefix index). Cost: reading every log once.
Status MarkStoredSessions(Db& db) {
  std::vector<int64_t> ids;
  {
    auto st = db.Prepare("SELECT id FROM sessions ORDER BY id");
    if (!st) return st.error();
    for (;;) {
      auto row = st->Step();
      if (!row) return row.error();
      if (!*row) break;
      ids.push_back(st->Int(0));
    }
  }
  for (int64_t id : ids) MNEMO_TRY(sqlite::MarkPrefixes(db, id, {}));
  return {};
}

// Brings the schema to Store::kSchemaVersion in one transaction.
Status Migrate(Db& db, const std::string& path) {
  auto tx = Transaction::Begin(db, Transaction::Kind::kWrite);
  if (!tx) return tx.error();
  auto n_tables = db.QueryInt("SELECT count(*) FROM sqlite_schema WHERE type='table'");
  if (!n_tables) return n_tables.error();
  auto app_id = db.QueryInt("PRAGMA application_id");
  if (!app_id) return app_id.error();
  int64_t version = 0;
  if (**n_tables == 0) {
    MNEMO_TRY(db.Exec(("PRAGMA application_id=" + std::to_string(kApplicationId)).c_str()));
    MNEMO_TRY(db.Exec("CREATE TABLE schema_version(version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)"));
  } else {
    if (app_id->value_or(0) != kApplicationId) {
      return MakeError("'%s' is a SQLite database but not a mnemo store", path.c_str());
    }
    auto v = db.QueryInt("SELECT max(version) FROM schema_version");
    if (!v) return v.error();
    version = v->value_or(0);
  }
  if (version > Store::kSchemaVersion) {
    return MakeError("store '%s' has schema version %lld, newer than this build's %d", path.c_str(),
                     static_cast<long long>(version), Store::kSchemaVersion);
  }
  for (; version < Store::kSchemaVersion; ++version) {
    MNEMO_TRY(db.Exec(kMigrations[version]));
    if (version + 1 == 5) MNEMO_TRY(MarkStoredSessions(db));
    auto ins = db.Prepare("INSERT INTO schema_version(version, applied_at) VALUES(?1, ?2)");
    if (!ins) return ins.error();
    MNEMO_TRY(ins->Bind(1, version + 1).Bind(2, UnixNow()).Run());
  }
  return tx->Commit();
}

Status QuickCheck(Db& db, const std::string& path) {
  auto st = db.Prepare("PRAGMA quick_check");
  if (!st) return st.error();
  std::string problems;
  for (;;) {
    auto row = st->Step();
    if (!row) return row.error();
    if (!*row) break;
    std::string line = st->Text(0);
    if (line == "ok") continue;
    if (problems.size() < 500) problems += (problems.empty() ? "" : "; ") + line;
  }
  if (!problems.empty()) return MakeError("store '%s' is corrupt: %s", path.c_str(), problems.c_str());
  return {};
}

}  // namespace

Result<std::unique_ptr<Store>> SqliteStore::Open(const std::string& path, const StoreOptions& options) {
  if (path.empty() || path == ":memory:" || path.starts_with("file:")) {
    return MakeError("store path must name a file, not '%s'", path.c_str());
  }
  // SQLite takes a zero-byte file for a new, empty database: a store truncated by a crash or an
  // operator's mistake would start empty without a word, and the conversations in its backup would
  // be forgotten. Only a missing file makes a new store.
  {
    std::error_code ec;
    const auto size = std::filesystem::file_size(path, ec);
    if (!ec && size == 0) {
      return MakeError("store '%s' is an empty file (0 bytes), not a database: restore it from a backup, or "
                       "delete it to start a new, empty store", path.c_str());
    }
  }
  std::unique_ptr<SqliteStore> store(new SqliteStore());
  store->path_ = path;

  auto writer = Db::Open(path, /*create=*/true);
  if (!writer) return writer.error();
  store->writer_ = std::move(*writer);
  Db& w = *store->writer_;
  MNEMO_TRY(Configure(w, options));
  MNEMO_TRY(w.Exec(options.durability == Durability::kFull ? "PRAGMA synchronous=FULL"
                                                             : "PRAGMA synchronous=NORMAL"));
  // Keep the -wal file from growing without bound after checkpoints.
  MNEMO_TRY(w.Exec("PRAGMA journal_size_limit=67108864"));
  if (options.check_integrity) MNEMO_TRY(QuickCheck(w, path));
  MNEMO_TRY(Migrate(w, path));

  auto reader = Db::Open(path, /*create=*/false);
  if (!reader) return reader.error();
  store->reader_ = std::move(*reader);
  MNEMO_TRY(Configure(*store->reader_, options));
  MNEMO_TRY(store->reader_->Exec("PRAGMA query_only=1"));
  return std::unique_ptr<Store>(std::move(store));
}

Status SqliteStore::CheckWritable() {
  struct statvfs fs{};
  const std::filesystem::path dir = std::filesystem::path(path_).parent_path();
  if (statvfs(dir.empty() ? "." : dir.c_str(), &fs) != 0) return {};  // unknown: the commit will tell
  const uint64_t free_bytes = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
  if (free_bytes >= kMinFreeBytes) return {};
  return MakeError(StatusCode::kUnavailable, "store '%s': its disk has %llu KB free (at least %llu KB are kept for commits)",
                   path_.c_str(), static_cast<unsigned long long>(free_bytes >> 10),
                   static_cast<unsigned long long>(kMinFreeBytes >> 10));
}

Result<bool> SqliteStore::TryLockTurn(int64_t id) {
  std::lock_guard lock(turn_mu_);
  return turn_locked_.insert(id).second;
}

void SqliteStore::UnlockTurn(int64_t id) {
  std::lock_guard lock(turn_mu_);
  turn_locked_.erase(id);
}

SqliteStore::~SqliteStore() {
  // Close the reader first so the writer's close can checkpoint and remove the -wal file.
  reader_.reset();
  writer_.reset();
}

}  // namespace mnemo
