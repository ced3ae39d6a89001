#include "store/pg_conn.h"

#include <libpq-fe.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "base/log.h"

namespace mnemo::pg {

// ---- Param ----

Param::Param(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  text_ = buf;
}
Param::Param(const std::optional<std::string>& v) {
  if (v) text_ = *v;
  else null_ = true;
}
Param::Param(const std::optional<int64_t>& v) {
  if (v) text_ = std::to_string(*v);
  else null_ = true;
}
Param Param::Bytes(std::span<const uint8_t> b) {
  Param p{std::string_view(reinterpret_cast<const char*>(b.data()), b.size())};
  p.binary_ = true;
  return p;
}

// ---- Rows ----

Rows::~Rows() {
  if (r_) PQclear(r_);
}
int Rows::size() const { return PQntuples(r_); }
bool Rows::IsNull(int row, int col) const { return PQgetisnull(r_, row, col) != 0; }
int64_t Rows::Int(int row, int col) const { return std::strtoll(PQgetvalue(r_, row, col), nullptr, 10); }
double Rows::Double(int row, int col) const { return std::strtod(PQgetvalue(r_, row, col), nullptr); }
std::string Rows::Text(int row, int col) const {
  return std::string(PQgetvalue(r_, row, col), static_cast<size_t>(PQgetlength(r_, row, col)));
}
std::optional<std::string> Rows::OptText(int row, int col) const {
  if (IsNull(row, col)) return std::nullopt;
  return Text(row, col);
}
std::optional<int64_t> Rows::OptInt(int row, int col) const {
  if (IsNull(row, col)) return std::nullopt;
  return Int(row, col);
}
std::optional<std::vector<uint8_t>> Rows::Bytes(int row, int col) const {
  size_t n = 0;
  unsigned char* raw = PQunescapeBytea(reinterpret_cast<const unsigned char*>(PQgetvalue(r_, row, col)), &n);
  if (!raw) return std::nullopt;
  std::vector<uint8_t> out(raw, raw + n);
  PQfreemem(raw);
  return out;
}
int64_t Rows::affected() const {
  const char* n = PQcmdTuples(r_);
  return n && *n ? std::strtoll(n, nullptr, 10) : 0;
}

// ---- Conn ----

namespace {
// A lost or refused connection: the detail (host, port, database, the server's words) goes to the
// log; the Error, which may reach a client as a 503, says only what happened.
Error Unreachable(const std::string& detail) {
  spdlog::warn("PostgreSQL store: {}", detail);
  return MakeError(StatusCode::kUnavailable, "the database is unreachable (retry later)");
}

// The server's message without libpq's trailing newline.
std::string Trim(const char* msg) {
  std::string s = msg ? msg : "";
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}
}  // namespace

Result<std::unique_ptr<Conn>> Conn::Open(const std::string& url, int connect_timeout_s, std::string setup) {
  // The URI's own options go first; connect_timeout is added unless it names one.
  const std::string timeout = std::to_string(connect_timeout_s > 0 ? connect_timeout_s : 5);
  const char* keys[] = {"dbname", "connect_timeout", "application_name", nullptr};
  const char* values[] = {url.c_str(), timeout.c_str(), "mnemo", nullptr};
  pg_conn* c = PQconnectdbParams(keys, values, /*expand_dbname=*/1);
  if (!c) return MakeError(StatusCode::kUnavailable, "PostgreSQL: out of memory opening a connection");
  if (PQstatus(c) != CONNECTION_OK) {
    std::string msg = Trim(PQerrorMessage(c));
    PQfinish(c);
    const bool bad_uri = msg.find("invalid") != std::string::npos && msg.find("URI") != std::string::npos;
    if (bad_uri) return MakeError(StatusCode::kInvalidArgument, "malformed PostgreSQL URL: %s", msg.c_str());
    return Unreachable("cannot connect: " + msg);
  }
  std::unique_ptr<Conn> conn(new Conn(c, std::move(setup)));
  if (!conn->setup_.empty()) MNEMO_TRY(conn->Script(conn->setup_.c_str()));
  return conn;
}

Conn::~Conn() { PQfinish(c_); }

bool Conn::broken() const { return PQstatus(c_) == CONNECTION_BAD; }

int Conn::socket() const { return PQsocket(c_); }

Result<std::vector<Conn::Notification>> Conn::TakeNotifications() {
  if (PQconsumeInput(c_) == 0) return Unreachable("connection lost: " + Trim(PQerrorMessage(c_)));
  std::vector<Notification> out;
  while (PGnotify* n = PQnotifies(c_)) {
    out.push_back(Notification{n->relname ? n->relname : "", n->extra ? n->extra : ""});
    PQfreemem(n);
  }
  return out;
}

Status Conn::Reconnect() {
  PQreset(c_);
  prepared_.clear();  // a new server session: nothing prepared
  if (PQstatus(c_) != CONNECTION_OK) {
    return Unreachable("cannot reconnect: " + Trim(PQerrorMessage(c_)));
  }
  if (!setup_.empty()) MNEMO_TRY(Script(setup_.c_str()));
  return {};
}

Error Conn::Fail(pg_result* r, const char* sql) const {
  const char* state = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : nullptr;
  std::string msg = r ? Trim(PQresultErrorMessage(r)) : std::string();
  if (msg.empty()) msg = Trim(PQerrorMessage(c_));
  StatusCode code = StatusCode::kInternal;
  const std::string s = state ? state : "";
  if (broken() || s.starts_with("08") || s == "57P01" || s == "57P02" || s == "57P03") {
    // connection lost, or the server is shutting down / starting
    return Unreachable("connection lost: " + msg);
  } else if (s == "23505") {
    code = StatusCode::kAlreadyExists;
  } else if (s == "40001" || s == "40P01") {
    code = StatusCode::kAborted;
  }
  // The statement's first line only: enough to find it, short in logs.
  std::string_view first(sql);
  first = first.substr(0, std::min<size_t>(first.find('\n'), 120));
  return MakeError(code, "PostgreSQL: %.*s: %s", static_cast<int>(first.size()), first.data(), msg.c_str());
}

Conn::Binds Conn::Bind(std::initializer_list<Param> params) {
  Binds b;
  for (const Param& p : params) {
    b.values.push_back(p.null_ ? nullptr : p.text_.data());
    b.lengths.push_back(static_cast<int>(p.text_.size()));
    b.formats.push_back(p.binary_ ? 1 : 0);
  }
  return b;
}

Result<Rows> Conn::Take(pg_result* r, const char* sql) const {
  const ExecStatusType st = r ? PQresultStatus(r) : PGRES_FATAL_ERROR;
  if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
    Error e = Fail(r, sql);
    if (r) PQclear(r);
    return e;
  }
  return Rows(r);
}

Result<Rows> Conn::Exec(const char* sql, std::initializer_list<Param> params) {
  const Binds b = Bind(params);
  const int n = b.n();
  // Unnamed: parsed and planned at each call. The statements every turn runs are prepared (Stmt).
  return Take(PQexecParams(c_, sql, n, nullptr, b.values.data(), b.lengths.data(), b.formats.data(), 0), sql);
}

Result<Rows> Conn::Exec(const Stmt& s, std::initializer_list<Param> params) {
  const Binds b = Bind(params);
  const int n = b.n();
  for (int attempt = 0;; ++attempt) {
    auto it = prepared_.find(s.name);
    if (it == prepared_.end()) {
      // Parameter types as PQexecParams infers them. A prepared statement is not transactional:
      // one prepared in a transaction that rolls back stays.
      pg_result* p = PQprepare(c_, s.name, s.sql, n, nullptr);
      auto done = Take(p, s.sql);
      if (!done) return done.error();
      prepared_.emplace(s.name, s.sql);
    } else {
      MNEMO_CHECK(it->second == s.sql || std::strcmp(it->second, s.sql) == 0);  // one text per name
    }
    pg_result* r = PQexecPrepared(c_, s.name, n, b.values.data(), b.lengths.data(), b.formats.data(), 0);
    // 26000: the server session no longer holds it (DISCARD ALL by a pooler in between): once more.
    const char* state = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : nullptr;
    if (attempt == 0 && state && std::strcmp(state, "26000") == 0) {
      PQclear(r);
      prepared_.erase(s.name);
      continue;
    }
    return Take(r, s.sql);
  }
}

Status Conn::Run(const char* sql, std::initializer_list<Param> params) {
  auto r = Exec(sql, params);
  if (!r) return r.error();
  return {};
}

Status Conn::Run(const Stmt& s, std::initializer_list<Param> params) {
  auto r = Exec(s, params);
  if (!r) return r.error();
  return {};
}

Result<std::optional<int64_t>> Conn::QueryInt(const Stmt& s, std::initializer_list<Param> params) {
  auto r = Exec(s, params);
  if (!r) return r.error();
  if (r->size() == 0 || r->IsNull(0, 0)) return std::optional<int64_t>();
  return std::optional<int64_t>(r->Int(0, 0));
}

Status Conn::Script(const char* sql) {
  pg_result* r = PQexec(c_, sql);
  const ExecStatusType st = r ? PQresultStatus(r) : PGRES_FATAL_ERROR;
  if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
    Error e = Fail(r, sql);
    if (r) PQclear(r);
    return e;
  }
  PQclear(r);
  return {};
}

Result<std::optional<int64_t>> Conn::QueryInt(const char* sql, std::initializer_list<Param> params) {
  auto r = Exec(sql, params);
  if (!r) return r.error();
  if (r->size() == 0 || r->IsNull(0, 0)) return std::optional<int64_t>();
  return std::optional<int64_t>(r->Int(0, 0));
}

// ---- Tx ----

Result<Tx> Tx::Begin(Conn& c, const char* begin_sql) {
  MNEMO_TRY(c.Run(begin_sql));
  return Tx(&c);
}

Tx::~Tx() {
  if (c_ && !c_->broken()) (void)c_->Run("ROLLBACK");
}

Status Tx::Commit() {
  MNEMO_CHECK(c_ != nullptr);
  c_->set_commit_sent(true);
  Status st = c_->Run("COMMIT");
  if (!st.ok()) return st;  // the destructor rolls back what is left
  c_ = nullptr;
  return {};
}

// ---- Pool ----

Pool::Pool(std::string url, int size, int connect_timeout_s, std::string setup)
    : url_(std::move(url)), setup_(std::move(setup)), size_(size), connect_timeout_s_(connect_timeout_s) {}

Pool::~Pool() = default;

Result<Conn*> Pool::Acquire() {
  std::unique_lock lock(mu_);
  // Bounded wait: a stuck server must not hold HTTP threads forever.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (idle_.empty() && static_cast<int>(all_.size()) + opening_ >= size_) {
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout) {
      return MakeError(StatusCode::kUnavailable, "PostgreSQL: all %d connections stayed busy for 30 s", size_);
    }
  }
  if (!idle_.empty()) {
    Conn* c = idle_.back();
    idle_.pop_back();
    return c;
  }
  ++opening_;
  lock.unlock();
  auto c = Conn::Open(url_, connect_timeout_s_, setup_);  // outside the lock: it may take seconds
  lock.lock();
  --opening_;
  if (!c) {
    cv_.notify_one();
    return c.error();
  }
  all_.push_back(std::move(*c));
  return all_.back().get();
}

void Pool::Release(Conn* c, bool drop) {
  {
    std::lock_guard lock(mu_);
    if (drop) {
      std::erase_if(all_, [c](const std::unique_ptr<Conn>& p) { return p.get() == c; });
    } else {
      idle_.push_back(c);
    }
  }
  cv_.notify_one();
}

Status Pool::With(const std::function<Status(Conn&)>& fn) {
  auto c = Acquire();
  if (!c) return c.error();
  Conn& conn = **c;
  Status st;
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (conn.broken()) {
      st = conn.Reconnect();
      if (!st.ok()) break;
    }
    conn.set_commit_sent(false);
    st = fn(conn);
    // Retry only a failure of the connection itself, and only when nothing may have committed.
    if (st.ok() || st.code() != StatusCode::kUnavailable || !conn.broken() || conn.commit_sent()) break;
  }
  // A broken connection is closed; the next caller opens a fresh one.
  Release(&conn, conn.broken());
  return st;
}

}  // namespace mnemo::pg
