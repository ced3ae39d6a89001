// Small helpers shared by the HTTP handlers: OpenAI-shaped errors, JSON field access with type
// checks, SSE framing.
#pragma once

#include <httplib.h>

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "engine/request.h"
#include "sampling/stop.h"
#include "server/service.h"

namespace mnemo::http {

using Json = nlohmann::json;

// Writes {"error": {"message", "type", "param", "code"}} with the error's status.
void SendError(httplib::Response& res, const ApiError& e);
void SendJson(httplib::Response& res, const Json& j, int status = 200);
ApiError BadRequest(std::string message, std::string param = "", std::string code = "");
ApiError NotFound(std::string message);

// Parses a request body that must be a JSON object.
std::variant<Json, ApiError> ParseBody(const std::string& body);

// Fails when `body` has members outside `known` (OpenAI rejects unrecognized arguments).
std::optional<ApiError> CheckKnownFields(const Json& body, std::initializer_list<const char*> known);

// The generation parameters shared by chat completions, completions and responses, into req.
// max_token_fields: the names that may carry the output limit, first found wins.
std::optional<ApiError> ParseGeneration(const Json& body, std::initializer_list<const char*> max_token_fields,
                                        TurnRequest* req);

// Selective-context members: context_budget (a token count >= 1 or a share < 1), context_mode
// ("reuse" or "exact"), context_preset (scoring weights), context_relevance ("keyword",
// "embedding", "centred", "whitened"), context_keep_last (newest turns always kept), and
// include: an array of strings; "mnemo_context.scores" asks for every turn's score in
// mnemo_context (other values are accepted and ignored, as OpenAI's include values name outputs
// mnemo does not produce).
std::optional<ApiError> ParseContext(const Json& body, ContextRequest* ctx);
// The `mnemo_context` extension member of a response.
Json ContextJson(const ContextReport& r);

// "data: <json>\n\n" (and the named-event form for the Responses API).
std::string SseData(const Json& j);
std::string SseEvent(const std::string& type, const Json& j);

int64_t UnixSeconds();

// The usage block of a finished turn, chat-completions style or responses style.
Json ChatUsage(const TurnResult& r);
Json ResponsesUsage(const TurnResult& r);

}  // namespace mnemo::http
