// Python semantics the filters and templates share: call arguments, str helpers, str / dict /
// list methods, and sequences (iteration, length, containment, ordering, indexing, slicing).
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>

#include "chat/jinja_internal.h"

namespace mnemo::jinja::internal {

// ---- arguments ----------------------------------------------------------------------------------

const Value* Arg(CallArgs& args, size_t i, std::string_view name) {
  if (i < args.positional.size()) return &args.positional[i];
  for (const auto& [k, v] : args.named) {
    if (k == name) return &v;
  }
  return nullptr;
}

Value ArgOr(CallArgs& args, size_t i, std::string_view name, Value def) {
  const Value* v = Arg(args, i, name);
  return v ? *v : std::move(def);
}

// ---- str helpers -------------------------------------------------------------------------------

const std::string& NeedString(const Value& v, const char* what) {
  if (!v.is_string()) Fail(std::string(what) + ": expected a string, got '" + v.TypeName() + "'");
  return v.str();
}

int64_t NeedInt(const Value& v, const char* what) {
  if (!v.is_int() && !v.is_bool()) Fail(std::string(what) + ": expected an integer, got '" + v.TypeName() + "'");
  return v.as_int();
}

bool IsPySpace(unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f); }

// str.strip / lstrip / rstrip: whitespace, or any character of `chars` (code points).
std::string Strip(const std::string& s, const Value& chars, bool left, bool right) {
  size_t b = 0;
  size_t e = s.size();
  if (chars.is_undefined() || chars.is_none()) {
    while (left && b < e && IsPySpace(static_cast<unsigned char>(s[b]))) ++b;
    while (right && e > b && IsPySpace(static_cast<unsigned char>(s[e - 1]))) --e;
    return s.substr(b, e - b);
  }
  const std::string& set = NeedString(chars, "strip");
  const std::vector<uint32_t> off = Utf8Offsets(s);
  std::vector<std::string_view> members;
  const std::vector<uint32_t> set_off = Utf8Offsets(set);
  for (size_t i = 0; i + 1 < set_off.size(); ++i) members.push_back(std::string_view(set).substr(set_off[i], set_off[i + 1] - set_off[i]));
  auto in_set = [&](size_t ci) {
    const std::string_view ch = std::string_view(s).substr(off[ci], off[ci + 1] - off[ci]);
    return std::find(members.begin(), members.end(), ch) != members.end();
  };
  size_t cb = 0;
  size_t ce = off.size() - 1;
  while (left && cb < ce && in_set(cb)) ++cb;
  while (right && ce > cb && in_set(ce - 1)) --ce;
  return s.substr(off[cb], off[ce] - off[cb]);
}

std::string AsciiMap(std::string s, int (*f)(int)) {
  for (char& c : s) {
    if (static_cast<unsigned char>(c) < 0x80) c = static_cast<char>(f(c));
  }
  return s;
}
int Upper(int c) { return (c >= 'a' && c <= 'z') ? c - 32 : c; }
int Lower(int c) { return (c >= 'A' && c <= 'Z') ? c + 32 : c; }
static bool IsAlpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

std::string Title(const std::string& s) {  // Python str.title (ASCII letters)
  std::string out = s;
  bool prev_cased = false;
  for (char& c : out) {
    if (IsAlpha(c)) {
      c = static_cast<char>(prev_cased ? Lower(c) : Upper(c));
      prev_cased = true;
    } else {
      prev_cased = static_cast<unsigned char>(c) >= 0x80 && prev_cased;
    }
  }
  return out;
}

std::string Capitalize(const std::string& s) {
  std::string out = AsciiMap(s, Lower);
  if (!out.empty()) out[0] = static_cast<char>(Upper(out[0]));
  return out;
}

std::string Replace(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  std::string out;
  if (from.empty()) {  // Python inserts `to` between every character
    const std::vector<uint32_t> off = Utf8Offsets(s);
    for (size_t i = 0; i + 1 < off.size(); ++i) {
      if (count < 0 || static_cast<int64_t>(i) < count) out += to;
      out.append(s, off[i], off[i + 1] - off[i]);
    }
    if (count < 0 || static_cast<int64_t>(off.size() - 1) < count) out += to;
    CheckStringSize(out.size());
    return out;
  }
  size_t pos = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    const size_t k = s.find(from, pos);
    if (k == std::string::npos) break;
    out.append(s, pos, k - pos);
    out += to;
    CheckStringSize(out.size());
    pos = k + from.size();
    ++n;
  }
  out.append(s, pos, std::string::npos);
  CheckStringSize(out.size());
  return out;
}

List Split(const std::string& s, const Value& sep, int64_t maxsplit) {
  List out;
  if (sep.is_undefined() || sep.is_none()) {  // runs of whitespace, no empty strings
    size_t i = 0;
    while (true) {
      while (i < s.size() && IsPySpace(static_cast<unsigned char>(s[i]))) ++i;
      if (i >= s.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) >= maxsplit) {
        size_t e = s.size();
        while (e > i && IsPySpace(static_cast<unsigned char>(s[e - 1]))) --e;
        out.push_back(Value(s.substr(i, e - i)));
        break;
      }
      size_t j = i;
      while (j < s.size() && !IsPySpace(static_cast<unsigned char>(s[j]))) ++j;
      out.push_back(Value(s.substr(i, j - i)));
      i = j;
    }
    return out;
  }
  const std::string& d = NeedString(sep, "split");
  if (d.empty()) Fail("split: empty separator");
  size_t pos = 0;
  while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
    const size_t k = s.find(d, pos);
    if (k == std::string::npos) break;
    out.push_back(Value(s.substr(pos, k - pos)));
    pos = k + d.size();
  }
  out.push_back(Value(s.substr(pos)));
  return out;
}

static bool StartsOrEnds(const std::string& s, const Value& what, bool starts) {
  auto one = [&](const Value& p) {
    const std::string& x = NeedString(p, starts ? "startswith" : "endswith");
    if (x.size() > s.size()) return false;
    return starts ? s.compare(0, x.size(), x) == 0 : s.compare(s.size() - x.size(), x.size(), x) == 0;
  };
  if (what.is_list()) {
    for (const Value& p : what.list()) {
      if (one(p)) return true;
    }
    return false;
  }
  return one(what);
}

std::string Join(const Value& seq, const std::string& sep, const Value& attribute) {
  std::string out;
  bool first = true;
  for (const Value& v : Iterate(seq)) {
    if (!first) out += sep;
    first = false;
    out += ToStr(attribute.is_undefined() ? v : GetAttr(v, ToStr(attribute)));
    CheckStringSize(out.size());
  }
  return out;
}

// "{} and {}".format(a, b): positional {} and {0} fields, {{ }} escapes.
static std::string Format(const std::string& fmt, CallArgs& args) {
  std::string out;
  size_t next = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    const char c = fmt[i];
    if (c == '{' && i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out += '{';
      ++i;
    } else if (c == '}' && i + 1 < fmt.size() && fmt[i + 1] == '}') {
      out += '}';
      ++i;
    } else if (c == '{') {
      const size_t close = fmt.find('}', i);
      if (close == std::string::npos) Fail("format: unmatched '{'");
      const std::string field = fmt.substr(i + 1, close - i - 1);
      const Value* v = nullptr;
      if (field.empty()) {
        v = Arg(args, next++, "\x01");
      } else if (std::all_of(field.begin(), field.end(), [](char d) { return d >= '0' && d <= '9'; })) {
        v = Arg(args, static_cast<size_t>(std::stoul(field)), "\x01");
      } else {
        v = Arg(args, static_cast<size_t>(-1), field);
      }
      if (v == nullptr) Fail("format: missing argument for {" + field + "}");
      out += ToStr(*v);
      i = close;
    } else {
      out += c;
    }
    CheckStringSize(out.size());
  }
  return out;
}

namespace {

Value Method(const Value& self, std::string_view name, Value (*fn)(const Value&, CallArgs&)) {
  return Value::MakeFunction(std::string(name), [self, fn](CallArgs& args) { return fn(self, args); });
}

Value StrMethod(const Value& self, std::string_view name) {
  using F = Value (*)(const Value&, CallArgs&);
  static const std::pair<const char*, F> kMethods[] = {
      {"strip", [](const Value& s, CallArgs& a) { return Value(Strip(s.str(), ArgOr(a, 0, "chars", Value()), true, true)); }},
      {"lstrip", [](const Value& s, CallArgs& a) { return Value(Strip(s.str(), ArgOr(a, 0, "chars", Value()), true, false)); }},
      {"rstrip", [](const Value& s, CallArgs& a) { return Value(Strip(s.str(), ArgOr(a, 0, "chars", Value()), false, true)); }},
      {"split", [](const Value& s, CallArgs& a) {
         return Value(Split(s.str(), ArgOr(a, 0, "sep", Value()), NeedInt(ArgOr(a, 1, "maxsplit", Value(-1)), "split")));
       }},
      {"rsplit", [](const Value& s, CallArgs& a) {
         const int64_t maxsplit = NeedInt(ArgOr(a, 1, "maxsplit", Value(-1)), "rsplit");
         List all = Split(s.str(), ArgOr(a, 0, "sep", Value()), -1);
         if (maxsplit < 0 || static_cast<int64_t>(all.size()) <= maxsplit + 1) return Value(std::move(all));
         const Value sep = ArgOr(a, 0, "sep", Value(" "));
         const size_t head = all.size() - static_cast<size_t>(maxsplit);
         std::string first;
         for (size_t i = 0; i < head; ++i) first += (i ? ToStr(sep) : "") + all[i].str();
         List out{Value(first)};
         out.insert(out.end(), all.begin() + static_cast<std::ptrdiff_t>(head), all.end());
         return Value(std::move(out));
       }},
      {"splitlines", [](const Value& s, CallArgs&) {
         List out;
         const std::string& x = s.str();
         size_t b = 0;
         for (size_t i = 0; i < x.size(); ++i) {
           if (x[i] == '\n' || x[i] == '\r') {
             out.push_back(Value(x.substr(b, i - b)));
             if (x[i] == '\r' && i + 1 < x.size() && x[i + 1] == '\n') ++i;
             b = i + 1;
           }
         }
         if (b < x.size()) out.push_back(Value(x.substr(b)));
         return Value(std::move(out));
       }},
      {"startswith", [](const Value& s, CallArgs& a) { return Value(StartsOrEnds(s.str(), ArgOr(a, 0, "prefix", Value()), true)); }},
      {"endswith", [](const Value& s, CallArgs& a) { return Value(StartsOrEnds(s.str(), ArgOr(a, 0, "suffix", Value()), false)); }},
      {"lower", [](const Value& s, CallArgs&) { return Value(AsciiMap(s.str(), Lower)); }},
      {"upper", [](const Value& s, CallArgs&) { return Value(AsciiMap(s.str(), Upper)); }},
      {"title", [](const Value& s, CallArgs&) { return Value(Title(s.str())); }},
      {"capitalize", [](const Value& s, CallArgs&) { return Value(Capitalize(s.str())); }},
      {"replace", [](const Value& s, CallArgs& a) {
         return Value(Replace(s.str(), NeedString(ArgOr(a, 0, "old", Value()), "replace"),
                              NeedString(ArgOr(a, 1, "new", Value()), "replace"),
                              NeedInt(ArgOr(a, 2, "count", Value(-1)), "replace")));
       }},
      {"find", [](const Value& s, CallArgs& a) {
         const size_t k = s.str().find(NeedString(ArgOr(a, 0, "sub", Value()), "find"));
         return Value(k == std::string::npos ? int64_t{-1} : static_cast<int64_t>(Utf8Length(std::string_view(s.str()).substr(0, k))));
       }},
      {"rfind", [](const Value& s, CallArgs& a) {
         const size_t k = s.str().rfind(NeedString(ArgOr(a, 0, "sub", Value()), "rfind"));
         return Value(k == std::string::npos ? int64_t{-1} : static_cast<int64_t>(Utf8Length(std::string_view(s.str()).substr(0, k))));
       }},
      {"count", [](const Value& s, CallArgs& a) {
         const std::string& sub = NeedString(ArgOr(a, 0, "sub", Value()), "count");
         if (sub.empty()) return Value(static_cast<int64_t>(Utf8Length(s.str()) + 1));
         int64_t n = 0;
         for (size_t k = s.str().find(sub); k != std::string::npos; k = s.str().find(sub, k + sub.size())) ++n;
         return Value(n);
       }},
      {"join", [](const Value& s, CallArgs& a) { return Value(Join(ArgOr(a, 0, "iterable", Value(List{})), s.str(), Value())); }},
      {"format", [](const Value& s, CallArgs& a) { return Value(Format(s.str(), a)); }},
      {"isdigit", [](const Value& s, CallArgs&) {
         return Value(!s.str().empty() && std::all_of(s.str().begin(), s.str().end(), [](char c) { return c >= '0' && c <= '9'; }));
       }},
      {"isalpha", [](const Value& s, CallArgs&) { return Value(!s.str().empty() && std::all_of(s.str().begin(), s.str().end(), IsAlpha)); }},
      {"isalnum", [](const Value& s, CallArgs&) {
         return Value(!s.str().empty() && std::all_of(s.str().begin(), s.str().end(), [](char c) { return IsAlpha(c) || (c >= '0' && c <= '9'); }));
       }},
      {"isspace", [](const Value& s, CallArgs&) {
         return Value(!s.str().empty() && std::all_of(s.str().begin(), s.str().end(), [](char c) { return IsPySpace(static_cast<unsigned char>(c)); }));
       }},
      {"isupper", [](const Value& s, CallArgs&) {
         const std::string& x = s.str();
         return Value(std::any_of(x.begin(), x.end(), IsAlpha) && std::none_of(x.begin(), x.end(), [](char c) { return c >= 'a' && c <= 'z'; }));
       }},
      {"islower", [](const Value& s, CallArgs&) {
         const std::string& x = s.str();
         return Value(std::any_of(x.begin(), x.end(), IsAlpha) && std::none_of(x.begin(), x.end(), [](char c) { return c >= 'A' && c <= 'Z'; }));
       }},
  };
  for (const auto& [n, fn] : kMethods) {
    if (name == n) return Method(self, name, fn);
  }
  return Value();
}

Value DictMethod(const Value& self, std::string_view name) {
  if (name == "items") {
    return Method(self, name, [](const Value& d, CallArgs&) {
      List l;
      for (const auto& [k, v] : d.dict().items) l.push_back(Value(List{KeyValue(k), v}));
      return Value(std::move(l));
    });
  }
  if (name == "keys") {
    return Method(self, name, [](const Value& d, CallArgs&) {
      List l;
      for (const auto& kv : d.dict().items) l.push_back(KeyValue(kv.first));
      return Value(std::move(l));
    });
  }
  if (name == "values") {
    return Method(self, name, [](const Value& d, CallArgs&) {
      List l;
      for (const auto& kv : d.dict().items) l.push_back(kv.second);
      return Value(std::move(l));
    });
  }
  if (name == "get") {
    return Method(self, name, [](const Value& d, CallArgs& a) {
      const Value key = ArgOr(a, 0, "key", Value());
      const bool hashable = !(key.is_list() || key.is_dict() || key.is_function() || key.is_undefined());
      const Value* v = hashable ? d.dict().Find(DictKey(key)) : nullptr;
      return v ? *v : ArgOr(a, 1, "default", Value::None());
    });
  }
  return Value();
}

Value ListMethod(const Value& self, std::string_view name) {
  if (name == "index") {
    return Method(self, name, [](const Value& l, CallArgs& a) {
      const Value x = ArgOr(a, 0, "value", Value());
      for (size_t i = 0; i < l.list().size(); ++i) {
        if (Equals(l.list()[i], x)) return Value(static_cast<int64_t>(i));
      }
      Fail(Repr(x) + " is not in list");
    });
  }
  if (name == "count") {
    return Method(self, name, [](const Value& l, CallArgs& a) {
      const Value x = ArgOr(a, 0, "value", Value());
      return Value(static_cast<int64_t>(std::count_if(l.list().begin(), l.list().end(), [&](const Value& v) { return Equals(v, x); })));
    });
  }
  return Value();
}

}  // namespace

Value FindMethod(const Value& self, std::string_view name) {
  if (self.is_string()) return StrMethod(self, name);
  if (self.is_dict() && !self.dict().is_namespace) return DictMethod(self, name);
  if (self.is_list()) return ListMethod(self, name);
  return Value();
}

// ---- sequences ----------------------------------------------------------------------------------

List Iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return {};
    case Value::Kind::kList: return v.list();
    case Value::Kind::kDict: {
      List l;
      for (const auto& kv : v.dict().items) l.push_back(KeyValue(kv.first));
      return l;
    }
    case Value::Kind::kString: {
      const std::vector<uint32_t> off = Utf8Offsets(v.str());
      List l;
      l.reserve(off.size() - 1);
      for (size_t i = 0; i + 1 < off.size(); ++i) l.push_back(Value(v.str().substr(off[i], off[i + 1] - off[i])));
      return l;
    }
    default: Fail(std::string("'") + v.TypeName() + "' object is not iterable");
  }
}

int64_t Length(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return 0;
    case Value::Kind::kString: return static_cast<int64_t>(Utf8Length(v.str()));
    case Value::Kind::kList: return static_cast<int64_t>(v.list().size());
    case Value::Kind::kDict: return static_cast<int64_t>(v.dict().items.size());
    default: Fail(std::string("object of type '") + v.TypeName() + "' has no len()");
  }
}

bool Contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::kUndefined: return false;
    case Value::Kind::kString:
      if (!item.is_string()) Fail("'in <string>' requires a string as left operand, not '" + std::string(item.TypeName()) + "'");
      return container.str().find(item.str()) != std::string::npos;
    case Value::Kind::kList:
      return std::any_of(container.list().begin(), container.list().end(), [&](const Value& v) { return Equals(v, item); });
    case Value::Kind::kDict: return !item.is_undefined() && container.dict().Find(DictKey(item)) != nullptr;
    default: Fail(std::string("argument of type '") + container.TypeName() + "' is not iterable");
  }
}

int Compare(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) {
      const double x = a.as_float();
      const double y = b.as_float();
      return x < y ? -1 : (x > y ? 1 : 0);
    }
    const int64_t x = a.as_int();
    const int64_t y = b.as_int();
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) {
    const int c = a.str().compare(b.str());
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.is_list() && b.is_list()) {
    const List& x = a.list();
    const List& y = b.list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!Equals(x[i], y[i])) return Compare(x[i], y[i]);
    }
    return x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0);
  }
  Fail(std::string("'<' not supported between instances of '") + a.TypeName() + "' and '" + b.TypeName() + "'");
}

namespace {
// Python index normalization: negative counts from the end; out of range -> -1.
int64_t NormIndex(int64_t i, int64_t n) {
  if (i < 0) i += n;
  return (i < 0 || i >= n) ? -1 : i;
}
}  // namespace

Value GetItem(const Value& obj, const Value& key) {
  switch (obj.kind()) {
    case Value::Kind::kList: {
      if (!key.is_int() && !key.is_bool()) {
        if (key.is_string()) return FindMethod(obj, key.str());
        Fail("list indices must be integers, not '" + std::string(key.TypeName()) + "'");
      }
      const int64_t i = NormIndex(key.as_int(), static_cast<int64_t>(obj.list().size()));
      return i < 0 ? Value() : obj.list()[static_cast<size_t>(i)];
    }
    case Value::Kind::kString: {
      if (!key.is_int() && !key.is_bool()) {
        if (key.is_string()) return FindMethod(obj, key.str());
        Fail("string indices must be integers");
      }
      const std::vector<uint32_t> off = Utf8Offsets(obj.str());
      const int64_t i = NormIndex(key.as_int(), static_cast<int64_t>(off.size() - 1));
      return i < 0 ? Value() : Value(obj.str().substr(off[i], off[i + 1] - off[i]));
    }
    case Value::Kind::kDict: {
      if (key.is_list() || key.is_dict() || key.is_function() || key.is_undefined()) return Value();
      const std::string k = DictKey(key);
      if (const Value* v = obj.dict().Find(k)) return *v;
      return key.is_string() ? FindMethod(obj, k) : Value();
    }
    default: return Value();
  }
}

Value GetAttr(const Value& obj, std::string_view name) {
  if (obj.is_dict()) {
    // Jinja tries the Python attribute first: d.items is the method even if d has a key "items".
    Value m = FindMethod(obj, name);
    if (!m.is_undefined()) return m;
    if (const Value* v = obj.dict().Find(name)) return *v;
    return Value();
  }
  return FindMethod(obj, name);
}

Value Slice(const Value& obj, const Value& start_v, const Value& stop_v, const Value& step_v) {
  auto opt = [](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_none() || v.is_undefined()) return std::nullopt;
    return NeedInt(v, what);
  };
  const std::optional<int64_t> start_o = opt(start_v, "slice start");
  const std::optional<int64_t> stop_o = opt(stop_v, "slice stop");
  const int64_t step = opt(step_v, "slice step").value_or(1);
  if (step == 0) Fail("slice step cannot be zero");
  std::vector<uint32_t> off;
  int64_t n;
  if (obj.is_string()) {
    off = Utf8Offsets(obj.str());
    n = static_cast<int64_t>(off.size() - 1);
  } else if (obj.is_list()) {
    n = static_cast<int64_t>(obj.list().size());
  } else {
    Fail(std::string("'") + obj.TypeName() + "' object is not subscriptable");
  }
  // Python's PySlice_AdjustIndices.
  auto adjust = [&](std::optional<int64_t> v, int64_t def) {
    if (!v) return def;
    int64_t i = *v;
    if (i < 0) {
      i += n;
      if (i < 0) i = step < 0 ? -1 : 0;
    } else if (i >= n) {
      i = step < 0 ? n - 1 : n;
    }
    return i;
  };
  const int64_t start = adjust(start_o, step < 0 ? n - 1 : 0);
  const int64_t stop = adjust(stop_o, step < 0 ? -1 : n);
  if (obj.is_string()) {
    std::string out;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.append(obj.str(), off[i], off[i + 1] - off[i]);
    return Value(std::move(out));
  }
  List out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.push_back(obj.list()[static_cast<size_t>(i)]);
  return Value(std::move(out));
}

}  // namespace mnemo::jinja::internal
