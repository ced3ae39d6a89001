#include "schema_validator.h"

#include <arpa/inet.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <regex>
#include <vector>

#include "tokenizer/unicode.h"

namespace mnemo::test {
namespace {

using J = nlohmann::ordered_json;

size_t CodePoints(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

bool HasType(const J& v, const std::string& t) {
  if (t == "object") return v.is_object();
  if (t == "array") return v.is_array();
  if (t == "string") return v.is_string();
  if (t == "boolean") return v.is_boolean();
  if (t == "null") return v.is_null();
  if (t == "number") return v.is_number();
  if (t == "integer") return v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
  return false;
}

// ---- Formats, from the RFCs' grammars ---------------------------------------------------------

bool AllOf(const std::string& s, const char* chars) { return !s.empty() && s.find_first_not_of(chars) == std::string::npos; }
constexpr const char* kDigits = "0123456789";

int Num(const std::string& s, size_t at, size_t n) {
  if (at + n > s.size() || !AllOf(s.substr(at, n), kDigits)) return -1;
  return std::stoi(s.substr(at, n));
}

bool IsDate(const std::string& s) {
  if (s.size() != 10 || s[4] != '-' || s[7] != '-') return false;
  const int y = Num(s, 0, 4), m = Num(s, 5, 2), d = Num(s, 8, 2);
  if (y < 0 || m < 1 || m > 12 || d < 1) return false;
  const bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
  const int days[] = {31, leap ? 29 : 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  return d <= days[m - 1];
}

// RFC 3339 full-time (we generate seconds 00-59).
bool IsTime(const std::string& s) {
  if (s.size() < 9 || s[2] != ':' || s[5] != ':') return false;
  const int h = Num(s, 0, 2), m = Num(s, 3, 2), sec = Num(s, 6, 2);
  if (h < 0 || h > 23 || m < 0 || m > 59 || sec < 0 || sec > 60) return false;
  size_t i = 8;
  if (i < s.size() && s[i] == '.') {
    const size_t start = ++i;
    while (i < s.size() && isdigit(static_cast<unsigned char>(s[i]))) ++i;
    if (i == start) return false;
  }
  const std::string zone = s.substr(i);
  if (zone == "Z" || zone == "z") return true;
  if (zone.size() != 6 || (zone[0] != '+' && zone[0] != '-') || zone[3] != ':') return false;
  const int zh = Num(zone, 1, 2), zm = Num(zone, 4, 2);
  return zh >= 0 && zh <= 23 && zm >= 0 && zm <= 59;
}

bool IsDateTime(const std::string& s) {
  const size_t t = s.find_first_of("Tt");
  return t != std::string::npos && IsDate(s.substr(0, t)) && IsTime(s.substr(t + 1));
}

// JSON Schema's appendix A: P (date [time] | time | week), components in order Y M D / H M S,
// each a digit run, with no gaps (a year is followed by months before days, hours by minutes
// before seconds).
bool IsDuration(const std::string& s) {
  if (s.size() < 3 || s[0] != 'P') return false;
  std::vector<std::pair<std::string, char>> parts;  // (digits, unit); 'T' as its own part
  for (size_t i = 1; i < s.size();) {
    if (s[i] == 'T') {
      parts.push_back({"", 'T'});
      ++i;
      continue;
    }
    const size_t start = i;
    while (i < s.size() && isdigit(static_cast<unsigned char>(s[i]))) ++i;
    if (i == start || i == s.size()) return false;
    parts.push_back({s.substr(start, i - start), s[i]});
    ++i;
  }
  if (parts.size() == 1 && parts[0].second == 'W') return true;
  size_t t = parts.size();
  for (size_t i = 0; i < parts.size(); ++i)
    if (parts[i].second == 'T') {
      if (t != parts.size()) return false;
      t = i;
    }
  auto chain = [&](size_t from, size_t to, const std::string& units) {
    if (from == to) return true;
    const size_t first = units.find(parts[from].second);
    if (first == std::string::npos) return false;
    for (size_t i = from; i < to; ++i)
      if (first + (i - from) >= units.size() || parts[i].second != units[first + (i - from)]) return false;
    return true;
  };
  if (t < parts.size() && t + 1 == parts.size()) return false;  // "T" with nothing after it
  return chain(0, t, "YMD") && (t == parts.size() || chain(t + 1, parts.size(), "HMS")) && (t > 0 || t < parts.size());
}

bool IsLabel(const std::string& l) {
  const char* ldh = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-";
  return l.size() >= 1 && l.size() <= 63 && AllOf(l, ldh) && l.front() != '-' && l.back() != '-';
}

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> out(1);
  for (char c : s) {
    if (c == sep) out.emplace_back();
    else out.back() += c;
  }
  return out;
}

bool IsHostname(const std::string& s, size_t max_len = 253) {
  if (s.size() > max_len) return false;
  for (const auto& l : Split(s, '.'))
    if (!IsLabel(l)) return false;
  return true;
}

// RFC 5321 Mailbox with a dot-atom local part (at most 64 octets) and a domain of labels.
bool IsEmail(const std::string& s) {
  const size_t at = s.rfind('@');
  if (at == std::string::npos || at > 64) return false;
  const char* atext = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789!#$%&'*+/=?^_`{|}~-";
  for (const auto& atom : Split(s.substr(0, at), '.'))
    if (!AllOf(atom, atext)) return false;
  return IsHostname(s.substr(at + 1), 255);
}

bool IsIpv4(const std::string& s) {
  in_addr a;
  if (inet_pton(AF_INET, s.c_str(), &a) != 1) return false;
  for (const auto& part : Split(s, '.'))
    if (part.size() > 1 && part[0] == '0') return false;
  return true;
}

bool IsIpv6(const std::string& s) {
  in6_addr a;
  return s.find('.') == std::string::npos && inet_pton(AF_INET6, s.c_str(), &a) == 1;
}

bool IsUuid(const std::string& s) {
  if (s.size() != 36) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    const bool dash = i == 8 || i == 13 || i == 18 || i == 23;
    if (dash ? s[i] != '-' : !isxdigit(static_cast<unsigned char>(s[i]))) return false;
  }
  return true;
}

// RFC 3986 URI: scheme ":" then only URI characters, '%' always followed by two hex digits, at
// most one '#', and no "//" right after the scheme unless an authority follows it.
bool IsUri(const std::string& s) {
  const size_t colon = s.find(':');
  if (colon == std::string::npos || colon == 0 || !isalpha(static_cast<unsigned char>(s[0]))) return false;
  if (!AllOf(s.substr(0, colon), "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+.-")) return false;
  const std::string rest = s.substr(colon + 1);
  if (!rest.empty() && !AllOf(rest, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~:/?#[]@!$&'()*+,;=%")) return false;
  for (size_t i = 0; i < rest.size(); ++i)
    if (rest[i] == '%' && (i + 2 >= rest.size() || !isxdigit(static_cast<unsigned char>(rest[i + 1])) ||
                           !isxdigit(static_cast<unsigned char>(rest[i + 2]))))
      return false;
  if (std::count(rest.begin(), rest.end(), '#') > 1) return false;
  if (rest.find_first_of("[]") != std::string::npos) return false;  // only in IP literals, which we do not write
  return true;
}

// A JSON number as exact decimal digits and a count of fraction digits: integers as written, a
// double as its shortest round-trip text (what the output wrote, when it had at most 17
// significant digits; past that a double has no fraction digits left to check).
std::pair<std::string, int> DecimalOf(const J& v) {
  std::string t;
  if (v.is_number_unsigned()) t = std::to_string(v.get<uint64_t>());
  else if (v.is_number_integer()) t = std::to_string(v.get<int64_t>());
  else {
    char buf[400];
    auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v.get<double>(), std::chars_format::fixed);
    t.assign(buf, end);
  }
  if (!t.empty() && t[0] == '-') t.erase(0, 1);
  int k = 0;
  if (const size_t dot = t.find('.'); dot != std::string::npos) {
    k = static_cast<int>(t.size() - dot - 1);
    t.erase(dot, 1);
  }
  return {t, k};
}

// Whether x is an integer multiple of m, in exact decimal arithmetic: with both scaled to the
// same fraction digits, X mod M == 0.
bool IsMultiple(const J& x, const J& m) {
  auto [xd, xk] = DecimalOf(x);
  auto [md, mk] = DecimalOf(m);
  const int k = std::max(xk, mk);
  xd += std::string(static_cast<size_t>(k - xk), '0');
  md += std::string(static_cast<size_t>(k - mk), '0');
  md = md.substr(std::min(md.find_first_not_of('0'), md.size()));
  if (md.empty() || md.size() > 36) return false;
  unsigned __int128 mod = 0, r = 0;
  for (char c : md) mod = mod * 10 + static_cast<unsigned>(c - '0');
  for (char c : xd) r = (r * 10 + static_cast<unsigned>(c - '0')) % mod;
  return r == 0;
}

std::wstring Wide(const std::string& utf8) {
  std::wstring w;
  for (uint32_t c : DecodeUtf8Lenient(utf8)) w += static_cast<wchar_t>(c);
  return w;
}

}  // namespace

bool FormatValid(const std::string& format, const std::string& v) {
  if (format == "date") return IsDate(v);
  if (format == "time") return IsTime(v);
  if (format == "date-time") return IsDateTime(v);
  if (format == "duration") return IsDuration(v);
  if (format == "email" || format == "idn-email") return IsEmail(v);
  if (format == "hostname" || format == "idn-hostname") return IsHostname(v);
  if (format == "ipv4") return IsIpv4(v);
  if (format == "ipv6") return IsIpv6(v);
  if (format == "uuid") return IsUuid(v);
  if (format == "uri" || format == "uri-reference" || format == "iri" || format == "iri-reference") return IsUri(v);
  return true;
}

bool PatternMatches(const std::string& pattern, const std::string& v) {
  return std::regex_search(Wide(v), std::wregex(Wide(pattern), std::regex::ECMAScript));
}

std::string Validate(const J& s, const J& v, const J& root) {
  if (s.is_boolean()) return s.get<bool>() ? "" : "false schema";
  if (s.contains("not") && Validate(s["not"], v, root).empty()) return "matches not: " + v.dump();
  if (s.contains("$ref")) {
    const std::string ref = s["$ref"].get<std::string>();
    return Validate(root.at(J::json_pointer(ref.substr(1))), v, root);
  }
  if (s.contains("const") && s["const"] != v) return "const mismatch: " + v.dump();
  if (s.contains("enum")) {
    bool found = false;
    for (const auto& e : s["enum"]) found |= e == v;
    if (!found) return "not in enum: " + v.dump();
  }
  for (const char* k : {"anyOf", "oneOf", "allOf"}) {
    if (!s.contains(k)) continue;
    int ok = 0;
    std::string why;
    for (const auto& sub : s[k]) {
      std::string e = Validate(sub, v, root);
      ok += e.empty();
      if (!e.empty()) why = e;
    }
    if (std::string(k) == "allOf" && ok != static_cast<int>(s[k].size())) return "allOf: " + why;
    if (std::string(k) == "anyOf" && ok == 0) return "anyOf: none matches " + v.dump() + " (" + why + ")";
    if (std::string(k) == "oneOf" && ok != 1) return "oneOf: " + std::to_string(ok) + " match " + v.dump();
  }
  if (s.contains("type")) {
    bool ok = false;
    if (s["type"].is_string()) ok = HasType(v, s["type"]);
    else for (const auto& t : s["type"]) ok |= HasType(v, t);
    if (s.value("nullable", false) && v.is_null()) ok = true;
    if (!ok) return "type mismatch: " + v.dump() + " is not " + s["type"].dump();
  }
  if (v.is_string()) {
    const size_t n = CodePoints(v.get<std::string>());
    if (s.contains("minLength") && n < s["minLength"].get<size_t>()) return "shorter than minLength: " + v.dump();
    if (s.contains("maxLength") && n > s["maxLength"].get<size_t>()) return "longer than maxLength: " + v.dump();
    if (s.contains("format") && s["format"].is_string() && !FormatValid(s["format"], v.get<std::string>()))
      return "not a valid " + s["format"].get<std::string>() + ": " + v.dump();
    if (s.contains("pattern") && !PatternMatches(s["pattern"], v.get<std::string>())) return "does not match the pattern: " + v.dump();
  }
  if (v.is_number()) {
    const double x = v.get<double>();
    if (s.contains("minimum") && x < s["minimum"].get<double>()) return "below minimum: " + v.dump();
    if (s.contains("maximum") && x > s["maximum"].get<double>()) return "above maximum: " + v.dump();
    if (s.contains("exclusiveMinimum") && s["exclusiveMinimum"].is_number() && x <= s["exclusiveMinimum"].get<double>()) return "not above exclusiveMinimum: " + v.dump();
    if (s.contains("exclusiveMaximum") && s["exclusiveMaximum"].is_number() && x >= s["exclusiveMaximum"].get<double>()) return "not below exclusiveMaximum: " + v.dump();
    if (s.contains("multipleOf") && !IsMultiple(v, s["multipleOf"])) return "not a multiple of " + s["multipleOf"].dump() + ": " + v.dump();
  }
  if (v.is_array()) {
    if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) return "fewer than minItems: " + v.dump();
    if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) return "more than maxItems: " + v.dump();
    // Tuples: prefixItems then items (2020-12), or items as an array then additionalItems (draft-07).
    const bool draft7 = !s.contains("prefixItems") && s.contains("items") && s["items"].is_array();
    const J* prefix = draft7 ? &s["items"] : s.contains("prefixItems") ? &s["prefixItems"] : nullptr;
    const char* rest_key = draft7 ? "additionalItems" : "items";
    const J* rest = s.contains(rest_key) ? &s[rest_key] : nullptr;
    for (size_t i = 0; i < v.size(); ++i) {
      const J* item = prefix && i < prefix->size() ? &(*prefix)[i] : rest;
      if (!item) continue;
      std::string e = Validate(*item, v[i], root);
      if (!e.empty()) return "item " + std::to_string(i) + ": " + e;
    }
  }
  if (v.is_object()) {
    if (s.contains("required"))
      for (const auto& r : s["required"])
        if (!v.contains(r.get<std::string>())) return "missing required " + r.dump() + " in " + v.dump();
    const J props = s.value("properties", J::object());
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (s.contains("propertyNames")) {
        std::string e = Validate(s["propertyNames"], J(it.key()), root);
        if (!e.empty()) return "property name " + it.key() + ": " + e;
      }
      if (props.contains(it.key())) {
        std::string e = Validate(props[it.key()], it.value(), root);
        if (!e.empty()) return "property " + it.key() + ": " + e;
      } else if (s.contains("additionalProperties")) {
        std::string e = Validate(s["additionalProperties"], it.value(), root);
        if (!e.empty()) return "additional property " + it.key() + ": " + e;
      }
    }
  }
  return "";
}

}  // namespace mnemo::test
