// Real chat templates (tests/chat/templates/*.jinja, the chat_template texts of the models'
// tokenizer_config.json): known conversations against expected prompts, system-message handling,
// raise_exception on bad role order, and the incremental-rendering property.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "base/rng.h"
#include "chat/chat_template.h"

namespace mnemo {
namespace {

std::string ReadTemplate(const std::string& name) {
  std::ifstream f(std::string(MNEMO_CHAT_TEMPLATES_DIR) + "/" + name + ".jinja", std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

ChatTemplate Load(const std::string& name, const std::string& bos, const std::string& eos) {
  const std::string source = ReadTemplate(name);
  EXPECT_FALSE(source.empty()) << name;
  auto t = ChatTemplate::Create(source, bos, eos);
  EXPECT_TRUE(t.ok()) << name << ": " << (t.ok() ? "" : t.error().message);
  return t.ok() ? std::move(*t) : ChatTemplate::Fallback();
}

// The conversation of llama.cpp's test-chat-template.cpp (note the reply with spaces around it).
const std::vector<ChatMessage> kWithSystem = {
    {"system", "You are a helpful assistant"}, {"user", "Hello"},
    {"assistant", "Hi there"},                 {"user", "Who are you"},
    {"assistant", "   I am an assistant   "},  {"user", "Another question"},
};
const std::vector<ChatMessage> kNoSystem(kWithSystem.begin() + 1, kWithSystem.end());

// The conversation of huggingface.js's chat template tests (targets rendered by transformers).
const std::vector<ChatMessage> kHfChat = {
    {"user", "Hello, how are you?"},
    {"assistant", "I'm doing great. How can I help you today?"},
    {"user", "I'd like to show off how chat templating works!"},
};
const ChatMessage kPirate = {"system", "You are a friendly chatbot who always responds in the style of a pirate"};

std::string RenderOk(const ChatTemplate& t, const std::vector<ChatMessage>& m, bool gen = true) {
  auto r = t.Render(m, gen);
  EXPECT_TRUE(r.ok()) << r.error().message;
  return r.ok() ? *r : "";
}

void ExpectRaises(const ChatTemplate& t, const std::vector<ChatMessage>& m, const std::string& message) {
  auto r = t.Render(m, true);
  ASSERT_FALSE(r.ok()) << *r;
  EXPECT_NE(r.error().message.find("raise_exception: " + message), std::string::npos) << r.error().message;
}

TEST(ChatTemplate, Llama2Chat) {
  const ChatTemplate t = Load("llama-2-chat", "<s>", "</s>");
  EXPECT_EQ(t.family(), "llama2");
  EXPECT_TRUE(t.renders_bos());
  EXPECT_EQ(RenderOk(t, kWithSystem),
            "<s>[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST] Hi there </s>"
            "<s>[INST] Who are you [/INST] I am an assistant </s><s>[INST] Another question [/INST]");
  EXPECT_EQ(RenderOk(t, kNoSystem),
            "<s>[INST] Hello [/INST] Hi there </s><s>[INST] Who are you [/INST] I am an assistant </s>"
            "<s>[INST] Another question [/INST]");
  std::vector<ChatMessage> hf = kHfChat;
  hf.insert(hf.begin(), kPirate);
  EXPECT_EQ(RenderOk(t, hf),
            "<s>[INST] <<SYS>>\nYou are a friendly chatbot who always responds in the style of a pirate\n<</SYS>>\n\n"
            "Hello, how are you? [/INST] I'm doing great. How can I help you today? </s>"
            "<s>[INST] I'd like to show off how chat templating works! [/INST]");
  ExpectRaises(t, {{"user", "a"}, {"user", "b"}}, "Conversation roles must alternate user/assistant/user/assistant/...");
  ExpectRaises(t, {{"assistant", "a"}}, "Conversation roles must alternate");
}

TEST(ChatTemplate, Llama3Instruct) {
  const ChatTemplate t = Load("llama-3-instruct", "<|begin_of_text|>", "<|eot_id|>");
  EXPECT_EQ(t.family(), "llama3");
  EXPECT_EQ(RenderOk(t, kWithSystem),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHi there<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nWho are you<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nI am an assistant<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nAnother question<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(RenderOk(t, {{"user", "Hi"}}, false),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>");
}

TEST(ChatTemplate, Llama31Instruct) {
  const ChatTemplate t = Load("llama-3.1-instruct", "<|begin_of_text|>", "<|eot_id|>");
  EXPECT_EQ(t.family(), "llama3");
  const std::string turns =
      "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\nHi there<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nWho are you<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\nI am an assistant<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nAnother question<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\n";
  EXPECT_EQ(RenderOk(t, kWithSystem),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
            "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
            "You are a helpful assistant<|eot_id|>" + turns);
  EXPECT_EQ(RenderOk(t, kNoSystem),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
            "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|>" + turns);
}

TEST(ChatTemplate, Llama32UsesStrftimeNow) {
  ChatTemplate t = Load("llama-3.2-instruct", "<|begin_of_text|>", "<|eot_id|>");
  t.WithFixedTime(1735689600);  // 2025-01-01 00:00:00 UTC
  EXPECT_EQ(RenderOk(t, {{"user", "Hi"}}),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
            "Cutting Knowledge Date: December 2023\nToday Date: 01 Jan 2025\n\n<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplate, ChatMLAndQwen) {
  const std::string chatml_turns =
      "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\nHi there<|im_end|>\n"
      "<|im_start|>user\nWho are you<|im_end|>\n<|im_start|>assistant\n   I am an assistant   <|im_end|>\n"
      "<|im_start|>user\nAnother question<|im_end|>\n<|im_start|>assistant\n";
  const std::string system = "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n";
  const ChatTemplate chatml = Load("chatml", "", "<|im_end|>");
  EXPECT_EQ(chatml.family(), "chatml");
  EXPECT_FALSE(chatml.renders_bos());
  EXPECT_EQ(RenderOk(chatml, kWithSystem), system + chatml_turns);
  EXPECT_EQ(RenderOk(chatml, kHfChat, false),
            "<|im_start|>user\nHello, how are you?<|im_end|>\n<|im_start|>assistant\n"
            "I'm doing great. How can I help you today?<|im_end|>\n"
            "<|im_start|>user\nI'd like to show off how chat templating works!<|im_end|>\n");

  const ChatTemplate qwen2 = Load("qwen2-instruct", "", "<|im_end|>");
  EXPECT_EQ(RenderOk(qwen2, kWithSystem), system + chatml_turns);
  EXPECT_EQ(RenderOk(qwen2, kNoSystem), "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n" + chatml_turns);

  const ChatTemplate qwen25 = Load("qwen2.5-instruct", "", "<|im_end|>");
  EXPECT_EQ(RenderOk(qwen25, kWithSystem), system + chatml_turns);
  EXPECT_EQ(RenderOk(qwen25, kNoSystem),
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n" +
                chatml_turns);
}

TEST(ChatTemplate, Qwen25WithTools) {
  const ChatTemplate t = Load("qwen2.5-instruct", "", "<|im_end|>");
  jinja::Dict extra;
  jinja::Dict fn;
  fn.Set("name", jinja::Value("get_weather"));
  fn.Set("parameters", jinja::Value(jinja::Dict{}));
  jinja::Dict tool;
  tool.Set("type", jinja::Value("function"));
  tool.Set("function", jinja::Value(std::move(fn)));
  extra.Set("tools", jinja::Value(jinja::List{jinja::Value(std::move(tool))}));
  auto r = t.Render({{"user", "Weather?"}}, true, &extra);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(*r,
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n\n# Tools\n\n"
            "You may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
            "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {}}}\n</tools>\n\n"
            "For each function call, return a json object with function name and arguments within "
            "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
            "<args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>user\nWeather?<|im_end|>\n"
            "<|im_start|>assistant\n");
}

TEST(ChatTemplate, Mistral) {
  const ChatTemplate v1 = Load("mistral-v0.1", "<s>", "</s>");
  EXPECT_EQ(v1.family(), "mistral");
  EXPECT_EQ(RenderOk(v1, kNoSystem),
            "<s>[INST] Hello [/INST]Hi there</s> [INST] Who are you [/INST]   I am an assistant   </s> "
            "[INST] Another question [/INST]");
  EXPECT_EQ(RenderOk(v1, kHfChat),
            "<s>[INST] Hello, how are you? [/INST]I'm doing great. How can I help you today?</s> "
            "[INST] I'd like to show off how chat templating works! [/INST]");
  ExpectRaises(v1, kWithSystem, "Conversation roles must alternate user/assistant/user/assistant/...");

  const ChatTemplate v2 = Load("mistral-v0.2", "<s>", "</s>");
  EXPECT_EQ(RenderOk(v2, kHfChat),
            "<s>[INST] Hello, how are you? [/INST]I'm doing great. How can I help you today?</s>"
            "[INST] I'd like to show off how chat templating works! [/INST]");
  ExpectRaises(v2, {{"user", "a"}, {"user", "b"}}, "Conversation roles must alternate");

  const ChatTemplate v3 = Load("mistral-v0.3", "<s>", "</s>");
  EXPECT_EQ(v3.family(), "mistral");
  EXPECT_EQ(RenderOk(v3, kNoSystem),
            "<s>[INST] Hello[/INST] Hi there</s>[INST] Who are you[/INST] I am an assistant</s>"
            "[INST] Another question[/INST]");
  // The system prompt goes into the last user turn.
  EXPECT_EQ(RenderOk(v3, kWithSystem),
            "<s>[INST] Hello[/INST] Hi there</s>[INST] Who are you[/INST] I am an assistant</s>"
            "[INST] You are a helpful assistant\n\nAnother question[/INST]");
  ExpectRaises(v3, {{"user", "a"}, {"user", "b"}},
               "After the optional system message, conversation roles must alternate");
  ExpectRaises(v3, {{"user", "a"}, {"tool_x", "b"}}, "Only user and assistant roles are supported");

  const ChatTemplate nemo = Load("mistral-nemo", "<s>", "</s>");
  EXPECT_EQ(RenderOk(nemo, kWithSystem),
            "<s>[INST]Hello[/INST]Hi there</s>[INST]Who are you[/INST]   I am an assistant   </s>"
            "[INST]You are a helpful assistant\n\nAnother question[/INST]");
}

TEST(ChatTemplate, Gemma) {
  const std::string turns =
      "<start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\nHi there<end_of_turn>\n"
      "<start_of_turn>user\nWho are you<end_of_turn>\n<start_of_turn>model\nI am an assistant<end_of_turn>\n"
      "<start_of_turn>user\nAnother question<end_of_turn>\n<start_of_turn>model\n";
  const ChatTemplate gemma = Load("gemma-it", "<bos>", "<eos>");
  EXPECT_EQ(gemma.family(), "gemma");
  EXPECT_FALSE(gemma.renders_bos());
  EXPECT_EQ(RenderOk(gemma, kNoSystem), turns);
  ExpectRaises(gemma, kWithSystem, "System role not supported");

  const ChatTemplate gemma2 = Load("gemma-2-it", "<bos>", "<eos>");
  EXPECT_TRUE(gemma2.renders_bos());
  EXPECT_EQ(RenderOk(gemma2, kNoSystem), "<bos>" + turns);
  ExpectRaises(gemma2, kWithSystem, "System role not supported");
  ExpectRaises(gemma2, {{"user", "a"}, {"user", "b"}}, "Conversation roles must alternate");
}

// The four-message conversation of issue 10 (system, user, assistant, user; generation prompt) through
// the GGUF templates of Gemma 3 and Qwen3 (the other families above).
const std::vector<ChatMessage> kFour = {
    {"system", "You are a helpful assistant"}, {"user", "Hello"}, {"assistant", " Hi there "}, {"user", "Who are you"}};

TEST(ChatTemplate, Gemma3FoldsSystemIntoFirstUserTurn) {
  const ChatTemplate t = Load("gemma-3-it", "<bos>", "<eos>");
  EXPECT_EQ(t.family(), "gemma");
  EXPECT_TRUE(t.renders_bos());
  EXPECT_EQ(RenderOk(t, kFour),
            "<bos><start_of_turn>user\nYou are a helpful assistant\n\nHello<end_of_turn>\n"
            "<start_of_turn>model\nHi there<end_of_turn>\n"
            "<start_of_turn>user\nWho are you<end_of_turn>\n<start_of_turn>model\n");
  EXPECT_EQ(RenderOk(t, std::vector<ChatMessage>(kFour.begin() + 1, kFour.end()), false),
            "<bos><start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\nHi there<end_of_turn>\n"
            "<start_of_turn>user\nWho are you<end_of_turn>\n");
  ExpectRaises(t, {{"system", "s"}, {"assistant", "a"}}, "Conversation roles must alternate");
}

TEST(ChatTemplate, Qwen3SystemUserAssistantUser) {
  const ChatTemplate t = Load("qwen3", "", "<|im_end|>");
  EXPECT_EQ(RenderOk(t, kFour),
            "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n"
            "<|im_start|>assistant\n Hi there <|im_end|>\n<|im_start|>user\nWho are you<|im_end|>\n"
            "<|im_start|>assistant\n");
}

TEST(ChatTemplate, Phi3) {
  const std::string expected =
      "<|system|>\nYou are a helpful assistant<|end|>\n<|user|>\nHello<|end|>\n<|assistant|>\nHi there<|end|>\n"
      "<|user|>\nWho are you<|end|>\n<|assistant|>\n   I am an assistant   <|end|>\n"
      "<|user|>\nAnother question<|end|>\n";
  const ChatTemplate phi3 = Load("phi-3-mini", "<s>", "<|endoftext|>");
  EXPECT_EQ(phi3.family(), "phi3");
  EXPECT_EQ(RenderOk(phi3, kWithSystem), expected + "<|assistant|>\n");
  EXPECT_EQ(RenderOk(phi3, kWithSystem, false), expected + "<|endoftext|>");
  const ChatTemplate phi35 = Load("phi-3.5-mini", "<s>", "<|endoftext|>");
  EXPECT_EQ(RenderOk(phi35, kWithSystem), expected + "<|assistant|>\n");
  std::vector<ChatMessage> empty_system = kWithSystem;
  empty_system[0].content = "";  // Phi-3.5 skips an empty system message
  EXPECT_EQ(RenderOk(phi35, empty_system), expected.substr(expected.find("<|user|>")) + "<|assistant|>\n");
}

TEST(ChatTemplate, Fallback) {
  const ChatTemplate t = ChatTemplate::Fallback();
  EXPECT_EQ(t.family(), "fallback");
  EXPECT_FALSE(t.renders_bos());
  EXPECT_EQ(RenderOk(t, kWithSystem),
            "System: You are a helpful assistant\n\nUser: Hello\n\nAssistant: Hi there\n\nUser: Who are you\n\n"
            "Assistant: I am an assistant\n\nUser: Another question\n\nAssistant:");  // content trimmed
  EXPECT_EQ(RenderOk(t, {{"user", "Once upon a time"}}, false), "User: Once upon a time\n\n");
}

TEST(ChatTemplate, CreateRejectsBadTemplates) {
  EXPECT_FALSE(ChatTemplate::Create("{% for m in messages %}", "", "").ok());
  EXPECT_FALSE(ChatTemplate::Create("{% include 'x' %}", "", "").ok());
  EXPECT_FALSE(ChatTemplate::Create("{{ messages | no_such_filter }}", "", "").ok());
  auto t = ChatTemplate::Create("{{ messages[5].content }}", "", "");
  ASSERT_TRUE(t.ok());
  auto r = t->Render({{"user", "x"}}, true);
  ASSERT_FALSE(r.ok());  // undefined message: an error, not a crash
  EXPECT_EQ(DetectChatFamily("{{ '<|im_start|>' }}"), "chatml");
  EXPECT_EQ(DetectChatFamily("plain"), "unknown");
}

// ---- incremental rendering ----------------------------------------------------------------------

TEST(ChatTemplateAppend, DecomposesAroundTheReply) {
  const ChatTemplate llama2 = Load("llama-2-chat", "<s>", "</s>");
  // history[0..3) = system, user, assistant reply, then a new user turn.
  std::vector<ChatMessage> h(kWithSystem.begin(), kWithSystem.begin() + 4);
  auto a = llama2.RenderAppend(h, 2, true);
  ASSERT_TRUE(a.ok()) << a.error().message;
  EXPECT_EQ(a->reply_prefix, " ");
  EXPECT_EQ(a->reply, "Hi there");
  EXPECT_EQ(a->tail, " </s><s>[INST] Who are you [/INST]");
  EXPECT_EQ(RenderOk(llama2, {h[0], h[1]}) + a->text(), RenderOk(llama2, h));

  const ChatTemplate chatml = Load("chatml", "", "<|im_end|>");
  a = chatml.RenderAppend(h, 2, true);
  ASSERT_TRUE(a.ok()) << a.error().message;
  EXPECT_EQ(a->reply_prefix, "");
  EXPECT_EQ(a->reply, "Hi there");
  EXPECT_EQ(a->tail, "<|im_end|>\n<|im_start|>user\nWho are you<|im_end|>\n<|im_start|>assistant\n");
  a = chatml.RenderAppend(h, 2, false);  // no generation prompt at the end
  ASSERT_TRUE(a.ok()) << a.error().message;
  EXPECT_EQ(a->tail, "<|im_end|>\n<|im_start|>user\nWho are you<|im_end|>\n");

  // Llama 3 trims the reply: the rendered reply is not the content.
  const ChatTemplate llama3 = Load("llama-3-instruct", "<|begin_of_text|>", "<|eot_id|>");
  std::vector<ChatMessage> h2(kWithSystem.begin(), kWithSystem.begin() + 6);
  a = llama3.RenderAppend(h2, 4, true);
  ASSERT_TRUE(a.ok()) << a.error().message;
  EXPECT_EQ(a->reply, "I am an assistant");
  EXPECT_EQ(a->tail,
            "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nAnother question<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");

  // A user message where the reply should be: the old generation prompt is not a prefix.
  std::vector<ChatMessage> no_reply = {{"user", "a"}, {"user", "b"}};
  EXPECT_FALSE(chatml.RenderAppend(no_reply, 1, true).ok());
  EXPECT_FALSE(chatml.RenderAppend(no_reply, 3, true).ok());
  a = chatml.RenderAppend(no_reply, 0, true);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->tail, RenderOk(chatml, no_reply));
}

TEST(ChatTemplateAppend, Qwen3DropsEarlierReasoning) {
  // Qwen3 removes <think>...</think> from earlier replies: the decomposition still holds, but the
  // rendered reply differs from what the model generated, which tells the caller to re-render.
  const ChatTemplate t = Load("qwen3", "", "<|im_end|>");
  const std::vector<ChatMessage> h = {{"user", "q"}, {"assistant", "<think>\nhmm\n</think>\n\nanswer"}, {"user", "q2"}};
  auto a = t.RenderAppend(h, 1, true);
  ASSERT_TRUE(a.ok()) << a.error().message;
  EXPECT_EQ(a->reply, "answer");
  EXPECT_EQ(RenderOk(t, {h[0]}) + a->text(), RenderOk(t, h));
}

std::string RandomText(Rng& rng) {
  static const char* const kWords[] = {"hello", "world", "How", "are", "you?", "é", "你好", "I'm", "fine.", "\n",
                                       "a", "42", "[INST]", "code:", "x = 1", "😀", "<tag>", "'quoted'", "\"q\""};
  std::string s;
  if (rng.Next() % 4 == 0) s += " ";  // leading / trailing whitespace: exercises strip and trim
  const int n = 1 + static_cast<int>(rng.Next() % 8);
  for (int i = 0; i < n; ++i) {
    if (i > 0) s += " ";
    s += kWords[rng.Next() % (sizeof(kWords) / sizeof(kWords[0]))];
  }
  if (rng.Next() % 4 == 0) s += "\n";
  return s;
}

// 1..6 user turns, assistant replies between them, optionally a system message first.
std::vector<ChatMessage> RandomConversation(Rng& rng, bool system) {
  std::vector<ChatMessage> m;
  if (system) m.push_back({"system", RandomText(rng)});
  const int turns = 1 + static_cast<int>(rng.Next() % 6);
  for (int i = 0; i < turns; ++i) {
    if (i > 0) m.push_back({"assistant", RandomText(rng)});
    m.push_back({"user", RandomText(rng)});
  }
  return m;
}

std::string Strip(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\n\r\f\v");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\n\r\f\v") + 1 - b);
}

struct AppendCase {
  const char* name;
  const char* bos;
  const char* eos;
  bool system_ok;      // the template accepts a system message
  bool stable_system;  // prefix-stable with a system message
};

const AppendCase kAppendCases[] = {
    {"llama-2-chat", "<s>", "</s>", true, true},
    {"llama-3-instruct", "<|begin_of_text|>", "<|eot_id|>", true, true},
    {"llama-3.1-instruct", "<|begin_of_text|>", "<|eot_id|>", true, true},
    {"chatml", "", "<|im_end|>", true, true},
    {"qwen2-instruct", "", "<|im_end|>", true, true},
    {"qwen2.5-instruct", "", "<|im_end|>", true, true},
    {"qwen3", "", "<|im_end|>", true, true},
    {"mistral-v0.1", "<s>", "</s>", false, false},
    {"mistral-v0.2", "<s>", "</s>", false, false},
    {"mistral-v0.3", "<s>", "</s>", true, false},
    {"mistral-nemo", "<s>", "</s>", true, false},
    {"gemma-it", "<bos>", "<eos>", false, false},
    {"gemma-2-it", "<bos>", "<eos>", false, false},
    {"phi-3-mini", "<s>", "<|endoftext|>", true, true},
    {"phi-3.5-mini", "<s>", "<|endoftext|>", true, true},
    {"fallback", "", "", true, true},
};

// Property: rendering the whole conversation equals the first turn's prompt followed, for every
// later turn, by the reply as generated (reply_prefix + reply) and the tail RenderAppend returns.
// Where a template is not prefix-stable (Mistral v0.3 / Nemo with a system message, which moves
// into the last user turn), RenderAppend must say so for every later turn.
TEST(ChatTemplateAppend, IncrementalEqualsWholeForRandomConversations) {
  Rng rng(42);
  for (const AppendCase& c : kAppendCases) {
    const ChatTemplate t = std::string(c.name) == "fallback" ? ChatTemplate::Fallback() : Load(c.name, c.bos, c.eos);
    int n_checked = 0, n_unstable = 0;
    for (int iter = 0; iter < 60; ++iter) {
      const bool system = c.system_ok && iter % 2 == 1;
      const std::vector<ChatMessage> conv = RandomConversation(rng, system);
      const size_t user_turns = (conv.size() + (system ? 0 : 1)) / 2;
      const bool expect_unstable = system && !c.stable_system && user_turns >= 2;
      const std::string whole = RenderOk(t, conv);
      // First turn: everything up to the first user message, with the generation prompt.
      size_t n_old = system ? 2 : 1;
      std::string incremental = RenderOk(t, {conv.begin(), conv.begin() + static_cast<std::ptrdiff_t>(n_old)});
      bool stable = true;
      while (n_old < conv.size()) {
        const std::vector<ChatMessage> history(conv.begin(), conv.begin() + static_cast<std::ptrdiff_t>(n_old + 2));
        auto a = t.RenderAppend(history, n_old, true);
        if (!a.ok()) {
          EXPECT_NE(a.error().message.find("not prefix-stable"), std::string::npos) << a.error().message;
          stable = false;
          break;
        }
        const std::string& content = conv[n_old].content;
        EXPECT_TRUE(a->reply == content || a->reply == Strip(content))
            << c.name << ": reply '" << a->reply << "' for content '" << content << "'";
        incremental += a->reply_prefix + a->reply + a->tail;
        n_old += 2;
      }
      EXPECT_EQ(stable, !expect_unstable) << c.name << " iteration " << iter;
      if (stable) {
        ++n_checked;
        EXPECT_EQ(incremental, whole) << c.name;
      } else {
        ++n_unstable;
      }
    }
    std::printf("%-20s %2d conversations checked, %2d not prefix-stable\n", c.name, n_checked, n_unstable);
  }
}

}  // namespace
}  // namespace mnemo
