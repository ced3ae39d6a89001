#include "store/sqlite_db.h"

#include <sqlite3.h>

#include <limits>

namespace mnemo::sqlite {

Result<std::unique_ptr<Db>> Db::Open(const std::string& path, bool create) {
  sqlite3* raw = nullptr;
  // NOMUTEX: the Store serializes use of each connection itself.
  int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX | (create ? SQLITE_OPEN_CREATE : 0);
  int rc = sqlite3_open_v2(path.c_str(), &raw, flags, nullptr);
  if (rc != SQLITE_OK) {
    std::string msg = raw ? sqlite3_errmsg(raw) : sqlite3_errstr(rc);
    sqlite3_close_v2(raw);
    return MakeError("cannot open database '%s': %s", path.c_str(), msg.c_str());
  }
  sqlite3_extended_result_codes(raw, 1);
  // SQLite silently falls back to read-only for a write-protected file; a store must write.
  if (sqlite3_db_readonly(raw, "main") == 1) {
    sqlite3_close_v2(raw);
    return MakeError("database '%s' is read-only (check the file's permissions)", path.c_str());
  }
  return std::unique_ptr<Db>(new Db(raw, path));
}

Db::~Db() {
  for (auto& [sql, s] : cache_) sqlite3_finalize(s);
  sqlite3_close_v2(db_);
}

Error Db::Err(std::string_view what) const {
  int code = sqlite3_errcode(db_) & 0xff;
  const char* kind = code == SQLITE_CORRUPT ? " is corrupt"
                     : code == SQLITE_NOTADB ? " is not a database"
                     : code == SQLITE_FULL   ? ": disk full"
                                             : "";
  // A full disk is a condition to wait out (kUnavailable: the server answers 503 and recovers once
  // there is room), not a fault of the store.
  return MakeError(code == SQLITE_FULL ? StatusCode::kUnavailable : StatusCode::kInternal,
                   "database '%s'%s: %.*s: %s", path_.c_str(), kind, static_cast<int>(what.size()), what.data(),
                   sqlite3_errmsg(db_));
}

bool Db::autocommit() const { return sqlite3_get_autocommit(db_) != 0; }

int64_t Db::changes() const { return sqlite3_changes64(db_); }

Status Db::Exec(const char* sql) {
  char* msg = nullptr;
  int rc = sqlite3_exec(db_, sql, nullptr, nullptr, &msg);
  if (rc != SQLITE_OK) {
    Error e = MakeError("database '%s': %s: %s", path_.c_str(), sql, msg ? msg : sqlite3_errstr(rc));
    sqlite3_free(msg);
    return e;
  }
  return {};
}

Result<Stmt> Db::Prepare(const char* sql) {
  auto it = cache_.find(sql);
  if (it != cache_.end()) return Stmt(this, it->second);
  sqlite3_stmt* s = nullptr;
  int rc = sqlite3_prepare_v3(db_, sql, -1, SQLITE_PREPARE_PERSISTENT, &s, nullptr);
  if (rc != SQLITE_OK) return Err(std::string("preparing '") + sql + "'");
  cache_.emplace(sql, s);
  return Stmt(this, s);
}

Result<std::optional<int64_t>> Db::QueryInt(const char* sql) {
  auto st = Prepare(sql);
  if (!st) return st.error();
  auto row = st->Step();
  if (!row) return row.error();
  if (!*row) return std::optional<int64_t>();
  return std::optional<int64_t>(st->Int(0));
}

// ---- Stmt ----

Stmt::~Stmt() {
  if (s_) {
    sqlite3_reset(s_);
    sqlite3_clear_bindings(s_);
  }
}

#define MNEMO_BIND(call)                \
  do {                                  \
    int rc_ = (call);                   \
    if (rc_ != SQLITE_OK && !bind_rc_) bind_rc_ = rc_; \
  } while (0)

Stmt& Stmt::Bind(int i, int64_t v) {
  MNEMO_BIND(sqlite3_bind_int64(s_, i, v));
  return *this;
}
Stmt& Stmt::Bind(int i, double v) {
  MNEMO_BIND(sqlite3_bind_double(s_, i, v));
  return *this;
}
Stmt& Stmt::Bind(int i, std::string_view v) {
  MNEMO_BIND(sqlite3_bind_text64(s_, i, v.data(), v.size(), SQLITE_TRANSIENT, SQLITE_UTF8));
  return *this;
}
Stmt& Stmt::Bind(int i, const std::optional<std::string>& v) {
  return v ? Bind(i, std::string_view(*v)) : BindNull(i);
}
Stmt& Stmt::Bind(int i, const std::optional<int64_t>& v) { return v ? Bind(i, *v) : BindNull(i); }
Stmt& Stmt::BindBlob(int i, std::span<const uint8_t> bytes) {
  // A zero-length blob (not NULL) needs a non-null pointer.
  static const uint8_t kEmpty = 0;
  MNEMO_BIND(sqlite3_bind_blob64(s_, i, bytes.empty() ? &kEmpty : bytes.data(), bytes.size(),
                                 SQLITE_TRANSIENT));
  return *this;
}
Stmt& Stmt::BindNull(int i) {
  MNEMO_BIND(sqlite3_bind_null(s_, i));
  return *this;
}
#undef MNEMO_BIND

Result<bool> Stmt::Step() {
  if (bind_rc_) {
    return MakeError("binding a parameter of '%s': %s", sqlite3_sql(s_), sqlite3_errstr(bind_rc_));
  }
  int rc = sqlite3_step(s_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  return db_->Err(std::string("running '") + sqlite3_sql(s_) + "'");
}

Status Stmt::Run() {
  for (;;) {
    auto r = Step();
    if (!r) return r.error();
    if (!*r) return {};
  }
}

void Stmt::Reset() {
  sqlite3_reset(s_);
  bind_rc_ = 0;
}

bool Stmt::IsNull(int col) const { return sqlite3_column_type(s_, col) == SQLITE_NULL; }
int64_t Stmt::Int(int col) const { return sqlite3_column_int64(s_, col); }
double Stmt::Double(int col) const { return sqlite3_column_double(s_, col); }
std::string Stmt::Text(int col) const {
  const unsigned char* p = sqlite3_column_text(s_, col);
  int n = sqlite3_column_bytes(s_, col);
  return p ? std::string(reinterpret_cast<const char*>(p), n) : std::string();
}
std::optional<std::string> Stmt::OptText(int col) const {
  if (IsNull(col)) return std::nullopt;
  return Text(col);
}
std::optional<int64_t> Stmt::OptInt(int col) const {
  if (IsNull(col)) return std::nullopt;
  return Int(col);
}
std::span<const uint8_t> Stmt::Blob(int col) const {
  const void* p = sqlite3_column_blob(s_, col);
  int n = sqlite3_column_bytes(s_, col);
  if (!p) return {};
  return {static_cast<const uint8_t*>(p), static_cast<size_t>(n)};
}

// ---- Transaction ----

Result<Transaction> Transaction::Begin(Db& db, Kind kind) {
  Status st = db.Exec(kind == Kind::kWrite ? "BEGIN IMMEDIATE" : "BEGIN");
  if (!st) return st.error();
  return Transaction(&db);
}

Transaction::~Transaction() {
  // An I/O error or SQLITE_FULL may already have rolled the transaction back.
  if (db_ && !db_->autocommit()) (void)db_->Exec("ROLLBACK");
}

Status Transaction::Commit() {
  MNEMO_CHECK(db_ != nullptr);
  Status st = db_->Exec("COMMIT");
  if (!st.ok()) return st;  // the destructor rolls back
  db_ = nullptr;
  return {};
}

}  // namespace mnemo::sqlite
