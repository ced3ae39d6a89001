#include "grammar/json_schema.h"

#include <cctype>
#include <cmath>
#include <optional>
#include <string_view>

#include "grammar/grammar.h"
#include "grammar/json_regex.h"
#include "tokenizer/unicode.h"

namespace mnemo::grammar {
namespace {

constexpr int64_t kIntClamp = 999999999999999999;  // 10^18 - 1: every bound is clamped into +-this

// Shared rules of JSON syntax. Whitespace is bounded (at most a newline and 20 indentation
// characters between tokens) so that a model cannot stall an output in whitespace.
const std::pair<const char*, const char*> kCommon[] = {
    {"ws", "| \" \" | \"\\n\" [ \\t]{0,20}"},
    {"json-hex4", "[0-9a-cA-Ce-fE-F] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2}"},
    {"json-char", "[^\"\\\\\\x00-\\x1F] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" json-hex4 )"},
    {"json-string", "\"\\\"\" json-char* \"\\\"\""},
    // At most 18 digits (the clamp of bounded integers): every output parses, as an int64 and as a
    // double (an unbounded digit run overflowed doubles past 308 digits).
    {"json-int", "\"-\"? ( \"0\" | [1-9] [0-9]{0,17} )"},
    {"json-number", "json-int ( \".\" [0-9]+ )? ( [eE] [-+]? [0-9]{1,2} )?"},
    {"json-bool", "\"true\" | \"false\""},
    {"json-null", "\"null\""},
    {"json-value", "json-object | json-array | json-string | json-number | json-bool | json-null"},
    {"json-member", "json-string ws \":\" ws json-value ws"},
    {"json-object", "\"{\" ws ( json-member ( \",\" ws json-member )* )? \"}\""},
    {"json-array", "\"[\" ws ( json-value ws ( \",\" ws json-value ws )* )? \"]\""},
};
// What each shared rule references.
const std::pair<const char*, std::vector<const char*>> kCommonDeps[] = {
    {"json-char", {"json-hex4"}},
    {"json-string", {"json-char"}},
    {"json-number", {"json-int"}},
    {"json-value", {"json-object", "json-array", "json-string", "json-number", "json-bool", "json-null"}},
    {"json-member", {"json-string", "ws", "json-value"}},
    {"json-object", {"ws", "json-member"}},
    {"json-array", {"ws", "json-value"}},
};

// Keywords that constrain values in ways this compiler does not generate.
const char* const kUnsupported[] = {
    "patternProperties", "multipleOf", "uniqueItems", "not", "if", "then", "else",
    "prefixItems", "contains", "minContains", "maxContains", "minProperties", "maxProperties",
    "propertyNames", "dependentRequired", "dependentSchemas", "dependencies", "unevaluatedProperties",
    "unevaluatedItems", "$dynamicRef", "$recursiveRef", "additionalItems",
};

// A `propertyNames` schema every member name satisfies (names are strings): `true`, `{}` or
// `{"type": "string"}` with annotations, what zod writes for every z.record(z.string(), ...).
bool AnyPropertyName(const OrderedJson& p) {
  if (p.is_boolean()) return p.get<bool>();
  if (!p.is_object()) return false;
  for (const auto& [k, v] : p.items()) {
    if (k == "type" && v == "string") continue;
    if (k == "$schema" || k == "title" || k == "description") continue;
    return false;
  }
  return true;
}

Error Unsupported(const std::string& path, const std::string& what) {
  return MakeError(StatusCode::kInvalidArgument, "schema at '%s': %s", path.empty() ? "/" : path.c_str(), what.c_str());
}

std::string PointerEscape(const std::string& key) {
  std::string s;
  for (char c : key) {
    if (c == '~') s += "~0";
    else if (c == '/') s += "~1";
    else s += c;
  }
  return s;
}

std::string AnyDigits(int k) {
  if (k <= 0) return "";
  if (k == 1) return " [0-9]";
  return " [0-9]{" + std::to_string(k) + "}";
}

std::string DigitClass(char a, char b) {
  if (a == b) return std::string(" \"") + a + "\"";
  return std::string(" [") + a + "-" + b + "]";
}

// Alternatives for the decimal numbers [A, B] written with the same number of digits.
void SameLength(const std::string& a, const std::string& b, const std::string& prefix, std::vector<std::string>* out) {
  if (a.empty()) {
    out->push_back(prefix);
    return;
  }
  if (a[0] == b[0]) return SameLength(a.substr(1), b.substr(1), prefix + DigitClass(a[0], a[0]), out);
  const size_t rest = a.size() - 1;
  const bool low_full = a.find_first_not_of('0', 1) == std::string::npos;
  const bool high_full = b.find_first_not_of('9', 1) == std::string::npos;
  if (low_full && high_full) {
    out->push_back(prefix + DigitClass(a[0], b[0]) + AnyDigits(static_cast<int>(rest)));
    return;
  }
  char mid_lo = a[0], mid_hi = b[0];
  if (!low_full) {
    SameLength(a.substr(1), std::string(rest, '9'), prefix + DigitClass(a[0], a[0]), out);
    ++mid_lo;
  }
  if (!high_full) --mid_hi;
  if (mid_lo <= mid_hi) out->push_back(prefix + DigitClass(mid_lo, mid_hi) + AnyDigits(static_cast<int>(rest)));
  if (!high_full) SameLength(std::string(rest, '0'), b.substr(1), prefix + DigitClass(b[0], b[0]), out);
}

uint64_t Pow10(int k) {
  uint64_t p = 1;
  for (int i = 0; i < k; ++i) p *= 10;
  return p;
}
int NumDigits(uint64_t v) { return static_cast<int>(std::to_string(v).size()); }

// Non-negative magnitudes a..b (b absent: unbounded), without leading zeros.
void Magnitudes(uint64_t a, std::optional<uint64_t> b, std::vector<std::string>* out) {
  const int da = NumDigits(a);
  const int db = b ? NumDigits(*b) : da;
  for (int d = da; d <= db; ++d) {
    const uint64_t lo = d == da ? a : Pow10(d - 1);
    const uint64_t hi = b && d == db ? *b : Pow10(d) - 1;
    if (lo <= hi) SameLength(std::to_string(lo), std::to_string(hi), "", out);
  }
  if (!b) out->push_back(" [1-9] [0-9]{" + std::to_string(da) + ",}");
}

std::string Join(const std::vector<std::string>& alts) {
  std::string s = "(";
  for (size_t i = 0; i < alts.size(); ++i) s += (i ? " |" : "") + alts[i];
  return s + " )";
}

std::optional<double> NumberOf(const OrderedJson& s, const char* key) {
  auto it = s.find(key);
  if (it == s.end() || !it->is_number()) return std::nullopt;
  return it->get<double>();
}

// The string languages a schema's `format` (known ones) and `pattern` ask for; none when neither.
Result<std::vector<Regex>> StringLanguages(const OrderedJson& s, const std::string& path) {
  std::vector<Regex> langs;
  const std::string format = s.contains("format") && s["format"].is_string() ? s["format"].get<std::string>() : "";
  const char* fp = FormatPattern(format);
  if (s.contains("pattern")) {
    if (!s["pattern"].is_string()) return Unsupported(path + "/pattern", "pattern must be a string");
    const std::string pattern = s["pattern"].get<std::string>();
    if (fp && FormatImpliesPattern(format, pattern)) return std::vector<Regex>{*ParsePattern(fp)};
    auto re = ParsePattern(pattern);
    if (!re.ok()) return Unsupported(path + "/pattern", re.error().message);
    langs.push_back(std::move(*re));
  }
  if (fp) {
    auto re = ParsePattern(fp);
    MNEMO_CHECK(re.ok());
    langs.push_back(std::move(*re));
  }
  return langs;
}

Result<std::pair<int64_t, int64_t>> LengthBounds(const OrderedJson& s, const std::string& path) {
  int64_t min = 0, max = -1;
  if (s.contains("minLength")) {
    if (!s["minLength"].is_number_integer() || s["minLength"].get<int64_t>() < 0) return Unsupported(path + "/minLength", "minLength must be an integer >= 0");
    min = s["minLength"].get<int64_t>();
  }
  if (s.contains("maxLength")) {
    if (!s["maxLength"].is_number_integer() || s["maxLength"].get<int64_t>() < 0) return Unsupported(path + "/maxLength", "maxLength must be an integer >= 0");
    max = s["maxLength"].get<int64_t>();
  }
  if (max >= 0 && max < min) return Unsupported(path, "maxLength < minLength");
  if (min > kMaxRepeat || max > kMaxRepeat) return Unsupported(path, "minLength / maxLength over " + std::to_string(kMaxRepeat));
  return std::make_pair(min, max);
}

int64_t ClampInt(double v) {
  if (!(v < static_cast<double>(kIntClamp))) return kIntClamp;
  if (!(v > -static_cast<double>(kIntClamp))) return -kIntClamp;
  return static_cast<int64_t>(v);
}

}  // namespace

std::string IntegerRangeExpr(const int64_t* lo, const int64_t* hi) {
  std::vector<std::string> alts;
  // Negative values: "-" and a magnitude in [-vmax, -lo].
  const int64_t vmax = hi ? std::min<int64_t>(*hi, -1) : -1;
  if (!lo || *lo <= vmax) {
    std::vector<std::string> mags;
    Magnitudes(static_cast<uint64_t>(-vmax), lo ? std::optional<uint64_t>(static_cast<uint64_t>(-*lo)) : std::nullopt, &mags);
    alts.push_back(" \"-\" " + Join(mags));
  }
  const int64_t vmin = lo ? std::max<int64_t>(*lo, 0) : 0;
  if (!hi || *hi >= vmin) {
    Magnitudes(static_cast<uint64_t>(vmin), hi ? std::optional<uint64_t>(static_cast<uint64_t>(*hi)) : std::nullopt, &alts);
  }
  if (alts.empty()) return "";
  return Join(alts);
}

std::string SchemaCompiler::NewRule(const std::string& hint, const std::string& body) {
  std::string base;
  for (char c : hint) base += (std::isalnum(static_cast<unsigned char>(c)) || c == '-') ? c : '-';
  if (base.empty() || base.size() > 40) base = base.empty() ? "r" : base.substr(0, 40);
  std::string name = base;
  // Suffixes resume where this base left off: a pattern's product names thousands of rules.
  for (int& i = suffix_[base]; names_.count(name) || name.rfind("json-", 0) == 0 || name == "ws" || name == "root";)
    name = base + "-" + std::to_string(++i);
  names_.insert(name);
  rules_.push_back({name, body});
  return name;
}

std::string SchemaCompiler::Common(const std::string& name) {
  if (names_.count(name)) return name;
  for (const auto& [n, body] : kCommon) {
    if (name != n) continue;
    names_.insert(name);
    rules_.push_back({name, body});
    for (const auto& [d, deps] : kCommonDeps)
      if (name == d)
        for (const char* dep : deps) Common(dep);
  }
  return name;
}

std::string SchemaCompiler::Text() const {
  std::string s;
  for (const auto& [name, body] : rules_) s += name + " ::= " + body + "\n";
  return s;
}

Status SchemaCompiler::Add(const std::string& name, const OrderedJson& schema) {
  if (names_.count(name)) return MakeError(StatusCode::kInvalidArgument, "rule '%s' already exists", name.c_str());
  doc_ = &schema;
  refs_.clear();
  auto body = Visit(schema, "");
  doc_ = nullptr;
  if (!body.ok()) return body.error();
  names_.insert(name);
  rules_.push_back({name, *body});
  return Status::Ok();
}

Result<std::string> SchemaCompiler::RefRule(const std::string& ref, const std::string& path) {
  auto it = refs_.find(ref);
  if (it != refs_.end()) return it->second;
  if (ref.empty() || ref[0] != '#') return Unsupported(path, "$ref '" + ref + "' is not a reference into this schema");
  const OrderedJson* target = nullptr;
  try {
    const OrderedJson::json_pointer ptr(ref.substr(1));
    if (doc_->contains(ptr)) target = &doc_->at(ptr);
  } catch (const std::exception&) {
  }
  if (!target) return Unsupported(path, "$ref '" + ref + "' does not resolve");
  // Named before its body is built, so recursive references find it.
  const size_t slash = ref.find_last_of('/');
  const std::string name = NewRule(slash == std::string::npos ? "ref" : "ref-" + ref.substr(slash + 1), "");
  refs_[ref] = name;
  auto body = Visit(*target, ref.substr(1));
  if (!body.ok()) return body.error();
  for (auto& r : rules_)
    if (r.first == name) r.second = *body;
  return name;
}

Result<std::string> SchemaCompiler::Visit(const OrderedJson& s, const std::string& path) {
  if (s.is_boolean()) {
    if (s.get<bool>()) return Common("json-value");
    return Unsupported(path, "the schema `false` accepts no value");
  }
  if (!s.is_object()) return Unsupported(path, "a schema must be an object or a boolean");
  for (const char* k : kUnsupported) {
    if (k == std::string_view("propertyNames") && s.contains(k) && AnyPropertyName(s[k])) continue;
    if (s.contains(k)) return Unsupported(path + "/" + k, std::string("the keyword '") + k + "' is not supported");
  }
  if (s.contains("$ref")) {
    if (!s["$ref"].is_string()) return Unsupported(path + "/$ref", "$ref must be a string");
    return RefRule(s["$ref"].get<std::string>(), path + "/$ref");
  }
  for (const char* k : {"const", "enum"}) {
    if (!s.contains(k)) continue;
    auto values = AllowedValues(s, path, k);
    if (!values.ok()) return values.error();
    std::vector<std::string> alts;
    for (const auto& v : *values) alts.push_back(" " + Literal(v.dump()));
    return Join(alts);
  }
  for (const char* k : {"anyOf", "oneOf", "allOf"}) {
    if (!s.contains(k)) continue;
    const OrderedJson& list = s[k];
    const std::string p = path + "/" + k;
    if (!list.is_array() || list.empty()) return Unsupported(p, std::string(k) + " must be a non-empty array");
    if (std::string(k) == "allOf" && list.size() > 1) return Unsupported(p, "allOf with more than one schema is not supported");
    std::vector<std::string> alts;
    for (size_t i = 0; i < list.size(); ++i) {
      auto a = Visit(list[i], p + "/" + std::to_string(i));
      if (!a.ok()) return a.error();
      alts.push_back(" " + *a);
    }
    return Join(alts);
  }
  std::vector<std::string> types;
  if (s.contains("type")) {
    const OrderedJson& t = s["type"];
    if (t.is_string()) {
      types.push_back(t.get<std::string>());
    } else if (t.is_array() && !t.empty()) {
      for (const auto& x : t) {
        if (!x.is_string()) return Unsupported(path + "/type", "type must be a string or an array of strings");
        types.push_back(x.get<std::string>());
      }
    } else {
      return Unsupported(path + "/type", "type must be a string or an array of strings");
    }
  } else if (s.contains("properties") || s.contains("required") || s.contains("additionalProperties")) {
    types.push_back("object");
  } else if (s.contains("items") || s.contains("minItems") || s.contains("maxItems")) {
    types.push_back("array");
  } else if (s.contains("minLength") || s.contains("maxLength") || s.contains("pattern") ||
             (s.contains("format") && s["format"].is_string() && FormatPattern(s["format"].get<std::string>()))) {
    types.push_back("string");
  } else if (s.contains("minimum") || s.contains("maximum") || s.contains("exclusiveMinimum") || s.contains("exclusiveMaximum")) {
    types.push_back("number");
  } else {
    return Common("json-value");
  }
  if (s.contains("nullable") && s["nullable"].is_boolean() && s["nullable"].get<bool>()) types.push_back("null");
  std::vector<std::string> alts;
  for (const auto& t : types) {
    auto e = TypeExpr(t, s, path);
    if (!e.ok()) return e.error();
    alts.push_back(" " + *e);
  }
  return alts.size() == 1 ? alts[0].substr(1) : Join(alts);
}

Result<std::string> SchemaCompiler::TypeExpr(const std::string& type, const OrderedJson& s, const std::string& path) {
  if (type == "object") return ObjectExpr(s, path);
  if (type == "array") return ArrayExpr(s, path);
  if (type == "string") return StringExpr(s, path);
  if (type == "integer") return NumberExpr(s, path, true);
  if (type == "number") return NumberExpr(s, path, false);
  if (type == "boolean") return Common("json-bool");
  if (type == "null") return Common("json-null");
  return Unsupported(path + "/type", "unknown type '" + type + "'");
}

Result<std::string> SchemaCompiler::ObjectExpr(const OrderedJson& s, const std::string& path) {
  const std::string ws = Common("ws");
  OrderedJson props = OrderedJson::object();
  if (s.contains("properties")) {
    if (!s["properties"].is_object()) return Unsupported(path + "/properties", "properties must be an object");
    props = s["properties"];
  }
  std::set<std::string> required;
  if (s.contains("required")) {
    if (!s["required"].is_array()) return Unsupported(path + "/required", "required must be an array of strings");
    for (const auto& r : s["required"]) {
      if (!r.is_string()) return Unsupported(path + "/required", "required must be an array of strings");
      required.insert(r.get<std::string>());
    }
  }
  const OrderedJson additional = s.contains("additionalProperties") ? s["additionalProperties"] : OrderedJson(true);
  for (const auto& r : required) {
    if (props.contains(r)) continue;
    if (additional.is_boolean() && !additional.get<bool>())
      return Unsupported(path + "/required", "required property '" + r + "' is not in properties and additionalProperties is false");
    props[r] = additional.is_object() ? additional : OrderedJson(true);
  }
  if (props.empty()) {
    if (additional.is_boolean() && !additional.get<bool>()) return "\"{\" " + ws + " \"}\"";
    std::string value = Common("json-value");
    if (additional.is_object()) {
      auto v = Visit(additional, path + "/additionalProperties");
      if (!v.ok()) return v.error();
      value = NewRule("value", *v);
    } else if (!additional.is_boolean()) {
      return Unsupported(path + "/additionalProperties", "additionalProperties must be a boolean or a schema");
    }
    const std::string member = NewRule("member", Common("json-string") + " " + ws + " \":\" " + ws + " " + value + " " + ws);
    return "\"{\" " + ws + " ( " + member + " ( \",\" " + ws + " " + member + " )* )? \"}\"";
  }
  // Members in schema order; rest(i, f) = members i.. where f says whether one was written
  // already (then the next needs a comma). Optional members may be skipped.
  std::vector<std::string> members;
  std::vector<bool> req;
  for (auto it = props.begin(); it != props.end(); ++it) {
    auto v = Visit(it.value(), path + "/properties/" + PointerEscape(it.key()));
    if (!v.ok()) return v.error();
    members.push_back(Literal(OrderedJson(it.key()).dump()) + " " + ws + " \":\" " + ws + " " + *v + " " + ws);
    req.push_back(required.count(it.key()) > 0);
  }
  const size_t n = members.size();
  std::vector<std::string> rest[2];  // rest[f][i]: rule name ("" = empty)
  rest[0].assign(n + 1, "");
  rest[1].assign(n + 1, "");
  for (size_t i = n; i-- > 0;) {
    for (int f = 0; f < 2; ++f) {
      const std::string take = (f ? "\",\" " + ws + " " : "") + members[i] + (rest[1][i + 1].empty() ? "" : " " + rest[1][i + 1]);
      std::string body = take;
      if (!req[i]) body += " | " + (rest[f][i + 1].empty() ? std::string("") : rest[f][i + 1]);
      rest[f][i] = NewRule("obj", body);
    }
  }
  return "\"{\" " + ws + " " + rest[0][0] + " \"}\"";
}

Result<std::string> SchemaCompiler::ArrayExpr(const OrderedJson& s, const std::string& path) {
  const std::string ws = Common("ws");
  std::string item = Common("json-value");
  if (s.contains("items")) {
    const OrderedJson& it = s["items"];
    if (it.is_array()) return Unsupported(path + "/items", "tuple items (an array) are not supported");
    if (it.is_boolean() && !it.get<bool>()) return "\"[\" " + ws + " \"]\"";
    auto v = Visit(it, path + "/items");
    if (!v.ok()) return v.error();
    item = NewRule("item", *v);
  }
  int64_t min = 0, max = -1;
  if (s.contains("minItems")) {
    if (!s["minItems"].is_number_integer() || s["minItems"].get<int64_t>() < 0) return Unsupported(path + "/minItems", "minItems must be an integer >= 0");
    min = s["minItems"].get<int64_t>();
  }
  if (s.contains("maxItems")) {
    if (!s["maxItems"].is_number_integer() || s["maxItems"].get<int64_t>() < 0) return Unsupported(path + "/maxItems", "maxItems must be an integer >= 0");
    max = s["maxItems"].get<int64_t>();
  }
  if (max >= 0 && max < min) return Unsupported(path, "maxItems < minItems");
  if (min > kMaxRepeat || max > kMaxRepeat) return Unsupported(path, "minItems / maxItems over " + std::to_string(kMaxRepeat));
  if (max == 0) return "\"[\" " + ws + " \"]\"";
  const std::string more = "( \",\" " + ws + " " + item + " " + ws + " )";
  const int64_t lo = min > 0 ? min - 1 : 0;
  const std::string rep = max < 0 ? "{" + std::to_string(lo) + ",}" : "{" + std::to_string(lo) + "," + std::to_string(max - 1) + "}";
  const std::string list = item + " " + ws + " " + more + rep;
  if (min == 0) return "\"[\" " + ws + " ( " + list + " )? \"]\"";
  return "\"[\" " + ws + " " + list + " \"]\"";
}

Result<std::string> SchemaCompiler::StringExpr(const OrderedJson& s, const std::string& path) {
  auto bounds = LengthBounds(s, path);
  if (!bounds.ok()) return bounds.error();
  const auto [min, max] = *bounds;
  if (s.contains("pattern") || s.contains("format")) {
    auto e = PatternExpr(s, path, min, max);
    if (!e.ok()) return e.error();
    if (!e->empty()) return "\"\\\"\" " + *e + " \"\\\"\"";
  }
  if (min == 0 && max < 0) return Common("json-string");
  const std::string ch = Common("json-char");
  const std::string rep = max < 0 ? "{" + std::to_string(min) + ",}" : "{" + std::to_string(min) + "," + std::to_string(max) + "}";
  return "\"\\\"\" " + ch + rep + " \"\\\"\"";
}

// One language whose lengths lie within the bounds is written as grammar text directly (its
// repetitions stay repetitions, which the matcher's per-element masks serve well); anything more
// (a format and a pattern, or bounds that cut into a language) is the product of NFAs, a rule per
// product state. Empty: no format or pattern applies.
Result<std::string> SchemaCompiler::PatternExpr(const OrderedJson& s, const std::string& path, int64_t min, int64_t max) {
  auto langs = StringLanguages(s, path);
  if (!langs.ok()) return langs.error();
  if (langs->empty()) return std::string();
  RuleSink sink;
  sink.shared = [this](const std::string& hint, const std::string& body) {
    auto it = shared_.find(body);
    if (it != shared_.end()) return it->second;
    return shared_[body] = NewRule(hint, body);
  };
  // Reserved rules by name -> index in rules_ (a product defines thousands).
  auto reserved = std::make_shared<std::map<std::string, size_t>>();
  sink.reserve = [this, reserved](const std::string& hint) {
    const std::string name = NewRule(hint, "");
    (*reserved)[name] = rules_.size() - 1;
    return name;
  };
  sink.define = [this, reserved](const std::string& name, const std::string& body) { rules_[reserved->at(name)].second = body; };
  const std::string where = path + (s.contains("pattern") ? "/pattern" : "/format");
  if (langs->size() == 1) {
    const auto [lo, hi] = LengthRange((*langs)[0]);
    if (lo >= min && (max < 0 || (hi >= 0 && hi <= max))) {
      std::string e = RegexExpr((*langs)[0], sink);
      if (!e.empty()) return e;
    }
  }
  std::vector<Nfa> nfas;
  for (const auto& re : *langs) {
    auto nfa = BuildNfa(re);
    if (!nfa.ok()) return Unsupported(where, nfa.error().message);
    nfas.push_back(std::move(*nfa));
  }
  std::vector<const Nfa*> ptrs;
  for (const auto& n : nfas) ptrs.push_back(&n);
  auto e = IntersectionExpr(ptrs, min, max, sink);
  if (!e.ok()) return Unsupported(where, e.error().message);
  return *e;
}

Result<std::vector<OrderedJson>> SchemaCompiler::AllowedValues(const OrderedJson& s, const std::string& path, const std::string& key) {
  const std::string p = path + "/" + key;
  std::vector<OrderedJson> values;
  if (key == "const") {
    values.push_back(s["const"]);
  } else {
    if (!s["enum"].is_array() || s["enum"].empty()) return Unsupported(p, "enum must be a non-empty array");
    for (const auto& v : s["enum"]) values.push_back(v);
  }
  if (!s.contains("pattern") && !s.contains("format") && !s.contains("minLength") && !s.contains("maxLength")) return values;
  auto langs = StringLanguages(s, path);
  if (!langs.ok()) return langs.error();
  auto bounds = LengthBounds(s, path);
  if (!bounds.ok()) return bounds.error();
  std::vector<Nfa> nfas;
  for (const auto& re : *langs) {
    auto nfa = BuildNfa(re);
    if (!nfa.ok()) return Unsupported(p, nfa.error().message);
    nfas.push_back(std::move(*nfa));
  }
  std::vector<OrderedJson> kept;
  for (const auto& v : values) {
    bool ok = true;
    if (v.is_string()) {
      const std::vector<uint32_t> cps = DecodeUtf8Lenient(v.get<std::string>());
      const int64_t n = static_cast<int64_t>(cps.size());
      ok = n >= bounds->first && (bounds->second < 0 || n <= bounds->second);
      for (const auto& nfa : nfas) ok = ok && NfaMatches(nfa, cps);
    }
    if (ok) kept.push_back(v);
  }
  if (kept.empty())
    return Unsupported(p, std::string(key == "const" ? "the const value does not" : "no enum value does") +
                              " satisfy the schema's format, pattern or length bounds");
  return kept;
}

Result<std::string> SchemaCompiler::NumberExpr(const OrderedJson& s, const std::string& path, bool integer) {
  // Integer bounds L <= value <= H, inward: minimum 0.5 -> 1, exclusiveMaximum 10 -> 9.
  std::optional<int64_t> lo, hi;
  auto tighten_lo = [&](int64_t v) { lo = lo ? std::max(*lo, v) : v; };
  auto tighten_hi = [&](int64_t v) { hi = hi ? std::min(*hi, v) : v; };
  const bool old_excl_min = s.contains("exclusiveMinimum") && s["exclusiveMinimum"].is_boolean() && s["exclusiveMinimum"].get<bool>();
  const bool old_excl_max = s.contains("exclusiveMaximum") && s["exclusiveMaximum"].is_boolean() && s["exclusiveMaximum"].get<bool>();
  if (auto v = NumberOf(s, "minimum")) tighten_lo(ClampInt(old_excl_min ? std::floor(*v) + 1 : std::ceil(*v)));
  if (auto v = NumberOf(s, "maximum")) tighten_hi(ClampInt(old_excl_max ? std::ceil(*v) - 1 : std::floor(*v)));
  if (auto v = NumberOf(s, "exclusiveMinimum")) tighten_lo(ClampInt(std::floor(*v) + 1));
  if (auto v = NumberOf(s, "exclusiveMaximum")) tighten_hi(ClampInt(std::ceil(*v) - 1));
  for (const char* k : {"minimum", "maximum"}) {
    if (s.contains(k) && !s[k].is_number()) return Unsupported(path + "/" + k, std::string(k) + " must be a number");
  }
  if (lo && hi && *lo > *hi) return Unsupported(path, "no " + std::string(integer ? "integer" : "number") + " the grammar can write lies within the bounds");
  if (!lo && !hi) return Common(integer ? "json-int" : "json-number");
  const std::string ints = IntegerRangeExpr(lo ? &*lo : nullptr, hi ? &*hi : nullptr);
  if (integer) return ints;
  // A fraction strictly between the bounds: n.ddd with n in [max(L, 0), H - 1], or -m.ddd with
  // m in [max(-H, 0), -L - 1].
  std::vector<std::string> alts = {" " + ints};
  const std::string frac = " \".\" [0-9]+";
  {
    const int64_t a = lo ? std::max<int64_t>(*lo, 0) : 0;
    std::optional<int64_t> b;
    if (hi) b = *hi - 1;
    if (!b || *b >= a) {
      const int64_t* bp = b ? &*b : nullptr;
      alts.push_back(" " + IntegerRangeExpr(&a, bp) + frac);
    }
  }
  {
    const int64_t a = hi ? std::max<int64_t>(-*hi, 0) : 0;
    std::optional<int64_t> b;
    if (lo) b = -*lo - 1;
    if (!b || *b >= a) {
      const int64_t* bp = b ? &*b : nullptr;
      alts.push_back(" \"-\" " + IntegerRangeExpr(&a, bp) + frac);
    }
  }
  return Join(alts);
}

Result<std::string> SchemaToGrammar(const OrderedJson& schema) {
  SchemaCompiler c;
  MNEMO_TRY(c.Add("root", schema));
  return c.Text();
}

std::string JsonObjectGrammar() {
  SchemaCompiler c;
  Status st = c.Add("root", OrderedJson{{"type", "object"}});
  MNEMO_CHECK(st.ok());
  return c.Text();
}

}  // namespace mnemo::grammar
