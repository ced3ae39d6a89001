// Errors at API boundaries: Result<T> holds a value or an Error; CHECK guards invariants.
// Bad user input must come back as an Error, never as a crash; CHECK is for programmer errors only.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <variant>

namespace mnemo {

// What kind of failure an Error is, for callers that act on it (the HTTP server maps codes to
// statuses; clients retry kResourceExhausted / kUnavailable). Messages are for people only: never
// match on their text.
enum class StatusCode : uint8_t {
  kOk = 0,
  kInvalidArgument,     // the caller's input is wrong (bad value, too long, malformed file)
  kNotFound,            // a named thing (session, response, item) does not exist
  kAlreadyExists,       // creating something whose id is taken
  kFailedPrecondition,  // valid, but not in the current state (a session with a turn in progress)
  kAborted,             // lost a race: another writer changed the object first (a store's compare-and-set)
  kOutOfRange,          // beyond a limit of this server (a context longer than the model or KV cache holds)
  kResourceExhausted,   // out of a bounded resource for now (queue full); retrying later may work
  kUnavailable,         // the service cannot take it now (shutting down)
  kCancelled,           // the caller gave up
  kDataLoss,            // stored data is corrupt or unreadable
  kInternal,            // anything else: a bug or an environment failure (I/O, SQLite)
};

// "invalid_argument", "not_found", ... (stable; used in logs and metrics).
const char* StatusCodeName(StatusCode code);

struct Error {
  std::string message;
  StatusCode code = StatusCode::kInternal;  // uncoded errors are the server's fault (HTTP 500)
};

// A value or an Error (a small stand-in for C++23 std::expected).
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}       // NOLINT: implicit on purpose
  Result(Error error) : v_(std::move(error)) {}   // NOLINT
  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  const Error& error() const { return std::get<1>(v_); }

 private:
  std::variant<T, Error> v_;
};

// Result for operations with no value.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Error error) : error_(std::move(error)), ok_(false) {}  // NOLINT
  static Status Ok() { return {}; }
  bool ok() const { return ok_; }
  explicit operator bool() const { return ok_; }
  Error error() const { return error_; }  // by value: safe on a temporary Status
  StatusCode code() const { return ok_ ? StatusCode::kOk : error_.code; }

 private:
  Error error_;
  bool ok_ = true;
};

// printf-style Error constructors; the first makes a kInternal error.
Error MakeError(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
Error MakeError(StatusCode code, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

[[noreturn]] void CheckFailed(const char* file, int line, const char* cond, const std::string& msg);

}  // namespace mnemo

#define MNEMO_CHECK(cond)                                             \
  do {                                                                \
    if (!(cond)) ::mnemo::CheckFailed(__FILE__, __LINE__, #cond, ""); \
  } while (0)
#define MNEMO_CHECK_MSG(cond, msg)                                       \
  do {                                                                   \
    if (!(cond)) ::mnemo::CheckFailed(__FILE__, __LINE__, #cond, (msg)); \
  } while (0)

// Propagates an error from an expression returning Result<T> or Status.
#define MNEMO_TRY(expr)                         \
  do {                                          \
    auto _st = (expr);                          \
    if (!_st.ok()) return Error(_st.error());   \
  } while (0)
