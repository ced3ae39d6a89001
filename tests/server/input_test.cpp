// Hostile and malformed request bodies against mnemo serve over real HTTP on 127.0.0.1 (issue 13):
// every one is answered with a 4xx in OpenAI's error shape, never a 5xx, never library exception
// text, and the server keeps answering afterwards.
#include <gtest/gtest.h>
#include <httplib.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <map>
#include <random>

#include <sqlite3.h>

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
  httplib::Result Post(const std::string& path, const std::string& body, const std::string& key = "") {
    httplib::Headers h;
    if (!key.empty()) h.emplace("Authorization", "Bearer " + key);
    return c.Post(path.c_str(), h, body, "application/json");
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

// JSON types a request member accepts, as the API documents them (the test's own copy of the
// schema: the server's CheckFields tables must agree with it).
enum : unsigned { S = 1, I = 2, N = 4, B = 8, A = 16, O = 32 };
struct Field {
  const char* name;
  unsigned types;         // I: integers only; N: any number
  bool required = false;  // null is then a 400 too
};

const std::vector<Field> kChatFields = {
    {"model", S}, {"messages", A, true}, {"max_tokens", I}, {"max_completion_tokens", I}, {"temperature", N},
    {"top_p", N}, {"n", I}, {"stream", B}, {"stream_options", O}, {"stop", S | A}, {"presence_penalty", N},
    {"frequency_penalty", N}, {"seed", I}, {"user", S}, {"top_k", I}, {"min_p", N}, {"repetition_penalty", N},
    {"ignore_eos", B}, {"min_tokens", I}, {"metadata", O}, {"store", B}, {"logprobs", B},
    {"parallel_tool_calls", B}, {"service_tier", S}, {"context_budget", N}, {"context_mode", S},
    {"context_preset", S}, {"context_relevance", S}, {"context_keep_last", I}, {"include", A}};

const std::vector<Field> kResponsesFields = {
    {"model", S}, {"input", S | A, true}, {"instructions", S}, {"previous_response_id", S},
    {"conversation", S | O}, {"store", B}, {"max_output_tokens", I}, {"temperature", N}, {"top_p", N},
    {"truncation", S}, {"stream", B}, {"metadata", O}, {"user", S}, {"seed", I}, {"top_k", I}, {"min_p", N},
    {"stop", S | A}, {"presence_penalty", N}, {"frequency_penalty", N}, {"repetition_penalty", N},
    {"ignore_eos", B}, {"min_tokens", I}, {"parallel_tool_calls", B}, {"tool_choice", S | O}, {"tools", A},
    {"text", O}, {"reasoning", O}, {"service_tier", S}, {"context_budget", N}, {"context_mode", S},
    {"context_preset", S}, {"context_relevance", S}, {"context_keep_last", I}, {"include", A}};

const std::vector<Field> kCompletionsFields = {
    {"model", S}, {"prompt", S, true}, {"max_tokens", I}, {"temperature", N}, {"top_p", N}, {"n", I},
    {"stream", B}, {"stream_options", O}, {"stop", S | A}, {"presence_penalty", N}, {"frequency_penalty", N},
    {"seed", I}, {"user", S}, {"top_k", I}, {"min_p", N}, {"repetition_penalty", N}, {"ignore_eos", B},
    {"min_tokens", I}, {"echo", B}, {"logprobs", I}, {"best_of", I}, {"suffix", S}};

struct Probe {
  Json value;
  unsigned type;  // 0 for null
};

// Library exception text that must never reach a client.
bool LeaksInternals(const std::string& body) {
  for (const char* s : {"json.exception", "type_error", "parse_error", "out_of_range", "std::", "basic_string",
                        "what():", "/tmp/", ".db"}) {
    if (body.find(s) != std::string::npos) return true;
  }
  return false;
}

// Every member of both generation endpoints (and completions) with a value of every JSON type:
// a type the member does not take is a 400 invalid_type naming it; null is absent (200) unless the
// member is required; a type it takes is never a 5xx.
TEST(Input, EveryFieldWithEveryWrongTypeIsA400NamingIt) {
  ServerProcess server({"--db", TempDb("types")});
  ASSERT_GT(server.port(), 0) << server.log();
  Client c(server.port());
  const std::vector<Probe> probes = {{"x", S},   {1.5, N},          {7, I | N},
                                     {true, B},  {nullptr, 0},      {Json::array(), A},
                                     {Json{{"a", 1}}, O}};
  struct Endpoint {
    const char* path;
    Json base;
    const std::vector<Field>* fields;
  };
  const std::vector<Endpoint> endpoints = {
      {"/v1/chat/completions",
       {{"messages", {{{"role", "user"}, {"content", "Once upon a time"}}}}, {"max_tokens", 2}, {"temperature", 0}},
       &kChatFields},
      {"/v1/responses", {{"input", "Once upon a time"}, {"max_output_tokens", 2}, {"temperature", 0}, {"store", false}},
       &kResponsesFields},
      {"/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 2}, {"temperature", 0}},
       &kCompletionsFields},
  };
  int sent = 0, wrong_type = 0;
  for (const Endpoint& ep : endpoints) {
    for (const Field& f : *ep.fields) {
      for (const Probe& p : probes) {
        Json body = ep.base;
        body[f.name] = p.value;
        const std::string what = std::string(ep.path) + " " + f.name + "=" + p.value.dump();
        auto r = c.Post(ep.path, body.dump());
        sent++;
        ASSERT_TRUE(r) << what << ": no response\nserver log:\n" << server.log();
        EXPECT_LT(r->status, 500) << what << ": " << r->body.substr(0, 300);
        EXPECT_FALSE(LeaksInternals(r->body)) << what << ": " << r->body.substr(0, 300);
        if (p.type == 0) {
          if (f.required) {
            EXPECT_EQ(r->status, 400) << what;
          } else {
            EXPECT_EQ(r->status, 200) << what << ": " << r->body.substr(0, 300);
          }
        } else if (!(p.type & f.types)) {
          wrong_type++;
          Json e = ErrorOf(r, what);
          EXPECT_EQ(r->status, 400) << what;
          if (e.is_object()) {
            EXPECT_EQ(e["param"], f.name) << what << ": " << r->body;
            EXPECT_EQ(e["code"], "invalid_type") << what << ": " << r->body;
          }
        } else if (r->status >= 400) {
          ErrorOf(r, what);
        }
      }
    }
  }
  EXPECT_GT(wrong_type, 300);
  // Members inside members, and the other JSON endpoints.
  struct Case {
    const char* path;
    std::string body;
    const char* param;
  };
  const std::vector<Case> nested = {
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"stream":true,"stream_options":{"include_usage":"yes"}})", "stream_options.include_usage"},
      {"/v1/chat/completions", R"({"messages":[{"role":7,"content":"x"}]})", "messages[0].role"},
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":{"text":"x"}}]})", "messages[0].content"},
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x","pinned":"yes"}]})", "messages[0].pinned"},
      {"/v1/responses", R"({"input":[{"type":7,"role":"user","content":"x"}]})", "input[0].type"},
      {"/v1/responses", R"({"input":[{"role":"user","content":"x","id":7}]})", "input[0].id"},
      {"/v1/responses", R"({"input":[{"role":["user"],"content":"x"}]})", "input[0].role"},
      {"/v1/responses", R"({"input":[{"role":"user","content":[{"type":"input_text","text":7}]}]})", "input[0].content"},
      {"/tokenize", R"({"content":"x","add_special":"yes"})", "add_special"},
      {"/tokenize", R"({"messages":[{"role":7,"content":"x"}]})", "messages[0].role"},
      {"/tokenize", R"({"content":7})", "content"},
      {"/detokenize", R"({"tokens":"1 2 3"})", "tokens"},
      {"/v1/conversations", R"({"items":"x"})", "items"},
      {"/v1/conversations", R"({"metadata":"x"})", "metadata"},
      {"/v1/conversations", R"({"items":[{"role":"user","content":"x","pinned":1}]})", "items[0].pinned"},
  };
  for (const Case& k : nested) {
    const std::string what = std::string(k.path) + " " + k.body;
    auto r = c.Post(k.path, k.body);
    Json e = ErrorOf(r, what);
    ASSERT_TRUE(r && e.is_object()) << what;
    EXPECT_EQ(r->status, 400) << what << ": " << r->body;
    EXPECT_EQ(e["param"], k.param) << what << ": " << r->body;
    EXPECT_EQ(e["code"], "invalid_type") << what << ": " << r->body;
  }
  // temperature and top_p null count as absent, and the response reports the defaults.
  auto r = c.Post("/v1/responses", R"({"input":"hi","max_output_tokens":2,"temperature":null,"top_p":null,"store":null,"truncation":null,"stream":null,"metadata":null})");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  Json j = Json::parse(r->body);
  EXPECT_EQ(j["temperature"], 1.0);
  EXPECT_EQ(j["top_p"], 1.0);
  EXPECT_EQ(j["store"], true);
  EXPECT_EQ(j["truncation"], "disabled");
  EXPECT_EQ(c.c.Get(("/v1/responses/" + j["id"].get<std::string>()).c_str())->status, 200);  // stored
  auto h = c.c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  std::printf("%d requests, %d with a wrong type\n", sent, wrong_type);
}

// A random JSON value of any type, nested at most `depth` more levels.
Json RandomValue(std::mt19937_64& rng, int depth) {
  static const char* strings[] = {"", "x", "user", "assistant", "system", "message", "auto", "disabled",
                                  "exact", "reuse", "keyword", "\xc3\xa9t\xc3\xa9", "\\u0000", "msg_1",
                                  "mnemo_context.scores", "Once upon a time"};
  switch (rng() % (depth > 0 ? 9 : 7)) {
    case 0: return nullptr;
    case 1: return rng() % 2 == 0;
    case 2: return static_cast<int64_t>(rng() % 5) - 1;
    case 3: {
      const int64_t big[] = {INT64_MIN, INT64_MAX, 1 << 20, -(1 << 20), 100000, 2};
      return big[rng() % 6];
    }
    case 4: {
      const double d[] = {0.5, -0.0, 1e308, -1e-300, 2.5, 0.999};
      return d[rng() % 6];
    }
    case 5: return strings[rng() % std::size(strings)];
    case 6: return std::string(rng() % 2000, "ab .\n"[rng() % 5]);
    case 7: {
      Json a = Json::array();
      for (int i = static_cast<int>(rng() % 4); i > 0; i--) a.push_back(RandomValue(rng, depth - 1));
      return a;
    }
    default: {
      static const char* keys[] = {"role", "content", "type", "text", "id", "pinned", "include_usage", "zz"};
      Json o = Json::object();
      for (int i = static_cast<int>(rng() % 4); i > 0; i--) o[keys[rng() % std::size(keys)]] = RandomValue(rng, depth - 1);
      return o;
    }
  }
}

// A random array or object inside `v` (v itself included), or nullptr when there is none.
Json* RandomContainer(std::mt19937_64& rng, Json& v) {
  std::vector<Json*> all;
  std::vector<Json*> todo = {&v};
  while (!todo.empty()) {
    Json* x = todo.back();
    todo.pop_back();
    if (!x->is_structured()) continue;
    all.push_back(x);
    for (auto& child : *x) todo.push_back(&child);
  }
  return all.empty() ? nullptr : all[rng() % all.size()];
}

// A few hundred random mutations of valid bodies (members replaced, removed, added, at any depth;
// bytes cut, changed or inserted) on every JSON endpoint: no 5xx, no exception text, and the
// server answers normally afterwards. Deterministic seed; bounded in time.
TEST(Input, RandomMutationsOfValidBodiesNeverGetA5xx) {
  ServerProcess server({"--db", TempDb("fuzz")});
  ASSERT_GT(server.port(), 0) << server.log();
  Client c(server.port());
  auto conv = c.Post("/v1/conversations", R"({"metadata":{"k":"v"}})");
  ASSERT_TRUE(conv && conv->status == 200) << (conv ? conv->body : "");
  const std::string conv_id = Json::parse(conv->body)["id"];
  struct Seed {
    std::string path;
    Json body;
    const char* max_field;  // the output limit, put back after mutating to keep turns short
  };
  const std::vector<Seed> seeds = {
      {"/v1/chat/completions",
       {{"messages", {{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", "Once upon a time"}}}},
        {"max_tokens", 2}, {"temperature", 0.5}, {"stop", {"."}}, {"stream", false}, {"stream_options", {{"include_usage", true}}},
        {"context_budget", 0.5}, {"include", {"mnemo_context.scores"}}},
       "max_tokens"},
      {"/v1/responses",
       {{"input", {{{"role", "user"}, {"content", {{{"type", "input_text"}, {"text", "Lily"}}}}}}},
        {"max_output_tokens", 2}, {"instructions", "Tell a story."}, {"metadata", {{"a", "b"}}}, {"truncation", "auto"},
        {"store", true}, {"top_p", 0.9}},
       "max_output_tokens"},
      {"/v1/responses", {{"input", "hi"}, {"max_output_tokens", 2}, {"conversation", conv_id}}, "max_output_tokens"},
      {"/v1/completions", {{"prompt", "Once"}, {"max_tokens", 2}, {"echo", false}, {"seed", 3}}, "max_tokens"},
      {"/tokenize", {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"add_special", true}}, nullptr},
      {"/detokenize", {{"tokens", {1, 2, 3}}}, nullptr},
      {"/v1/conversations", {{"items", {{{"role", "user"}, {"content", "hi"}}}}, {"metadata", {{"k", "v"}}}}, nullptr},
      {"/v1/conversations/" + conv_id + "/items", {{"items", {{{"role", "assistant"}, {"content", "ok"}}}}}, nullptr},
  };
  std::mt19937_64 rng(20261201);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  int sent = 0;
  std::map<int, int> by_status;
  for (int i = 0; i < 400 && std::chrono::steady_clock::now() < deadline; i++) {
    const Seed& seed = seeds[rng() % seeds.size()];
    Json body = seed.body;
    for (int m = 1 + static_cast<int>(rng() % 3); m > 0; m--) {
      Json* at = RandomContainer(rng, body);
      if (!at) break;
      const int op = static_cast<int>(rng() % 3);
      if (at->is_object()) {
        if (op == 0 && !at->empty()) {
          auto it = at->begin();
          std::advance(it, rng() % at->size());
          at->erase(it);
        } else if (op == 1 || at->empty()) {
          (*at)["zz" + std::to_string(rng() % 3)] = RandomValue(rng, 2);
        } else {
          auto it = at->begin();
          std::advance(it, rng() % at->size());
          *it = RandomValue(rng, 2);
        }
      } else if (at->is_array()) {
        if (op == 0 && !at->empty()) {
          at->erase(at->begin() + static_cast<std::ptrdiff_t>(rng() % at->size()));
        } else if (op == 1 || at->empty()) {
          at->push_back(RandomValue(rng, 2));
        } else {
          (*at)[rng() % at->size()] = RandomValue(rng, 2);
        }
      }
    }
    if (seed.max_field && body.is_object() && rng() % 8 != 0) body[seed.max_field] = 2;
    std::string text = body.dump();
    if (rng() % 5 == 0 && !text.empty()) {  // byte-level damage
      const size_t pos = rng() % text.size();
      const char junk[] = "{}[]\",:0aZ\\\x80\xff";
      switch (rng() % 3) {
        case 0: text.resize(pos); break;
        case 1: text[pos] = junk[rng() % (sizeof junk - 1)]; break;
        default: text = text.substr(0, pos) + junk[rng() % (sizeof junk - 1)] + text.substr(pos);
      }
    }
    auto r = c.Post(seed.path, text);
    sent++;
    ASSERT_TRUE(r) << seed.path << " " << text.substr(0, 300) << ": no response\nserver log:\n" << server.log();
    by_status[r->status]++;
    EXPECT_LT(r->status, 500) << seed.path << " " << text.substr(0, 300) << ": " << r->body.substr(0, 300);
    EXPECT_FALSE(LeaksInternals(r->body)) << seed.path << " " << text.substr(0, 300) << ": " << r->body.substr(0, 300);
    if (r->status >= 400) ErrorOf(r, seed.path + " " + text.substr(0, 300));
  }
  EXPECT_GE(sent, 100);
  std::string summary;
  for (auto [status, n] : by_status) {
    char part[32];
    std::snprintf(part, sizeof part, " %d:%d", status, n);
    summary += part;
  }
  std::printf("%d mutated requests, by status:%s\n", sent, summary.c_str());
  auto ok = c.Post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"Once upon a time"}],"max_tokens":4})");
  ASSERT_TRUE(ok) << server.log();
  EXPECT_EQ(ok->status, 200) << ok->body;
}

// The generated-token counter of /metrics.
long CompletionTokens(Client& c) {
  auto m = c.c.Get("/metrics");
  if (!m) return -1;
  const std::string key = "\nmnemo_completion_tokens_total ";  // the sample, not its # HELP line
  auto p = m->body.find(key);
  return p == std::string::npos ? -1 : std::stol(m->body.substr(p + key.size()));
}

// Client-chosen conversation item ids are scoped to their conversation: another key's use of the
// same id neither collides nor shows (it was a 500 "conversation item '<id>' exists" after the
// turn was generated, an existence oracle across keys); a repeat within the conversation is a 409
// before any token is generated. A store failure's detail (the db path) stays in the log.
TEST(Input, ItemIdsAreScopedToTheirConversationAndStoreErrorsShowNoPath) {
  const std::string db = TempDb("ids");
  ServerProcess server({"--db", db, "--api-key", "k1", "--api-key", "k2"});
  ASSERT_GT(server.port(), 0) << server.log();
  Client c(server.port());
  auto a = c.Post("/v1/conversations", R"({"items":[{"id":"msg_shared","role":"user","content":"Lily"}]})", "k1");
  ASSERT_TRUE(a && a->status == 200) << (a ? a->body : "");
  const std::string conv_a = Json::parse(a->body)["id"];
  auto b = c.Post("/v1/conversations", "{}", "k2");
  ASSERT_TRUE(b && b->status == 200) << (b ? b->body : "");
  const std::string conv_b = Json::parse(b->body)["id"];
  const Json item = {{"id", "msg_shared"}, {"role", "user"}, {"content", "Once upon a time"}};
  // Another key's conversation takes the same id.
  auto r = c.Post("/v1/responses", Json{{"input", {item}}, {"conversation", conv_b}, {"max_output_tokens", 2}}.dump(), "k2");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  auto got = c.c.Get(("/v1/conversations/" + conv_b + "/items/msg_shared").c_str(), {{"Authorization", "Bearer k2"}});
  ASSERT_TRUE(got);
  EXPECT_EQ(got->status, 200) << got->body;
  // Within one conversation: a 409 naming the item, before anything is generated.
  const long tokens = CompletionTokens(c);
  for (const Json& input : {Json::array({item}), Json::array({{{"id", "msg_x"}, {"role", "user"}, {"content", "a"}},
                                                              {{"id", "msg_x"}, {"role", "user"}, {"content", "b"}}})}) {
    r = c.Post("/v1/responses", Json{{"input", input}, {"conversation", conv_a}, {"max_output_tokens", 2}}.dump(), "k1");
    Json e = ErrorOf(r, "repeated id");
    ASSERT_TRUE(e.is_object());
    EXPECT_EQ(r->status, 409) << r->body;
    EXPECT_EQ(e["code"], "already_exists");
    EXPECT_EQ(e["param"], input.size() == 1 ? "input[0].id" : "input[1].id") << r->body;
  }
  EXPECT_EQ(CompletionTokens(c), tokens);
  r = c.Post("/v1/conversations/" + conv_a + "/items", Json{{"items", {item}}}.dump(), "k1");
  Json e = ErrorOf(r, "repeated item");
  ASSERT_TRUE(e.is_object());
  EXPECT_EQ(r->status, 409) << r->body;
  // A store that cannot be written (another process holds its write lock past the busy timeout):
  // a 5xx whose message names no file; the log has the detail.
  sqlite3* raw = nullptr;
  ASSERT_EQ(sqlite3_open(db.c_str(), &raw), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(raw, "BEGIN EXCLUSIVE", nullptr, nullptr, nullptr), SQLITE_OK);
  r = c.Post("/v1/conversations", "{}", "k1");
  sqlite3_exec(raw, "ROLLBACK", nullptr, nullptr, nullptr);
  sqlite3_close(raw);
  e = ErrorOf(r, "locked store");
  ASSERT_TRUE(e.is_object());
  EXPECT_GE(r->status, 500);
  EXPECT_EQ(r->body.find(db), std::string::npos) << r->body;
  EXPECT_EQ(r->body.find("database"), std::string::npos) << r->body;
  EXPECT_NE(server.log().find(db), std::string::npos) << "the detail is logged";
  r = c.Post("/v1/conversations", "{}", "k1");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
}

// The README's `curl -d` sends application/x-www-form-urlencoded: cpp-httplib's own reader refused
// such bodies over 8 KB with a 413. A Range header cut error bodies short. Neither now.
TEST(Input, FormEncodedBodiesAndRangeHeadersAreNotSpecial) {
  ServerProcess server({"--max-body-mb", "1"});
  ASSERT_GT(server.port(), 0) << server.log();
  Client c(server.port());
  const std::string big = Json{{"content", std::string(20000, 'a')}}.dump();
  auto r = c.c.Post("/tokenize", big, "application/x-www-form-urlencoded");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body.substr(0, 300);
  Json chat = {{"messages", {{{"role", "system"}, {"content", std::string(9000, ' ') + "Be brief."}},
                             {{"role", "user"}, {"content", "Once upon a time"}}}},
               {"max_tokens", 2}};
  r = c.c.Post("/v1/chat/completions", chat.dump(), "application/x-www-form-urlencoded");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body.substr(0, 300);
  // The body limit still holds for every type, and multipart bodies are refused, in OpenAI's shape.
  r = c.c.Post("/tokenize", std::string(2 << 20, ' '), "application/x-www-form-urlencoded");
  Json e = ErrorOf(r, "form body over the limit");
  ASSERT_TRUE(e.is_object());
  EXPECT_EQ(r->status, 413);
  httplib::MultipartFormDataItems parts = {{"content", "hello", "", ""}};
  r = c.c.Post("/tokenize", parts);
  e = ErrorOf(r, "multipart");
  ASSERT_TRUE(e.is_object());
  EXPECT_EQ(r->status, 400);
  // A Range header changes nothing.
  for (const char* range : {"bytes=0-10", "bytes=5-", "bytes=0-1,4-6"}) {
    r = c.c.Post("/v1/chat/completions", {{"Range", range}}, R"({"messages":"x"})", "application/json");
    e = ErrorOf(r, range);
    ASSERT_TRUE(e.is_object()) << range;
    EXPECT_EQ(r->status, 400) << range;
    EXPECT_EQ(e["param"], "messages") << range;
    EXPECT_FALSE(r->has_header("Content-Range")) << range;
  }
  r = c.c.Get("/health", {{"Range", "bytes=0-3"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(Json::parse(r->body, nullptr, false)["status"], "ok") << r->body;  // whole, not cut to 4 bytes
}

// A prompt far over the context is refused on a bound known without tokenizing (no token stands
// for more than the vocabulary's longest token text): a 7 MB one took a worker 5 s to tokenize
// before being refused, and each left ~26 MB in that worker's malloc arena. One just over the
// context is still counted exactly.
TEST(Input, OverLongPromptsAreRefusedBeforeTokenizing) {
  ServerProcess server({"--db", TempDb("long")});
  ASSERT_GT(server.port(), 0) << server.log();
  Client c(server.port());
  for (const auto& [text, at_least] : {std::pair{Repeat("once upon a time there was a little girl ", 50000), true},
                                       std::pair{Repeat("once upon a time ", 200), false}}) {
    const std::vector<std::pair<std::string, Json>> calls = {
        {"/v1/responses", {{"input", text}, {"max_output_tokens", 2}}},
        {"/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", text}}}}, {"max_tokens", 2}}},
        {"/v1/completions", {{"prompt", text}, {"max_tokens", 2}}},
    };
    for (const auto& [path, body] : calls) {
      const std::string what = path + " with " + std::to_string(text.size()) + " bytes";
      auto r = c.Post(path, body.dump());
      Json e = ErrorOf(r, what);
      ASSERT_TRUE(e.is_object()) << what;
      EXPECT_EQ(r->status, 400) << what;
      EXPECT_EQ(e["code"], "context_length_exceeded") << what;
      EXPECT_EQ(e["message"].get<std::string>().find("at least") != std::string::npos, at_least)
          << what << ": " << e["message"];
    }
  }
  auto r = c.Post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"Hi"}],"max_tokens":2})");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body.substr(0, 300);
}

// Every response carries X-Request-Id: a sane client id is echoed, anything else (too long,
// spaces, nothing) replaced by a generated one, on answers, errors, unknown routes and bodies over
// the limit alike; the server logs errors under it.
TEST(Input, EveryResponseCarriesARequestId) {
  ServerProcess server({"--max-body-mb", "1"});
  ASSERT_GT(server.port(), 0) << server.log();
  httplib::Client c("127.0.0.1", server.port());
  c.set_read_timeout(60, 0);
  auto id_of = [](const httplib::Result& r) { return r ? r->get_header_value("X-Request-Id") : std::string("<none>"); };
  const std::string chat = R"({"messages":[{"role":"user","content":"Hi"}],"max_tokens":2})";
  auto r = c.Post("/v1/chat/completions", {{"X-Request-Id", "trace-42.a:b"}}, chat, "application/json");
  ASSERT_TRUE(r && r->status == 200);
  EXPECT_EQ(id_of(r), "trace-42.a:b");
  r = c.Post("/v1/chat/completions", {{"X-Request-Id", "my id"}}, "{bad", "application/json");
  ASSERT_TRUE(r && r->status == 400);
  EXPECT_EQ(id_of(r).rfind("req_", 0), 0u) << id_of(r);
  const std::string logged = id_of(r);
  r = c.Post("/v1/chat/completions", {{"X-Request-Id", std::string(200, 'x')}}, chat, "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(id_of(r).rfind("req_", 0), 0u);
  r = c.Get("/no/such/route");
  ASSERT_TRUE(r && r->status == 404);
  EXPECT_EQ(id_of(r).rfind("req_", 0), 0u);
  auto first = id_of(c.Get("/health")), second = id_of(c.Get("/health"));
  EXPECT_NE(first, second);
  r = c.Post("/tokenize", {{"X-Request-Id", "big-one"}}, std::string(2 << 20, ' '), "application/json");
  ASSERT_TRUE(r && r->status == 413);
  EXPECT_EQ(id_of(r), "big-one");
  // The 400 above was logged with its id.
  for (int i = 0; i < 100 && server.log().find(logged) == std::string::npos; i++) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_NE(server.log().find("request " + logged + ": POST /v1/chat/completions -> 400"), std::string::npos)
      << server.log().substr(0, 3000);
}

}  // namespace
}  // namespace mnemo::testing
