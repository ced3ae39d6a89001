// Small helpers shared by the HTTP handlers: OpenAI-shaped errors, JSON field access with type
// checks, SSE framing.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <initializer_list>
#include <string>
#include <string_view>

#include "engine/request.h"
#include "sampling/stop.h"
#include "server/http_server.h"
#include "server/service.h"

namespace mnemo::http {

using Json = nlohmann::json;

// Writes {"error": {"message", "type", "param", "code"}} with the error's status.
void SendError(Response& res, const ApiError& e);
void SendJson(Response& res, const Json& j, int status = 200);
// The same as a new Response (for a deferred Reply).
Response ErrorResponse(const ApiError& e);
Response JsonResponse(const Json& j, int status = 200);
ApiError BadRequest(std::string message, std::string param = "", std::string code = "");
ApiError NotFound(std::string message);
// A 500 for an exception that escaped a handler (a bug: bad input never throws). The exception's
// text is logged with `context` (method and path) and never sent: library messages name internal
// types, files and ids.
ApiError InternalError(const std::string& context, std::exception_ptr ep);

// A client-supplied X-Request-Id is echoed when it is 1 to 128 characters of letters, digits and
// `-_.:/+=` (what request ids and trace headers use); anything else (empty, long, spaces, control
// bytes that could forge log lines) is replaced by a generated "req_" + 128 random bits.
bool SaneRequestId(std::string_view id);
std::string NewRequestId();

// Lower-case hex of the SHA-256 of the parts, hashed one after another (API key owners, request
// bodies for de-duplication).
std::string Sha256Hex(std::initializer_list<std::string_view> parts);

// The deepest nesting of arrays and objects a request body may have. Real requests stay far below
// it (a message with content parts is 4 levels deep, a metadata object 2). Parsing is iterative,
// but copying, dumping and destroying parts of a parsed value recurse once per level: a 100,000
// deep body overflowed the stack of a handler thread (issue 13). Bounding the depth at the parse
// bounds every later walk of the body and of what is stored from it.
inline constexpr int kMaxJsonDepth = 64;

// True when `text` nests arrays and objects more than `limit` deep, counting brackets outside
// strings. One linear pass that stops at the first level past the limit; for invalid JSON the
// answer is unspecified (the parser then refuses the text).
bool JsonDeeperThan(std::string_view text, int limit);

// Parses a request body that must be a JSON object nested at most kMaxJsonDepth deep
// (400 nesting_too_deep otherwise, before the parser builds anything).
std::variant<Json, ApiError> ParseBody(const std::string& body);

// The JSON types a request member may have, as bits of FieldSpec::types.
enum FieldType : unsigned {
  kString = 1u << 0,
  kInteger = 1u << 1,  // a number without a fraction or exponent
  kNumber = 1u << 2,   // any number, integers included
  kBool = 1u << 3,
  kArray = 1u << 4,
  kObject = 1u << 5,
};
struct FieldSpec {
  const char* name;
  unsigned types;  // FieldType bits
};

// Checks every member of `body` against `fields` before anything reads it: a member outside them
// is a 400 (OpenAI rejects unrecognized arguments), one of another JSON type a 400 invalid_type
// naming it. null counts as absent for every member (OpenAI's optional parameters are nullable;
// a required one that is null then fails as missing or mistyped where it is read). After this,
// reads of these members cannot throw.
std::optional<ApiError> CheckFields(const Json& body, std::initializer_list<FieldSpec> fields);

// A member that is absent or null.
bool Absent(const Json& obj, const char* key);
// The member, or `fallback` when it is absent or null. Unlike Json::value, never throws on null.
bool BoolOr(const Json& obj, const char* key, bool fallback);
Json ValueOr(const Json& obj, const char* key, Json fallback);

// The generation parameters shared by chat completions, completions and responses, into req.
// max_token_fields: the names that may carry the output limit, first found wins.
std::optional<ApiError> ParseGeneration(const Json& body, std::initializer_list<const char*> max_token_fields,
                                        TurnRequest* req);

// `n`, the choices a chat or completions request asks for: 1 to kMaxChoices (a 400 naming `n`
// otherwise). Responses have no `n` (an unknown member there).
inline constexpr int kMaxChoices = 8;
std::optional<ApiError> ParseChoices(const Json& body, int* n);
// Completions' `best_of`, the candidates generated for n choices: n (its default) to kMaxChoices; a
// stream cannot have more than n (it would send candidates that are then not chosen). 400s name
// `best_of`.
std::optional<ApiError> ParseBestOf(const Json& body, int n, bool stream, int* best_of);

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
// n > 1 choices: the prompt's turn (its tokens counted once) and the choices' generated tokens.
Json ChatUsage(const TurnResult& prompt, int64_t completion_tokens);
Json ResponsesUsage(const TurnResult& r);

}  // namespace mnemo::http
