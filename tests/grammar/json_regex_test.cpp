// JSON Schema `format` and `pattern`: random walks over a real vocabulary must give JSON strings
// whose decoded value passes the test validator (schema_validator.h: each format checked from its
// RFC's grammar, patterns by std::wregex, ECMAScript search semantics); zod 4's schemas (format and
// pattern together, length bounds) compile and hold both; random patterns agree with std::regex;
// what the subset leaves out is refused with its location.
#include <gtest/gtest.h>

#include <regex>

#include "base/rng.h"
#include "grammar/automaton.h"
#include "grammar/json_regex.h"
#include "grammar/json_schema.h"
#include "schema_validator.h"
#include "split_walks.h"
#include "tokenizer/unicode.h"

namespace mnemo::grammar {
namespace {

using J = OrderedJson;
using test::FormatValid;

// The value checked by the schema validator (schema_validator.h: formats from the RFCs' grammars,
// patterns by std::wregex), written independently of the compiler.
std::string Check(const J& s, const std::string& v) { return test::Validate(s, J(v), s); }

std::wstring Wide(const std::string& utf8) {
  std::wstring w;
  for (uint32_t c : DecodeUtf8Lenient(utf8)) w += static_cast<wchar_t>(c);
  return w;
}

TEST(JsonRegex, ChecksAgreeWithExamples) {
  EXPECT_TRUE(FormatValid("date", "2024-02-29") && FormatValid("date", "2000-02-29") && !FormatValid("date", "1900-02-29") && !FormatValid("date", "2023-04-31"));
  EXPECT_TRUE(FormatValid("date-time", "2023-12-31T23:59:59.123+05:30") && !FormatValid("date-time", "2023-12-31T24:00:00Z"));
  EXPECT_TRUE(FormatValid("duration", "P1Y2M3DT4H5M6S") && FormatValid("duration", "PT1S") && FormatValid("duration", "P3W") && !FormatValid("duration", "P1YT") &&
              !FormatValid("duration", "P1Y1D") && !FormatValid("duration", "P") && !FormatValid("duration", "PT1H1S"));
  EXPECT_TRUE(FormatValid("email", "a.b+c@x-y.example") && !FormatValid("email", "a..b@x.y") && !FormatValid("email", "a@-x.y"));
  EXPECT_TRUE(FormatValid("ipv4", "255.0.10.1") && !FormatValid("ipv4", "256.1.1.1") && !FormatValid("ipv4", "01.1.1.1"));
  EXPECT_TRUE(FormatValid("ipv6", "::") && FormatValid("ipv6", "1:2:3:4:5:6:7::") && FormatValid("ipv6", "fe80::1") && !FormatValid("ipv6", "1::2::3"));
  EXPECT_TRUE(FormatValid("uuid", "123e4567-e89b-12d3-a456-426614174000") && FormatValid("uri", "https://a.b/c?d#e") && !FormatValid("uri", "a:b#c#d"));
}

// ---- Walks ------------------------------------------------------------------------------------

std::shared_ptr<Automaton> Compile(const J& schema, const std::shared_ptr<const TokenIndex>& idx) {
  auto text = SchemaToGrammar(schema);
  EXPECT_TRUE(text.ok()) << text.error().message << "\n" << schema.dump();
  if (!text.ok()) return nullptr;
  auto g = Grammar::Parse(*text);
  EXPECT_TRUE(g.ok()) << g.error().message << "\n" << *text;
  if (!g.ok()) return nullptr;
  return std::make_shared<Automaton>(std::make_shared<Grammar>(std::move(*g)), idx);
}

// Walks a string schema `walks` times; each output must be one JSON string passing Check.
void WalkString(const std::shared_ptr<const TokenIndex>& idx, const J& schema, int walks, int budget, Rng& rng) {
  auto a = Compile(schema, idx);
  ASSERT_TRUE(a);
  for (int w = 0; w < walks; ++w) {
    bool ended = false;
    const std::string out = test::RandomWalk(a, rng, budget, &ended);
    ASSERT_TRUE(ended) << "not complete within " << budget << " tokens: " << out << "\nschema " << schema.dump();
    if (getenv("MNEMO_SHOW_WALKS")) printf("%s\n", out.c_str());
    const J v = J::parse(out, nullptr, false);
    ASSERT_TRUE(v.is_string()) << "not a JSON string: " << out << "\nschema " << schema.dump();
    EXPECT_EQ(Check(schema, v.get<std::string>()), "") << out << "\nschema " << schema.dump();
  }
}

const char* const kFormats[] = {"date-time", "date", "time", "duration", "email", "hostname", "ipv4", "ipv6", "uuid", "uri"};

TEST(JsonRegex, FormatWalksAreValid) {
  auto idx = test::LoadIndex("vocab/ggml-vocab-llama-spm.gguf");
  ASSERT_TRUE(idx);
  Rng rng(11);
  for (const char* f : kFormats) WalkString(idx, J{{"type", "string"}, {"format", f}}, 8, 96, rng);
}

TEST(JsonRegex, PatternWalksMatch) {
  auto idx = test::LoadIndex("vocab/ggml-vocab-llama-spm.gguf");
  ASSERT_TRUE(idx);
  Rng rng(12);
  const char* const patterns[] = {
      R"(^[A-Z]{3}-\d{2,4}$)",
      R"(ab+c)",                       // unanchored: anything before and after
      R"(^x.{2,5}$)",                  // '.' with JSON escapes
      R"(^[^a-z0-9]{1,6}$)",           // a negated class: quotes, backslashes, controls
      R"(^"\\/\u00e9\x41?\S$)",        // characters JSON escapes, non-ASCII, \S
      R"(^(?:foo|ba[rz])+(-\w+)*?$)",  // groups, alternation, a lazy quantifier
      R"(^(a?b?){2,3}$)",              // a repetition of something empty: the NFA path
      R"(\.json$|^/)",                 // one anchor per alternative
      R"(^\d*$)",
  };
  for (const char* p : patterns) WalkString(idx, J{{"type", "string"}, {"pattern", p}}, 8, 48, rng);
  // Lengths that cut into a pattern's language: the product path.
  WalkString(idx, J{{"type", "string"}, {"pattern", R"(\d{3})"}, {"minLength", 4}, {"maxLength", 6}}, 8, 48, rng);
  WalkString(idx, J{{"type", "string"}, {"format", "email"}, {"maxLength", 24}}, 8, 64, rng);
}

// What zod 4 writes (z.toJSONSchema): a format and its pattern together, lengths on top.
const J& ZodSchema() {
  static const J schema = J::parse(R"json({"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
  "properties": {
   "email": {"type": "string", "maxLength": 40, "format": "email", "pattern": "^(?:[A-Za-z0-9_'+\\-]+\\.)*[A-Za-z0-9_'+\\-]*[A-Za-z0-9_+-]@(?:[A-Za-z0-9][A-Za-z0-9\\-]*\\.)+[A-Za-z]{2,}$"},
   "uuid": {"type": "string", "format": "uuid", "pattern": "^([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[1-8][0-9a-fA-F]{3}-[89abAB][0-9a-fA-F]{3}-[0-9a-fA-F]{12}|00000000-0000-0000-0000-000000000000|ffffffff-ffff-ffff-ffff-ffffffffffff)$"},
   "dt": {"type": "string", "format": "date-time", "pattern": "^(?:(?:\\d\\d[2468][048]|\\d\\d[13579][26]|\\d\\d0[48]|[02468][048]00|[13579][26]00)-02-29|\\d{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\\d|30)|(?:02)-(?:0[1-9]|1\\d|2[0-8])))T(?:(?:[01]\\d|2[0-3]):[0-5]\\d:[0-5]\\d(?:\\.\\d+)?(?:Z|([+-](?:[01]\\d|2[0-3]):[0-5]\\d)))$"},
   "d": {"type": "string", "format": "date", "pattern": "^(?:(?:\\d\\d[2468][048]|\\d\\d[13579][26]|\\d\\d0[48]|[02468][048]00|[13579][26]00)-02-29|\\d{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\\d|30)|(?:02)-(?:0[1-9]|1\\d|2[0-8])))$"},
   "t": {"type": "string", "pattern": "^(?:[01]\\d|2[0-3]):[0-5]\\d(?::[0-5]\\d(?:\\.\\d+)?)?$"},
   "ip4": {"type": "string", "format": "ipv4", "pattern": "^(?:(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9][0-9]|[0-9])\\.){3}(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9][0-9]|[0-9])$"},
   "ip6": {"type": "string", "format": "ipv6", "pattern": "^(([0-9a-fA-F]{1,4}:){7}[0-9a-fA-F]{1,4}|([0-9a-fA-F]{1,4}:){1,7}:|([0-9a-fA-F]{1,4}:){1,6}:[0-9a-fA-F]{1,4}|([0-9a-fA-F]{1,4}:){1,5}(:[0-9a-fA-F]{1,4}){1,2}|([0-9a-fA-F]{1,4}:){1,4}(:[0-9a-fA-F]{1,4}){1,3}|([0-9a-fA-F]{1,4}:){1,3}(:[0-9a-fA-F]{1,4}){1,4}|([0-9a-fA-F]{1,4}:){1,2}(:[0-9a-fA-F]{1,4}){1,5}|[0-9a-fA-F]{1,4}:((:[0-9a-fA-F]{1,4}){1,6})|:((:[0-9a-fA-F]{1,4}){1,7}|:))$"},
   "url": {"type": "string", "format": "uri"},
   "dur": {"type": "string", "format": "duration", "pattern": "^P(?:(\\d+W)|(?!.*W)(?=\\d|T\\d)(\\d+Y)?(\\d+M)?(\\d+D)?(T(?=\\d)(\\d+H)?(\\d+M)?(\\d+([.,]\\d+)?S)?)?)$"},
   "host": {"type": "string", "format": "hostname", "pattern": "^(?=.{1,253}\\.?$)[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?(?:\\.[a-zA-Z0-9](?:[-0-9a-zA-Z]{0,61}[0-9a-zA-Z])?)*\\.?$"}
  }, "required": ["email", "uuid", "dt", "d", "t", "ip4", "ip6", "url", "dur", "host"], "additionalProperties": false})json");
  return schema;
}

TEST(JsonRegex, ZodFormatsWithPatternsWalkValid) {
  auto idx = test::LoadIndex("vocab/ggml-vocab-llama-spm.gguf");
  ASSERT_TRUE(idx);
  Rng rng(13);
  for (const auto& [name, s] : ZodSchema()["properties"].items()) WalkString(idx, s, 6, 80, rng);
  // z.email().max(100): the product with a length counter is over the limits at 100, so the
  // strings are capped shorter; still valid.
  J email = ZodSchema()["properties"]["email"];
  email["maxLength"] = 100;
  WalkString(idx, email, 4, 80, rng);
  // The whole object compiles (one grammar, shared character rules).
  EXPECT_TRUE(Compile(ZodSchema(), idx));
}

// Per-element masks against whole walks on the new grammar shapes (right-linear product rules,
// character-set rules with escapes).
TEST(JsonRegex, SplitMasksEqualWholeWalks) {
  auto idx = test::LoadIndex("vocab/ggml-vocab-llama-spm.gguf");
  ASSERT_TRUE(idx);
  Rng rng(14);
  const J schema = J::parse(R"({"type": "object", "properties": {
    "when": {"type": "string", "format": "date-time"}, "who": {"type": "string", "format": "email", "maxLength": 30},
    "code": {"type": "string", "pattern": "^[A-Z]{2}[^\"]{0,12}$"}, "any": {"type": "string", "pattern": "x.y"}},
    "required": ["when", "who", "code", "any"], "additionalProperties": false})");
  test::ExpectSchemaSplitMasksEqual(schema, idx, 6, [](int w, int cost) { return w % 2 ? INT_MAX : cost + 8; }, 120, rng);
}

// A random pattern from the subset: alternatives of atoms (characters, classes, groups) with
// quantifiers, anchors at the top level's edges.
std::string RandomPattern(Rng& rng, int depth) {
  const char* const atoms[] = {"a", "b", "c", ".", "\\d", "\\D", "\\w", "[ab]", "[^a]", "[a-c0]", "\\.", "-", "0", "]", "}", "x"};
  const char* const quants[] = {"", "", "", "*", "+", "?", "*?", "{2}", "{1,3}", "{0,2}", "{2,}", "+?"};
  std::string p;
  for (int alt = 0, alts = 1 + static_cast<int>(rng.Next() % 3 == 0); alt < alts; ++alt) {
    if (alt) p += "|";
    if (depth == 0 && rng.Next() % 3 == 0) p += "^";
    for (int n = static_cast<int>(rng.Next() % 4); n >= 0; --n) {
      const uint64_t r = rng.Next() % 8;
      if (r == 0 && depth < 2) p += "(" + RandomPattern(rng, depth + 1) + ")";
      else if (r == 1 && depth < 2) p += "(?:" + RandomPattern(rng, depth + 1) + ")";
      else p += atoms[rng.Next() % std::size(atoms)];
      p += quants[rng.Next() % std::size(quants)];
    }
    if (depth == 0 && rng.Next() % 3 == 0) p += "$";
  }
  return p;
}

// Random patterns: the NFA the compiler builds and std::regex (ECMAScript, search) agree on random
// strings, and every schema built on one compiles to a grammar that parses, alone and with length
// bounds (the direct and the product paths).
TEST(JsonRegex, RandomPatternsAgreeWithStdRegex) {
  const char alphabet[] = "abc01.-x";
  Rng rng(15);
  for (int i = 0; i < 400; ++i) {
    const std::string p = RandomPattern(rng, 0);
    const std::wregex want(Wide(p), std::regex::ECMAScript);
    auto re = ParsePattern(p);
    ASSERT_TRUE(re.ok()) << p << ": " << re.error().message;
    auto nfa = BuildNfa(*re);
    ASSERT_TRUE(nfa.ok()) << p;
    for (int k = 0; k < 20; ++k) {
      std::string str;
      for (int n = static_cast<int>(rng.Next() % 7); n > 0; --n) str += alphabet[rng.Next() % (sizeof alphabet - 1)];
      const std::vector<uint32_t> cps(str.begin(), str.end());
      ASSERT_EQ(NfaMatches(*nfa, cps), std::regex_search(Wide(str), want)) << "pattern " << p << " string '" << str << "'";
    }
    if (getenv("MNEMO_SHOW_WALKS") && i % 50 == 0) printf("%s\n", p.c_str());
    for (const J& schema : {J{{"pattern", p}}, J{{"pattern", p}, {"minLength", 1}, {"maxLength", 4}}}) {
      auto text = SchemaToGrammar(schema);
      if (!text.ok()) {
        EXPECT_NE(text.error().message.find("no string satisfies"), std::string::npos) << schema.dump() << ": " << text.error().message;
        continue;
      }
      auto g = Grammar::Parse(*text);
      ASSERT_TRUE(g.ok()) << schema.dump() << ": " << g.error().message << "\n" << *text;
    }
  }
}

// ---- Enum, const, refusals ------------------------------------------------------------------

std::string Err(const std::string& schema) {
  auto r = SchemaToGrammar(J::parse(schema));
  return r.ok() ? std::string("ok") : r.error().message;
}

TEST(JsonRegex, EnumAndConstHoldToFormatAndPattern) {
  auto g = SchemaToGrammar(J::parse(R"({"type": "string", "pattern": "^a", "enum": ["ab", "ba", "ac"]})"));
  ASSERT_TRUE(g.ok());
  EXPECT_NE(g->find("\\\"ab\\\""), std::string::npos);
  EXPECT_EQ(g->find("\\\"ba\\\""), std::string::npos);
  EXPECT_NE(Err(R"({"type": "string", "format": "date", "const": "2023-02-29"})").find("'/const'"), std::string::npos);
  EXPECT_EQ(Err(R"({"type": "string", "format": "date", "const": "2024-02-29"})"), "ok");
  EXPECT_NE(Err(R"({"enum": ["x", "yy"], "minLength": 3})").find("'/enum'"), std::string::npos);
}

TEST(JsonRegex, RefusalsNameTheKeyword) {
  auto refused = [](const std::string& pattern, const char* why) {
    const std::string e = Err(J{{"properties", {{"p", {{"type", "string"}, {"pattern", pattern}}}}}}.dump());
    EXPECT_NE(e.find("'/properties/p/pattern'"), std::string::npos) << pattern << ": " << e;
    EXPECT_NE(e.find(why), std::string::npos) << pattern << ": " << e;
  };
  refused(R"((a)\1)", "backreference");
  refused(R"((?<n>a)\k<n>)", "backreference");
  refused(R"(a(?=b))", "lookaround");
  refused(R"((?<!b)a)", "lookaround");
  refused(R"(\bword)", "\\b");
  refused(R"(\p{L}+)", "property");
  refused(R"(a{1001})", "over 1000");
  refused(R"((a{1000}){30})", "too large");
  refused(R"(a^b)", "'^'");
  refused(R"(a$b)", "'$'");
  refused(R"(\q)", "unknown escape");
  refused(R"([a-)", "unterminated");
  refused(R"((ab)", "missing ')'");
  refused(R"(*a)", "nothing to repeat");
  refused(R"([^\s\S])", "matches nothing");
  refused(R"(\ud800)", "surrogate");
  refused(R"(^(a?){1000}$)", "too complex");
  refused(std::string(101, '(') + "a" + std::string(101, ')'), "nested");
  // A format with a pattern outside the subset that does not follow from the format.
  EXPECT_NE(Err(R"js({"type": "string", "format": "date", "pattern": "(?=2)"})js").find("'/pattern'"), std::string::npos);
  // Bounds no formatted string meets.
  EXPECT_NE(Err(R"({"type": "string", "format": "uuid", "maxLength": 30})").find("no string satisfies"), std::string::npos);
  EXPECT_NE(Err(R"({"type": "string", "pattern": "^a+$", "format": "ipv4"})").find("no string satisfies"), std::string::npos);
  // Unknown formats stay annotations; a format with bounds it always meets needs no product.
  EXPECT_EQ(Err(R"({"type": "string", "format": "color", "maxLength": 3})"), "ok");
  EXPECT_EQ(Err(R"({"type": "string", "format": "uuid", "minLength": 36, "maxLength": 40})"), "ok");
  EXPECT_EQ(Err(R"({"type": ["string", "null"], "format": "date", "pattern": "^2"})"), "ok");
}

}  // namespace
}  // namespace mnemo::grammar
