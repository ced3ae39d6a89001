// Tool calls over real HTTP on stories260K (a model that knows no tools, rendered through the
// generic tools block) and on a generated model with Qwen 2.5's template (tools rendered by the
// template, Hermes syntax): required / named choices give calls whose arguments validate against
// the tool's schema across seeds, on both APIs, streamed deltas reassemble to the same call, a
// tool round trip continues the session's KV, and bad tool requests are 400s naming the member.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "../grammar/schema_validator.h"
#include "grammar/grammar.h"
#include "server/tools.h"
#include "post_json.h"
#include "server_process.h"

namespace mnemo::testing {
namespace {

using Json = nlohmann::json;
using OJ = nlohmann::ordered_json;

// Posts to the test server: the answer parsed, or a stream's events (post_json.h).
struct Client {
  explicit Client(int port) : port(port) {}
  Json Post(const std::string& path, const Json& body, int expect = 200) const { return PostJson(port, path, body, expect); }
  int port;
};

const char* kWeather = R"({"type": "object", "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 12},
  "unit": {"enum": ["celsius", "fahrenheit"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
  "required": ["city", "unit", "days"], "additionalProperties": false})";
const char* kTime = R"({"type": "object", "properties": {"zone": {"type": "string", "maxLength": 8}}, "required": ["zone"],
  "additionalProperties": false})";

Json ChatTools() {
  return Json::array({{{"type", "function"}, {"function", {{"name", "get_weather"}, {"description", "Weather forecast"}, {"parameters", Json::parse(kWeather)}}}},
                      {{"type", "function"}, {"function", {{"name", "get_time"}, {"parameters", Json::parse(kTime)}}}}});
}
Json ResponsesTools() {
  return Json::array({{{"type", "function"}, {"name", "get_weather"}, {"description", "Weather forecast"}, {"parameters", Json::parse(kWeather)}},
                      {{"type", "function"}, {"name", "get_time"}, {"parameters", Json::parse(kTime)}}});
}

void ExpectValidCall(const std::string& name, const std::string& arguments, const std::string& what) {
  ASSERT_TRUE(name == "get_weather" || name == "get_time") << what << ": " << name;
  const OJ schema = OJ::parse(name == "get_weather" ? kWeather : kTime);
  OJ v = OJ::parse(arguments, nullptr, false);
  ASSERT_FALSE(v.is_discarded()) << what << ": arguments do not parse: " << arguments;
  EXPECT_EQ(test::Validate(schema, v, schema), "") << what << ": " << arguments;
}

class Tools : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_ = new ServerProcess({"--max-context", "2048", "--kv-t0-mb", "64"}); }
  static void TearDownTestSuite() { delete server_; }
  static ServerProcess* server_;
};
ServerProcess* Tools::server_ = nullptr;

Json UserAsks() { return Json::array({{{"role", "user"}, {"content", "What is the weather in Paris?"}}}); }

TEST_F(Tools, ChatRequiredAndNamedCallsValidateAcrossSeeds) {
  ASSERT_GT(server_->port(), 0) << server_->log();
  Client c(server_->port());
  for (int seed = 1; seed <= 6; ++seed) {
    // Seed 5: allowed_tools (the AI SDK's allowedTools), required, with get_time alone allowed.
    const bool named = seed % 2 == 0 || seed == 5;
    const Json allowed = {{"type", "allowed_tools"},
                          {"allowed_tools", {{"mode", "required"}, {"tools", {{{"type", "function"}, {"function", {{"name", "get_time"}}}}}}}}};
    Json body = {{"messages", UserAsks()}, {"tools", ChatTools()}, {"max_tokens", 160}, {"seed", seed},
                 {"parallel_tool_calls", seed % 3 != 0},
                 {"tool_choice", seed == 5 ? allowed : named ? Json{{"type", "function"}, {"function", {{"name", "get_time"}}}} : Json("required")}};
    // Stop strings that occur in every call's syntax do not cut a forced call.
    if (seed >= 3) body["stop"] = Json::array({"\n", "}"});
    Json j = c.Post("/v1/chat/completions", body);
    const std::string what = "seed " + std::to_string(seed);
    ASSERT_EQ(j["choices"][0]["finish_reason"], "tool_calls") << what << ": " << j.dump();
    const Json& m = j["choices"][0]["message"];
    EXPECT_TRUE(m["content"].is_null()) << what;
    ASSERT_GE(m["tool_calls"].size(), 1u) << what;
    if (seed % 3 == 0) EXPECT_EQ(m["tool_calls"].size(), 1u) << what << ": parallel_tool_calls false";
    for (const Json& call : m["tool_calls"]) {
      EXPECT_EQ(call["type"], "function");
      EXPECT_EQ(call["id"].get<std::string>().rfind("call_", 0), 0u);
      if (named) EXPECT_EQ(call["function"]["name"], "get_time") << what;
      ExpectValidCall(call["function"]["name"], call["function"]["arguments"], what);
    }
  }
}

TEST_F(Tools, ChatStreamedDeltasReassembleToTheCall) {
  Client c(server_->port());
  for (int seed = 1; seed <= 3; ++seed) {
    Json body = {{"messages", UserAsks()}, {"tools", ChatTools()}, {"max_tokens", 160}, {"seed", seed}, {"temperature", 0.8},
                 {"tool_choice", "required"}};
    Json whole = c.Post("/v1/chat/completions", body);
    body["stream"] = true;
    const Json r = c.Post("/v1/chat/completions", body);
    ASSERT_TRUE(r.is_array());
    Json calls = Json::array();
    std::string finish, content;
    int texts = 0;  // deltas with a string content: OpenAI sends none before calls (content null)
    for (const Json& ev : r) {
      if (ev["choices"].empty()) continue;
      const Json& ch = ev["choices"][0];
      if (ch["finish_reason"].is_string()) finish = ch["finish_reason"];
      if (&ev == &r[0]) EXPECT_TRUE(ch["delta"]["role"] == "assistant" && ch["delta"]["content"].is_null()) << ev.dump();
      if (ch["delta"].contains("content") && ch["delta"]["content"].is_string()) {
        texts++;
        content += ch["delta"]["content"].get<std::string>();
      }
      if (!ch["delta"].contains("tool_calls")) continue;
      for (const Json& d : ch["delta"]["tool_calls"]) {
        const size_t k = d["index"];
        if (k == calls.size()) {  // the first delta of a call: id, type, name, empty arguments
          ASSERT_TRUE(d.contains("id") && d["type"] == "function" && d["function"]["arguments"] == "") << d.dump();
          calls.push_back({{"name", d["function"]["name"]}, {"arguments", ""}});
          continue;
        }
        ASSERT_LT(k, calls.size());
        EXPECT_FALSE(d.contains("id"));
        calls[k]["arguments"] = calls[k]["arguments"].get<std::string>() + d["function"]["arguments"].get<std::string>();
      }
    }
    EXPECT_EQ(finish, "tool_calls");
    EXPECT_EQ(content, "");
    EXPECT_EQ(texts, 0) << r.dump();
    const Json& want = whole["choices"][0]["message"]["tool_calls"];
    ASSERT_EQ(calls.size(), want.size()) << r.dump();
    for (size_t k = 0; k < calls.size(); ++k) {  // same seed: the same call
      EXPECT_EQ(calls[k]["name"], want[k]["function"]["name"]);
      EXPECT_EQ(calls[k]["arguments"], want[k]["function"]["arguments"]);
    }
  }
}

TEST_F(Tools, ChatRoundTripContinuesTheSessionKv) {
  Client c(server_->port());
  Json msgs = UserAsks();
  msgs[0]["content"] = "Is it raining in Rome today?";
  Json body = {{"messages", msgs}, {"tools", ChatTools()}, {"max_tokens", 160}, {"seed", 7}, {"tool_choice", "required"}};
  Json j = c.Post("/v1/chat/completions", body);
  const Json call_msg = j["choices"][0]["message"];
  const int turn1 = j["usage"]["prompt_tokens"].get<int>() + j["usage"]["completion_tokens"].get<int>();
  msgs.push_back(call_msg);
  for (const Json& call : call_msg["tool_calls"]) {
    msgs.push_back({{"role", "tool"}, {"tool_call_id", call["id"]}, {"content", "{\"rain\": false}"}});
  }
  body["messages"] = msgs;
  body["tool_choice"] = "auto";
  body["max_tokens"] = 12;
  Json j2 = c.Post("/v1/chat/completions", body);
  // The whole first turn (prompt, the call as generated; the end token at most) is served from the KV.
  EXPECT_GE(j2["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), turn1 - 1) << j2.dump();
  EXPECT_GT(j2["usage"]["prompt_tokens"].get<int>(), turn1);
}

TEST_F(Tools, ResponsesFunctionCallRoundTrip) {
  Client c(server_->port());
  for (int seed = 1; seed <= 3; ++seed) {
    const std::string what = "seed " + std::to_string(seed);
    Json body = {{"input", "Weather in Oslo for three days?"}, {"tools", ResponsesTools()}, {"max_output_tokens", 160},
                 {"seed", seed}, {"tool_choice", seed == 2 ? Json{{"type", "function"}, {"name", "get_weather"}} : Json("required")}};
    if (seed == 3) {  // allowed_tools, Responses' shape: only get_weather may be called
      body["tool_choice"] = {{"type", "allowed_tools"}, {"mode", "required"}, {"tools", {{{"type", "function"}, {"name", "get_weather"}}}}};
    }
    Json r = c.Post("/v1/responses", body);
    ASSERT_EQ(r["status"], "completed") << r.dump();
    EXPECT_EQ(r["tools"].size(), 2u);
    EXPECT_EQ(r["tool_choice"], body["tool_choice"]);
    Json outputs = Json::array();
    for (const Json& item : r["output"]) {
      ASSERT_EQ(item["type"], "function_call") << what << ": " << item.dump();
      EXPECT_EQ(item["call_id"].get<std::string>().rfind("call_", 0), 0u);
      EXPECT_EQ(item["id"].get<std::string>().rfind("fc_", 0), 0u);
      if (seed >= 2) EXPECT_EQ(item["name"], "get_weather");
      ExpectValidCall(item["name"], item["arguments"], what);
      outputs.push_back({{"type", "function_call_output"}, {"call_id", item["call_id"]}, {"output", "cloudy"}});
    }
    const int turn1 = r["usage"]["input_tokens"].get<int>() + r["usage"]["output_tokens"].get<int>();
    Json next = {{"previous_response_id", r["id"]}, {"input", outputs}, {"tools", ResponsesTools()}, {"max_output_tokens", 8}};
    Json r2 = c.Post("/v1/responses", next);
    EXPECT_GE(r2["usage"]["input_tokens_details"]["cached_tokens"].get<int>(), turn1 - 1) << what << ": " << r2.dump();
    // The calls can be referenced as items, and resent whole (stateless).
    Json again = {{"input", Json::array({{{"type", "message"}, {"role", "user"}, {"content", "Weather in Oslo for three days?"}}})},
                  {"tools", ResponsesTools()}, {"max_output_tokens", 4}};
    for (const Json& item : r["output"]) again["input"].push_back({{"type", "item_reference"}, {"id", item["id"]}});
    for (const Json& o : outputs) again["input"].push_back(o);
    Json r3 = c.Post("/v1/responses", again);
    EXPECT_GE(r3["usage"]["input_tokens_details"]["cached_tokens"].get<int>(), r["usage"]["input_tokens"].get<int>()) << what;
  }
  // In a conversation: the result's turn cuts the call's end-of-generation token from the session,
  // and still commits into the conversation (it was a 409 "moved on since this writer read it").
  Json conv = c.Post("/v1/conversations", Json::object());
  Json body = {{"conversation", conv["id"]}, {"input", "Weather in Oslo?"}, {"tools", ResponsesTools()},
               {"max_output_tokens", 160}, {"seed", 1}, {"tool_choice", "required"}};
  Json r = c.Post("/v1/responses", body);
  ASSERT_EQ(r["status"], "completed") << r.dump();
  Json outputs = Json::array();
  for (const Json& item : r["output"]) outputs.push_back({{"type", "function_call_output"}, {"call_id", item["call_id"]}, {"output", "cloudy"}});
  Json r2 = c.Post("/v1/responses", {{"conversation", conv["id"]}, {"input", outputs}, {"tools", ResponsesTools()}, {"max_output_tokens", 8}});
  EXPECT_GE(r2["usage"]["input_tokens_details"]["cached_tokens"].get<int>(),
            r["usage"]["input_tokens"].get<int>() + r["usage"]["output_tokens"].get<int>() - 1) << r2.dump();
}

TEST_F(Tools, ResponsesStreamedCallEvents) {
  Client c(server_->port());
  Json body = {{"input", "Time in Tokyo?"}, {"tools", ResponsesTools()}, {"max_output_tokens", 120}, {"seed", 5},
               {"tool_choice", "required"}, {"stream", true}};
  const Json r = c.Post("/v1/responses", body);
  ASSERT_TRUE(r.is_array());
  std::map<std::string, std::string> args, done;
  Json final_output;
  for (const Json& ev : r) {
    const std::string type = ev["type"];
    EXPECT_NE(type, "response.output_text.delta");
    if (type == "response.output_item.added") {
      ASSERT_EQ(ev["item"]["type"], "function_call");
      EXPECT_EQ(ev["item"]["arguments"], "");
      args[ev["item"]["id"]] = "";
    }
    if (type == "response.function_call_arguments.delta") args[ev["item_id"]] += ev["delta"].get<std::string>();
    if (type == "response.function_call_arguments.done") done[ev["item_id"]] = ev["arguments"];
    if (type == "response.completed") final_output = ev["response"]["output"];
  }
  ASSERT_FALSE(final_output.empty()) << r.dump();
  for (const Json& item : final_output) {
    EXPECT_EQ(args[item["id"]], item["arguments"]);
    EXPECT_EQ(done[item["id"]], item["arguments"]);
    ExpectValidCall(item["name"], item["arguments"], "streamed");
  }
}

TEST_F(Tools, AutoAndNoneAnswerInText) {
  Client c(server_->port());
  for (const char* choice : {"auto", "none"}) {
    Json j = c.Post("/v1/chat/completions", {{"messages", UserAsks()}, {"tools", ChatTools()}, {"max_tokens", 10},
                                           {"tool_choice", choice}, {"seed", 3}});
    // stories260K never writes <tool_call>: a story, not a call.
    EXPECT_TRUE(j["choices"][0]["message"]["content"].is_string()) << j.dump();
    EXPECT_FALSE(j["choices"][0]["message"].contains("tool_calls"));
    EXPECT_NE(j["choices"][0]["finish_reason"], "tool_calls");
  }
}

// A forced call that fits the budget in tokens (though not in bytes: the call's wrapper is ~70
// bytes) always completes within max_tokens, leaks no markup, and does not open a call it cannot
// close. Before the budget counted tokens, seeds ran out inside the closing tag ("</t" as
// content) or inside the call (finish_reason "length", no tool_calls).
Json SmallWeather() {
  return Json::parse(R"({"type":"object","properties":{"city":{"type":"string","maxLength":12}},"required":["city"],"additionalProperties":false})");
}

TEST_F(Tools, ForcedCallCompletesWithinMaxTokens) {
  Client c(server_->port());
  const Json tools = Json::array({{{"type", "function"}, {"function", {{"name", "weather"}, {"parameters", SmallWeather()}}}}});
  for (int seed = 1; seed <= 8; ++seed) {
    const std::string what = "seed " + std::to_string(seed);
    Json body = {{"messages", UserAsks()}, {"tools", tools}, {"tool_choice", "required"}, {"max_tokens", 60},
                 {"seed", seed}, {"temperature", 1}};
    Json j = c.Post("/v1/chat/completions", body);
    const Json& ch = j["choices"][0];
    ASSERT_EQ(ch["finish_reason"], "tool_calls") << what << ": " << j.dump();
    EXPECT_TRUE(ch["message"]["content"].is_null()) << what << ": " << j.dump();
    EXPECT_LE(j["usage"]["completion_tokens"].get<int>(), 60);
    for (const Json& call : ch["message"]["tool_calls"]) {
      OJ v = OJ::parse(call["function"]["arguments"].get<std::string>(), nullptr, false);
      ASSERT_TRUE(v.is_object() && v["city"].is_string()) << what << ": " << call.dump();
    }
    if (seed <= 3) {  // streamed: the same calls, no content
      body["stream"] = true;
      const Json r = c.Post("/v1/chat/completions", body);
      ASSERT_TRUE(r.is_array());
      std::string finish, content;
      int headers = 0;
      for (const Json& ev : r) {
        if (ev["choices"].empty()) continue;
        const Json& d = ev["choices"][0]["delta"];
        if (ev["choices"][0]["finish_reason"].is_string()) finish = ev["choices"][0]["finish_reason"];
        if (d.contains("content") && d["content"].is_string()) content += d["content"].get<std::string>();
        if (d.contains("tool_calls")) headers += d["tool_calls"][0].contains("id");
      }
      EXPECT_EQ(finish, "tool_calls") << what;
      EXPECT_EQ(content, "") << what;
      EXPECT_EQ(static_cast<size_t>(headers), ch["message"]["tool_calls"].size()) << what;
    }
  }
  // Too few tokens for any call: cut, and still no markup as content.
  Json j = c.Post("/v1/chat/completions", {{"messages", UserAsks()}, {"tools", tools}, {"tool_choice", "required"}, {"max_tokens", 5}, {"seed", 1}});
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length") << j.dump();
  EXPECT_FALSE(j["choices"][0]["message"].contains("tool_calls")) << j.dump();
  EXPECT_TRUE(j["choices"][0]["message"]["content"].is_null() || j["choices"][0]["message"]["content"] == "") << j.dump();
}

// Responses: the same request completes (a call, status "completed"), so that clients run the
// tool; with parallel_tool_calls false, exactly one call. Streamed, the call's item and its
// arguments go out as they are generated (one delta per token, not 16-byte pieces at the end).
TEST_F(Tools, ResponsesForcedCallCompletesWithinMaxOutputTokens) {
  Client c(server_->port());
  const Json tools = Json::array({{{"type", "function"}, {"name", "weather"}, {"parameters", SmallWeather()}}});
  for (int seed = 1; seed <= 6; ++seed) {
    const std::string what = "seed " + std::to_string(seed);
    Json body = {{"input", "Weather in Paris?"}, {"tools", tools}, {"tool_choice", "required"}, {"max_output_tokens", 60},
                 {"seed", seed}, {"parallel_tool_calls", seed % 2 == 0}};
    Json r = c.Post("/v1/responses", body);
    ASSERT_EQ(r["status"], "completed") << what << ": " << r.dump();
    ASSERT_GE(r["output"].size(), 1u);
    if (seed % 2) {
      EXPECT_EQ(r["output"].size(), 1u) << what << ": parallel_tool_calls false";
    }
    for (const Json& item : r["output"]) ASSERT_EQ(item["type"], "function_call") << what << ": " << r.dump();
  }
  Json body = {{"input", "Weather in Paris?"}, {"tools", tools}, {"tool_choice", "required"}, {"max_output_tokens", 60},
               {"seed", 2}, {"stream", true}};
  const Json r = c.Post("/v1/responses", body);
  ASSERT_TRUE(r.is_array());
  std::vector<std::string> types;
  std::string args;
  int deltas = 0;
  Json final_resp;
  for (const Json& ev : r) {
    const std::string type = ev["type"];
    types.push_back(type);
    if (type == "response.function_call_arguments.delta" && ev["output_index"] == 0) {
      args += ev["delta"].get<std::string>();
      deltas++;
    }
    if (type == "response.completed" || type == "response.incomplete") final_resp = ev["response"];
  }
  ASSERT_EQ(final_resp["status"], "completed") << r.dump();
  const std::string want = final_resp["output"][0]["arguments"];
  EXPECT_EQ(args, want);
  EXPECT_GT(deltas, static_cast<int>((want.size() + 15) / 16)) << r.dump();
  // added, then deltas, then done, then the next call or the end.
  const auto at = [&](const std::string& t) { return std::find(types.begin(), types.end(), t) - types.begin(); };
  EXPECT_LT(at("response.output_item.added"), at("response.function_call_arguments.delta"));
  EXPECT_LT(at("response.function_call_arguments.delta"), at("response.function_call_arguments.done"));
}

// Under auto, text and then a call (here written by a grammar, as a model that knows tools would):
// the call is found and the text is the content, whole and streamed, on both APIs.
TEST_F(Tools, AutoFindsACallAfterText) {
  Client c(server_->port());
  const std::string reply = "Let me check.\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"UTC\"}}\n</tool_call>";
  const std::string grammar = "root ::= " + grammar::Literal(reply);
  Json body = {{"messages", UserAsks()}, {"tools", ChatTools()}, {"tool_choice", "auto"}, {"max_tokens", 120}, {"grammar", grammar}};
  Json j = c.Post("/v1/chat/completions", body);
  const Json& m = j["choices"][0]["message"];
  EXPECT_EQ(j["choices"][0]["finish_reason"], "tool_calls") << j.dump();
  EXPECT_EQ(m["content"], "Let me check.") << j.dump();
  ASSERT_EQ(m["tool_calls"].size(), 1u) << j.dump();
  EXPECT_EQ(m["tool_calls"][0]["function"]["name"], "get_time");
  EXPECT_EQ(m["tool_calls"][0]["function"]["arguments"], "{\"zone\": \"UTC\"}");
  // With get_weather alone allowed, the call of get_time (rendered, not allowed) stays text.
  Json only_weather = body;
  only_weather["tool_choice"] = {{"type", "allowed_tools"},
                                 {"allowed_tools", {{"mode", "auto"}, {"tools", {{{"type", "function"}, {"function", {{"name", "get_weather"}}}}}}}}};
  Json text_reply = c.Post("/v1/chat/completions", only_weather);
  EXPECT_EQ(text_reply["choices"][0]["finish_reason"], "stop") << text_reply.dump();
  EXPECT_EQ(text_reply["choices"][0]["message"]["content"], reply) << text_reply.dump();
  EXPECT_FALSE(text_reply["choices"][0]["message"].contains("tool_calls"));
  body["stream"] = true;
  const Json r = c.Post("/v1/chat/completions", body);
  ASSERT_TRUE(r.is_array());
  std::string content, finish, name, args;
  for (const Json& ev : r) {
    if (ev["choices"].empty()) continue;
    const Json& ch = ev["choices"][0];
    if (ch["finish_reason"].is_string()) finish = ch["finish_reason"];
    if (ch["delta"].contains("content") && ch["delta"]["content"].is_string()) content += ch["delta"]["content"].get<std::string>();
    if (!ch["delta"].contains("tool_calls")) continue;
    const Json& d = ch["delta"]["tool_calls"][0];
    if (d.contains("id")) name = d["function"]["name"];
    args += d["function"]["arguments"].get<std::string>();
  }
  EXPECT_EQ(finish, "tool_calls") << r.dump();
  // Streamed as it came, up to the call, less the whitespace before it: the non-streamed content,
  // so that a client sending it back continues the session (it forked at the reply with the "\n").
  EXPECT_EQ(content, m["content"]) << r.dump();
  EXPECT_EQ(name, "get_time");
  EXPECT_EQ(args, "{\"zone\": \"UTC\"}");
  EXPECT_EQ(r[0]["choices"][0]["delta"]["role"], "assistant") << r.dump();
  // Under auto a stop applies to the text before a call, not inside the call's syntax ("\n" there
  // cut every call: LangChain agents send it); a reply that starts with whitespace keeps it as
  // content, streamed and whole alike (the stream sent it, the whole reply trimmed it).
  Json stops = body;
  stops.erase("stream");
  stops["stop"] = Json::array({"\n"});
  stops["grammar"] = "root ::= " + grammar::Literal("  Let me check. " + reply.substr(reply.find('<')));
  const Json sw = c.Post("/v1/chat/completions", stops);
  EXPECT_EQ(sw["choices"][0]["finish_reason"], "tool_calls") << sw.dump();
  EXPECT_EQ(sw["choices"][0]["message"]["content"], "  Let me check.") << sw.dump();
  EXPECT_EQ(sw["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"], "{\"zone\": \"UTC\"}") << sw.dump();
  stops["stream"] = true;
  std::string streamed;
  for (const Json& ev : c.Post("/v1/chat/completions", stops)) {
    if (ev.contains("choices") && !ev["choices"].empty() && ev["choices"][0]["delta"]["content"].is_string()) {
      streamed += ev["choices"][0]["delta"]["content"].get<std::string>();
    }
  }
  EXPECT_EQ(streamed, "  Let me check.");
  stops.erase("stream");
  stops["grammar"] = grammar;  // "Let me check.\n<tool_call>...": the stop comes first
  const Json cut = c.Post("/v1/chat/completions", stops);
  EXPECT_EQ(cut["choices"][0]["finish_reason"], "stop") << cut.dump();
  EXPECT_EQ(cut["choices"][0]["message"]["content"], "Let me check.") << cut.dump();
  // A reply that is only a call: the role comes with the call, content null, and no delta has text.
  Json only_call = body;
  only_call["grammar"] = "root ::= " + grammar::Literal(reply.substr(reply.find('<')));
  const Json oc = c.Post("/v1/chat/completions", only_call);
  ASSERT_TRUE(oc.is_array() && !oc.empty());
  EXPECT_EQ(oc[0]["choices"][0]["delta"]["role"], "assistant") << oc.dump();
  EXPECT_TRUE(oc[0]["choices"][0]["delta"]["content"].is_null()) << oc.dump();
  EXPECT_TRUE(oc[0]["choices"][0]["delta"].contains("tool_calls")) << oc.dump();
  for (const Json& ev : oc) {
    if (ev["choices"].empty()) continue;
    EXPECT_FALSE(ev["choices"][0]["delta"].contains("content") && ev["choices"][0]["delta"]["content"].is_string()) << ev.dump();
  }
  // Responses, streamed: a message item with the text, then the function_call item.
  Json rb = {{"input", "Time?"}, {"tools", ResponsesTools()}, {"max_output_tokens", 120}, {"grammar", grammar}, {"stream", true}};
  const Json rr = c.Post("/v1/responses", rb);
  ASSERT_TRUE(rr.is_array());
  std::string text;
  Json final_resp;
  for (const Json& ev : rr) {
    if (ev["type"] == "response.output_item.added" && ev["item"]["type"] == "message") {
      EXPECT_EQ(ev["item"]["content"], Json::array()) << ev.dump();  // the part comes in content_part.added
    }
    if (ev["type"] == "response.output_text.delta") text += ev["delta"].get<std::string>();
    if (ev["type"] == "response.completed") final_resp = ev["response"];
  }
  ASSERT_EQ(final_resp["output"].size(), 2u) << rr.dump();
  EXPECT_EQ(final_resp["output"][0]["type"], "message");
  EXPECT_EQ(final_resp["output"][0]["content"][0]["text"], text);  // what streamed is what is stored
  EXPECT_EQ(final_resp["output"][1]["type"], "function_call");
  EXPECT_EQ(final_resp["output"][1]["name"], "get_time");
}

// Tools with a JSON response format (an agent answering in a format after its calls, the AI SDK's
// Output.object or LangChain's provider strategy): the reply is calls or the format's JSON, as
// OpenAI's; the format alone never let a call out. logit_bias on the first character picks the branch.
TEST_F(Tools, ResponseFormatWithToolsAllowsCallsOrTheFormat) {
  Client c(server_->port());
  auto last_token = [&](const std::string& text) {
    Json t = c.Post("/tokenize", {{"content", text}});
    return std::to_string(t["tokens"].back().get<int>());
  };
  const OJ schema = OJ::parse(R"({"type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 5}},
    "required": ["x"], "additionalProperties": false})");
  const Json format = {{"type", "json_schema"}, {"json_schema", {{"name", "answer"}, {"schema", Json::parse(schema.dump())}}}};
  Json body = {{"messages", UserAsks()}, {"tools", ChatTools()}, {"response_format", format}, {"max_tokens", 160}, {"seed", 1}};
  body["logit_bias"] = {{last_token("<"), 100}};
  Json j = c.Post("/v1/chat/completions", body);
  ASSERT_EQ(j["choices"][0]["finish_reason"], "tool_calls") << j.dump();
  for (const Json& call : j["choices"][0]["message"]["tool_calls"]) ExpectValidCall(call["function"]["name"], call["function"]["arguments"], "call");
  body["logit_bias"] = {{last_token("{"), 100}};
  j = c.Post("/v1/chat/completions", body);
  ASSERT_EQ(j["choices"][0]["finish_reason"], "stop") << j.dump();
  const OJ v = OJ::parse(j["choices"][0]["message"]["content"].get<std::string>(), nullptr, false);
  EXPECT_EQ(test::Validate(schema, v, schema), "") << j.dump();
  // Responses, and required with a format: calls (it was a 400).
  Json rb = {{"input", "Weather?"}, {"tools", ResponsesTools()}, {"max_output_tokens", 160}, {"tool_choice", "required"},
             {"text", {{"format", {{"type", "json_schema"}, {"name", "answer"}, {"schema", Json::parse(schema.dump())}}}}}};
  Json r = c.Post("/v1/responses", rb);
  ASSERT_EQ(r["status"], "completed") << r.dump();
  EXPECT_EQ(r["output"][0]["type"], "function_call") << r.dump();
  // Rule names are prefixed where they are rules only.
  EXPECT_EQ(PrefixRules("root ::= \"a b\" [a-z]{1,3} ws # x y\nws ::= [ ]*", "f-"),
            "f-root ::= \"a b\" [a-z]{1,3} f-ws # x y\nf-ws ::= [ ]*");
}

TEST_F(Tools, BadToolRequestsAre400WithParam) {
  Client c(server_->port());
  auto expect_400 = [&](const std::string& path, Json body, const std::string& param) {
    Json e = c.Post(path, body, 400);
    EXPECT_EQ(e["error"]["param"], param) << e.dump();
    EXPECT_EQ(e["error"]["type"], "invalid_request_error");
  };
  const std::string chat = "/v1/chat/completions";
  expect_400(chat, {{"messages", UserAsks()}, {"tools", {{{"type", "function"}, {"function", {{"name", "bad name!"}}}}}}}, "tools[0].function.name");
  expect_400(chat, {{"messages", UserAsks()}, {"tools", {{{"type", "code_interpreter"}}}}}, "tools[0].type");
  expect_400(chat, {{"messages", UserAsks()}, {"tools", {{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", {{"type", "string"}, {"pattern", "(?=a)"}}}}}}}}},
             "tools[0].function.parameters");
  expect_400(chat, {{"messages", UserAsks()}, {"tools", {{{"type", "function"}, {"function", {{"name", "f"}}}}, {{"type", "function"}, {"function", {{"name", "f"}}}}}}},
             "tools[1].function.name");
  expect_400(chat, {{"messages", UserAsks()}, {"tools", ChatTools()}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "nope"}}}}}},
             "tool_choice.function.name");
  expect_400(chat, {{"messages", UserAsks()}, {"tool_choice", "required"}}, "tool_choice");
  expect_400(chat, {{"messages", UserAsks()}, {"tools", ChatTools()}, {"tool_choice", "sometimes"}}, "tool_choice");
  Json orphan = UserAsks();
  orphan.push_back({{"role", "tool"}, {"tool_call_id", "call_x"}, {"content", "1"}});
  expect_400(chat, {{"messages", orphan}, {"tools", ChatTools()}}, "messages[1].tool_call_id");
  Json no_id = UserAsks();
  no_id.push_back({{"role", "tool"}, {"content", "1"}});
  expect_400(chat, {{"messages", no_id}}, "messages[1].tool_call_id");
  expect_400("/v1/responses", {{"input", "hi"}, {"tools", ResponsesTools()}, {"tool_choice", {{"type", "function"}, {"name", "nope"}}}},
             "tool_choice.name");
  expect_400("/v1/responses", {{"input", {{{"type", "function_call"}, {"call_id", "c"}, {"name", "f"}}}}}, "input[0].arguments");
  expect_400(chat, {{"messages", UserAsks()}, {"tools", ChatTools()},
                    {"tool_choice", {{"type", "allowed_tools"}, {"allowed_tools", {{"mode", "required"}, {"tools", {{{"type", "function"}, {"function", {{"name", "nope"}}}}}}}}}}},
             "tool_choice.allowed_tools.tools[0].function.name");
  expect_400(chat, {{"messages", UserAsks()}, {"tools", ChatTools()},
                    {"tool_choice", {{"type", "allowed_tools"}, {"allowed_tools", {{"mode", "sometimes"}, {"tools", {{{"type", "function"}, {"function", {{"name", "get_time"}}}}}}}}}}},
             "tool_choice.allowed_tools.mode");
  expect_400("/v1/responses", {{"input", "hi"}, {"tools", ResponsesTools()},
                               {"tool_choice", {{"type", "allowed_tools"}, {"mode", "auto"}, {"tools", {{{"type", "function"}, {"name", "nope"}}}}}}},
             "tool_choice.tools[0].name");
}

// The parser never returns cut-off markup as content, and finds calls after text.
TEST(ParseToolCalls, DropsCutMarkupAndFindsCallsAfterText) {
  const std::string call = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\":1}}\n</tool_call>";
  for (const std::string tail : {"\n</t", "\n<", "\n</tool_call", "\n<tool_call>\n{\"name\": \"f\", \"argu"}) {
    const ParsedToolCalls p = ParseToolCalls(ToolFormat::kHermes, call + tail);
    ASSERT_EQ(p.calls.size(), 1u) << tail;
    EXPECT_EQ(p.content, "") << tail;
  }
  ParsedToolCalls cut = ParseToolCalls(ToolFormat::kHermes, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\":");
  EXPECT_TRUE(cut.calls.empty());
  EXPECT_EQ(cut.content, "");
  ParsedToolCalls after = ParseToolCalls(ToolFormat::kHermes, "Let me check.\n" + call + "\n" + call);
  EXPECT_EQ(after.calls.size(), 2u);
  EXPECT_EQ(after.content, "Let me check.");
  EXPECT_EQ(ParseToolCalls(ToolFormat::kHermes, "a < b").content, "a < b");
  ParsedToolCalls ll = ParseToolCalls(ToolFormat::kLlama3, "Sure.<|python_tag|>{\"name\": \"f\", \"parameters\": {}}");
  ASSERT_EQ(ll.calls.size(), 1u);
  EXPECT_EQ(ll.content, "Sure.");
  ParsedToolCalls mi = ParseToolCalls(ToolFormat::kMistral, "Sure. [TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}}]");
  ASSERT_EQ(mi.calls.size(), 1u);
  EXPECT_EQ(mi.content, "Sure.");
}

// The chat stream of forced calls: the header once the name is whole, the arguments as they come.
TEST(CallStream, StreamsArgumentsAsTheyAreGenerated) {
  for (ToolFormat f : {ToolFormat::kHermes, ToolFormat::kLlama3, ToolFormat::kMistral}) {
    const ToolCallFrame fr = ToolCallFraming(f);
    const std::string args0 = "{\"city\":\"Z\xC3\xBCrich\",\"n\":[1,2]}", args1 = "{}";
    const std::string text = fr.open + ToolCallText(f, "get_weather", args0) + fr.sep + ToolCallText(f, "t", args1) + fr.close;
    CallStream s(f);
    std::vector<Json> deltas;
    size_t header_at = 0, first_args_at = 0;
    for (size_t i = 0; i < text.size(); ++i) {  // one byte per token
      for (Json& d : s.Feed(text.substr(i, 1))) {
        if (d.contains("id") && header_at == 0) header_at = i;
        if (!d.contains("id") && first_args_at == 0) first_args_at = i;
        deltas.push_back(std::move(d));
      }
    }
    SCOPED_TRACE(ToolFormatName(f));
    EXPECT_EQ(s.calls(), 2);
    EXPECT_EQ(header_at + 1, text.find(args0));   // the header goes out with the byte before the arguments
    EXPECT_EQ(first_args_at, text.find(args0));   // and the arguments' first byte at once
    std::vector<std::string> names, args;
    for (const Json& d : deltas) {
      const size_t k = d["index"];
      if (d.contains("id")) {
        ASSERT_EQ(k, names.size());
        names.push_back(d["function"]["name"]);
        args.push_back("");
      } else {
        ASSERT_LT(k, args.size());
        args[k] += d["function"]["arguments"].get<std::string>();
      }
    }
    ASSERT_EQ(names.size(), 2u);
    EXPECT_EQ(names[0], "get_weather");
    EXPECT_EQ(args[0], args0);
    EXPECT_EQ(names[1], "t");
    EXPECT_EQ(args[1], args1);
  }
}

// A generated model whose template renders tools itself (Qwen 2.5: <tools> in the system block,
// <tool_call> replies): the grammar writes the template's own call syntax.
TEST(ToolsTemplate, QwenTemplateRendersToolsAndCallsParse) {
  const std::string bin = std::string(MNEMO_BINARY_DIR) + "/apps/mnemo";
  const std::string model = std::string(MNEMO_BINARY_DIR) + "/tools_qwen." + std::to_string(getpid()) + ".gguf";
  const std::string cmd = bin + " make-model --arch qwen2 --preset tiny --dtype f32 --seed 3 --context-length 4096 --vocab " + MNEMO_SHARED_DIR +
                          "/models/stories260K/stories260K.gguf --chat-template " + MNEMO_CHAT_TEMPLATES_DIR +
                          "/qwen2.5-instruct.jinja --out " + model + " >/dev/null 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  struct Cleanup {
    std::string p;
    ~Cleanup() { std::filesystem::remove(p); }
  } cleanup{model};
  ServerProcess server({"--max-context", "2048", "--kv-t0-mb", "64", "--threads", "1"}, model);
  ASSERT_GT(server.port(), 0) << server.log();
  Client c(server.port());
  Json msgs = UserAsks();
  for (int seed = 1; seed <= 3; ++seed) {
    Json j = c.Post("/v1/chat/completions", {{"messages", msgs}, {"tools", ChatTools()}, {"max_tokens", 160}, {"seed", seed},
                                           {"tool_choice", "required"}});
    ASSERT_EQ(j["choices"][0]["finish_reason"], "tool_calls") << j.dump();
    for (const Json& call : j["choices"][0]["message"]["tool_calls"]) {
      ExpectValidCall(call["function"]["name"], call["function"]["arguments"], "qwen seed " + std::to_string(seed));
    }
    if (seed == 3) {
      const int turn1 = j["usage"]["prompt_tokens"];
      msgs.push_back(j["choices"][0]["message"]);
      for (const Json& call : j["choices"][0]["message"]["tool_calls"]) {
        msgs.push_back({{"role", "tool"}, {"tool_call_id", call["id"]}, {"content", "ok"}});
      }
      Json j2 = c.Post("/v1/chat/completions", {{"messages", msgs}, {"tools", ChatTools()}, {"max_tokens", 4}});
      // At least the prompt (the template renders the call's arguments with spaces, the grammar without).
      EXPECT_GE(j2["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), turn1) << j2.dump();
    }
  }
}

}  // namespace
}  // namespace mnemo::testing
