// Structured outputs: what a request says its output must look like, as a grammar for the engine.
//   chat completions: response_format {type: text | json_object | json_schema, json_schema:
//     {name, schema, strict, description}}, and the extension `grammar` (grammar text, grammar.h);
//   responses: text {format: {type: text | json_object | json_schema, name, schema, strict,
//     description}, verbosity}, and `grammar`;
//   completions: `grammar`.
// A schema the compiler cannot honour, or grammar text that does not parse, is a 400 naming the
// member (response_format.json_schema.schema, text.format.schema, grammar).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "server/api_error.h"
#include "server/service.h"

namespace mnemo {

enum class OutputApi { kChat, kResponses, kCompletions };

// Reads the output-format members of `body` (raw_body: the same body as text, re-read with its
// member order kept, so that a schema's properties are generated in the order it lists them) and
// sets req->grammar. `echo` (Responses): the text.format object to report back. `format_text`:
// the grammar text of a JSON format (response_format / text.format; not of `grammar`), which tools
// combine with their calls (ApplyTools).
std::optional<ApiError> ParseOutputFormat(ServedModel& model, const nlohmann::json& body, const std::string& raw_body,
                                          OutputApi api, TurnRequest* req, nlohmann::json* echo = nullptr,
                                          std::string* format_text = nullptr);

}  // namespace mnemo
