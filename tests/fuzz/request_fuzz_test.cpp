// The request-parsing fuzz body (request_fuzz_body.h) in the normal build: the committed seed corpus,
// mutations of it (bytes, and JSON values replaced by values of other types), and the issue 13
// cases: deep nesting and wrong-typed members are 400s naming the member, null counts as absent.
#include <gtest/gtest.h>

#include "fuzz_inputs.h"
#include "request_fuzz_body.h"

namespace mnemo {
namespace {

using Json = nlohmann::json;

int Exercise(const std::string& s) { return test::ExerciseRequest(reinterpret_cast<const uint8_t*>(s.data()), s.size()); }

ServedModel& Model(int i) { return *test::RequestFuzzModels().models[i]; }

TEST(RequestFuzz, SeedCorpus) {
  const auto seeds = test::Corpus("request");
  ASSERT_GE(seeds.size(), 10u);
  int accepted = 0;
  for (const auto& s : seeds) accepted += Exercise(s.bytes) > 0;
  EXPECT_GE(accepted, int(seeds.size()) / 2);  // most seeds are real requests
}

// Replaces the value at a random place in j by one of another type (or removes it, or adds a member).
void Confuse(Json& j, Rng& rng) {
  static const std::vector<Json> values = {nullptr, true, false, 0, -1, 1, 2147483648LL, -9223372036854775807LL,
                                           1.5, 1e300, -0.0, "", "x", "auto", "none", "required", "function",
                                           Json::array(), Json::object(), Json::array({1, "a", nullptr}),
                                           Json{{"type", "object"}}, Json{{"type", "function"}, {"name", "f"}}};
  Json* at = &j;
  for (int depth = 0; depth < 6 && (at->is_object() || at->is_array()) && !at->empty() && rng.Next() % 3 != 0; depth++) {
    auto it = at->begin();
    std::advance(it, long(rng.Next() % at->size()));
    at = &*it;
  }
  const uint64_t op = rng.Next() % 8;
  if (op == 0 && at->is_object() && !at->empty()) {
    at->erase(at->begin());
  } else if (op == 1 && at->is_object()) {
    (*at)["unknown_" + std::to_string(rng.Next() % 4)] = values[rng.Next() % values.size()];
  } else if (op == 2 && at->is_array()) {
    at->push_back(values[rng.Next() % values.size()]);
  } else {
    *at = values[rng.Next() % values.size()];
  }
}

TEST(RequestFuzz, Mutations) {
  const auto seeds = test::Corpus("request");
  const std::vector<std::string> dict = {"{", "}", "[", "]", ":", ",", "\"", "null", "true", "1e999", "-0", "\\u0000",
                                         "\\ud800", "\"messages\":", "\"input\":", "\"tools\":", "\"role\":",
                                         "\"type\":", "\"schema\":", "\"$ref\":", "\"anyOf\":", "\"properties\":",
                                         "\"pattern\":", "\"enum\":", "\"minItems\":"};
  Rng rng(13);
  const int iters = test::FuzzIters(16000);
  int accepted = 0;
  for (int i = 0; i < iters; i++) {
    const auto& a = seeds[rng.Next() % seeds.size()];
    std::string body;
    if (i % 2 == 0) {
      body = test::Mutate(a.bytes, seeds[rng.Next() % seeds.size()].bytes, dict, rng);
    } else {
      Json j = Json::parse(a.bytes, nullptr, false);
      if (j.is_discarded()) continue;
      for (int k = 1 + int(rng.Next() % 3); k > 0; k--) Confuse(j, rng);
      body = j.dump();
    }
    accepted += Exercise(body) > 0;
  }
  EXPECT_GT(accepted, 0);
  EXPECT_LT(accepted, iters);
}

std::string Repeat(const std::string& s, int n) {
  std::string out;
  for (int i = 0; i < n; i++) out += s;
  return out;
}

ItemResolver NoItems() {
  return [](const std::string&, const std::string& param) -> std::variant<Json, ApiError> {
    return ApiError{404, "invalid_request_error", "Item not found.", param, "item_not_found"};
  };
}

// The error of a body on each endpoint (status 0: accepted).
struct Outcome {
  ApiError chat, completion, response;
};
Outcome Parse(const std::string& body) {
  Outcome o;
  o.chat.status = o.completion.status = o.response.status = 0;
  if (auto r = ParseChatCompletion(Model(1), body, ""); std::holds_alternative<ApiError>(r)) o.chat = std::get<ApiError>(r);
  if (auto r = ParseCompletion(Model(1), body, ""); std::holds_alternative<ApiError>(r)) o.completion = std::get<ApiError>(r);
  if (auto r = ParseResponseRequest(Model(1), body, "", NoItems()); std::holds_alternative<ApiError>(r)) {
    o.response = std::get<ApiError>(r);
  }
  return o;
}

// Issue 13: 100,000 levels overflowed a handler's stack on /v1/responses, in a known member or an
// unknown one. Refused as too deep before anything is built.
TEST(RequestFuzz, DeepNestingIsA400) {
  const std::string objects = Repeat("{\"a\":", 100000) + "1" + Repeat("}", 100000);
  const std::string arrays = Repeat("[", 100000) + Repeat("]", 100000);
  for (const std::string& body : {objects, arrays, R"({"input":"hi","frobnicate":)" + objects + "}",
                                  R"({"input":"hi","metadata":{"k":)" + arrays + "}}",
                                  R"({"messages":[{"role":"user","content":)" + arrays + "}]}"}) {
    const Outcome o = Parse(body);
    for (const ApiError* e : {&o.chat, &o.completion, &o.response}) {
      EXPECT_EQ(e->status, 400);
      EXPECT_EQ(e->code, "nesting_too_deep") << e->message;
    }
  }
  // 64 levels is the limit; a realistic body far below it parses.
  EXPECT_EQ(Parse(R"({"input":[{"role":"user","content":[{"type":"input_text","text":"hi"}]}]})").response.status, 0);
}

// Issue 13: wrong-typed members were 500s with library exception text. Each is a 400 naming it.
TEST(RequestFuzz, WrongTypesAre400sNamingTheMember) {
  const std::vector<std::pair<std::string, std::string>> chat = {
      {R"({"messages":[{"role":"user","content":"hi"}],"stream":"yes"})", "stream"},
      {R"({"messages":[{"role":"user","content":"hi"}],"store":1})", "store"},
      {R"({"messages":[{"role":"user","content":"hi"}],"temperature":"hot"})", "temperature"},
      {R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":1.5})", "max_tokens"},
      {R"({"messages":[{"role":7,"content":"hi"}]})", "messages[0].role"},
      {R"({"messages":[{"role":"user","content":{"text":"hi"}}]})", "messages[0].content"},
      {R"({"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":3}}]})", "tools[0].function.name"},
      {R"({"messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_schema","json_schema":{"schema":5}}})",
       "response_format.json_schema.schema"},
      {R"({"messages":[{"role":"user","content":"hi"}],"stream_options":{"include_usage":"no"}})", "stream_options.include_usage"},
  };
  for (const auto& [body, param] : chat) {
    const ApiError e = Parse(body).chat;
    EXPECT_EQ(e.status, 400) << body;
    EXPECT_EQ(e.param, param) << body << ": " << e.message;
  }
  const std::vector<std::pair<std::string, std::string>> responses = {
      {R"({"input":"hi","stream":"yes"})", "stream"},
      {R"({"input":"hi","store":"no"})", "store"},
      {R"({"input":"hi","truncation":1})", "truncation"},
      {R"({"input":"hi","truncation":"sometimes"})", "truncation"},
      {R"({"input":"hi","metadata":{"k":1}})", "metadata"},
      {R"({"input":[{"role":"user","content":"hi","id":5}]})", "input[0].id"},
      {R"({"input":[{"type":"function_call","call_id":"c","name":"f","arguments":{}}]})", "input[0].arguments"},
      {R"({"input":"hi","conversation":{"id":1}})", "conversation"},
      {R"({"input":"hi","text":{"format":{"type":"json_schema","schema":[]}}})", "text.format.schema"},
  };
  for (const auto& [body, param] : responses) {
    const ApiError e = Parse(body).response;
    EXPECT_EQ(e.status, 400) << body;
    EXPECT_EQ(e.param, param) << body << ": " << e.message;
  }
  const ApiError echo = Parse(R"({"prompt":"hi","echo":"true"})").completion;
  EXPECT_EQ(echo.status, 400);
  EXPECT_EQ(echo.param, "echo");
}

// docs/api.md: null counts as absent.
TEST(RequestFuzz, NullIsAbsent) {
  EXPECT_EQ(Parse(R"({"input":"hi","temperature":null,"top_p":null,"truncation":null,"store":null})").response.status, 0);
  EXPECT_EQ(Parse(R"({"messages":[{"role":"user","content":null}],"temperature":null,"stream":null})").chat.status, 0);
  EXPECT_EQ(Parse(R"({"prompt":"hi","max_tokens":null,"stop":null})").completion.status, 0);
}

}  // namespace
}  // namespace mnemo
