// Errors carry a code that callers switch on; the code survives Status, Result and MNEMO_TRY.
#include "base/status.h"

#include "base/log.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace mnemo {
namespace {

Status Fails(StatusCode c) { return MakeError(c, "failed with %d", 7); }
Result<int> Propagates(StatusCode c) {
  MNEMO_TRY(Fails(c));
  return 1;
}

TEST(Status, MakeErrorWithoutACodeIsInternal) {
  Error e = MakeError("disk %s", "full");
  EXPECT_EQ(e.message, "disk full");
  EXPECT_EQ(e.code, StatusCode::kInternal);
  EXPECT_EQ(Error{"plain"}.code, StatusCode::kInternal);
}

TEST(Status, CodeSurvivesStatusResultAndTry) {
  Status st = Fails(StatusCode::kNotFound);
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kNotFound);
  EXPECT_EQ(st.error().message, "failed with 7");
  EXPECT_EQ(Status::Ok().code(), StatusCode::kOk);
  auto r = Propagates(StatusCode::kResourceExhausted);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, StatusCode::kResourceExhausted);
  EXPECT_EQ(r.error().message, "failed with 7");
}

TEST(Status, EveryCodeHasADistinctName) {
  std::set<std::string> names;
  for (int c = 0; c <= static_cast<int>(StatusCode::kInternal); c++) {
    names.insert(StatusCodeName(static_cast<StatusCode>(c)));
  }
  EXPECT_EQ(names.size(), static_cast<size_t>(StatusCode::kInternal) + 1);
  EXPECT_STREQ(StatusCodeName(StatusCode::kFailedPrecondition), "failed_precondition");
}

TEST(Log, LevelsByName) {
  for (const char* l : {"trace", "debug", "info", "warn", "error", "off"}) EXPECT_TRUE(SetLogLevel(l).ok()) << l;
  EXPECT_EQ(spdlog::get_level(), spdlog::level::off);
  Status bad = SetLogLevel("loud");
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(SetLogLevel("info").ok());
  EXPECT_EQ(spdlog::get_level(), spdlog::level::info);
}

}  // namespace
}  // namespace mnemo
