// JSON Schema -> grammar text (grammar.h). The grammar generates a subset of the JSON texts the
// schema accepts, so that every output of a matcher over it validates:
//   - type (string or array of types), enum, const, anyOf / oneOf (as alternatives), allOf with one
//     member, $ref into the document ("#", "#/$defs/...", "#/definitions/...", recursive ones too),
//     nullable (OpenAPI);
//   - object: properties in the schema's order (required ones always, optional ones may be left
//     out), never properties beyond `properties` (whatever additionalProperties says); with no
//     properties, additionalProperties: false gives {} and a schema gives a map of such values;
//     propertyNames listing names (enum / const of strings, or none: zod's z.record(z.enum(...)))
//     gives those names as properties (their `properties` schema, else additionalProperties);
//   - array: items, minItems, maxItems; tuples (prefixItems then items, or draft-07's items array
//     then additionalItems) in order, positions past minItems optional, items past the prefix from
//     the rest schema (absent or true: only as many json values as minItems needs);
//   - string: minLength, maxLength (code points; an escape is one), all JSON escapes except lone
//     surrogates (\uD800-\uDFFF: a JSON parser refuses them); pattern (an ECMA-262 subset) and
//     format (date-time, date, time, duration, email, hostname, ipv4, ipv6, uuid, uri), each with
//     the others and the length bounds, as an intersection when several hold (json_regex.h); an
//     enum's or a const's strings must satisfy them;
//   - integer: minimum, maximum, exclusiveMinimum, exclusiveMaximum exactly, as decimal digit-range
//     alternatives (zod's +-(2^53-1) cost ~16 alternatives per digit count, not 2^53); bounds past
//     +-(10^18 - 1) are clamped to it; multipleOf exactly (read as the decimal the client wrote):
//     a list when the bounds hold at most 256 multiples, else the remainder automaton of m <= 10000
//     intersected with the digit ranges (at most 2,000 rules);
//   - number: the same bounds, rounded inward to integers (a fraction is allowed strictly between
//     them; no exponent when bounded); multipleOf an integer gives its integer multiples, 10^-k at
//     most k fraction digits (no exponent), other fractions are refused;
//   - annotations ($schema, $id, title, description, default, examples, unknown formats, ...) are
//     ignored.
// Keywords that constrain values in ways a grammar here cannot honour (uniqueItems, not,
// if/then/else, contains, min/maxProperties, ...) are errors naming the keyword and its JSON
// pointer in the schema.
//
// Compose grammars (a tool-call grammar wraps several schemas): create one SchemaCompiler, Add()
// each schema under its own rule name, write the rules that reference them, and join Text().
#pragma once

#include <map>
#include <optional>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "base/status.h"

namespace mnemo::grammar {

// Ordered: properties are generated in the order the schema lists them.
using OrderedJson = nlohmann::ordered_json;

class SchemaCompiler {
 public:
  SchemaCompiler() = default;
  // Adds rule `name` (letters, digits, '-', '_') for the values `schema` accepts; its $refs
  // resolve against `schema` as the document. Errors (kInvalidArgument) name the JSON pointer.
  Status Add(const std::string& name, const OrderedJson& schema);
  // Every rule added so far, one per line.
  std::string Text() const;

 private:
  Result<std::string> Visit(const OrderedJson& s, const std::string& path);
  Result<std::string> TypeExpr(const std::string& type, const OrderedJson& s, const std::string& path);
  Result<std::string> ObjectExpr(const OrderedJson& s, const std::string& path);
  Result<std::string> ArrayExpr(const OrderedJson& s, const std::string& path);
  // The tuple `list` (prefixItems or draft-07's items array, at `path`), then `rest` (an item
  // expression) past it.
  Result<std::string> TupleExpr(const OrderedJson& list, const std::string& path, const std::string& rest, bool rest_none, bool rest_given,
                                int64_t min, int64_t max);
  Result<std::string> StringExpr(const OrderedJson& s, const std::string& path);
  Result<std::string> NumberExpr(const OrderedJson& s, const std::string& path, bool integer);
  // The multiples of m within [lo, hi] (absent: the +-(10^18 - 1) clamp); errors name `path`.
  Result<std::string> MultipleExpr(std::optional<int64_t> lo, std::optional<int64_t> hi, uint64_t m, const std::string& path);
  Result<std::string> RefRule(const std::string& ref, const std::string& path);
  // A string schema's `format` and `pattern` with its length bounds (json_regex.h).
  Result<std::string> PatternExpr(const OrderedJson& s, const std::string& path, int64_t min, int64_t max);
  // Drops the string values of `enum` / `const` that fail `format`, `pattern` or the length bounds.
  Result<std::vector<OrderedJson>> AllowedValues(const OrderedJson& s, const std::string& path, const std::string& key);
  // A rule holding `body`, named after `hint` (made unique); returns its name.
  std::string NewRule(const std::string& hint, const std::string& body);
  // The shared rules (ws, json-string, json-value, ...), added on first use; returns `name`.
  std::string Common(const std::string& name);

  const OrderedJson* doc_ = nullptr;                 // the document $refs resolve in
  std::vector<std::pair<std::string, std::string>> rules_;  // name, body
  std::set<std::string> names_;
  std::map<std::string, int> suffix_;                // NewRule's last suffix per base name
  std::map<std::string, std::string> refs_;          // $ref -> rule name
  std::map<std::string, std::string> shared_;        // body -> rule name (patterns' character sets)
};

// A whole grammar (start rule `root`) for values of `schema`.
Result<std::string> SchemaToGrammar(const OrderedJson& schema);
// A whole grammar for any JSON object (response_format json_object).
std::string JsonObjectGrammar();

// Integer range helpers (exposed for tests): alternatives for lo..hi as a grammar expression.
std::string IntegerRangeExpr(const int64_t* lo, const int64_t* hi);

}  // namespace mnemo::grammar
