#include "server/api_error.h"

#include "base/log.h"

namespace mnemo {

namespace {
thread_local std::string t_request_id;
}  // namespace

void SetLogRequestId(std::string id) { t_request_id = std::move(id); }
const std::string& LogRequestId() { return t_request_id; }

ApiError ToApiError(const Error& e, const std::string& prefix, std::string param) {
  ApiError out;
  out.message = prefix + e.message;
  out.param = std::move(param);
  switch (e.code) {
    case StatusCode::kInvalidArgument:
      out.status = 400;
      out.code = "invalid_value";
      break;
    case StatusCode::kOutOfRange:
      out.status = 400;
      out.code = "context_length_exceeded";
      break;
    case StatusCode::kNotFound:
      out.status = 404;
      out.code = "not_found";
      break;
    case StatusCode::kAlreadyExists:
      out.status = 409;
      out.code = "already_exists";
      break;
    case StatusCode::kFailedPrecondition:
      out.status = 409;
      out.code = "session_busy";
      break;
    case StatusCode::kAborted:  // another replica appended to the session first: retry re-reads it
      out.status = 409;
      out.code = "session_conflict";
      break;
    case StatusCode::kResourceExhausted:
      out.status = 429;
      out.type = "rate_limit_error";
      out.code = "queue_full";
      break;
    case StatusCode::kUnavailable:
      out.status = 503;
      out.type = "server_error";
      out.code = "unavailable";
      break;
    case StatusCode::kCancelled:
      out.status = 499;
      out.code = "cancelled";
      break;
    case StatusCode::kOk:
    case StatusCode::kDataLoss:
    case StatusCode::kInternal:
      // The detail (a store's file path, a SQL statement, an internal id) stays in the log.
      spdlog::error("request {}: {}{}", t_request_id.empty() ? "-" : t_request_id, prefix, e.message);
      out.status = 500;
      out.type = "server_error";
      out.code = "server_error";
      out.message = "The server had an error while processing your request." +
                    (t_request_id.empty() ? std::string() : " Please include the request id " + t_request_id +
                                                                " if you report it.");
      break;
  }
  return out;
}

ApiError StoreError(const Error& e, const std::string& prefix) {
  if (e.code != StatusCode::kUnavailable) return ToApiError(e, prefix);
  spdlog::error("request {}: {}{}", t_request_id.empty() ? "-" : t_request_id, prefix, e.message);
  return ApiError{503, "server_error", "Storage is unavailable; retry later.", "", "storage_unavailable"};
}

}  // namespace mnemo
