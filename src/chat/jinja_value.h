// Values of the Jinja subset: undefined, none, bool, int, float, string, list, dict (insertion-ordered),
// and callables (builtins, macros, bound methods). Semantics follow Python/Jinja2 as used by Hugging
// Face chat templates: Python truthiness, equality (1 == 1.0 == true), str() and repr() formatting,
// json.dumps for `tojson`.
//
// Lists and dicts are shared by reference (copying a Value is cheap). Templates cannot mutate them,
// except namespace objects (`namespace(...)`), whose attributes `{% set ns.x = ... %}` assigns.
// Strings are UTF-8; length, indexing and slicing count code points, as Python does.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace mnemo::jinja {

class Value;
struct CallArgs;
using List = std::vector<Value>;

// Insertion-ordered string-keyed map (chat messages and tool schemas are small: linear lookup).
// Keys of other scalar types ({0: 'a'} in a template) are stored encoded by DictKey (a "\x01" byte,
// a type letter, then the value) and decoded by KeyValue, so they keep their type.
struct Dict {
  std::vector<std::pair<std::string, Value>> items;  // [n] key, value in insertion order
  bool is_namespace = false;                         // created by namespace(): attributes assignable

  const Value* Find(std::string_view key) const;
  void Set(std::string key, Value value);  // replaces an existing key in place, else appends
};

// A callable: receives positional and keyword arguments. May throw internal::JinjaError (caught by
// the interpreter, never escapes the public API).
struct Function {
  std::string name;                                  // for messages and repr
  std::function<Value(CallArgs& args)> call;
};

class Value {
 public:
  enum class Kind : uint8_t { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kFunction };

  Value() = default;  // undefined
  static Value None() { Value v; v.data_ = NoneTag{}; return v; }
  Value(bool b) : data_(b) {}                    // NOLINT: implicit on purpose
  Value(int i) : data_(static_cast<int64_t>(i)) {}  // NOLINT
  Value(int64_t i) : data_(i) {}                 // NOLINT
  Value(double f) : data_(f) {}                  // NOLINT
  Value(std::string s) : data_(std::move(s)) {}  // NOLINT
  Value(std::string_view s) : data_(std::string(s)) {}  // NOLINT
  Value(const char* s) : data_(std::string(s)) {}       // NOLINT
  Value(List l) : data_(std::make_shared<List>(std::move(l))) {}  // NOLINT
  Value(Dict d) : data_(std::make_shared<Dict>(std::move(d))) {}  // NOLINT
  static Value MakeFunction(std::string name, std::function<Value(CallArgs&)> fn);
  // JSON -> Value. Objects keep the key order of the json type: use ordered_json to keep the order
  // of the request (tool schemas are rendered with tojson, where order shows). Nesting deeper than
  // 128 levels is cut (becomes none).
  static Value FromJson(const nlohmann::json& j);
  static Value FromJson(const nlohmann::ordered_json& j);

  Kind kind() const { return static_cast<Kind>(data_.index()); }
  bool is_undefined() const { return kind() == Kind::kUndefined; }
  bool is_none() const { return kind() == Kind::kNone; }
  bool is_bool() const { return kind() == Kind::kBool; }
  bool is_int() const { return kind() == Kind::kInt; }
  bool is_float() const { return kind() == Kind::kFloat; }
  bool is_number() const { return is_bool() || is_int() || is_float(); }  // Python: bool is an int
  bool is_string() const { return kind() == Kind::kString; }
  bool is_list() const { return kind() == Kind::kList; }
  bool is_dict() const { return kind() == Kind::kDict; }
  bool is_function() const { return kind() == Kind::kFunction; }

  // Accessors; precondition: the matching kind.
  bool as_bool() const { return std::get<bool>(data_); }
  int64_t as_int() const;   // int or bool
  double as_float() const;  // float, int or bool
  const std::string& str() const { return std::get<std::string>(data_); }
  const List& list() const { return *std::get<std::shared_ptr<List>>(data_); }
  const Dict& dict() const { return *std::get<std::shared_ptr<Dict>>(data_); }
  Dict& mutable_dict() const { return *std::get<std::shared_ptr<Dict>>(data_); }  // namespaces only
  const Function& function() const { return *std::get<std::shared_ptr<const Function>>(data_); }

  bool Truthy() const;           // Python bool()
  const char* TypeName() const;  // Python-ish type name for messages: "str", "list", "dict", ...

 private:
  struct NoneTag {};
  std::variant<std::monostate, NoneTag, bool, int64_t, double, std::string, std::shared_ptr<List>,
               std::shared_ptr<Dict>, std::shared_ptr<const Function>>
      data_;
};

// Dict key of a hashable value: strings as is, ints / floats / bools / none encoded (see Dict).
// Throws internal::JinjaError for unhashable values (lists, dicts, functions, undefined).
std::string DictKey(const Value& key);
Value KeyValue(const std::string& key);  // inverse of DictKey

// Arguments of a call: positional, then keyword (name=value) in source order.
struct CallArgs {
  std::vector<Value> positional;                      // [n_pos]
  std::vector<std::pair<std::string, Value>> named;   // [n_named]
};

// Python semantics. These may throw internal::JinjaError (e.g. on nesting deeper than 128 levels, or
// tojson of an undefined value); the interpreter turns that into an Error.
bool Equals(const Value& a, const Value& b);
std::string ToStr(const Value& v);   // str(v): "None", "True", "1.5", "['a', 1]"; undefined -> ""
std::string Repr(const Value& v);    // repr(v): strings quoted
std::string FormatFloat(double f);   // Python repr of a float: "1.0", "1e-05", "1e+16"

// json.dumps(v, ensure_ascii, indent, separators, sort_keys) as transformers' `tojson` filter calls
// it: indent < 0 means none (one line, ", " and ": "), else newlines and `indent` spaces per level
// ("," and ": "). item_sep / key_sep override the separators when not null.
std::string ToJson(const Value& v, int indent = -1, bool ensure_ascii = false, const char* item_sep = nullptr,
                   const char* key_sep = nullptr, bool sort_keys = false);

// UTF-8 helpers (code point based, as Python str).
size_t Utf8Length(std::string_view s);                       // number of code points
std::vector<uint32_t> Utf8Offsets(std::string_view s);       // [n + 1] byte offset of each code point

}  // namespace mnemo::jinja
