// A thin layer over libpq: one connection with parameterised statements (PQexecParams, text
// parameters and results; bytea parameters binary), the hot ones prepared once per connection
// (Stmt), transactions that roll back unless committed, and a small bounded pool that reconnects a
// dropped connection. Internal to the store.
//
// Errors carry StatusCodes the store's callers act on: a lost or refused connection is
// kUnavailable (the HTTP server answers 503 in OpenAI's error shape), a unique violation
// kAlreadyExists, a serialization failure or deadlock kAborted; anything else kInternal.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/status.h"

struct pg_conn;
struct pg_result;

namespace mnemo::pg {

// One statement parameter: text (the server casts it to the column's type), binary bytes
// (bytea), or NULL.
class Param {
 public:
  Param(int64_t v) : text_(std::to_string(v)) {}  // NOLINT: implicit on purpose
  Param(int v) : text_(std::to_string(v)) {}      // NOLINT
  Param(double v);                                // NOLINT: 17 significant digits (round-trips)
  Param(std::string_view v) : text_(v) {}         // NOLINT
  Param(const std::string& v) : text_(v) {}       // NOLINT
  Param(const char* v) : text_(v) {}              // NOLINT
  Param(const std::optional<std::string>& v);     // NOLINT: NULL when empty
  Param(const std::optional<int64_t>& v);         // NOLINT: NULL when empty
  static Param Bytes(std::span<const uint8_t> b);  // a bytea, sent binary (copied)
  static Param Null() { Param p{int64_t{0}}; p.null_ = true; p.text_.clear(); return p; }

 private:
  friend class Conn;
  std::string text_;  // the value's text, or the raw bytes when binary_
  bool null_ = false;
  bool binary_ = false;
};

// A statement's result rows (text format). Rows and columns are 0-based.
class Rows {
 public:
  explicit Rows(pg_result* r) : r_(r) {}
  Rows(Rows&& o) noexcept : r_(o.r_) { o.r_ = nullptr; }
  Rows& operator=(Rows&&) = delete;
  Rows(const Rows&) = delete;
  ~Rows();

  int size() const;
  bool IsNull(int row, int col) const;
  int64_t Int(int row, int col) const;
  double Double(int row, int col) const;
  std::string Text(int row, int col) const;
  std::optional<std::string> OptText(int row, int col) const;  // empty when NULL
  std::optional<int64_t> OptInt(int row, int col) const;       // empty when NULL
  // A bytea column decoded from its text (hex) form; nullopt when it cannot be decoded.
  std::optional<std::vector<uint8_t>> Bytes(int row, int col) const;
  int64_t affected() const;  // rows an INSERT/UPDATE/DELETE changed

 private:
  pg_result* r_;
};

// A statement prepared once per connection (PQprepare) and then run by name (PQexecPrepared), for
// the statements every turn runs: parsing and planning are paid once per connection, not at each
// call (issue 14: CommitTurn's row lock with the prefix-mark lookup planned in 0.1-0.2 ms;
// docs/benchmarks.md §11b). `name` is PostgreSQL's name for it (pg_prepared_statements) and must
// belong to one statement text in the whole store; both are string literals.
struct Stmt {
  const char* name;
  const char* sql;
};

class Conn {
 public:
  // Connects to url (a libpq connection URI) and runs setup (session settings) on it. Errors:
  // kInvalidArgument for a malformed URI, kUnavailable when the server cannot be reached.
  static Result<std::unique_ptr<Conn>> Open(const std::string& url, int connect_timeout_s, std::string setup);
  ~Conn();
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;

  // Runs one statement ($1, $2, ... bind params in order). Cost: one round trip.
  Result<Rows> Exec(const char* sql, std::initializer_list<Param> params = {});
  Status Run(const char* sql, std::initializer_list<Param> params = {});
  // Runs a script of several statements without parameters (DDL).
  Status Script(const char* sql);
  // The first column of the first row as an integer; nullopt when there is no row or it is NULL.
  Result<std::optional<int64_t>> QueryInt(const char* sql, std::initializer_list<Param> params = {});
  // The same for a prepared statement: prepared on this connection at its first use (one round
  // trip more, once), then one round trip per call. After a reconnect (a new server session,
  // which holds none) it is prepared again.
  Result<Rows> Exec(const Stmt& s, std::initializer_list<Param> params = {});
  Status Run(const Stmt& s, std::initializer_list<Param> params = {});
  Result<std::optional<int64_t>> QueryInt(const Stmt& s, std::initializer_list<Param> params = {});

  bool broken() const;  // the connection is lost (libpq says CONNECTION_BAD)
  // LISTEN/NOTIFY (pg_listen.h): the connection's socket, to poll for input, and the
  // notifications that arrived, after reading what the socket holds. Errors: kUnavailable when
  // the connection is lost.
  int socket() const;
  struct Notification {
    std::string channel, payload;
  };
  Result<std::vector<Notification>> TakeNotifications();
  Status Reconnect();   // PQreset, then the setup again
  // Whether a COMMIT was sent since the last clear: a write lost after that point may have
  // committed, so it is not retried.
  bool commit_sent() const { return commit_sent_; }
  void set_commit_sent(bool v) { commit_sent_ = v; }

 private:
  Conn(pg_conn* c, std::string setup) : c_(c), setup_(std::move(setup)) {}
  Error Fail(pg_result* r, const char* sql) const;
  Result<Rows> Take(pg_result* r, const char* sql) const;  // Rows, or the Error (r cleared)
  struct Binds {  // libpq's parameter arrays, pointing into the Params
    std::vector<const char*> values;
    std::vector<int> lengths, formats;
    int n() const { return static_cast<int>(values.size()); }
  };
  static Binds Bind(std::initializer_list<Param> params);
  pg_conn* c_;
  std::string setup_;
  bool commit_sent_ = false;
  std::unordered_map<std::string, const char*> prepared_;  // Stmt name -> its sql, on this server session
};

// BEGIN (with options, e.g. "ISOLATION LEVEL REPEATABLE READ READ ONLY") ... COMMIT; rolls back in
// the destructor unless committed.
class Tx {
 public:
  static Result<Tx> Begin(Conn& c, const char* begin_sql = "BEGIN");
  Tx(Tx&& o) noexcept : c_(o.c_) { o.c_ = nullptr; }
  Tx& operator=(Tx&&) = delete;
  ~Tx();
  Status Commit();

 private:
  explicit Tx(Conn* c) : c_(c) {}
  Conn* c_;  // null once committed or rolled back
};

// At most `size` connections, opened on demand and shared by all threads. A caller waits for a
// free connection (at most wait_s seconds, then kUnavailable). Threads: any.
class Pool {
 public:
  Pool(std::string url, int size, int connect_timeout_s, std::string setup);
  ~Pool();
  // Runs fn on a connection of its own. A connection found broken is reconnected first; when fn
  // fails because the connection dropped before any COMMIT was sent (the server rolled the
  // transaction back), the connection is re-established and fn runs once more, so a restart of
  // the server costs the next request nothing. Otherwise fn's Error is returned.
  Status With(const std::function<Status(Conn&)>& fn);

 private:
  Result<Conn*> Acquire();
  void Release(Conn* c, bool drop);

  const std::string url_, setup_;
  const int size_, connect_timeout_s_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Conn>> all_;  // every open connection
  std::vector<Conn*> idle_;                  // open connections not in use
  int opening_ = 0;                          // connections being opened (counted against size_)
};

}  // namespace mnemo::pg
