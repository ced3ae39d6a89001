// A thin RAII layer over one SQLite connection: cached prepared statements, typed binding and
// reading, and transactions that roll back unless committed. Internal to the store.
//
// Not thread-safe: a Db is used by one thread at a time (the Store guards each with a mutex).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>

#include "base/status.h"

struct sqlite3;
struct sqlite3_stmt;

namespace mnemo::sqlite {

class Stmt;

class Db {
 public:
  // Opens (creating when `create`) the database file at path. Fails with a message naming the path.
  static Result<std::unique_ptr<Db>> Open(const std::string& path, bool create);
  ~Db();
  Db(const Db&) = delete;
  Db& operator=(const Db&) = delete;

  // Runs one or more statements that return no rows of interest (DDL, PRAGMA setters, BEGIN...).
  Status Exec(const char* sql);
  // A prepared statement for sql, compiled on first use and cached for the connection's life.
  // Only one Stmt per SQL text may be live at a time (it is reset when the Stmt dies).
  Result<Stmt> Prepare(const char* sql);
  // Runs a query expected to return one integer (e.g. a PRAGMA); nullopt when it returns no row.
  Result<std::optional<int64_t>> QueryInt(const char* sql);

  // An Error carrying what failed and SQLite's message for the last failure on this connection.
  Error Err(std::string_view what) const;
  // True when no transaction is open (SQLite's autocommit mode).
  bool autocommit() const;
  // Rows changed by the last INSERT/UPDATE/DELETE.
  int64_t changes() const;
  sqlite3* handle() { return db_; }

 private:
  explicit Db(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {}
  sqlite3* db_;
  std::string path_;
  std::unordered_map<std::string, sqlite3_stmt*> cache_;  // SQL text -> compiled statement
};

// A cached statement in use. Bind parameters are 1-based (as in SQLite); columns are 0-based.
// Binding errors are remembered and reported by the next Step/Run.
class Stmt {
 public:
  Stmt(Db* db, sqlite3_stmt* s) : db_(db), s_(s) {}
  Stmt(Stmt&& o) noexcept : db_(o.db_), s_(o.s_), bind_rc_(o.bind_rc_) { o.s_ = nullptr; }
  Stmt& operator=(Stmt&&) = delete;
  Stmt(const Stmt&) = delete;
  ~Stmt();  // resets and clears bindings, releasing any read lock the statement held

  Stmt& Bind(int i, int64_t v);
  Stmt& Bind(int i, double v);
  Stmt& Bind(int i, std::string_view v);  // bound as TEXT (copied)
  Stmt& Bind(int i, const char* v) { return Bind(i, std::string_view(v)); }
  Stmt& Bind(int i, const std::string& v) { return Bind(i, std::string_view(v)); }
  Stmt& Bind(int i, const std::optional<std::string>& v);   // NULL when empty
  Stmt& Bind(int i, const std::optional<int64_t>& v);       // NULL when empty
  Stmt& BindBlob(int i, std::span<const uint8_t> bytes);    // copied
  Stmt& BindNull(int i);

  // Advances: true when a row is available, false when done; Error on failure.
  Result<bool> Step();
  // Steps to completion, expecting no rows (INSERT/UPDATE/DELETE).
  Status Run();
  // Rewinds for another execution (bindings are kept until rebound).
  void Reset();

  bool IsNull(int col) const;
  int64_t Int(int col) const;
  double Double(int col) const;
  std::string Text(int col) const;
  std::optional<std::string> OptText(int col) const;   // empty when NULL
  std::optional<int64_t> OptInt(int col) const;        // empty when NULL
  std::span<const uint8_t> Blob(int col) const;        // valid until the next Step or reset

 private:
  Db* db_;
  sqlite3_stmt* s_;
  int bind_rc_ = 0;  // first failing sqlite3_bind_* result code, 0 if none
};

// BEGIN IMMEDIATE (write) or BEGIN (read snapshot) ... COMMIT; rolls back in the destructor unless
// Commit succeeded. Write transactions take the write lock up front, so they never fail with
// SQLITE_BUSY half-way through.
class Transaction {
 public:
  enum class Kind { kRead, kWrite };
  static Result<Transaction> Begin(Db& db, Kind kind);
  Transaction(Transaction&& o) noexcept : db_(o.db_) { o.db_ = nullptr; }
  Transaction& operator=(Transaction&&) = delete;
  ~Transaction();
  Status Commit();

 private:
  explicit Transaction(Db* db) : db_(db) {}
  Db* db_;  // null once committed or rolled back
};

}  // namespace mnemo::sqlite
