#include "base/status.h"

#include <spdlog/spdlog.h>

#include <cstdarg>

namespace mnemo {

const char* StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "ok";
    case StatusCode::kInvalidArgument: return "invalid_argument";
    case StatusCode::kNotFound: return "not_found";
    case StatusCode::kAlreadyExists: return "already_exists";
    case StatusCode::kFailedPrecondition: return "failed_precondition";
    case StatusCode::kAborted: return "aborted";
    case StatusCode::kOutOfRange: return "out_of_range";
    case StatusCode::kResourceExhausted: return "resource_exhausted";
    case StatusCode::kUnavailable: return "unavailable";
    case StatusCode::kCancelled: return "cancelled";
    case StatusCode::kDataLoss: return "data_loss";
    case StatusCode::kInternal: return "internal";
  }
  return "internal";
}

namespace {
Error Format(StatusCode code, const char* fmt, va_list ap) {
  char buf[1024];
  vsnprintf(buf, sizeof buf, fmt, ap);
  return Error{buf, code};
}
}  // namespace

Error MakeError(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  Error e = Format(StatusCode::kInternal, fmt, ap);
  va_end(ap);
  return e;
}

Error MakeError(StatusCode code, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  Error e = Format(code, fmt, ap);
  va_end(ap);
  return e;
}

void CheckFailed(const char* file, int line, const char* cond, const std::string& msg) {
  spdlog::critical("CHECK failed at {}:{}: {} {}", file, line, cond, msg);
  spdlog::default_logger()->flush();
  std::abort();
}

}  // namespace mnemo
