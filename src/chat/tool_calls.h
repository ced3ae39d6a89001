// Tool calls in a model's own syntax: which syntax a chat template uses, the text of a call in it,
// and parsing calls back out of generated text.
//
// Formats (picked from the chat template's source by DetectToolFormat):
//   kHermes   Qwen 2.5 / Qwen 3 / Hermes (templates that write "<tool_call>"): each call is
//             <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>, calls joined by "\n".
//   kLlama3   Llama 3.1-3.3 (a Llama 3 header template that mentions tools): one JSON object
//             {"name": "f", "parameters": {...}}, optionally after <|python_tag|> (then also
//             after text); several objects separated by ";" are parsed too.
//   kMistral  Mistral v0.3 / Nemo (templates that write "[TOOL_CALLS]"): [TOOL_CALLS] then a JSON
//             array [{"name": "f", "arguments": {...}}, ...]; the marker is a control token the
//             grammar cannot emit, so a bare leading array is parsed as calls too.
//   kGeneric  every other template (and the built-in fallback): the tools are described in a
//             system block (GenericToolsPrompt) and calls use the kHermes syntax; assistant calls
//             and tool results in the history render as text (GenericToolMessages).
// Parsing is lenient on whitespace, takes "arguments" or "parameters", and accepts a call whose
// closing tag the model never wrote (the output ended). Text outside the calls is the content;
// text before a call counts too ("Let me check.\n<tool_call>..."). Markup the output was cut
// inside is dropped, never content: a trailing partial tag ("</t", "<") and a call whose JSON
// never closed.
//
// Thread safety: pure functions.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "chat/chat_template.h"

namespace mnemo {

enum class ToolFormat { kHermes, kLlama3, kMistral, kGeneric };

// "hermes", "llama3", "mistral", "generic".
const char* ToolFormatName(ToolFormat f);

// The format a template's model writes calls in (see above).
ToolFormat DetectToolFormat(const ChatTemplate& t);
// Whether the template renders `tools` itself (its source reads a `tools` variable); otherwise the
// server adds GenericToolsPrompt as a system block.
bool TemplateRendersTools(const ChatTemplate& t);

// A call's text in format f with `arguments` verbatim (JSON text): what constrained decoding
// generates, and how kGeneric history renders a reply's calls. kLlama3 writes "parameters".
std::string ToolCallText(ToolFormat f, const std::string& name, const std::string& arguments);
// The text before the first call, between calls, and after the last one.
struct ToolCallFrame {
  std::string open, sep, close;
};
ToolCallFrame ToolCallFraming(ToolFormat f);

struct ParsedToolCalls {
  std::string content;                 // the text outside the calls, trimmed
  std::vector<ChatToolCall> calls;     // ids left empty (the caller assigns them)
};
// The calls in generated text `text` (control tokens included as their text). No call found:
// content is the whole text, untrimmed (less cut-off markup, see above).
ParsedToolCalls ParseToolCalls(ToolFormat f, std::string_view text);

// The system block that describes tools to a template that does not render them (kGeneric):
// `tools_json` is the OpenAI tools array as JSON text, one function per line.
std::string GenericToolsPrompt(const std::string& tools_json);
// The history rewritten for a template without tool support: an assistant message's calls are
// appended to its content as ToolCallText(kHermes, ...) (joined by "\n"); a tool result becomes a
// `tool_role` message "<tool_response>\n{content}\n</tool_response>" (tool_role: "tool" for the
// built-in fallback, whose transcript has a Tool: speaker; "user" for real templates, which
// usually refuse other roles).
std::vector<ChatMessage> GenericToolMessages(const std::vector<ChatMessage>& messages, const std::string& tool_role);

// Mistral templates insist on call ids of exactly 9 letters and digits: each id (the calls' and
// the results' tool_call_id) is replaced by 9 base-36 digits of its hash, the same every turn.
void MistralToolIds(std::vector<ChatMessage>* messages);

// The end of the JSON value starting at text[pos] (one past its last byte), or npos when it does
// not end within text. Scans brackets and strings only; the value is validated by the caller.
size_t JsonValueEnd(std::string_view text, size_t pos);

}  // namespace mnemo
