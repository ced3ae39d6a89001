// Tool calls per model family: format detection on real templates, parsing literal model outputs,
// and templates rendering `tools` and the history's tool_calls / tool results.
#include "chat/tool_calls.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace mnemo {
namespace {

ChatTemplate Load(const std::string& name, const std::string& bos = "<s>", const std::string& eos = "</s>") {
  std::ifstream f(std::string(MNEMO_CHAT_TEMPLATES_DIR) + "/" + name + ".jinja", std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  auto t = ChatTemplate::Create(ss.str(), bos, eos);
  EXPECT_TRUE(t.ok()) << name;
  return t.ok() ? std::move(*t) : ChatTemplate::Fallback();
}

TEST(ToolFormat, DetectedFromTemplates) {
  EXPECT_EQ(DetectToolFormat(Load("qwen2.5-instruct")), ToolFormat::kHermes);
  EXPECT_EQ(DetectToolFormat(Load("qwen3")), ToolFormat::kHermes);
  EXPECT_EQ(DetectToolFormat(Load("llama-3.1-instruct")), ToolFormat::kLlama3);
  EXPECT_EQ(DetectToolFormat(Load("llama-3.2-instruct")), ToolFormat::kLlama3);
  EXPECT_EQ(DetectToolFormat(Load("mistral-nemo")), ToolFormat::kMistral);
  EXPECT_EQ(DetectToolFormat(Load("chatml")), ToolFormat::kGeneric);
  EXPECT_EQ(DetectToolFormat(Load("llama-2-chat")), ToolFormat::kGeneric);
  EXPECT_EQ(DetectToolFormat(ChatTemplate::Fallback()), ToolFormat::kGeneric);
  EXPECT_FALSE(TemplateRendersTools(ChatTemplate::Fallback()));
  EXPECT_TRUE(TemplateRendersTools(Load("qwen2.5-instruct")));
}

TEST(ParseToolCalls, Hermes) {
  auto p = ParseToolCalls(ToolFormat::kHermes,
                          "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
                          "</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].name, "get_weather");
  EXPECT_EQ(p.calls[0].arguments, "{\"city\": \"Paris\"}");  // verbatim
  EXPECT_EQ(p.calls[1].name, "get_time");
  EXPECT_EQ(p.calls[1].arguments, "{}");
  EXPECT_EQ(p.content, "Let me check.");
  // Unclosed at the end of the output; braces inside strings; "parameters"; arguments as a string.
  p = ParseToolCalls(ToolFormat::kHermes, "<tool_call>{\"name\":\"f\",\"parameters\":{\"s\":\"a}{\\\"b\"}}");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].arguments, "{\"s\":\"a}{\\\"b\"}");
  p = ParseToolCalls(ToolFormat::kHermes, "<tool_call>{\"name\":\"f\",\"arguments\":\"{\\\"x\\\":1}\"}</tool_call>");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].arguments, "{\"x\":1}");
  // Not calls: plain text, a call without a name.
  for (const char* text : {"Once upon a time", "<tool_call>{\"arguments\": {}}</tool_call>"}) {
    p = ParseToolCalls(ToolFormat::kHermes, text);
    EXPECT_TRUE(p.calls.empty()) << text;
    EXPECT_EQ(p.content, text);
  }
  // A call the output was cut inside is markup, not content: dropped.
  p = ParseToolCalls(ToolFormat::kHermes, "Hm. <tool_call>{\"name\": \"f\", \"arguments\": {");
  EXPECT_TRUE(p.calls.empty());
  EXPECT_EQ(p.content, "Hm. ");
}

TEST(ParseToolCalls, Llama3) {
  auto p = ParseToolCalls(ToolFormat::kLlama3, "<|python_tag|>{\"name\": \"search\", \"parameters\": {\"q\": \"cats\"}}");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].name, "search");
  EXPECT_EQ(p.calls[0].arguments, "{\"q\": \"cats\"}");
  p = ParseToolCalls(ToolFormat::kLlama3, " {\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"arguments\": {\"n\": 2}}");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[1].name, "b");
  EXPECT_EQ(p.calls[1].arguments, "{\"n\": 2}");
  EXPECT_EQ(p.content, "");
  p = ParseToolCalls(ToolFormat::kLlama3, "The answer is {\"name\": \"a\"}");
  EXPECT_TRUE(p.calls.empty());
  p = ParseToolCalls(ToolFormat::kLlama3, "{\"city\": \"Paris\"}");  // JSON, but not a call
  EXPECT_TRUE(p.calls.empty());
}

TEST(ParseToolCalls, Mistral) {
  auto p = ParseToolCalls(ToolFormat::kMistral,
                          "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"a\": [1, 2]}, \"id\": \"abcdefghi\"}, "
                          "{\"name\": \"g\", \"arguments\": {}}]");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].arguments, "{\"a\": [1, 2]}");
  EXPECT_EQ(p.calls[1].name, "g");
  p = ParseToolCalls(ToolFormat::kMistral, "[{\"name\": \"f\", \"arguments\": {}}]");  // marker as a control token, not in the text
  ASSERT_EQ(p.calls.size(), 1u);
  p = ParseToolCalls(ToolFormat::kMistral, "[1, 2, 3]");
  EXPECT_TRUE(p.calls.empty());
}

TEST(ToolCallText, RoundTripsThroughTheParser) {
  for (ToolFormat f : {ToolFormat::kHermes, ToolFormat::kLlama3, ToolFormat::kMistral, ToolFormat::kGeneric}) {
    const ToolCallFrame fr = ToolCallFraming(f);
    const std::string text = fr.open + ToolCallText(f, "f_1", "{\"x\":[1,{\"y\":\"]\"}]}") + fr.sep +
                             ToolCallText(f, "g", "{}") + fr.close;
    auto p = ParseToolCalls(f, text);
    ASSERT_EQ(p.calls.size(), 2u) << ToolFormatName(f) << ": " << text;
    EXPECT_EQ(p.calls[0].name, "f_1");
    EXPECT_EQ(p.calls[0].arguments, "{\"x\":[1,{\"y\":\"]\"}]}");
    EXPECT_EQ(p.calls[1].arguments, "{}");
    EXPECT_EQ(p.content, "");
  }
}

TEST(JsonValueEnd, ScansStringsAndNesting) {
  EXPECT_EQ(JsonValueEnd("{\"a\":\"}\"} tail", 0), 9u);
  EXPECT_EQ(JsonValueEnd("[1,[2]],", 0), 7u);
  EXPECT_EQ(JsonValueEnd("\"a\\\"b\" x", 0), 6u);
  EXPECT_EQ(JsonValueEnd("12.5}", 0), 4u);
  EXPECT_EQ(JsonValueEnd("{\"a\":", 0), std::string_view::npos);
}

std::vector<ChatMessage> ToolConversation() {
  ChatMessage call("assistant", "");
  call.tool_calls.push_back({"call_1", "get_weather", "{\"city\":\"Paris\"}"});
  ChatMessage result("tool", "sunny");
  result.tool_call_id = "call_1";
  result.name = "get_weather";
  return {{"user", "Weather in Paris?"}, call, result};
}

jinja::Dict ToolsVar() {
  jinja::Dict d;
  d.Set("tools", jinja::Value::FromJson(nlohmann::ordered_json::parse(
                     R"([{"type":"function","function":{"name":"get_weather","description":"Weather now",)"
                     R"("parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}])")));
  return d;
}

TEST(ToolTemplates, RenderToolsCallsAndResults) {
  const jinja::Dict extra = ToolsVar();
  {
    auto r = Load("qwen2.5-instruct", "", "<|im_end|>").Render(ToolConversation(), true, &extra);
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_NE(r->find("<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\""), std::string::npos) << *r;
    // The call renders as the grammar writes it (up to the arguments' whitespace).
    EXPECT_NE(r->find(ToolCallText(ToolFormat::kHermes, "get_weather", "{\"city\": \"Paris\"}")), std::string::npos) << *r;
    EXPECT_NE(r->find("<tool_response>\nsunny\n</tool_response>"), std::string::npos) << *r;
  }
  {
    auto r = Load("llama-3.1-instruct", "<|begin_of_text|>", "<|eot_id|>").Render(ToolConversation(), true, &extra);
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_NE(r->find(ToolCallText(ToolFormat::kLlama3, "get_weather", "{\"city\": \"Paris\"}")), std::string::npos) << *r;
    EXPECT_NE(r->find("<|start_header_id|>ipython<|end_header_id|>\n\n\"sunny\""), std::string::npos) << *r;
  }
  {
    std::vector<ChatMessage> msgs = ToolConversation();
    MistralToolIds(&msgs);
    EXPECT_EQ(msgs[1].tool_calls[0].id.size(), 9u);
    EXPECT_EQ(msgs[1].tool_calls[0].id, msgs[2].tool_call_id);
    auto r = Load("mistral-nemo").Render(msgs, true, &extra);
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_NE(r->find("[AVAILABLE_TOOLS]"), std::string::npos) << *r;
    EXPECT_NE(r->find("[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}"), std::string::npos) << *r;
  }
}

TEST(ToolTemplates, GenericRewriteForTemplatesWithoutTools) {
  auto msgs = GenericToolMessages(ToolConversation(), "tool");
  ASSERT_EQ(msgs.size(), 3u);
  EXPECT_EQ(msgs[1].content, ToolCallText(ToolFormat::kGeneric, "get_weather", "{\"city\":\"Paris\"}"));
  EXPECT_TRUE(msgs[1].tool_calls.empty());
  EXPECT_EQ(msgs[2].role, "tool");
  EXPECT_EQ(msgs[2].content, "<tool_response>\nsunny\n</tool_response>");
  auto r = ChatTemplate::Fallback().Render(msgs, true);
  ASSERT_TRUE(r.ok());
  EXPECT_NE(r->find("Assistant: <tool_call>\n{\"name\": \"get_weather\""), std::string::npos) << *r;
  EXPECT_NE(r->find("Tool: <tool_response>"), std::string::npos) << *r;
  EXPECT_EQ(GenericToolMessages(ToolConversation(), "user")[2].role, "user");
  const std::string block = GenericToolsPrompt(R"([{"type":"function","function":{"name":"f"}}])");
  EXPECT_NE(block.find("{\"type\":\"function\",\"function\":{\"name\":\"f\"}}\n"), std::string::npos) << block;
}

}  // namespace
}  // namespace mnemo
