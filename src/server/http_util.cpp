#include "server/http_util.h"

#include <openssl/evp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cctype>
#include <random>
#include <cmath>
#include <cstring>
#include <set>

#include "base/log.h"

namespace mnemo::http {

void SendError(Response& res, const ApiError& e) {
  Json err = {{"message", e.message},
              {"type", e.type},
              {"param", e.param.empty() ? Json(nullptr) : Json(e.param)},
              {"code", e.code.empty() ? Json(nullptr) : Json(e.code)}};
  res.status = e.status;
  if (e.status == 429 || e.status == 503) res.set_header("Retry-After", "1");
  res.set_content(Json{{"error", err}}.dump(-1, ' ', false, Json::error_handler_t::replace), "application/json");
}

void SendJson(Response& res, const Json& j, int status) {
  res.status = status;
  res.set_content(j.dump(-1, ' ', false, Json::error_handler_t::replace), "application/json");
}

Response ErrorResponse(const ApiError& e) {
  Response res;
  SendError(res, e);
  return res;
}

Response JsonResponse(const Json& j, int status) {
  Response res;
  SendJson(res, j, status);
  return res;
}

ApiError BadRequest(std::string message, std::string param, std::string code) {
  return ApiError{400, "invalid_request_error", std::move(message), std::move(param), std::move(code)};
}

ApiError NotFound(std::string message) {
  return ApiError{404, "invalid_request_error", std::move(message), "", "not_found"};
}

bool JsonDeeperThan(std::string_view text, int limit) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (char ch : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (ch == '\\') escaped = true;
      else if (ch == '"') in_string = false;
    } else if (ch == '"') {
      in_string = true;
    } else if (ch == '{' || ch == '[') {
      if (++depth > limit) return true;
    } else if (ch == '}' || ch == ']') {
      depth--;  // below zero only in invalid JSON, which the parser refuses
    }
  }
  return false;
}

bool SaneRequestId(std::string_view id) {
  if (id.empty() || id.size() > 128) return false;
  for (char ch : id) {
    const bool ok = std::isalnum(static_cast<unsigned char>(ch)) || std::strchr("-_.:/+=", ch) != nullptr;
    if (!ok || ch == 0) return false;
  }
  return true;
}

std::string NewRequestId() { return NewId("req_"); }

std::string Sha256Hex(std::initializer_list<std::string_view> parts) {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr);
  for (std::string_view p : parts) EVP_DigestUpdate(ctx, p.data(), p.size());
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_DigestFinal_ex(ctx, md, &n);
  EVP_MD_CTX_free(ctx);
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < n; i++) {
    out += hex[md[i] >> 4];
    out += hex[md[i] & 15];
  }
  return out;
}

ApiError InternalError(const std::string& context, std::exception_ptr ep) {
  std::string what = "an exception of unknown type";
  try {
    std::rethrow_exception(ep);
  } catch (const std::exception& ex) {
    what = ex.what();
  } catch (...) {
  }
  spdlog::error("request {}: {}: unhandled exception: {}", LogRequestId().empty() ? "-" : LogRequestId(), context, what);
  const std::string& id = LogRequestId();
  return ApiError{500, "server_error",
                  "The server had an error while processing your request." +
                      (id.empty() ? std::string() : " Please include the request id " + id + " if you report it."),
                  "", "server_error"};
}

std::variant<Json, ApiError> ParseBody(const std::string& body) {
  if (JsonDeeperThan(body, kMaxJsonDepth)) {
    return BadRequest("The JSON body of your request nests arrays and objects more than " +
                          std::to_string(kMaxJsonDepth) + " levels deep.",
                      "", "nesting_too_deep");
  }
  Json j = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return BadRequest("We could not parse the JSON body of your request: it is not valid JSON.", "", "invalid_json");
  }
  if (!j.is_object()) return BadRequest("The request body must be a JSON object.", "", "invalid_json");
  return j;
}

namespace {

const char* TypeName(unsigned t) {
  if (t & kString) return "a string";
  if (t & kNumber) return "a number";
  if (t & kInteger) return "an integer";
  if (t & kBool) return "a boolean";
  if (t & kArray) return "an array";
  return "an object";
}

const char* TypeOf(const Json& v) {
  if (v.is_string()) return "a string";
  if (v.is_number()) return "a number";
  if (v.is_boolean()) return "a boolean";
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  return "null";
}

bool HasType(const Json& v, unsigned types) {
  switch (v.type()) {
    case Json::value_t::string: return types & kString;
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned: return types & (kInteger | kNumber);
    case Json::value_t::number_float: return types & kNumber;
    case Json::value_t::boolean: return types & kBool;
    case Json::value_t::array: return types & kArray;
    case Json::value_t::object: return types & kObject;
    default: return false;  // null is handled by the caller; binary and discarded never come from parse
  }
}

}  // namespace

std::optional<ApiError> CheckFields(const Json& body, std::initializer_list<FieldSpec> fields) {
  for (auto it = body.begin(); it != body.end(); ++it) {
    const FieldSpec* spec = nullptr;
    for (const FieldSpec& f : fields) {
      if (it.key() == f.name) spec = &f;
    }
    if (!spec) return BadRequest("Unrecognized request argument supplied: " + it.key(), it.key());
    if (it->is_null() || HasType(*it, spec->types)) continue;
    std::string want;
    for (unsigned bit = 1; bit <= kObject; bit <<= 1) {
      if (!(spec->types & bit) || (bit == kInteger && (spec->types & kNumber))) continue;
      want += want.empty() ? TypeName(bit) : std::string(" or ") + TypeName(bit);
    }
    return BadRequest("Invalid type for '" + it.key() + "': expected " + want + ", but got " + TypeOf(*it) + ".",
                      it.key(), "invalid_type");
  }
  return std::nullopt;
}

bool Absent(const Json& obj, const char* key) {
  auto it = obj.find(key);
  return it == obj.end() || it->is_null();
}

bool BoolOr(const Json& obj, const char* key, bool fallback) {
  auto it = obj.find(key);
  return it != obj.end() && it->is_boolean() ? it->get<bool>() : fallback;
}

Json ValueOr(const Json& obj, const char* key, Json fallback) {
  auto it = obj.find(key);
  return it != obj.end() && !it->is_null() ? *it : fallback;
}

namespace {

// Reads an optional number field; errors when present and not a number (null counts as absent).
std::optional<ApiError> Number(const Json& body, const char* key, double lo, double hi, std::optional<double>* out) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) return BadRequest(std::string("'") + key + "' must be a number", key, "invalid_type");
  double v = it->get<double>();
  if (!std::isfinite(v) || v < lo || v > hi) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "'%s' must be between %g and %g; got %g", key, lo, hi, v);
    return BadRequest(buf, key, "invalid_value");
  }
  *out = v;
  return std::nullopt;
}

std::optional<ApiError> Integer(const Json& body, const char* key, int64_t lo, int64_t hi, std::optional<int64_t>* out) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_number_integer()) return BadRequest(std::string("'") + key + "' must be an integer", key, "invalid_type");
  int64_t v = it->get<int64_t>();
  if (v < lo || v > hi) {
    return BadRequest(std::string("'") + key + "' must be between " + std::to_string(lo) + " and " + std::to_string(hi),
                      key, "invalid_value");
  }
  *out = v;
  return std::nullopt;
}

std::optional<ApiError> Bool(const Json& body, const char* key, std::optional<bool>* out) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) return BadRequest(std::string("'") + key + "' must be a boolean", key, "invalid_type");
  *out = it->get<bool>();
  return std::nullopt;
}

// A seed no other request of this process has had: a random base (the OS's entropy, read once)
// plus a counter, through splitmix64 so neighbouring counters give unrelated streams.
uint64_t FreshSeed() {
  static const uint64_t base = (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
  static std::atomic<uint64_t> counter{0};
  uint64_t z = base + 0x9e3779b97f4a7c15ull * (counter.fetch_add(1, std::memory_order_relaxed) + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

std::optional<ApiError> ParseGeneration(const Json& body, std::initializer_list<const char*> max_token_fields,
                                        TurnRequest* req) {
  std::optional<double> d;
  std::optional<int64_t> i;
  std::optional<bool> b;
  req->sampling.temperature = 1.0f;
  if (auto e = Number(body, "temperature", 0, 2, &d)) return e;
  if (d) req->sampling.temperature = static_cast<float>(*d);
  d.reset();
  if (auto e = Number(body, "top_p", 0, 1, &d)) return e;
  if (d) {
    if (*d <= 0) return BadRequest("'top_p' must be greater than 0", "top_p", "invalid_value");
    req->sampling.top_p = static_cast<float>(*d);
  }
  d.reset();
  if (auto e = Number(body, "min_p", 0, 1, &d)) return e;
  if (d) req->sampling.min_p = static_cast<float>(*d);
  d.reset();
  if (auto e = Number(body, "presence_penalty", -2, 2, &d)) return e;
  if (d) req->sampling.presence_penalty = static_cast<float>(*d);
  d.reset();
  if (auto e = Number(body, "frequency_penalty", -2, 2, &d)) return e;
  if (d) req->sampling.frequency_penalty = static_cast<float>(*d);
  d.reset();
  if (auto e = Number(body, "repetition_penalty", 0.01, 10, &d)) return e;
  if (d) req->sampling.repetition_penalty = static_cast<float>(*d);
  if (auto e = Integer(body, "top_k", 0, 1 << 20, &i)) return e;
  if (i) req->sampling.top_k = static_cast<int32_t>(*i);
  i.reset();
  if (auto e = Integer(body, "seed", INT64_MIN, INT64_MAX, &i)) return e;
  // Without a seed every request draws afresh (OpenAI's behaviour: "regenerate" gives another
  // answer); with one, the same seed, prompt and parameters give the same tokens.
  req->sampling.seed = i ? static_cast<uint64_t>(*i) : FreshSeed();
  i.reset();
  if (auto e = Integer(body, "min_tokens", 0, 1 << 20, &i)) return e;
  if (i) req->min_tokens = static_cast<int>(*i);
  if (auto e = Bool(body, "ignore_eos", &b)) return e;
  if (b) req->ignore_eos = *b;
  req->max_tokens = 1 << 20;  // bounded by the context unless a limit is given
  for (const char* f : max_token_fields) {
    i.reset();
    if (auto e = Integer(body, f, 1, 1 << 20, &i)) return e;
    if (i) {
      req->max_tokens = static_cast<int>(*i);
      break;
    }
  }
  auto it = body.find("stop");
  if (it != body.end() && !it->is_null()) {
    if (it->is_string()) {
      req->stop = {it->get<std::string>()};
    } else if (it->is_array()) {
      for (const auto& s : *it) {
        if (!s.is_string()) return BadRequest("'stop' must be a string or an array of strings", "stop", "invalid_type");
        req->stop.push_back(s.get<std::string>());
      }
    } else {
      return BadRequest("'stop' must be a string or an array of strings", "stop", "invalid_type");
    }
    Status st = StopMatcher::Validate(req->stop);
    if (!st.ok()) return BadRequest(st.error().message, "stop", "invalid_value");
  }
  Status st = req->sampling.Validate();
  if (!st.ok()) return BadRequest(st.error().message, "", "invalid_value");
  return std::nullopt;
}

std::optional<ApiError> ParseChoices(const Json& body, int* n) {
  std::optional<int64_t> i;
  if (auto e = Integer(body, "n", 1, kMaxChoices, &i)) return e;
  *n = i ? static_cast<int>(*i) : 1;
  return std::nullopt;
}

std::optional<ApiError> ParseBestOf(const Json& body, int n, bool stream, int* best_of) {
  std::optional<int64_t> i;
  if (auto e = Integer(body, "best_of", 1, kMaxChoices, &i)) return e;
  *best_of = i ? static_cast<int>(*i) : n;
  if (*best_of < n) {
    return BadRequest("'best_of' must be at least 'n' (" + std::to_string(n) + ")", "best_of", "invalid_value");
  }
  if (stream && *best_of > n) {
    return BadRequest("'best_of' above 'n' cannot be streamed", "best_of", "invalid_value");
  }
  return std::nullopt;
}

std::optional<ApiError> ParseContext(const Json& body, ContextRequest* ctx) {
  std::optional<double> b;
  if (auto e = Number(body, "context_budget", 0, 1e9, &b)) return e;
  if (b) {
    if (*b <= 0) return BadRequest("'context_budget' must be > 0", "context_budget", "invalid_value");
    ctx->budget = *b;
  }
  for (const char* k : {"context_mode", "context_preset"}) {
    auto it = body.find(k);
    if (it == body.end() || it->is_null()) continue;
    if (!it->is_string()) return BadRequest(std::string("'") + k + "' must be a string", k, "invalid_type");
    (std::string(k) == "context_mode" ? ctx->mode : ctx->preset) = it->get<std::string>();
  }
  if (ctx->mode != "reuse" && ctx->mode != "exact") {
    return BadRequest("'context_mode' must be 'reuse' or 'exact'", "context_mode", "invalid_value");
  }
  if (auto it = body.find("context_relevance"); it != body.end() && !it->is_null()) {
    if (!it->is_string()) return BadRequest("'context_relevance' must be a string", "context_relevance", "invalid_type");
    if (!context::ParseRelevanceKind(it->get<std::string>()).ok()) {
      return BadRequest("'context_relevance' must be 'keyword', 'embedding', 'centred', 'whitened', 'hidden' or 'attention'",
                        "context_relevance", "invalid_value");
    }
    ctx->relevance = it->get<std::string>();
  }
  std::optional<int64_t> keep;
  if (auto e = Integer(body, "context_keep_last", 0, 1000000, &keep)) return e;
  if (keep) ctx->keep_last = static_cast<int>(*keep);
  if (auto it = body.find("include"); it != body.end() && !it->is_null()) {
    if (!it->is_array()) return BadRequest("'include' must be an array of strings", "include", "invalid_type");
    for (const Json& v : *it) {
      if (!v.is_string()) return BadRequest("'include' must be an array of strings", "include", "invalid_type");
      if (v.get<std::string>() == "mnemo_context.scores") ctx->scores = true;
    }
  }
  return std::nullopt;
}

Json ContextJson(const ContextReport& r) {
  Json j = {{"kept_turns", r.kept_turns}, {"dropped_turns", r.dropped_turns}, {"kept_tokens", r.kept_tokens},
            {"dropped_tokens", r.dropped_tokens}, {"mode", r.mode}};
  if (r.has_scores) {
    Json scores = Json::array();
    for (size_t t = 0; t < r.scores.size(); t++) {
      const context::TurnScore& s = r.scores[t];
      const bool kept = std::find(r.kept_turns.begin(), r.kept_turns.end(), static_cast<int>(t)) != r.kept_turns.end();
      scores.push_back({{"turn", t}, {"kept", kept}, {"total", s.total}, {"recency", s.recency},
                        {"relevance", s.relevance}, {"information", s.information}});
    }
    j["scores"] = std::move(scores);
    j["method"] = r.method;
    j["relevance"] = r.relevance;
    j["scoring_ms"] = r.scoring_ms;
    j["probe_tokens"] = r.probe_tokens;
  }
  return j;
}

std::string SseData(const Json& j) {
  return "data: " + j.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n\n";
}

std::string SseEvent(const std::string& type, const Json& j) {
  return "event: " + type + "\ndata: " + j.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n\n";
}

int64_t UnixSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

Json ChatUsage(const TurnResult& r) { return ChatUsage(r, static_cast<int64_t>(r.tokens.size())); }

Json ChatUsage(const TurnResult& r, int64_t completion) {
  return {{"prompt_tokens", r.prompt_tokens},
          {"completion_tokens", completion},
          {"total_tokens", r.prompt_tokens + completion},
          {"prompt_tokens_details", {{"cached_tokens", r.sources.cached()}}},
          {"mnemo_tokens_by_source",
           {{"t0", r.sources.t0}, {"t1", r.sources.t1}, {"t2", r.sources.t2}, {"recomputed", r.sources.recomputed},
            {"new", r.sources.fresh}, {"remote", r.sources.remote}}}};
}

Json ResponsesUsage(const TurnResult& r) {
  const int64_t out = static_cast<int64_t>(r.tokens.size());
  return {{"input_tokens", r.prompt_tokens},
          {"input_tokens_details", {{"cached_tokens", r.sources.cached()}}},
          {"output_tokens", out},
          {"output_tokens_details", {{"reasoning_tokens", 0}}},
          {"total_tokens", r.prompt_tokens + out}};
}

}  // namespace mnemo::http
