// Value semantics: Python truthiness, equality, str(), repr() and json.dumps.
#include "chat/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include <nlohmann/json.hpp>

#include "chat/jinja_internal.h"

namespace mnemo::jinja {

using internal::Fail;

namespace {
// Containers can reach themselves only through namespaces; this bounds recursion either way.
constexpr int kMaxDepth = 128;

void CheckDepth(int depth) {
  if (depth > kMaxDepth) Fail("value nested deeper than 128 levels (self-referencing namespace?)");
}
}  // namespace

const Value* Dict::Find(std::string_view key) const {
  for (const auto& [k, v] : items) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Dict::Set(std::string key, Value value) {
  for (auto& [k, v] : items) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  items.emplace_back(std::move(key), std::move(value));
}

Value Value::MakeFunction(std::string name, std::function<Value(CallArgs&)> fn) {
  Value v;
  v.data_ = std::make_shared<const Function>(Function{std::move(name), std::move(fn)});
  return v;
}

namespace {
template <class Json>
Value FromJsonImpl(const Json& j, int depth = 0) {
  if (depth > kMaxDepth) return Value::None();  // cut: deeper JSON is not rendered
  switch (j.type()) {
    case nlohmann::json::value_t::null: return Value::None();
    case nlohmann::json::value_t::boolean: return Value(j.template get<bool>());
    case nlohmann::json::value_t::number_integer: return Value(j.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      const uint64_t u = j.template get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value(static_cast<double>(u));
      return Value(static_cast<int64_t>(u));
    }
    case nlohmann::json::value_t::number_float: return Value(j.template get<double>());
    case nlohmann::json::value_t::string: return Value(j.template get<std::string>());
    case nlohmann::json::value_t::array: {
      List l;
      l.reserve(j.size());
      for (const auto& e : j) l.push_back(FromJsonImpl(e, depth + 1));
      return Value(std::move(l));
    }
    case nlohmann::json::value_t::object: {
      Dict d;
      for (auto it = j.begin(); it != j.end(); ++it) d.Set(it.key(), FromJsonImpl(it.value(), depth + 1));
      return Value(std::move(d));
    }
    default: return Value();  // binary / discarded
  }
}
}  // namespace

Value Value::FromJson(const nlohmann::json& j) { return FromJsonImpl(j); }
Value Value::FromJson(const nlohmann::ordered_json& j) { return FromJsonImpl(j); }

int64_t Value::as_int() const {
  if (is_bool()) return as_bool() ? 1 : 0;
  return std::get<int64_t>(data_);
}

double Value::as_float() const {
  if (is_float()) return std::get<double>(data_);
  return static_cast<double>(as_int());
}

std::string DictKey(const Value& key) {
  switch (key.kind()) {
    case Value::Kind::kString: return key.str();
    case Value::Kind::kInt: return "\x01i" + std::to_string(key.as_int());
    case Value::Kind::kBool: return key.as_bool() ? "\x01i1" : "\x01i0";  // Python: True == 1
    case Value::Kind::kFloat: {
      const double f = key.as_float();  // Python: 2.0 == 2 hashes alike
      if (std::isfinite(f) && f == std::floor(f) && std::fabs(f) < 9e18) return "\x01i" + std::to_string(static_cast<int64_t>(f));
      return "\x01" "f" + FormatFloat(f);
    }
    case Value::Kind::kNone: return "\x01n";
    default: Fail(std::string("unhashable type: '") + key.TypeName() + "'");
  }
}

Value KeyValue(const std::string& key) {
  if (key.size() < 2 || key[0] != '\x01') return Value(key);
  switch (key[1]) {
    case 'i': return Value(static_cast<int64_t>(std::strtoll(key.c_str() + 2, nullptr, 10)));
    case 'f': return Value(std::strtod(key.c_str() + 2, nullptr));
    case 'n': return Value::None();
    default: return Value(key);
  }
}

bool Value::Truthy() const {
  switch (kind()) {
    case Kind::kUndefined:
    case Kind::kNone: return false;
    case Kind::kBool: return as_bool();
    case Kind::kInt: return as_int() != 0;
    case Kind::kFloat: return as_float() != 0.0;
    case Kind::kString: return !str().empty();
    case Kind::kList: return !list().empty();
    case Kind::kDict: return dict().is_namespace || !dict().items.empty();
    case Kind::kFunction: return true;
  }
  return false;
}

const char* Value::TypeName() const {
  switch (kind()) {
    case Kind::kUndefined: return "undefined";
    case Kind::kNone: return "NoneType";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "str";
    case Kind::kList: return "list";
    case Kind::kDict: return dict().is_namespace ? "Namespace" : "dict";
    case Kind::kFunction: return "function";
  }
  return "?";
}

namespace {

bool EqualsAt(const Value& a, const Value& b, int depth) {
  CheckDepth(depth);
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_float() == b.as_float();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone: return true;
    case Value::Kind::kString: return a.str() == b.str();
    case Value::Kind::kList: {
      const List& x = a.list();
      const List& y = b.list();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i) {
        if (!EqualsAt(x[i], y[i], depth + 1)) return false;
      }
      return true;
    }
    case Value::Kind::kDict: {
      const Dict& x = a.dict();
      const Dict& y = b.dict();
      if (x.is_namespace || y.is_namespace) return &x == &y;  // objects compare by identity
      if (x.items.size() != y.items.size()) return false;
      for (const auto& [k, v] : x.items) {
        const Value* w = y.Find(k);
        if (w == nullptr || !EqualsAt(v, *w, depth + 1)) return false;
      }
      return true;
    }
    case Value::Kind::kFunction: return &a.function() == &b.function();
    default: return false;
  }
}

void AppendRepr(const Value& v, std::string* out, int depth);

void AppendStr(const Value& v, std::string* out, int depth) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return;
    case Value::Kind::kNone: *out += "None"; return;
    case Value::Kind::kBool: *out += v.as_bool() ? "True" : "False"; return;
    case Value::Kind::kInt: *out += std::to_string(v.as_int()); return;
    case Value::Kind::kFloat: *out += FormatFloat(v.as_float()); return;
    case Value::Kind::kString: *out += v.str(); return;
    default: AppendRepr(v, out, depth); return;
  }
}

void AppendQuoted(const std::string& s, std::string* out) {
  // Python repr: single quotes unless the string has ' and no ".
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char q = (has_single && !has_double) ? '"' : '\'';
  *out += q;
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == q || c == '\\') {
      *out += '\\';
      *out += c;
    } else if (c == '\n') {
      *out += "\\n";
    } else if (c == '\r') {
      *out += "\\r";
    } else if (c == '\t') {
      *out += "\\t";
    } else if (u < 0x20 || u == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", u);
      *out += buf;
    } else {
      *out += c;
    }
  }
  *out += q;
}

void AppendRepr(const Value& v, std::string* out, int depth) {
  CheckDepth(depth);
  internal::CheckStringSize(out->size());
  switch (v.kind()) {
    case Value::Kind::kString: AppendQuoted(v.str(), out); return;
    case Value::Kind::kList: {
      *out += '[';
      bool first = true;
      for (const Value& e : v.list()) {
        if (!first) *out += ", ";
        first = false;
        AppendRepr(e, out, depth + 1);
      }
      *out += ']';
      return;
    }
    case Value::Kind::kDict: {
      const Dict& d = v.dict();
      if (d.is_namespace) *out += "<Namespace ";
      *out += '{';
      bool first = true;
      for (const auto& [k, e] : d.items) {
        if (!first) *out += ", ";
        first = false;
        AppendRepr(KeyValue(k), out, depth + 1);
        *out += ": ";
        AppendRepr(e, out, depth + 1);
      }
      *out += '}';
      if (d.is_namespace) *out += '>';
      return;
    }
    case Value::Kind::kFunction: *out += "<function " + v.function().name + ">"; return;
    default: AppendStr(v, out, depth); return;
  }
}

void AppendJsonString(std::string_view s, bool ensure_ascii, std::string* out) {
  *out += '"';
  for (size_t i = 0; i < s.size(); ++i) {
    const auto u = static_cast<unsigned char>(s[i]);
    switch (u) {
      case '"': *out += "\\\""; continue;
      case '\\': *out += "\\\\"; continue;
      case '\n': *out += "\\n"; continue;
      case '\r': *out += "\\r"; continue;
      case '\t': *out += "\\t"; continue;
      case '\b': *out += "\\b"; continue;
      case '\f': *out += "\\f"; continue;
      default: break;
    }
    char buf[16];
    if (u < 0x20) {
      std::snprintf(buf, sizeof(buf), "\\u%04x", u);
      *out += buf;
    } else if (u < 0x80 || !ensure_ascii) {
      *out += s[i];
    } else {
      // Decode one UTF-8 sequence; invalid bytes are written as U+FFFD.
      uint32_t cp = 0xFFFD;
      int len = 1;
      if ((u & 0xE0) == 0xC0) len = 2, cp = u & 0x1F;
      else if ((u & 0xF0) == 0xE0) len = 3, cp = u & 0x0F;
      else if ((u & 0xF8) == 0xF0) len = 4, cp = u & 0x07;
      bool ok = len > 1 && i + len <= s.size();
      for (int k = 1; ok && k < len; ++k) {
        const auto c = static_cast<unsigned char>(s[i + k]);
        if ((c & 0xC0) != 0x80) ok = false;
        cp = (cp << 6) | (c & 0x3F);
      }
      if (!ok) {
        cp = 0xFFFD;
        len = 1;
      }
      i += len - 1;
      if (cp >= 0x10000) {
        const uint32_t c = cp - 0x10000;
        std::snprintf(buf, sizeof(buf), "\\u%04x\\u%04x", 0xD800 + (c >> 10), 0xDC00 + (c & 0x3FF));
      } else {
        std::snprintf(buf, sizeof(buf), "\\u%04x", cp);
      }
      *out += buf;
    }
  }
  *out += '"';
}

struct JsonStyle {
  int indent;
  bool ensure_ascii;
  std::string item_sep;
  std::string key_sep;
  bool sort_keys;
};

void AppendJson(const Value& v, const JsonStyle& st, int level, std::string* out) {
  CheckDepth(level);
  internal::CheckStringSize(out->size());
  auto newline = [&](int lvl) {
    if (st.indent < 0) return;
    *out += '\n';
    out->append(static_cast<size_t>(st.indent) * lvl, ' ');
  };
  switch (v.kind()) {
    case Value::Kind::kUndefined: Fail("tojson: value is undefined");
    case Value::Kind::kNone: *out += "null"; return;
    case Value::Kind::kBool: *out += v.as_bool() ? "true" : "false"; return;
    case Value::Kind::kInt: *out += std::to_string(v.as_int()); return;
    case Value::Kind::kFloat: {
      const double f = v.as_float();
      if (std::isnan(f)) *out += "NaN";
      else if (std::isinf(f)) *out += f > 0 ? "Infinity" : "-Infinity";
      else *out += FormatFloat(f);
      return;
    }
    case Value::Kind::kString: AppendJsonString(v.str(), st.ensure_ascii, out); return;
    case Value::Kind::kList: {
      const List& l = v.list();
      if (l.empty()) {
        *out += "[]";
        return;
      }
      *out += '[';
      for (size_t i = 0; i < l.size(); ++i) {
        if (i > 0) *out += st.item_sep;
        newline(level + 1);
        AppendJson(l[i], st, level + 1, out);
      }
      newline(level);
      *out += ']';
      return;
    }
    case Value::Kind::kDict: {
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.dict().items) items.push_back(&kv);
      if (st.sort_keys) {
        std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      }
      if (items.empty()) {
        *out += "{}";
        return;
      }
      *out += '{';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) *out += st.item_sep;
        newline(level + 1);
        const Value key = KeyValue(items[i]->first);  // json.dumps writes non-string keys as strings
        AppendJsonString(key.is_string() ? key.str() : key.is_none() ? "null" : ToStr(key), st.ensure_ascii, out);
        *out += st.key_sep;
        AppendJson(items[i]->second, st, level + 1, out);
      }
      newline(level);
      *out += '}';
      return;
    }
    case Value::Kind::kFunction: Fail("tojson: a function is not JSON serializable");
  }
}

}  // namespace

bool Equals(const Value& a, const Value& b) { return EqualsAt(a, b, 0); }

std::string ToStr(const Value& v) {
  if (v.is_string()) return v.str();
  std::string out;
  AppendStr(v, &out, 0);
  return out;
}

std::string Repr(const Value& v) {
  std::string out;
  AppendRepr(v, &out, 0);
  return out;
}

std::string FormatFloat(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  if (f == 0) return std::signbit(f) ? "-0.0" : "0.0";
  // Shortest round-trip digits, then Python's layout: fixed when -4 <= exponent < 16.
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), f, std::chars_format::scientific);
  std::string sci(buf, r.ptr);  // e.g. "-1.2345e+02"
  const size_t e = sci.find('e');
  const int exp = std::stoi(sci.substr(e + 1));
  std::string mant = sci.substr(0, e);
  const bool neg = mant[0] == '-';
  if (neg) mant.erase(0, 1);
  std::string digits;
  for (const char c : mant) {
    if (c != '.') digits += c;
  }
  std::string out = neg ? "-" : "";
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      out += "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
    } else if (static_cast<size_t>(exp) + 1 >= digits.size()) {
      out += digits + std::string(exp + 1 - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, exp + 1) + "." + digits.substr(exp + 1);
    }
  } else {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof(eb), "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    out += eb;
  }
  return out;
}

std::string ToJson(const Value& v, int indent, bool ensure_ascii, const char* item_sep, const char* key_sep,
                   bool sort_keys) {
  JsonStyle st{indent, ensure_ascii, indent < 0 ? ", " : ",", ": ", sort_keys};
  if (item_sep != nullptr) st.item_sep = item_sep;
  if (key_sep != nullptr) st.key_sep = key_sep;
  std::string out;
  AppendJson(v, st, 0, &out);
  return out;
}

size_t Utf8Length(std::string_view s) {
  // Same rule as Utf8Offsets: a leading stray continuation byte counts as a character.
  size_t n = 0;
  for (size_t i = 0; i < s.size(); ++i) n += (static_cast<unsigned char>(s[i]) & 0xC0) != 0x80 || i == 0;
  return n;
}

std::vector<uint32_t> Utf8Offsets(std::string_view s) {
  // A code point starts at every byte that is not a continuation byte (stray continuation bytes at
  // the start count as their own characters so that no byte is lost).
  std::vector<uint32_t> off;
  off.reserve(s.size() + 1);
  for (size_t i = 0; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80 || off.empty()) off.push_back(static_cast<uint32_t>(i));
  }
  off.push_back(static_cast<uint32_t>(s.size()));
  return off;
}

}  // namespace mnemo::jinja
