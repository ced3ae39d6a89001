// Function tools on both APIs: request parsing and checks, rendering, the grammar that enforces
// `required` / a named tool_choice, and the calls found in a reply.
//
//   chat:      tools: [{type: "function", function: {name, description, parameters, strict}}],
//              tool_choice: "none" | "auto" | "required" | {type: "function", function: {name}},
//              parallel_tool_calls (default true);
//   responses: tools: [{type: "function", name, description, parameters, strict}],
//              tool_choice: the strings above | {type: "function", name}, parallel_tool_calls.
//   Both also take tool_choice allowed_tools (chat {type: "allowed_tools", allowed_tools: {mode,
//   tools: [{type: "function", function: {name}}]}}, responses {type: "allowed_tools", mode,
//   tools: [{type: "function", name}]}): every tool is rendered (the prompt, and so its cache,
//   stays the same whichever subset a turn allows), only the allowed ones are called.
// Rendering: a template that renders tools itself (chat/tool_calls.h TemplateRendersTools) gets
// `tools` (chat shape) as a template variable; any other gets GenericToolsPrompt as a system block
// (merged into the leading system message / the Responses instructions) and the history's calls
// and results as text (GenericToolMessages).
// Decoding: `required` and a named tool constrain the output to calls in the template's format
// (at most 4 with parallel_tool_calls, else 1), each call's arguments valid against its tool's
// parameters schema (written compactly, without whitespace). `auto` decodes freely and parses.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "chat/tool_calls.h"
#include "server/api_error.h"
#include "server/service.h"

namespace mnemo {

enum class ToolChoice { kNone, kAuto, kRequired, kNamed };

struct ToolRequest {
  struct Tool {
    std::string name;
    nlohmann::ordered_json parameters;  // JSON Schema of the arguments ({"type": "object"} if none)
  };
  std::vector<Tool> tools;
  nlohmann::ordered_json chat_tools = nlohmann::ordered_json::array();  // chat-shaped, for templates
  ToolChoice choice = ToolChoice::kAuto;
  std::string named;      // kNamed: the function
  std::vector<std::string> allowed;  // allowed_tools: the tools that may be called (empty: all of them)
  bool parallel = true;   // parallel_tool_calls
  bool parse() const { return !tools.empty() && choice != ToolChoice::kNone; }  // look for calls in the reply
  bool Has(const std::string& name) const;       // offered (rendered)
  bool Callable(const std::string& name) const;  // offered, and allowed (a named choice: that one)
};

// Reads tools / tool_choice / parallel_tool_calls (raw_body keeps the schemas' key order).
// Errors: 400 naming the member (bad tool definitions, schemas the grammar cannot honour, a
// tool_choice naming no tool, required with no tools).
std::optional<ApiError> ParseTools(const nlohmann::json& body, const std::string& raw_body, bool responses,
                                   ToolRequest* out);

// Checks the history's tool messages: each answers a call of an earlier assistant message
// (messages[i].tool_call_id); fills their `name`. `param` is "messages" or "input".
std::optional<ApiError> CheckToolHistory(std::vector<ChatMessage>* messages, const std::string& param);

// The history's calls and results as the template takes them: rewritten as text for templates
// without tool support (GenericToolMessages), 9-character ids for Mistral (MistralToolIds).
// One message out per message in.
void PrepareToolMessages(const ServedModel& model, std::vector<ChatMessage>* messages);

// Prepares spec for rendering (PrepareToolMessages on spec->messages included): template variables or the generic system block and history
// rewrite; sets the grammar for required / named choices. `instructions` (Responses): where the
// generic block goes instead of a system message. Shifts spec->hint.reply_message when a system
// message is inserted. `format_text`: the grammar of a JSON response format (response_format /
// text.format), as OpenAI combines them: under auto the reply is calls or the format's JSON (the
// grammar offers both); under required / a named tool it is calls (the format applies to a text
// reply, which cannot come). A raw `grammar` with required / a named tool is a 400.
std::optional<ApiError> ApplyTools(ServedModel& model, const ToolRequest& tools, TurnSpec* spec,
                                   std::optional<std::string>* instructions = nullptr,
                                   const std::string& format_text = "");

// The grammar text for tools.choice kRequired / kNamed in format f (exposed for tests).
Result<std::string> ToolCallGrammar(ToolFormat f, const ToolRequest& tools);
// Grammar text with every rule name prefixed (definitions and references; literals, classes,
// repetition bounds and comments untouched), so that two grammars can be joined under one root.
std::string PrefixRules(const std::string& text, const std::string& prefix);

// The calls in a finished reply (ids assigned "call_..."), or none (content = the text). Under
// required / a named tool the content is always empty (the reply is call syntax, even when cut).
struct ToolReply {
  std::string content;
  std::vector<ChatToolCall> calls;
};
ToolReply ExtractToolCalls(const ServedModel& model, const ToolRequest& tools, const TurnResult& r);
// The same from the reply's text with control tokens written out.
ToolReply ToolReplyFromText(ToolFormat f, const ToolRequest& tools, std::string_view raw);

// Where a call begins in format f under auto (what ToolHold and the stop strings look for): "<tool_call>"
// anywhere; for Llama 3 and Mistral "{" / "[" at the start and <|python_tag|> / [TOOL_CALLS]
// anywhere; a control token anywhere.
CallStart CallOpeners(ToolFormat f);

// Streaming under auto: which generated text may go out as content at once. Text is released as
// it comes, except a tail that may still become a call opener in the template's format
// ("<tool_call>" anywhere; "{" / "[" only at the start after whitespace; the control tokens
// <|python_tag|> and [TOOL_CALLS] anywhere). From an opener on, the rest of the reply is held and
// parsed at the end (End). So "Let me check.\n<tool_call>..." streams its text, then the call.
// Without tools to look for, everything is released.
class ToolHold {
 public:
  ToolHold(const ServedModel& model, const ToolRequest& tools);
  // The content to send now for one generated token and its text ("" while held).
  std::string Feed(int32_t token, const std::string& text);
  // At the end of the reply: the content not sent yet (cut-off markup dropped) and the calls in
  // the held text.
  ToolReply End();
  // The content Feed released so far.
  const std::string& released() const { return released_; }

 private:
  const Tokenizer* tok_;
  const ToolRequest* tools_;
  ToolFormat format_ = ToolFormat::kGeneric;
  bool active_ = false;
  std::vector<std::string> start_openers_;  // only before any content
  std::vector<std::string> openers_;        // anywhere
  std::string pending_;   // not released yet: may start an opener
  std::string held_;      // from an opener on
  std::string released_;
  bool holding_ = false;
};

// Streaming under required / a named tool, where the grammar fixes the reply's shape: turns the
// generated text into chat `delta.tool_calls` entries as it arrives, as OpenAI streams a call: the
// first entry of call k is {index, id, type, function: {name, arguments: ""}} (sent once the name
// is complete), then {index, function: {arguments: piece}} entries with the arguments' bytes as
// they are generated (cut at UTF-8 character boundaries), concatenating to the arguments.
class CallStream {
 public:
  explicit CallStream(ToolFormat f);
  // The delta entries the new text completes (possibly none).
  std::vector<nlohmann::json> Feed(const std::string& text);
  int calls() const { return calls_; }   // calls complete so far
  // Every call begun so far, its id and name and the arguments sent; the last one may be
  // unfinished (calls() tells).
  const std::vector<ChatToolCall>& begun() const { return begun_; }

 private:
  std::string text_;          // the reply so far
  std::string name_prefix_;   // the call text before the quoted name (after any separator)
  std::string mid_;           // between the quoted name and the arguments
  size_t pos_ = 0;            // where the next call is looked for
  bool in_args_ = false;
  size_t args_start_ = 0;     // the current call's arguments start here
  size_t sent_ = 0;           // its bytes before this were sent
  int calls_ = 0;
  std::vector<ChatToolCall> begun_;
};

// OpenAI chat `message.tool_calls` / `delta.tool_calls` entries.
nlohmann::json ToolCallsJson(const std::vector<ChatToolCall>& calls);
// Splits text into pieces of at most n bytes, never inside a UTF-8 character (streamed arguments).
std::vector<std::string> Utf8Pieces(const std::string& text, size_t n);

}  // namespace mnemo
