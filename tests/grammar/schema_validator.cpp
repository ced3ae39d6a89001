#include "schema_validator.h"

#include <cmath>

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

}  // namespace

std::string Validate(const J& s, const J& v, const J& root) {
  if (s.is_boolean()) return s.get<bool>() ? "" : "false schema";
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
  }
  if (v.is_number()) {
    const double x = v.get<double>();
    if (s.contains("minimum") && x < s["minimum"].get<double>()) return "below minimum: " + v.dump();
    if (s.contains("maximum") && x > s["maximum"].get<double>()) return "above maximum: " + v.dump();
    if (s.contains("exclusiveMinimum") && s["exclusiveMinimum"].is_number() && x <= s["exclusiveMinimum"].get<double>()) return "not above exclusiveMinimum: " + v.dump();
    if (s.contains("exclusiveMaximum") && s["exclusiveMaximum"].is_number() && x >= s["exclusiveMaximum"].get<double>()) return "not below exclusiveMaximum: " + v.dump();
  }
  if (v.is_array()) {
    if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) return "fewer than minItems: " + v.dump();
    if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) return "more than maxItems: " + v.dump();
    if (s.contains("items"))
      for (const auto& x : v) {
        std::string e = Validate(s["items"], x, root);
        if (!e.empty()) return "item: " + e;
      }
  }
  if (v.is_object()) {
    if (s.contains("required"))
      for (const auto& r : s["required"])
        if (!v.contains(r.get<std::string>())) return "missing required " + r.dump() + " in " + v.dump();
    const J props = s.value("properties", J::object());
    for (auto it = v.begin(); it != v.end(); ++it) {
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
