// The API's errors: an HTTP status, an OpenAI error type, a message and a machine-readable code.
// Library errors are mapped by their StatusCode (base/status.h), never by their message text.
#pragma once

#include <string>
#include <variant>

#include "base/status.h"

namespace mnemo {

// An API-level error: HTTP status, OpenAI error type and message.
struct ApiError {
  int status = 400;
  std::string type = "invalid_request_error";
  std::string message;
  std::string param;  // the request field at fault, or ""
  std::string code;   // machine-readable code, or ""
};

template <class T>
using ApiResult = std::variant<T, ApiError>;

// The HTTP status, OpenAI type and code for an error of this kind:
//   kInvalidArgument    400 invalid_request_error  invalid_value
//   kOutOfRange         400 invalid_request_error  context_length_exceeded
//   kNotFound           404 invalid_request_error  not_found
//   kAlreadyExists      409 invalid_request_error  already_exists
//   kFailedPrecondition 409 invalid_request_error  session_busy
//   kResourceExhausted  429 rate_limit_error       queue_full
//   kUnavailable        503 server_error           unavailable
//   kCancelled          499 invalid_request_error  cancelled   (nginx's "client closed request")
//   kDataLoss, kInternal (and kOk) 500 server_error  server_error
// `prefix` is put before the message (e.g. "store: "); param names the request field at fault.
// A 500's message is generic: its detail (file paths, SQL, internal ids) is logged at error level
// here and never reaches a client.
ApiError ToApiError(const Error& e, const std::string& prefix = "", std::string param = "");
// A store's error: as ToApiError, except that kUnavailable (a full disk, an unreachable database)
// is 503 server_error `storage_unavailable` with a generic message (the detail, which names files
// or hosts, is logged at error level with the request id).
ApiError StoreError(const Error& e, const std::string& prefix = "");

// The X-Request-Id of the request the calling thread serves ("" outside one). The HTTP layer sets
// it around each handler (a handler, and a stream's writer, run on one thread), so that what is
// logged on a request's behalf (a 500's detail, an exception) names the request the client saw.
void SetLogRequestId(std::string id);
const std::string& LogRequestId();

}  // namespace mnemo
