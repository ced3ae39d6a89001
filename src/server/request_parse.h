// Reading the bodies of POST /v1/chat/completions, /v1/completions and /v1/responses into a turn:
// everything a request goes through before the engine or the store sees it (the JSON parse with
// its depth limit, every member's type and value, messages and input items, tools, output formats
// and their grammars). Any body gives a parsed call or an ApiError (a 4xx naming the member at
// fault); nothing here throws or crashes (tests/fuzz runs it under libFuzzer).
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "server/api_error.h"
#include "server/service.h"
#include "server/tools.h"

namespace mnemo {

// A chat completion: the turn (messages with tools applied, generation parameters, grammar).
struct ChatCall {
  TurnSpec spec;
  std::shared_ptr<ToolRequest> tools;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  int n = 1;                   // choices (1 to http::kMaxChoices)
};
ApiResult<ChatCall> ParseChatCompletion(ServedModel& model, const std::string& raw_body, const std::string& owner);

// A completion: a raw prompt.
// Completions' prompt arrays: at most kMaxPrompts prompts (LangChain's OpenAI LLM sends up to 20,
// its batchSize), and at most kMaxPromptChoices turns in all (prompts x best_of).
inline constexpr int kMaxPrompts = 32;
inline constexpr int kMaxPromptChoices = 64;

struct CompletionCall {
  TurnSpec spec;                     // the first prompt's
  std::vector<std::string> prompts;  // every prompt (several: each runs as its own request, not streamed)
  bool stream = false;
  int n = 1;          // choices returned (1 to http::kMaxChoices)
  int best_of = 1;    // candidates generated, of which the n most likely are returned (n to kMaxChoices)
  bool echo = false;  // each choice's text begins with the prompt (never with logprobs)
};
ApiResult<CompletionCall> ParseCompletion(ServedModel& model, const std::string& raw_body, const std::string& owner);

// An item_reference {"type": "item_reference", "id": ...} is replaced by the stored item `resolve`
// returns (a 404 when there is none).
using ItemResolver =
    std::function<std::variant<nlohmann::json, ApiError>(const std::string& id, const std::string& param)>;

// A response, before its history (the previous_response_id chain or the conversation's items) is
// read from the store: spec holds the generation parameters, tools' template variables and
// grammar, not the messages yet.
struct ResponseCall {
  nlohmann::json body;
  nlohmann::json input_items;  // InputItems' normalized items
  TurnSpec spec;
  std::optional<std::string> instructions;  // with the generic tools block when the template has no tools
  std::shared_ptr<ToolRequest> tools;
  std::optional<std::string> previous_response_id, conversation_id;
  std::string truncation;  // "disabled" or "auto"
  bool store = true;
  bool stream = false;
};
ApiResult<ResponseCall> ParseResponseRequest(ServedModel& model, const std::string& raw_body, const std::string& owner,
                                             const ItemResolver& resolve);

// Normalizes request input (a string or an array of message items) to message items with ids.
// `param` names the member in errors ("input", or "items" on the Conversations API). Other
// members of an item (status, a part's annotations: what clients pass back from an output) are
// accepted and not kept. item_reference items need `resolve` (elsewhere they are a 400).
std::variant<nlohmann::json, ApiError> InputItems(const nlohmann::json& input, const std::string& param,
                                                  const ItemResolver& resolve = nullptr);
// Appends the messages of normalized items (InputItems' output, or stored items; anything else in
// them is skipped, never thrown on).
void AppendMessages(const nlohmann::json& items, std::vector<ChatMessage>* out, std::vector<bool>* pinned);
// At most 16 string values, keys <= 64 and values <= 512 characters (OpenAI's limits).
std::optional<ApiError> CheckMetadata(const nlohmann::json& metadata);

}  // namespace mnemo
