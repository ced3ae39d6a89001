#include "server/output_format.h"

#include "grammar/json_schema.h"
#include "server/http_util.h"

namespace mnemo {

using http::Json;
using grammar::OrderedJson;

namespace {

ApiError Invalid(const std::string& message, const std::string& param, const std::string& code = "invalid_value") {
  return http::BadRequest(message, param, code);
}

// One format object: {type, ...}; `schema_holder` is where name/schema/strict live (chat nests them
// in json_schema, Responses puts them in the format itself). Sets *text to the grammar ("" = none).
std::optional<ApiError> FormatGrammar(const OrderedJson& format, const std::string& param, bool nested,
                                      std::string* text) {
  if (!format.is_object()) return Invalid("'" + param + "' must be an object", param, "invalid_type");
  auto type = format.find("type");
  if (type == format.end() || !type->is_string())
    return Invalid("Missing required parameter: '" + param + ".type'.", param + ".type", "missing_required_parameter");
  const std::string t = type->get<std::string>();
  if (t == "text") return std::nullopt;
  if (t == "json_object") {
    *text = grammar::JsonObjectGrammar();
    return std::nullopt;
  }
  if (t != "json_schema")
    return Invalid("'" + param + ".type' must be one of 'text', 'json_object', 'json_schema'; got '" + t + "'", param + ".type");
  std::string holder_param = param;
  const OrderedJson* holder = &format;
  if (nested) {
    holder_param = param + ".json_schema";
    auto js = format.find("json_schema");
    if (js == format.end() || js->is_null())
      return Invalid("Missing required parameter: '" + holder_param + "'.", holder_param, "missing_required_parameter");
    if (!js->is_object()) return Invalid("'" + holder_param + "' must be an object", holder_param, "invalid_type");
    holder = &*js;
  }
  for (auto it = holder->begin(); it != holder->end(); ++it) {
    const std::string& k = it.key();
    const bool known = k == "name" || k == "schema" || k == "strict" || k == "description" || (!nested && k == "type");
    if (!known) return Invalid("Unrecognized request argument supplied: " + holder_param + "." + k, holder_param + "." + k, "unknown_parameter");
  }
  auto name = holder->find("name");
  if (name != holder->end() && !name->is_null() && !name->is_string())
    return Invalid("'" + holder_param + ".name' must be a string", holder_param + ".name", "invalid_type");
  auto strict = holder->find("strict");
  if (strict != holder->end() && !strict->is_null() && !strict->is_boolean())
    return Invalid("'" + holder_param + ".strict' must be a boolean", holder_param + ".strict", "invalid_type");
  auto desc = holder->find("description");
  if (desc != holder->end() && !desc->is_null() && !desc->is_string())
    return Invalid("'" + holder_param + ".description' must be a string", holder_param + ".description", "invalid_type");
  auto schema = holder->find("schema");
  const std::string schema_param = holder_param + ".schema";
  if (schema == holder->end() || schema->is_null()) {  // no schema: any JSON object
    *text = grammar::JsonObjectGrammar();
    return std::nullopt;
  }
  if (!schema->is_object() && !schema->is_boolean())
    return Invalid("'" + schema_param + "' must be a JSON Schema object", schema_param, "invalid_type");
  auto g = grammar::SchemaToGrammar(*schema);
  if (!g.ok()) return Invalid("Invalid or unsupported JSON Schema in '" + schema_param + "': " + g.error().message, schema_param, "invalid_json_schema");
  *text = *g;
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> ParseOutputFormat(ServedModel& model, const Json& body, const std::string& raw_body, OutputApi api,
                                          TurnRequest* req, Json* echo, std::string* format_text) {
  const char* format_member = api == OutputApi::kChat ? "response_format" : api == OutputApi::kResponses ? "text" : nullptr;
  const bool has_format = format_member && !http::Absent(body, format_member);
  const bool has_grammar = !http::Absent(body, "grammar");
  if (echo) *echo = Json{{"type", "text"}};
  if (!has_format && !has_grammar) return std::nullopt;
  std::string text, param;
  if (has_format) {
    // The body again, with member order kept (only requests that ask for a format pay this).
    const OrderedJson ordered = OrderedJson::parse(raw_body, nullptr, false);
    if (!ordered.is_object()) return Invalid("the request body must be a JSON object", "");
    const OrderedJson& f = ordered[format_member];
    if (api == OutputApi::kChat) {
      param = "response_format";
      if (auto e = FormatGrammar(f, param, /*nested=*/true, &text)) return e;
      if (f["type"] == "json_schema") param = "response_format.json_schema.schema";
    } else {
      if (!f.is_object()) return Invalid("'text' must be an object", "text", "invalid_type");
      for (auto it = f.begin(); it != f.end(); ++it) {
        if (it.key() != "format" && it.key() != "verbosity")
          return Invalid("Unrecognized request argument supplied: text." + it.key(), "text." + it.key(), "unknown_parameter");
      }
      if (f.contains("verbosity") && !f["verbosity"].is_null() && !f["verbosity"].is_string())
        return Invalid("'text.verbosity' must be a string", "text.verbosity", "invalid_type");
      if (f.contains("format") && !f["format"].is_null()) {
        param = "text.format";
        if (auto e = FormatGrammar(f["format"], param, /*nested=*/false, &text)) return e;
        if (f["format"]["type"] == "json_schema") param = "text.format.schema";
        if (echo) *echo = Json::parse(f["format"].dump());
      }
    }
  }
  if (format_text) *format_text = text;
  if (has_grammar) {
    if (!body["grammar"].is_string()) return Invalid("'grammar' must be a string", "grammar", "invalid_type");
    if (!text.empty()) return Invalid("'grammar' cannot be combined with a JSON " + std::string(api == OutputApi::kChat ? "response_format" : "text.format"), "grammar");
    text = body["grammar"].get<std::string>();
    param = "grammar";
  }
  if (text.empty()) return std::nullopt;
  auto a = model.Grammar(text);
  if (!a.ok()) {
    if (param == "grammar") return Invalid("Invalid grammar: " + a.error().message, "grammar", "invalid_grammar");
    // A compiled schema that fails to parse is our bug, but still the request's problem to report.
    return Invalid("The JSON Schema could not be compiled: " + a.error().message, param, "invalid_json_schema");
  }
  req->grammar = std::move(*a);
  return std::nullopt;
}

}  // namespace mnemo
