#include "server/openai_fields.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "server/http_util.h"

namespace mnemo::http {
namespace {

ApiError Unsupported(const std::string& param, const std::string& what) {
  return BadRequest(what + " (mnemo does not support it yet; see docs/api.md)", param, "unsupported_parameter");
}

// OpenAI's logit_bias: {"<token id>": bias in [-100, 100]}.
std::optional<ApiError> LogitBias(const Json& body, int n_vocab, SamplingParams* sp) {
  if (Absent(body, "logit_bias")) return std::nullopt;
  for (const auto& [key, value] : body["logit_bias"].items()) {
    char* end = nullptr;
    const long id = std::strtol(key.c_str(), &end, 10);
    if (key.empty() || *end != '\0' || key.size() > 10 || id < 0 || id >= n_vocab) {
      return BadRequest("logit_bias keys must be token ids in [0, " + std::to_string(n_vocab) + "); got '" +
                            key.substr(0, 32) + "'",
                        "logit_bias", "invalid_value");
    }
    if (!value.is_number() || !(value.get<double>() >= -100 && value.get<double>() <= 100)) {
      return BadRequest("logit_bias values must be numbers in [-100, 100]", "logit_bias", "invalid_value");
    }
    sp->logit_bias.emplace_back(static_cast<int32_t>(id), value.get<float>());
  }
  return std::nullopt;
}

// The deprecated functions / function_call with no function offered (tools / tool_choice are
// server/tools.h).
std::optional<ApiError> NoTools(const Json& body, Endpoint ep) {
  for (const char* k : {"functions"}) {
    if (!Absent(body, k) && !body[k].empty()) return Unsupported(k, std::string("'") + k + "' with any tool");
  }
  for (const char* k : {"function_call"}) {
    if (Absent(body, k)) continue;
    const Json& v = body[k];
    // "none" and "auto" mean the same as no tools at all; "required" or a named tool cannot hold.
    if (v.is_string() && (v == "none" || v == "auto")) continue;
    return Unsupported(k, std::string("'") + k + "' other than \"none\" or \"auto\"");
  }
  if (ep == Endpoint::kResponses && !Absent(body, "max_tool_calls")) {
    const Json& v = body["max_tool_calls"];
    if (!v.is_number_integer() || v.get<int64_t>() < 0) {
      return BadRequest("'max_tool_calls' must be an integer >= 0", "max_tool_calls", "invalid_value");
    }
  }
  return std::nullopt;
}

// logprobs: chat `logprobs: true` with `top_logprobs` alternatives (0 to 20; only with logprobs);
// completions `logprobs: N` alternatives (0 to 20); Responses `include:
// ["message.output_text.logprobs"]` or `top_logprobs` above 0. *out: -1 (off) or the alternatives.
std::optional<ApiError> Logprobs(const Json& body, Endpoint ep, int* out) {
  auto count = [&](const char* key, int* n) -> std::optional<ApiError> {
    if (Absent(body, key)) return std::nullopt;
    const Json& v = body[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > kMaxTopLogprobs) {
      return BadRequest(std::string("'") + key + "' must be an integer between 0 and " + std::to_string(kMaxTopLogprobs),
                        key, "invalid_value");
    }
    *n = static_cast<int>(v.get<int64_t>());
    return std::nullopt;
  };
  int top = -1;
  if (ep == Endpoint::kCompletions) return count("logprobs", out);
  if (auto e = count("top_logprobs", &top)) return e;
  if (ep == Endpoint::kChat) {
    const bool on = BoolOr(body, "logprobs", false);
    if (top > 0 && !on) {
      return BadRequest("'top_logprobs' needs 'logprobs': true", "top_logprobs", "invalid_value");
    }
    if (on) *out = std::max(top, 0);
    return std::nullopt;
  }
  bool included = false;
  if (!Absent(body, "include") && body["include"].is_array()) {
    for (const Json& v : body["include"]) included = included || v == "message.output_text.logprobs";
  }
  if (included || top > 0) *out = std::max(top, 0);
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> ParseKnownFields(const Json& body, Endpoint ep, int n_vocab, TurnRequest* req) {
  if (auto e = LogitBias(body, n_vocab, &req->sampling)) return e;
  if (auto e = NoTools(body, ep)) return e;
  if (auto e = Logprobs(body, ep, &req->logprobs)) return e;
  if (!Absent(body, "modalities")) {
    for (const auto& m : body["modalities"]) {
      if (m != "text") return Unsupported("modalities", "Output modalities other than \"text\"");
    }
  }
  for (const char* k : {"audio", "web_search_options"}) {
    if (ep == Endpoint::kChat && !Absent(body, k)) return Unsupported(k, std::string("'") + k + "'");
  }
  // Responses' `prompt` names a stored prompt template (the completions `prompt` is the text).
  if (ep == Endpoint::kResponses && !Absent(body, "prompt")) return Unsupported("prompt", "Prompt templates");
  // How long OpenAI keeps a prompt's cache: mnemo keeps sessions by its own bounds (--session-ttl,
  // --max-sessions, the tiers), so either value means the same here.
  if (!Absent(body, "prompt_cache_retention")) {
    const Json& v = body["prompt_cache_retention"];
    if (v != "in_memory" && v != "in-memory" && v != "24h") {
      return BadRequest("'prompt_cache_retention' must be one of in_memory, 24h", "prompt_cache_retention", "invalid_value");
    }
  }
  // Cache breakpoints and their lifetime: mnemo keeps every session's prefix itself, whatever the
  // mode (no breakpoint marks, content parts' `prompt_cache_breakpoint` included, change what is kept).
  if (!Absent(body, "prompt_cache_options")) {
    const Json& o = body["prompt_cache_options"];
    if (auto e = CheckFields(o, {{"mode", kString}, {"ttl", kString}})) {
      e->param = "prompt_cache_options." + e->param;
      return e;
    }
    if (!Absent(o, "mode") && o["mode"] != "implicit" && o["mode"] != "explicit") {
      return BadRequest("'prompt_cache_options.mode' must be one of implicit, explicit", "prompt_cache_options.mode", "invalid_value");
    }
    if (!Absent(o, "ttl") && o["ttl"] != "30m") {
      return BadRequest("'prompt_cache_options.ttl' must be 30m", "prompt_cache_options.ttl", "invalid_value");
    }
  }
  // Moderation of the input and output: no moderation model runs here, and skipping what the
  // client asked to be checked would be silent.
  if (!Absent(body, "moderation")) return Unsupported("moderation", "Moderation ('moderation')");
  // Responses' server-side compaction: ignoring it would let a conversation overflow that the
  // client expected compacted.
  if (ep == Endpoint::kResponses && !Absent(body, "context_management") && !body["context_management"].empty()) {
    return Unsupported("context_management", "Server-side compaction ('context_management')");
  }
  if (!Absent(body, "background") && body["background"].get<bool>()) {
    return Unsupported("background", "Background responses");
  }
  if (!Absent(body, "reasoning_effort")) {
    const Json& v = body["reasoning_effort"];
    if (v != "none" && v != "minimal" && v != "low" && v != "medium" && v != "high") {
      return BadRequest("'reasoning_effort' must be one of none, minimal, low, medium, high", "reasoning_effort",
                        "invalid_value");
    }
  }
  if (!Absent(body, "verbosity")) {
    const Json& v = body["verbosity"];
    if (v != "low" && v != "medium" && v != "high") {
      return BadRequest("'verbosity' must be one of low, medium, high", "verbosity", "invalid_value");
    }
  }
  return std::nullopt;
}

}  // namespace mnemo::http
