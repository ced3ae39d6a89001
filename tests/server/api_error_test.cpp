// Library errors reach clients as HTTP statuses and OpenAI error types chosen by their code, not
// by their message text.
#include "server/api_error.h"

#include <gtest/gtest.h>

namespace mnemo {
namespace {

struct Want {
  StatusCode code;
  int status;
  const char* type;
  const char* api_code;
};

TEST(ApiError, MapsEveryCode) {
  const Want table[] = {
      {StatusCode::kInvalidArgument, 400, "invalid_request_error", "invalid_value"},
      {StatusCode::kOutOfRange, 400, "invalid_request_error", "context_length_exceeded"},
      {StatusCode::kNotFound, 404, "invalid_request_error", "not_found"},
      {StatusCode::kAlreadyExists, 409, "invalid_request_error", "already_exists"},
      {StatusCode::kFailedPrecondition, 409, "invalid_request_error", "session_busy"},
      {StatusCode::kResourceExhausted, 429, "rate_limit_error", "queue_full"},
      {StatusCode::kUnavailable, 503, "server_error", "unavailable"},
      {StatusCode::kCancelled, 499, "invalid_request_error", "cancelled"},
      {StatusCode::kDataLoss, 500, "server_error", "server_error"},
      {StatusCode::kInternal, 500, "server_error", "server_error"},
  };
  for (const Want& w : table) {
    ApiError e = ToApiError(MakeError(w.code, "what happened"), "store: ", "after");
    EXPECT_EQ(e.status, w.status) << StatusCodeName(w.code);
    EXPECT_EQ(e.type, w.type) << StatusCodeName(w.code);
    EXPECT_EQ(e.code, w.api_code) << StatusCodeName(w.code);
    if (w.status == 500) {  // the detail is logged, never sent
      EXPECT_EQ(e.message.find("what happened"), std::string::npos) << e.message;
    } else {
      EXPECT_EQ(e.message, "store: what happened");
    }
    EXPECT_EQ(e.param, "after");
  }
}

TEST(ApiError, MessageTextDoesNotChooseTheStatus) {
  // A message that reads like a full queue but is coded as internal stays a 500, and the reverse.
  EXPECT_EQ(ToApiError(MakeError("queue full: 3 turns waiting")).status, 500);
  EXPECT_EQ(ToApiError(MakeError(StatusCode::kResourceExhausted, "busy")).status, 429);
  EXPECT_EQ(ToApiError(MakeError(StatusCode::kNotFound, "queue full")).status, 404);
}

}  // namespace
}  // namespace mnemo
