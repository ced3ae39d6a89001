// Structured outputs over real HTTP on stories260K (a model that knows no JSON): with
// response_format / text.format / grammar, every output parses and validates against its schema,
// across seeds, streamed or not, on both APIs, and even when max_tokens cuts it short.
#include <gtest/gtest.h>
#include <httplib.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "../grammar/schema_validator.h"
#include "server_process.h"

namespace mnemo::testing {
namespace {

using Json = nlohmann::json;
using OJ = nlohmann::ordered_json;

std::string TempDb(const char* name) {
  auto p = std::filesystem::temp_directory_path() / (std::string("mnemo-so-") + name + "-" + std::to_string(getpid()) + ".db");
  std::filesystem::remove(p);
  std::filesystem::remove_all(p.string() + ".kv");
  return p.string();
}

struct Client {
  explicit Client(int port) : c("127.0.0.1", port) { c.set_read_timeout(120, 0); }
  httplib::Result Post(const std::string& path, const Json& body) { return c.Post(path.c_str(), body.dump(), "application/json"); }
  httplib::Client c;
};

const char* kPerson = R"({"type": "object", "title": "Person", "$schema": "http://json-schema.org/draft-07/schema#",
  "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 10, "description": "the name"},
    "age": {"type": "integer", "minimum": -9007199254740991, "maximum": 9007199254740991},
    "mood": {"enum": ["happy", "sad"]}, "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 2},
    "home": {"type": "object", "properties": {"x": {"type": "number", "minimum": 0, "maximum": 1}, "ok": {"type": "boolean"}},
      "required": ["x", "ok"], "additionalProperties": false},
    "note": {"anyOf": [{"type": "string", "maxLength": 6}, {"type": "null"}]}},
  "required": ["name", "age", "mood", "tags", "home", "note"], "additionalProperties": false})";

void ExpectValid(const std::string& text, const OJ& schema, const std::string& what) {
  OJ v = OJ::parse(text, nullptr, false);
  ASSERT_FALSE(v.is_discarded()) << what << ": does not parse: " << text;
  EXPECT_EQ(test::Validate(schema, v, schema), "") << what << ": " << text;
}

class StructuredOutput : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_ = new ServerProcess({"--db", TempDb("suite")}); }
  static void TearDownTestSuite() { delete server_; }
  static ServerProcess* server_;
};
ServerProcess* StructuredOutput::server_ = nullptr;

TEST_F(StructuredOutput, ChatJsonSchemaValidatesAcrossSeeds) {
  ASSERT_GT(server_->port(), 0) << server_->log();
  Client c(server_->port());
  const OJ schema = OJ::parse(kPerson);
  int stopped = 0;
  for (int seed = 1; seed <= 8; ++seed) {
    Json body = {{"messages", {{{"role", "user"}, {"content", "Tell me about a person."}}}}, {"max_tokens", 200},
                 {"seed", seed}, {"temperature", 1.0},
                 {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "person"}, {"strict", seed % 2 ? Json(true) : Json(nullptr)}, {"schema", Json::parse(kPerson)}}}}}};
    auto r = c.Post("/v1/chat/completions", body);
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    Json j = Json::parse(r->body);
    const std::string finish = j["choices"][0]["finish_reason"];
    stopped += finish == "stop";
    ExpectValid(j["choices"][0]["message"]["content"], schema, "seed " + std::to_string(seed) + " finish " + finish);
  }
  EXPECT_GT(stopped, 0);
}

TEST_F(StructuredOutput, ShortMaxTokensStillCloseTheOutput) {
  Client c(server_->port());
  const OJ schema = OJ::parse(R"({"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "array", "items": {"type": "integer"}}},
    "required": ["a", "b"], "additionalProperties": false})");
  for (int seed = 1; seed <= 6; ++seed) {
    // The shortest completion is {"a":"","b":[]} (15 bytes); 16 tokens must end it complete.
    Json body = {{"messages", {{{"role", "user"}, {"content", "Once upon a time"}}}}, {"max_tokens", 16}, {"seed", seed},
                 {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", Json::parse(schema.dump())}}}}}};
    auto r = c.Post("/v1/chat/completions", body);
    ASSERT_TRUE(r && r->status == 200) << (r ? r->body : "no response");
    Json j = Json::parse(r->body);
    EXPECT_LE(j["usage"]["completion_tokens"].get<int>(), 16);
    ExpectValid(j["choices"][0]["message"]["content"], schema, "seed " + std::to_string(seed));
  }
}

TEST_F(StructuredOutput, ChatJsonObjectStreamed) {
  Client c(server_->port());
  for (int seed = 1; seed <= 4; ++seed) {
    Json body = {{"messages", {{{"role", "user"}, {"content", "Lily and Tom"}}}}, {"max_tokens", 100}, {"seed", seed},
                 {"stream", true}, {"response_format", {{"type", "json_object"}}}};
    auto r = c.Post("/v1/chat/completions", body);
    ASSERT_TRUE(r && r->status == 200);
    std::string text;
    size_t pos = 0;
    while ((pos = r->body.find("data: ", pos)) != std::string::npos) {
      const size_t end = r->body.find("\n\n", pos);
      const std::string data = r->body.substr(pos + 6, end - pos - 6);
      pos = end;
      if (data == "[DONE]") break;
      Json ev = Json::parse(data);
      if (!ev["choices"].empty() && ev["choices"][0]["delta"].contains("content")) text += ev["choices"][0]["delta"]["content"].get<std::string>();
    }
    Json v = Json::parse(text, nullptr, false);
    EXPECT_TRUE(v.is_object()) << text;
  }
}

TEST_F(StructuredOutput, ResponsesTextFormatValidatesAndIsEchoed) {
  Client c(server_->port());
  const OJ schema = OJ::parse(kPerson);
  std::string prev;
  for (int seed = 1; seed <= 6; ++seed) {
    Json body = {{"input", "Describe someone."}, {"max_output_tokens", 200}, {"seed", seed},
                 {"text", {{"format", {{"type", "json_schema"}, {"name", "person"}, {"strict", true}, {"schema", Json::parse(kPerson)}}}}}};
    if (seed % 2 == 0) body["previous_response_id"] = prev;  // two-turn conversations of structured turns
    auto r = c.Post("/v1/responses", body);
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    Json j = Json::parse(r->body);
    ExpectValid(j["output_text"], schema, "seed " + std::to_string(seed));
    EXPECT_EQ(j["text"]["format"]["type"], "json_schema");
    EXPECT_EQ(j["text"]["format"]["name"], "person");
    prev = j["id"];
  }
}

TEST_F(StructuredOutput, RawGrammarOnAllThreeEndpoints) {
  Client c(server_->port());
  const std::string g = "root ::= (\"yes\" | \"no\") \" \" [0-9]{1,3}";
  auto ok = [](const std::string& s) {
    return (s.rfind("yes ", 0) == 0 || s.rfind("no ", 0) == 0) && s.size() <= 7 && s.find_first_not_of("0123456789", s[0] == 'y' ? 4 : 3) == std::string::npos;
  };
  for (int seed = 1; seed <= 4; ++seed) {
    auto r1 = c.Post("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"seed", seed}, {"grammar", g}});
    ASSERT_TRUE(r1 && r1->status == 200) << (r1 ? r1->body : "");
    EXPECT_TRUE(ok(Json::parse(r1->body)["choices"][0]["message"]["content"])) << r1->body;
    auto r2 = c.Post("/v1/responses", {{"input", "Hi"}, {"seed", seed}, {"grammar", g}, {"store", false}});
    ASSERT_TRUE(r2 && r2->status == 200) << (r2 ? r2->body : "");
    EXPECT_TRUE(ok(Json::parse(r2->body)["output_text"])) << r2->body;
    auto r3 = c.Post("/v1/completions", {{"prompt", "Hi"}, {"seed", seed}, {"grammar", g}, {"max_tokens", 10}});
    ASSERT_TRUE(r3 && r3->status == 200) << (r3 ? r3->body : "");
    EXPECT_TRUE(ok(Json::parse(r3->body)["choices"][0]["text"])) << r3->body;
  }
}

TEST_F(StructuredOutput, UnsupportedFormatsAreClear400s) {
  Client c(server_->port());
  const Json msgs = {{{"role", "user"}, {"content", "Hi"}}};
  struct Case {
    std::string path, body, param;
  };
  const Case cases[] = {
      {"/v1/chat/completions", R"({"messages": MSGS, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "(a)\\1"}}}})",
       "response_format.json_schema.schema"},
      {"/v1/chat/completions", R"({"messages": MSGS, "response_format": {"type": "yaml"}})", "response_format.type"},
      {"/v1/chat/completions", R"({"messages": MSGS, "response_format": {"type": "json_schema"}})", "response_format.json_schema"},
      {"/v1/chat/completions", R"({"messages": MSGS, "response_format": "json"})", "response_format"},
      {"/v1/chat/completions", R"({"messages": MSGS, "grammar": "root ::= root"})", "grammar"},
      {"/v1/chat/completions", R"({"messages": MSGS, "grammar": "root ::= \"a\"", "response_format": {"type": "json_object"}})", "grammar"},
      {"/v1/responses", R"({"input": "Hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object", "properties": {"a": {"not": {"type": "null"}}}}}}})",
       "text.format.schema"},
      {"/v1/responses", R"({"input": "Hi", "text": {"colour": "red"}})", "text.colour"},
      // Schemas whose grammar is refused (a rule that never ends, left recursion through $ref).
      {"/v1/chat/completions", R"({"messages": MSGS, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#"}}}})",
       "response_format.json_schema.schema"},
      {"/v1/responses", R"({"input": "Hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": {"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "null"}]}}, "$ref": "#/$defs/a"}}}})",
       "text.format.schema"},
  };
  for (const auto& k : cases) {
    std::string text = k.body;
    if (text.find("MSGS") != std::string::npos) text.replace(text.find("MSGS"), 4, msgs.dump());
    const Json body = Json::parse(text);
    auto r = c.Post(k.path, body);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << k.body << " -> " << r->body;
    Json j = Json::parse(r->body, nullptr, false);
    ASSERT_TRUE(j.contains("error")) << r->body;
    EXPECT_EQ(j["error"]["param"], k.param) << r->body;
    EXPECT_EQ(j["error"]["type"], "invalid_request_error") << r->body;
  }
  // The server still serves.
  auto r = c.Post("/v1/chat/completions", {{"messages", msgs}, {"max_tokens", 4}});
  ASSERT_TRUE(r && r->status == 200);
}

}  // namespace
}  // namespace mnemo::testing
