// One chat-template fuzz input, shared by the libFuzzer target (template_fuzz.cpp) and the gtest
// that replays the seed corpus and mutates it (template_fuzz_test.cpp).
//
// Input: "<template>\0<conversation>". An empty template part picks one of the real templates
// (tests/chat/templates) by the conversation's length. The conversation is JSON when it parses
// ({"messages": [...], "tools": [...]} or a bare array of messages, any member of any type: what a
// client can send once the server has checked it), otherwise its lines alternate user and
// assistant messages.
//
// Property: Create, Render and RenderAppend give a value or an Error with a message, whatever the
// input; a template from a GGUF file is as untrusted as the messages. Nothing crashes or throws,
// and the renderer's limits (jinja.h Limits) keep time and memory bounded (libFuzzer's -timeout
// and -rss_limit_mb catch the rest).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "chat/chat_template.h"
#include "chat/tool_calls.h"

namespace mnemo::test {

// The real templates (tests/chat/templates/*.jinja, MNEMO_CHAT_TEMPLATES_DIR), by name (read once).
inline const std::vector<std::string>& RealTemplates() {
  static const std::vector<std::string> all = [] {
    std::vector<std::filesystem::path> paths;
    for (const auto& e : std::filesystem::directory_iterator(MNEMO_CHAT_TEMPLATES_DIR)) {
      if (e.path().extension() == ".jinja") paths.push_back(e.path());
    }
    std::sort(paths.begin(), paths.end());
    std::vector<std::string> texts;
    for (const auto& p : paths) {
      std::ifstream f(p, std::ios::binary);
      texts.emplace_back(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    }
    if (texts.empty()) texts.push_back("{{ messages }}");  // MNEMO_CHAT_TEMPLATES_DIR is wrong: still fuzz
    return texts;
  }();
  return all;
}

inline std::string JsonText(const nlohmann::json& j) {
  return j.is_string() ? j.get<std::string>() : j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// Messages from a parsed conversation: role and content as text whatever their JSON type (the
// server flattens content parts the same way), tool calls and tool results.
inline std::vector<ChatMessage> FuzzMessages(const nlohmann::json& list) {
  std::vector<ChatMessage> out;
  if (!list.is_array()) return out;
  for (const auto& m : list) {
    if (!m.is_object()) {
      out.emplace_back("user", JsonText(m));
      continue;
    }
    ChatMessage msg(m.contains("role") ? JsonText(m["role"]) : "user", m.contains("content") ? JsonText(m["content"]) : "");
    if (m.contains("tool_call_id")) msg.tool_call_id = JsonText(m["tool_call_id"]);
    if (m.contains("name")) msg.name = JsonText(m["name"]);
    if (m.contains("tool_calls") && m["tool_calls"].is_array()) {
      for (const auto& c : m["tool_calls"]) {
        if (!c.is_object()) continue;
        msg.tool_calls.push_back(ChatToolCall{c.contains("id") ? JsonText(c["id"]) : "call_0",
                                              c.contains("name") ? JsonText(c["name"]) : "f",
                                              c.contains("arguments") ? JsonText(c["arguments"]) : "{}"});
      }
    }
    out.push_back(std::move(msg));
  }
  return out;
}

// Returns true when the input rendered. Never crashes on any input (that is the property).
inline bool ExerciseTemplate(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t nul = in.find('\0');
  std::string source(in.substr(0, nul == std::string_view::npos ? in.size() : nul));
  const std::string_view conv = nul == std::string_view::npos ? std::string_view() : in.substr(nul + 1);
  if (source.empty()) source = RealTemplates()[conv.size() % RealTemplates().size()];

  std::vector<ChatMessage> messages;
  jinja::Dict extra;
  nlohmann::json j = nlohmann::json::parse(conv, nullptr, /*allow_exceptions=*/false);
  if (j.is_object()) {
    if (j.contains("messages")) messages = FuzzMessages(j["messages"]);
    if (j.contains("tools")) extra.Set("tools", jinja::Value::FromJson(j["tools"]));
  } else if (j.is_array()) {
    messages = FuzzMessages(j);
  } else {
    size_t at = 0;
    while (at <= conv.size()) {
      size_t nl = conv.find('\n', at);
      if (nl == std::string_view::npos) nl = conv.size();
      messages.emplace_back(messages.size() % 2 ? "assistant" : "user", std::string(conv.substr(at, nl - at)));
      at = nl + 1;
    }
  }

  auto t = ChatTemplate::Create(source, "<s>", "</s>");
  if (!t.ok()) {
    if (t.error().message.empty()) __builtin_trap();  // an error must say something
    return false;
  }
  t->WithFixedTime(0);
  auto r = t->Render(messages, /*add_generation_prompt=*/true, &extra);
  if (!r.ok()) {
    if (r.error().message.empty()) __builtin_trap();
    return false;
  }
  // What the server does with a rendering: appends (session reuse) and tool-call parsing of text.
  if (messages.size() > 1) {
    auto a = t->RenderAppend(messages, messages.size() - 1, true, &extra);
    if (!a.ok() && a.error().message.empty()) __builtin_trap();
  }
  ParseToolCalls(DetectToolFormat(*t), *r);
  return true;
}

}  // namespace mnemo::test
