// Hostile and malformed request bodies against mnemo serve over real HTTP on 127.0.0.1 (issue 13):
// every one is answered with a 4xx in OpenAI's error shape, never a 5xx, never library exception
// text, and the server keeps answering afterwards.
#include <gtest/gtest.h>
#include <httplib.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "server_process.h"

namespace mnemo::testing {
namespace {

using Json = nlohmann::json;

std::string TempDb(const char* name) {
  auto p = std::filesystem::temp_directory_path() / (std::string("mnemo-input-") + name + "-" + std::to_string(getpid()) + ".db");
  std::filesystem::remove(p);
  std::filesystem::remove_all(p.string() + ".kv");
  return p.string();
}

struct Client {
  explicit Client(int port) : c("127.0.0.1", port) {
    c.set_read_timeout(60, 0);
    c.set_connection_timeout(5, 0);
  }
  httplib::Result Post(const std::string& path, const std::string& body) {
    return c.Post(path.c_str(), body, "application/json");
  }
  httplib::Client c;
};

std::string Repeat(const std::string& s, int n) {
  std::string out;
  out.reserve(s.size() * n);
  for (int i = 0; i < n; i++) out += s;
  return out;
}

// The error object of a 4xx answer, after checking OpenAI's shape; null when the shape is wrong.
Json ErrorOf(const httplib::Result& r, const std::string& what) {
  if (!r) {
    ADD_FAILURE() << what << ": no response (" << httplib::to_string(r.error()) << ")";
    return nullptr;
  }
  Json j = Json::parse(r->body, nullptr, false);
  if (!j.is_object() || !j.contains("error") || !j["error"].is_object()) {
    ADD_FAILURE() << what << ": not an error object: " << r->body.substr(0, 300);
    return nullptr;
  }
  const Json& e = j["error"];
  EXPECT_TRUE(e["message"].is_string() && e["type"].is_string() && e.contains("param") && e.contains("code"))
      << what << ": " << r->body;
  return e;
}

// Nesting 100,000 deep overflowed the handler thread's stack on /v1/responses (SIGSEGV), in a known
// field or an unknown one; every JSON endpoint now refuses anything past 64 levels before parsing.
TEST(Input, DeepNestingIsRefusedAndTheServerLives) {
  ServerProcess server({"--db", TempDb("deep")});
  ASSERT_GT(server.port(), 0) << server.log();
  Client c(server.port());
  const std::string objects = Repeat("{\"a\":", 100000) + "1" + Repeat("}", 100000);
  const std::string arrays = Repeat("[", 100000) + Repeat("]", 100000);
  const std::vector<std::string> bodies = {
      objects,
      arrays,
      R"({"input":"hi","max_output_tokens":2,"frobnicate":)" + objects + "}",     // an unknown field
      R"({"input":"hi","max_output_tokens":2,"metadata":{"k":)" + arrays + "}}",  // a known one
      R"({"input":[{"role":"user","content":)" + arrays + "}]}",
  };
  for (const char* path : {"/v1/responses", "/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize",
                           "/v1/conversations"}) {
    for (size_t i = 0; i < bodies.size(); i++) {
      const std::string what = std::string(path) + " body " + std::to_string(i);
      auto r = c.Post(path, bodies[i]);
      Json e = ErrorOf(r, what);
      ASSERT_TRUE(r) << what << "\nserver log:\n" << server.log();
      EXPECT_EQ(r->status, 400) << what << ": " << r->body.substr(0, 300);
      if (e.is_object()) {
        EXPECT_EQ(e["code"], "nesting_too_deep") << what;
      }
    }
  }
  // The limit is 64 levels: the body object plus 63 more passes the depth check (and is refused
  // for the unknown field instead); one more level is too deep.
  auto nested = [](int levels) { return R"({"input":"hi","x":)" + Repeat("[", levels) + Repeat("]", levels) + "}"; };
  auto at = c.Post("/v1/responses", nested(63));
  Json e = ErrorOf(at, "63 levels");
  ASSERT_TRUE(e.is_object());
  EXPECT_EQ(e["param"], "x");
  e = ErrorOf(c.Post("/v1/responses", nested(64)), "64 levels");
  ASSERT_TRUE(e.is_object());
  EXPECT_EQ(e["code"], "nesting_too_deep");
  // Brackets inside strings are text, at any count, escaped quotes included.
  auto text = c.Post("/tokenize", Json{{"content", Repeat("[{\\\"", 25000)}}.dump());
  ASSERT_TRUE(text);
  EXPECT_EQ(text->status, 200) << text->body.substr(0, 300);
  text = c.Post("/v1/responses", Json{{"input", Repeat("[{", 40) + "\\\"" + Repeat("[{", 40)}, {"max_output_tokens", 2}}.dump());
  ASSERT_TRUE(text);
  EXPECT_EQ(text->status, 200) << text->body.substr(0, 300);
  // Still serving.
  auto ok = c.Post("/v1/responses", R"({"input":"Once upon a time","max_output_tokens":4,"temperature":0})");
  ASSERT_TRUE(ok) << server.log();
  EXPECT_EQ(ok->status, 200) << ok->body;
}

}  // namespace
}  // namespace mnemo::testing
