#include "grammar/json_schema.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <functional>
#include <optional>
#include <string_view>

#include "grammar/grammar.h"
#include "grammar/json_regex.h"
#include "tokenizer/unicode.h"

namespace mnemo::grammar {
namespace {

constexpr int64_t kIntClamp = 999999999999999999;  // 10^18 - 1: every bound is clamped into +-this
// multipleOf: bounds holding fewer multiples are written as a list of them; beyond, m is capped
// and so is the remainder automaton's size (a rule per digit position and remainder).
constexpr uint64_t kMaxListedMultiples = 256;
constexpr uint64_t kMaxMultipleOf = 10000;
constexpr int kMaxMultipleRules = 2000;  // 1,464 rules for 97 unbounded: 300 KB of grammar, 27 ms to a first mask

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
    "patternProperties", "uniqueItems", "not", "if", "then", "else",
    "contains", "minContains", "maxContains", "minProperties", "maxProperties",
    "propertyNames", "dependentRequired", "dependentSchemas", "dependencies", "unevaluatedProperties",
    "unevaluatedItems", "$dynamicRef", "$recursiveRef",
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

// The names a `propertyNames` schema lists: {"enum": [...]} or {"const": ...} of strings (with
// "type": "string" and annotations), or one no name passes (`false`, {"not": {}}: zod's record of
// an empty enum). None: any other schema.
std::optional<std::vector<std::string>> ListedPropertyNames(const OrderedJson& p) {
  if (p.is_boolean()) return p.get<bool>() ? std::nullopt : std::optional<std::vector<std::string>>(std::vector<std::string>{});
  if (!p.is_object()) return std::nullopt;
  std::optional<std::vector<std::string>> names;
  for (const auto& [k, v] : p.items()) {
    if (k == "type" && v == "string") continue;
    if (k == "$schema" || k == "title" || k == "description") continue;
    if (names) return std::nullopt;  // both enum and const, or not with either
    names.emplace();
    if (k == "not" && (v == true || v == OrderedJson::object())) continue;
    if (k == "const" && v.is_string()) {
      names->push_back(v.get<std::string>());
      continue;
    }
    if (k != "enum" || !v.is_array()) return std::nullopt;
    for (const auto& name : v) {
      if (!name.is_string()) return std::nullopt;
      if (std::find(names->begin(), names->end(), name.get<std::string>()) == names->end()) names->push_back(name.get<std::string>());
    }
  }
  return names;
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

// A run of decimal numbers: `prefix`'s digits, then one digit in [lo, hi] (none when lo is 0),
// then `free` digits of any value.
struct DigitRun {
  std::string prefix;
  char lo = 0, hi = 0;
  int free = 0;
};

std::string RunText(const DigitRun& r) {
  std::string s;
  for (char c : r.prefix) s += DigitClass(c, c);
  if (r.lo) s += DigitClass(r.lo, r.hi);
  return s + AnyDigits(r.free);
}

// Runs for the decimal numbers [A, B] written with the same number of digits.
void SameLength(const std::string& a, const std::string& b, const std::string& prefix, std::vector<DigitRun>* out) {
  if (a.empty()) {
    out->push_back({prefix});
    return;
  }
  if (a[0] == b[0]) return SameLength(a.substr(1), b.substr(1), prefix + a[0], out);
  const int rest = static_cast<int>(a.size()) - 1;
  const bool low_full = a.find_first_not_of('0', 1) == std::string::npos;
  const bool high_full = b.find_first_not_of('9', 1) == std::string::npos;
  if (low_full && high_full) {
    out->push_back({prefix, a[0], b[0], rest});
    return;
  }
  char mid_lo = a[0], mid_hi = b[0];
  if (!low_full) {
    SameLength(a.substr(1), std::string(rest, '9'), prefix + a[0], out);
    ++mid_lo;
  }
  if (!high_full) --mid_hi;
  if (mid_lo <= mid_hi) out->push_back({prefix, mid_lo, mid_hi, rest});
  if (!high_full) SameLength(std::string(rest, '0'), b.substr(1), prefix + b[0], out);
}

uint64_t Pow10(int k) {
  uint64_t p = 1;
  for (int i = 0; i < k; ++i) p *= 10;
  return p;
}
int NumDigits(uint64_t v) { return static_cast<int>(std::to_string(v).size()); }

// Runs for the magnitudes a..b, without leading zeros.
std::vector<DigitRun> MagnitudeRuns(uint64_t a, uint64_t b) {
  std::vector<DigitRun> runs;
  for (int d = NumDigits(a); d <= NumDigits(b); ++d) {
    const uint64_t lo = std::max(a, d == 1 ? 0 : Pow10(d - 1));
    const uint64_t hi = std::min(b, Pow10(d) - 1);
    if (lo <= hi) SameLength(std::to_string(lo), std::to_string(hi), "", &runs);
  }
  return runs;
}

// Non-negative magnitudes a..b (b absent: unbounded), without leading zeros.
void Magnitudes(uint64_t a, std::optional<uint64_t> b, std::vector<std::string>* out) {
  for (const DigitRun& r : MagnitudeRuns(a, b ? *b : Pow10(NumDigits(a)) - 1)) out->push_back(RunText(r));
  if (!b) out->push_back(" [1-9] [0-9]{" + std::to_string(NumDigits(a)) + ",}");
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

// A positive decimal a / 10^k, read exactly: a double's shortest round-trip text is the number
// as the client wrote it (0.01 stays 0.01, not 0.01000000000000000020816681711721685).
struct Decimal {
  uint64_t a = 0;
  int k = 0;
};

Result<Decimal> ReadDecimal(const OrderedJson& v, const std::string& path) {
  const char* what = "multipleOf must be a number > 0 with at most 18 significant digits";
  if (v.is_number_unsigned() || v.is_number_integer()) {
    if (v.is_number_unsigned() ? v.get<uint64_t>() == 0 : v.get<int64_t>() <= 0) return Unsupported(path, what);
    return Decimal{v.get<uint64_t>(), 0};
  }
  if (!v.is_number_float() || !(v.get<double>() > 0)) return Unsupported(path, what);
  char buf[400];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v.get<double>(), std::chars_format::fixed);
  if (ec != std::errc()) return Unsupported(path, what);
  std::string text(buf, end), digits;
  const size_t dot = text.find('.');
  int k = 0;
  if (dot != std::string::npos) {
    while (text.back() == '0') text.pop_back();
    k = static_cast<int>(text.size() - dot - 1);
    text.erase(dot, 1);
  }
  digits = text.substr(std::min(text.find_first_not_of('0'), text.size()));
  if (digits.empty() || digits.size() > 18) return Unsupported(path, what);
  return Decimal{std::stoull(digits), k};
}

// Decimal digit strings by their value mod m: the remainder automaton of m unrolled over digit
// positions, one rule per (digits left, remainder wanted) pair reached. A run of numbers of one
// length (DigitRun) then keeps its multiples of m exactly, whatever bounds cut it.
class MultipleRuns {
 public:
  MultipleRuns(uint64_t m, std::function<std::string(const std::string&)> new_rule) : m_(m), new_rule_(std::move(new_rule)) {
    for (int t = 0; t <= 18 && t_ < 0; ++t)
      if (Pow10(t) % m == 0) t_ = t;
  }
  // The run's numbers that are multiples of m; empty when none.
  std::string Keep(const DigitRun& r) {
    uint64_t v = 0;
    for (char c : r.prefix) v = (v * 10 + static_cast<uint64_t>(c - '0')) % m_;
    if (!r.lo) return v == 0 ? RunText(r) : "";
    const uint64_t shift = PowMod(r.free);
    std::map<std::string, std::string> by_suffix;  // suffix expression -> its leading digits
    for (char d = r.lo; d <= r.hi; ++d) {
      const uint64_t w = (v * 10 + static_cast<uint64_t>(d - '0')) % m_;
      auto suffix = Suffix(r.free, (m_ - w * shift % m_) % m_);
      if (suffix) by_suffix[*suffix] += d;
    }
    std::vector<std::string> alts;
    for (const auto& [suffix, ds] : by_suffix) {
      std::string e;
      for (char c : r.prefix) e += DigitClass(c, c);
      e += ds.size() == 1 ? DigitClass(ds[0], ds[0]) : ds.size() == static_cast<size_t>(ds.back() - ds[0] + 1) ? DigitClass(ds[0], ds.back()) : " [" + ds + "]";
      alts.push_back(e + (suffix.empty() ? "" : " " + suffix));
    }
    if (alts.empty()) return "";
    return alts.size() == 1 ? alts[0] : " " + Join(alts);
  }
  int rules() const { return rules_; }

 private:
  uint64_t PowMod(int k) const {
    uint64_t p = 1 % m_;
    for (int i = 0; i < k; ++i) p = p * 10 % m_;
    return p;
  }
  // Strings of exactly k digits (leading zeros allowed) whose value is c mod m; none: nullopt.
  std::optional<std::string> Suffix(int k, uint64_t c) {
    if (k == 0) return c == 0 ? std::optional<std::string>("") : std::nullopt;
    if (rules_ > kMaxMultipleRules) return std::nullopt;  // over budget: MultipleExpr refuses
    if (k <= 18 && Pow10(k) <= m_) {  // each residue is one value
      if (c >= Pow10(k)) return std::nullopt;
      std::string digits = std::to_string(c);
      return Literal(std::string(static_cast<size_t>(k) - digits.size(), '0') + digits);
    }
    if (t_ >= 0 && k > t_) {  // m divides 10^t: the digits before the last t do not matter
      auto inner = Suffix(t_, c);
      if (!inner) return std::nullopt;
      return AnyDigits(k - t_).substr(1) + (inner->empty() ? "" : " " + *inner);
    }
    auto it = memo_.find({k, c});
    if (it != memo_.end()) return it->second;
    const uint64_t p = PowMod(k - 1);
    std::map<std::string, std::string> by_suffix;
    for (uint64_t d = 0; d <= 9; ++d) {
      auto rest = Suffix(k - 1, (c + m_ - d * p % m_) % m_);
      if (rest) by_suffix[*rest] += static_cast<char>('0' + d);
    }
    std::optional<std::string> result;
    if (!by_suffix.empty()) {
      std::string body;
      for (const auto& [rest, ds] : by_suffix) {
        body += body.empty() ? "" : " | ";
        body += (ds.size() == 1 ? "\"" + ds + "\"" : "[" + ds + "]") + (rest.empty() ? "" : " " + rest);
      }
      ++rules_;
      result = new_rule_(body);
    }
    memo_[{k, c}] = result;
    return result;
  }

  uint64_t m_;
  int t_ = -1;  // the least t with m | 10^t; -1: none (m has a factor other than 2 and 5)
  std::function<std::string(const std::string&)> new_rule_;
  std::map<std::pair<int, uint64_t>, std::optional<std::string>> memo_;
  int rules_ = 0;
};

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
    if (k == std::string_view("propertyNames") && s.contains(k) && (AnyPropertyName(s[k]) || ListedPropertyNames(s[k]))) continue;
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
  } else if (s.contains("properties") || s.contains("required") || s.contains("additionalProperties") ||
             (s.contains("propertyNames") && !AnyPropertyName(s["propertyNames"]))) {
    types.push_back("object");
  } else if (s.contains("items") || s.contains("prefixItems") || s.contains("minItems") || s.contains("maxItems")) {
    types.push_back("array");
  } else if (s.contains("minLength") || s.contains("maxLength") || s.contains("pattern") ||
             (s.contains("format") && s["format"].is_string() && FormatPattern(s["format"].get<std::string>()))) {
    types.push_back("string");
  } else if (s.contains("minimum") || s.contains("maximum") || s.contains("exclusiveMinimum") || s.contains("exclusiveMaximum") ||
             s.contains("multipleOf")) {
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
  // propertyNames listing names (zod's z.record(z.enum([...]), X)): the object whose members are
  // those names, each with its `properties` schema or else additionalProperties, and no others.
  if (s.contains("propertyNames") && !AnyPropertyName(s["propertyNames"])) {
    const auto names = ListedPropertyNames(s["propertyNames"]);
    MNEMO_CHECK(names.has_value());
    OrderedJson listed = s;
    listed.erase("propertyNames");
    const OrderedJson additional = s.contains("additionalProperties") ? s["additionalProperties"] : OrderedJson(true);
    OrderedJson props = OrderedJson::object();
    for (const auto& name : *names) {
      if (s.contains("properties") && s["properties"].is_object() && s["properties"].contains(name)) props[name] = s["properties"][name];
      else if (!(additional.is_boolean() && !additional.get<bool>())) props[name] = additional;
    }
    if (s.contains("required") && s["required"].is_array())
      for (const auto& r : s["required"])
        if (r.is_string() && !props.contains(r.get<std::string>()))
          return Unsupported(path + "/required", "required property '" + r.get<std::string>() + "' is not allowed by propertyNames");
    listed["properties"] = std::move(props);
    listed["additionalProperties"] = false;
    return ObjectExpr(listed, path);
  }
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
  // Tuples: prefixItems then items for the rest (2020-12), or items as an array then
  // additionalItems (draft-07; additionalItems is ignored when items is a schema).
  const bool draft7 = !s.contains("prefixItems") && s.contains("items") && s["items"].is_array();
  const std::string prefix_key = draft7 ? "items" : "prefixItems";
  const std::string rest_key = draft7 ? "additionalItems" : "items";
  std::string item = Common("json-value");
  bool rest_none = false, rest_given = false;  // rest: false / a schema (absent or true: neither)
  if (s.contains(rest_key)) {
    const OrderedJson& it = s[rest_key];
    if (it.is_boolean()) {
      rest_none = !it.get<bool>();
    } else {
      auto v = Visit(it, path + "/" + rest_key);
      if (!v.ok()) return v.error();
      item = NewRule("item", *v);
      rest_given = true;
    }
  }
  if (s.contains(prefix_key)) {
    const OrderedJson& list = s[prefix_key];
    if (!list.is_array()) return Unsupported(path + "/" + prefix_key, prefix_key + " must be an array of schemas");
    if (!list.empty()) return TupleExpr(list, path + "/" + prefix_key, item, rest_none, rest_given, min, max);
  }
  if (rest_none || max == 0) {
    if (min > 0) return Unsupported(path, "minItems > 0 but no item is allowed");
    return "\"[\" " + ws + " \"]\"";
  }
  const std::string more = "( \",\" " + ws + " " + item + " " + ws + " )";
  const int64_t lo = min > 0 ? min - 1 : 0;
  const std::string rep = max < 0 ? "{" + std::to_string(lo) + ",}" : "{" + std::to_string(lo) + "," + std::to_string(max - 1) + "}";
  const std::string list = item + " " + ws + " " + more + rep;
  if (min == 0) return "\"[\" " + ws + " ( " + list + " )? \"]\"";
  return "\"[\" " + ws + " " + list + " \"]\"";
}

// Items in the prefix's order: position i >= minItems may end the array (then no later item
// follows), items past the prefix are `rest` repeated. With rest absent or true, only as many
// json values as minItems needs are written past the prefix (as members beyond properties are
// never written).
Result<std::string> SchemaCompiler::TupleExpr(const OrderedJson& list, const std::string& path, const std::string& rest, bool rest_none,
                                              bool rest_given, int64_t min, int64_t max) {
  const std::string ws = Common("ws");
  const int64_t n = static_cast<int64_t>(list.size());
  const int64_t most = rest_none ? n : rest_given ? -1 : std::max(n, min);  // -1: no limit
  if (most >= 0) max = max < 0 ? most : std::min(max, most);
  if (min > max && max >= 0) return Unsupported(path, "minItems is over the tuple's length and no further items are allowed");
  if (max == 0) return "\"[\" " + ws + " \"]\"";
  const int64_t used = max < 0 ? n : std::min(n, max);
  std::vector<std::string> items;
  for (int64_t i = 0; i < used; ++i) {
    auto v = Visit(list[static_cast<size_t>(i)], path + "/" + std::to_string(i));
    if (!v.ok()) return v.error();
    items.push_back(*v);
  }
  std::string tail;  // what follows item i (a rule name, or the rest's repetition, or "")
  if (used == n && (max < 0 || max > n) && !rest_none) {
    const int64_t lo = std::max<int64_t>(0, min - n);
    tail = "( \",\" " + ws + " " + rest + " " + ws + " ){" + std::to_string(lo) + "," + (max < 0 ? "" : std::to_string(max - n)) + "}";
  }
  for (int64_t i = used - 1; i >= 1; --i) {
    std::string body = "\",\" " + ws + " " + items[static_cast<size_t>(i)] + " " + ws + (tail.empty() ? "" : " " + tail);
    if (i >= min) body += " | ";
    tail = NewRule("tuple", body);
  }
  const std::string list_text = items[0] + " " + ws + (tail.empty() ? "" : " " + tail);
  if (min == 0) return "\"[\" " + ws + " ( " + list_text + " )? \"]\"";
  return "\"[\" " + ws + " " + list_text + " \"]\"";
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
  // multipleOf a / 10^k: on integers, the multiples of a / gcd(a, 10^k); on numbers, an integer m
  // gives the integer multiples of m and 10^-k at most k fraction digits; other fractions are
  // refused (0.25 would need the remainder automaton over the fraction digits too).
  int frac_digits = -1;  // at most this many fraction digits; -1: any
  if (s.contains("multipleOf")) {
    auto d = ReadDecimal(s["multipleOf"], path + "/multipleOf");
    if (!d.ok()) return d.error();
    uint64_t m = d->a;
    if (integer) {
      for (int i = 0; i < d->k && m % 2 == 0; ++i) m /= 2;
      for (int i = 0; i < d->k && m % 5 == 0; ++i) m /= 5;
    } else if (d->k > 0 && d->a != 1) {
      return Unsupported(path + "/multipleOf", "multipleOf on a number must be an integer or 0.1, 0.01, 0.001, ... (10^-k)");
    }
    if (integer || d->k == 0) {
      if (m > 1) return MultipleExpr(lo, hi, m, path + "/multipleOf");
      integer = true;
    } else {
      frac_digits = d->k;
    }
  }
  if (!lo && !hi) {
    if (frac_digits >= 0) return Common("json-int") + " ( \".\" [0-9]{1," + std::to_string(frac_digits) + "} )?";
    return Common(integer ? "json-int" : "json-number");
  }
  const std::string ints = IntegerRangeExpr(lo ? &*lo : nullptr, hi ? &*hi : nullptr);
  if (integer) return ints;
  // A fraction strictly between the bounds: n.ddd with n in [max(L, 0), H - 1], or -m.ddd with
  // m in [max(-H, 0), -L - 1].
  std::vector<std::string> alts = {" " + ints};
  const std::string frac = frac_digits < 0 ? " \".\" [0-9]+" : " \".\" [0-9]{1," + std::to_string(frac_digits) + "}";
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

Result<std::string> SchemaCompiler::MultipleExpr(std::optional<int64_t> lo, std::optional<int64_t> hi, uint64_t m, const std::string& path) {
  const int64_t low = lo ? *lo : -kIntClamp, high = hi ? *hi : kIntClamp;
  const int64_t mi = static_cast<int64_t>(std::min<uint64_t>(m, kIntClamp + 1));
  const int64_t first = low >= 0 ? (low + mi - 1) / mi * mi : -(-low / mi * mi);
  const int64_t last = high >= 0 ? high / mi * mi : -((-high + mi - 1) / mi * mi);
  const std::string ms = std::to_string(m);
  if (first > last) return Unsupported(path, "no multiple of " + ms + " lies within the bounds");
  std::vector<std::string> alts;
  if (static_cast<uint64_t>(last - first) / m < kMaxListedMultiples) {
    for (int64_t v = first; v <= last; v += mi) {
      char lit[32];
      snprintf(lit, sizeof(lit), " \"%lld\"", static_cast<long long>(v));  // digits and '-': nothing to escape
      alts.push_back(lit);
    }
    return Join(alts);
  }
  if (m > kMaxMultipleOf)
    return Unsupported(path, "multipleOf " + ms + " (over " + std::to_string(kMaxMultipleOf) + ") with bounds that hold more than " +
                                 std::to_string(kMaxListedMultiples) + " multiples is not supported");
  MultipleRuns runs(m, [this](const std::string& body) { return NewRule("multiple", body); });
  auto keep = [&](uint64_t a, uint64_t b) {
    std::vector<std::string> kept;
    for (const DigitRun& r : MagnitudeRuns(a, b)) {
      std::string e = runs.Keep(r);
      if (!e.empty()) kept.push_back(e);
    }
    return kept;
  };
  if (first < 0) {
    auto neg = keep(last < 0 ? static_cast<uint64_t>(-last) : 1, static_cast<uint64_t>(-first));
    if (!neg.empty()) alts.push_back(" \"-\" " + Join(neg));
  }
  if (last >= 0)
    for (auto& e : keep(static_cast<uint64_t>(std::max<int64_t>(first, 0)), static_cast<uint64_t>(last))) alts.push_back(e);
  if (runs.rules() > kMaxMultipleRules)
    return Unsupported(path, "multipleOf " + ms + " with these bounds needs " + std::to_string(runs.rules()) +
                                 " grammar rules (at most " + std::to_string(kMaxMultipleRules) + ")");
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
