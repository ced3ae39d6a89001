// JSON Schema -> grammar: random walks over real vocabularies (any allowed token, uniformly) must
// give JSON that parses and validates, whatever the token boundaries; unsupported schemas are
// refused with the keyword's location.
#include <gtest/gtest.h>

#include <climits>

#include "base/rng.h"
#include "grammar/automaton.h"
#include "grammar/json_schema.h"
#include "schema_validator.h"
#include "split_walks.h"

namespace mnemo::grammar {
namespace {

using J = OrderedJson;
using test::LoadIndex;
using test::RandomWalk;

const std::vector<J>& Schemas() {
  static const std::vector<J> schemas = {
      J::parse(R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 150}, "ok": {"type": "boolean"}},
        "required": ["name", "age", "ok"], "additionalProperties": false})"),
      // Nesting, enums, arrays with bounds, optional members, anyOf, $defs/$ref, zod's bounds.
      J::parse(R"({"$schema": "http://json-schema.org/draft-07/schema#", "title": "T", "type": "object",
        "properties": {
          "kind": {"enum": ["cat", "dog", 3, null, "with \"quotes\""]},
          "tags": {"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": 5}, "minItems": 1, "maxItems": 3},
          "pos": {"$ref": "#/$defs/point"},
          "id": {"type": "integer", "minimum": -9007199254740991, "maximum": 9007199254740991},
          "score": {"type": "number", "minimum": -2.5, "maximum": 10},
          "note": {"anyOf": [{"type": "string", "maxLength": 8}, {"type": "null"}]},
          "v": {"const": "v1"}},
        "required": ["kind", "tags", "pos", "id"], "additionalProperties": false,
        "$defs": {"point": {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "integer", "exclusiveMinimum": 0}},
          "required": ["x", "y"], "additionalProperties": false, "description": "a point"}}})"),
      // Recursion through $ref, a map, strings with minLength, nullable.
      J::parse(R"({"type": "object", "properties": {"tree": {"$ref": "#/definitions/node"},
        "meta": {"type": "object", "additionalProperties": {"type": "integer", "minimum": 1, "maximum": 9}},
        "s": {"type": "string", "minLength": 2, "maxLength": 4, "nullable": true}},
        "required": ["tree", "meta", "s"],
        "definitions": {"node": {"type": "object", "properties": {"v": {"type": "integer"},
          "kids": {"type": "array", "items": {"$ref": "#/definitions/node"}, "maxItems": 2}}, "required": ["v"], "additionalProperties": false}}})"),
      J::parse(R"({"type": "array", "items": {"type": ["string", "number", "boolean"]}, "maxItems": 4})"),
      // zod 4's z.record(z.string(), ...): a map whose propertyNames constrain nothing.
      J::parse(R"({"type": "object", "properties": {"r": {"type": "object", "propertyNames": {"type": "string"},
        "additionalProperties": {"type": "integer", "minimum": 0, "maximum": 3}}}, "required": ["r"],
        "additionalProperties": false})"),
      J::parse(R"({"type": "object"})"),
      // Formats and patterns (json_regex.h): direct grammar, a product with a length counter, an
      // unanchored pattern.
      J::parse(R"({"type": "object", "properties": {"when": {"type": "string", "format": "date-time"},
        "who": {"type": "string", "format": "email", "maxLength": 20}, "code": {"type": "string", "pattern": "^[A-Z]{2}-\\d{3}$"},
        "tag": {"type": "string", "pattern": "ok", "maxLength": 6}}, "required": ["when", "who", "code", "tag"], "additionalProperties": false})"),
  };
  return schemas;
}

// multipleOf, tuples and records of an enum's keys, as zod 4 and pydantic write them.
const std::vector<J>& KeywordSchemas() {
  static const std::vector<J> schemas = {
      J::parse(R"({"type": "object", "properties": {
        "few": {"type": "integer", "multipleOf": 7, "minimum": -20, "maximum": 103},
        "five": {"type": "integer", "multipleOf": 5, "minimum": -9007199254740991, "maximum": 9007199254740991},
        "seven": {"type": "integer", "multipleOf": 7},
        "twelve": {"type": "integer", "multipleOf": 12, "minimum": -1001, "maximum": 100001},
        "cents": {"type": "number", "multipleOf": 0.01, "minimum": -2.5, "maximum": 10},
        "step": {"type": "number", "multipleOf": 0.001},
        "three": {"type": "number", "multipleOf": 3, "exclusiveMaximum": 0},
        "halves": {"type": "integer", "multipleOf": 2.5, "minimum": -50, "maximum": 5000}},
        "required": ["few", "five", "seven", "twelve", "cents", "step", "three", "halves"], "additionalProperties": false})"),
      J::parse(R"({"type": "object", "properties": {
        "t2020": {"type": "array", "prefixItems": [{"type": "string", "maxLength": 3}, {"type": "integer", "minimum": 0, "maximum": 5}],
          "items": false, "minItems": 2, "maxItems": 2},
        "t7": {"type": "array", "items": [{"type": "string", "maxLength": 3}, {"type": "integer", "minimum": 0, "maximum": 5}],
          "additionalItems": false, "minItems": 2, "maxItems": 2},
        "rest": {"type": "array", "prefixItems": [{"type": "string", "maxLength": 2}], "items": {"type": "integer", "minimum": 0, "maximum": 9},
          "minItems": 1, "maxItems": 4},
        "rest7": {"type": "array", "items": [{"type": "boolean"}], "additionalItems": {"type": "null"}, "minItems": 1},
        "opt": {"type": "array", "prefixItems": [{"type": "string", "maxLength": 2}, {"type": "number", "minimum": 0, "maximum": 1},
          {"type": "boolean"}], "items": false, "minItems": 1, "maxItems": 3},
        "open": {"type": "array", "prefixItems": [{"type": "boolean"}], "minItems": 2}},
        "required": ["t2020", "t7", "rest", "rest7", "opt", "open"], "additionalProperties": false})"),
      J::parse(R"({"type": "object", "properties": {
        "rec": {"type": "object", "propertyNames": {"type": "string", "enum": ["a", "b"]}, "additionalProperties": {"type": "number"},
          "required": ["a", "b"]},
        "partial": {"type": "object", "propertyNames": {"type": "string", "enum": ["x", "y", "z"]},
          "additionalProperties": {"type": "integer", "minimum": 0, "maximum": 9}},
        "none": {"type": "object", "propertyNames": {"not": {}}, "additionalProperties": {"type": "number"}},
        "untyped": {"propertyNames": {"const": "k"}},
        "mixed": {"type": "object", "propertyNames": {"enum": ["p", "q"]}, "properties": {"p": {"type": "boolean"}, "r": {"type": "null"}},
          "additionalProperties": {"type": "string", "maxLength": 2}, "required": ["p"]}},
        "required": ["rec", "partial", "none", "untyped", "mixed"], "additionalProperties": false})"),
  };
  return schemas;
}

void CheckWalks(const std::string& vocab_file, int walks_per_schema, int budget, const std::vector<J>& schemas = Schemas()) {
  auto idx = LoadIndex(vocab_file);
  ASSERT_TRUE(idx) << vocab_file;
  Rng rng(42);
  for (const J& schema : schemas) {
    auto text = SchemaToGrammar(schema);
    ASSERT_TRUE(text.ok()) << text.error().message;
    auto g = Grammar::Parse(*text);
    ASSERT_TRUE(g.ok()) << g.error().message << "\n" << *text;
    auto a = std::make_shared<Automaton>(std::make_shared<Grammar>(std::move(*g)), idx);
    for (int w = 0; w < walks_per_schema; ++w) {
      bool ended = false;
      const std::string out = RandomWalk(a, rng, budget, &ended);
      ASSERT_TRUE(ended) << "not complete within " << budget << " tokens: " << out;
      if (getenv("MNEMO_SHOW_WALKS")) printf("%s\n", out.c_str());
      J value = J::parse(out, nullptr, false);
      ASSERT_FALSE(value.is_discarded()) << "does not parse: " << out << "\nschema " << schema.dump();
      const std::string why = test::Validate(schema, value, schema);
      ASSERT_EQ(why, "") << out << "\nschema " << schema.dump();
    }
  }
}

TEST(JsonSchema, RandomWalksValidateStories260K) { CheckWalks("stories260K/stories260K.gguf", 40, 160); }
TEST(JsonSchema, RandomWalksValidateLlamaSpm32k) { CheckWalks("vocab/ggml-vocab-llama-spm.gguf", 6, 120); }
TEST(JsonSchema, RandomWalksValidateGpt2) { CheckWalks("vocab/ggml-vocab-gpt-2.gguf", 6, 120); }
TEST(JsonSchema, KeywordWalksValidateStories260K) { CheckWalks("stories260K/stories260K.gguf", 30, 400, KeywordSchemas()); }
TEST(JsonSchema, KeywordWalksValidateGpt2) { CheckWalks("vocab/ggml-vocab-gpt-2.gguf", 6, 300, KeywordSchemas()); }

// Per-element masks (automaton.h) against whole walks of every new state, on real vocabularies
// and schemas with bounded strings, numbers and arrays: equal masks at every step, with budgets
// from unbounded to below what closing needs.
void CheckSplitMasks(const std::string& vocab_file, int walks_per_schema, uint64_t seed) {
  auto idx = LoadIndex(vocab_file);
  ASSERT_TRUE(idx) << vocab_file;
  std::vector<J> schemas = Schemas();
  schemas.insert(schemas.end(), KeywordSchemas().begin(), KeywordSchemas().end());
  schemas.push_back(J::parse(R"({"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 24}, "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "id": {"type": "integer", "minimum": -9007199254740991, "maximum": 9007199254740991},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 4},
    "score": {"type": "number", "minimum": 0, "maximum": 1}, "kind": {"enum": ["a", "b", "c"]},
    "note": {"anyOf": [{"type": "string", "maxLength": 40}, {"type": "null"}]}},
    "required": ["name", "age", "id", "tags", "score", "kind", "note"], "additionalProperties": false})"));
  Rng rng(seed);
  for (const J& schema : schemas) {
    auto a = test::ExpectSchemaSplitMasksEqual(
        schema, idx, walks_per_schema,
        [](int w, int cost) {
          const int kinds[] = {INT_MAX, 64, cost + w % 3, std::max(1, cost - 2), cost + 10};
          return kinds[w % 5];
        },
        80, rng);
    if (!a || ::testing::Test::HasFatalFailure()) return;
    EXPECT_GT(a->stats().masks_split, 0) << schema.dump();
  }
}

TEST(JsonSchema, SplitMasksEqualWholeWalksLlamaSpm32k) { CheckSplitMasks("vocab/ggml-vocab-llama-spm.gguf", 10, 5); }
TEST(JsonSchema, SplitMasksEqualWholeWalksGpt2) { CheckSplitMasks("vocab/ggml-vocab-gpt-2.gguf", 5, 6); }
TEST(JsonSchema, SplitMasksEqualWholeWalksStories260K) { CheckSplitMasks("stories260K/stories260K.gguf", 20, 7); }

TEST(JsonSchema, JsonObjectGrammarGivesObjects) {
  auto idx = LoadIndex("stories260K/stories260K.gguf");
  ASSERT_TRUE(idx);
  auto g = Grammar::Parse(JsonObjectGrammar());
  ASSERT_TRUE(g.ok()) << g.error().message;
  auto a = std::make_shared<Automaton>(std::make_shared<Grammar>(std::move(*g)), idx);
  Rng rng(3);
  for (int w = 0; w < 30; ++w) {
    bool ended;
    const std::string out = RandomWalk(a, rng, 100, &ended);
    ASSERT_TRUE(ended) << out;
    J v = J::parse(out, nullptr, false);
    ASSERT_TRUE(v.is_object()) << out;
  }
}

TEST(JsonSchema, UnsupportedKeywordsNameTheirLocation) {
  auto err = [](const char* s) {
    auto r = SchemaToGrammar(J::parse(s));
    return r.ok() ? std::string("ok") : r.error().message;
  };
  EXPECT_NE(err(R"({"type": "object", "patternProperties": {"^a": {}}})").find("'/patternProperties'"), std::string::npos);
  EXPECT_NE(err(R"({"properties": {"a b": {"type": "array", "uniqueItems": true}}})").find("'/properties/a b/uniqueItems'"), std::string::npos);
  EXPECT_NE(err(R"({"$ref": "#/$defs/missing"})").find("does not resolve"), std::string::npos);
  EXPECT_NE(err(R"({"type": "integer", "minimum": 5, "maximum": 4})").find("bounds"), std::string::npos);
  EXPECT_NE(err(R"({"type": "frog"})").find("unknown type"), std::string::npos);
  EXPECT_NE(err(R"({"enum": []})").find("non-empty"), std::string::npos);
  EXPECT_NE(err(R"({"type": "object", "required": ["x"], "additionalProperties": false})").find("not in properties"), std::string::npos);
  EXPECT_EQ(err(R"({"type": "string", "format": "email", "title": "t", "description": "d", "examples": ["a"]})"), "ok");
  EXPECT_EQ(err("true"), "ok");
  // propertyNames only when every name passes (names are strings).
  EXPECT_EQ(err(R"({"type": "object", "propertyNames": {"type": "string"}, "additionalProperties": {"type": "integer"}})"), "ok");
  EXPECT_EQ(err(R"({"type": "object", "propertyNames": {}})"), "ok");
  EXPECT_NE(err(R"({"type": "object", "propertyNames": {"type": "string", "maxLength": 3}})").find("'/propertyNames'"), std::string::npos);
  EXPECT_NE(err(R"({"type": "object", "propertyNames": {"enum": ["a"], "maxLength": 3}})").find("'/propertyNames'"), std::string::npos);
  EXPECT_NE(err(R"({"type": "object", "propertyNames": {"enum": ["a", 1]}})").find("'/propertyNames'"), std::string::npos);
  EXPECT_EQ(err(R"({"type": "object", "propertyNames": {"enum": []}})"), "ok");
  EXPECT_NE(err(R"({"type": "object", "propertyNames": {"enum": ["a"]}, "required": ["b"]})").find("'/required'"), std::string::npos);
  // multipleOf: what is not generated exactly is a 400 naming the keyword.
  EXPECT_NE(err(R"({"type": "number", "multipleOf": 0.25})").find("'/multipleOf'"), std::string::npos);
  EXPECT_NE(err(R"({"type": "integer", "multipleOf": 0})").find("'/multipleOf'"), std::string::npos);
  EXPECT_NE(err(R"({"type": "integer", "multipleOf": -5})").find("'/multipleOf'"), std::string::npos);
  EXPECT_NE(err(R"({"type": "integer", "multipleOf": 10007})").find("'/multipleOf'"), std::string::npos);
  EXPECT_EQ(err(R"({"type": "integer", "multipleOf": 10007, "minimum": 0, "maximum": 1000000})"), "ok");  // 100 multiples: a list
  EXPECT_NE(err(R"({"type": "integer", "multipleOf": 7, "minimum": 1, "maximum": 6})").find("no multiple of 7"), std::string::npos);
  EXPECT_NE(err(R"({"properties": {"n": {"type": "integer", "multipleOf": 9973}}})").find("'/properties/n/multipleOf'"), std::string::npos);
  for (int m : {5, 12, 97, 100, 4096}) {
    const std::string safe = R"({"type": "integer", "minimum": -9007199254740991, "maximum": 9007199254740991, "multipleOf": )";
    EXPECT_EQ(err((safe + std::to_string(m) + "}").c_str()), "ok") << m;
  }
  // Tuples: minItems past a closed tuple.
  EXPECT_NE(err(R"({"type": "array", "prefixItems": [{}], "items": false, "minItems": 2})").find("minItems"), std::string::npos);
  EXPECT_NE(err(R"({"type": "array", "items": false, "minItems": 1})").find("minItems"), std::string::npos);
}

}  // namespace
}  // namespace mnemo::grammar

