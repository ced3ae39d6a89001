// Built-in filters and tests.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>

#include "chat/jinja_internal.h"

namespace mnemo::jinja::internal {
namespace {

// ---- tests --------------------------------------------------------------------------------------

bool TestNumberCmp(const Value& v, CallArgs& a, bool (*cmp)(int)) {
  const Value* other = Arg(a, 0, "other");
  if (other == nullptr) Fail("comparison test needs an argument");
  return cmp(Compare(v, *other));
}

const std::pair<const char*, TestFn> kTests[] = {
    {"defined", [](const Value& v, CallArgs&) { return !v.is_undefined(); }},
    {"undefined", [](const Value& v, CallArgs&) { return v.is_undefined(); }},
    {"none", [](const Value& v, CallArgs&) { return v.is_none(); }},
    {"boolean", [](const Value& v, CallArgs&) { return v.is_bool(); }},
    {"true", [](const Value& v, CallArgs&) { return v.is_bool() && v.as_bool(); }},
    {"false", [](const Value& v, CallArgs&) { return v.is_bool() && !v.as_bool(); }},
    {"integer", [](const Value& v, CallArgs&) { return v.is_int(); }},
    {"float", [](const Value& v, CallArgs&) { return v.is_float(); }},
    {"number", [](const Value& v, CallArgs&) { return v.is_number(); }},
    {"string", [](const Value& v, CallArgs&) { return v.is_string(); }},
    {"mapping", [](const Value& v, CallArgs&) { return v.is_dict(); }},
    {"iterable", [](const Value& v, CallArgs&) { return v.is_list() || v.is_dict() || v.is_string() || v.is_undefined(); }},
    {"sequence", [](const Value& v, CallArgs&) { return v.is_list() || v.is_dict() || v.is_string(); }},
    {"callable", [](const Value& v, CallArgs&) { return v.is_function(); }},
    {"sameas", [](const Value& v, CallArgs& a) {
       const Value o = ArgOr(a, 0, "other", Value());
       if (v.is_list() && o.is_list()) return &v.list() == &o.list();
       if (v.is_dict() && o.is_dict()) return &v.dict() == &o.dict();
       return v.kind() == o.kind() && (v.is_none() || v.is_undefined() || Equals(v, o));
     }},
    {"eq", [](const Value& v, CallArgs& a) { return Equals(v, ArgOr(a, 0, "other", Value())); }},
    {"equalto", [](const Value& v, CallArgs& a) { return Equals(v, ArgOr(a, 0, "other", Value())); }},
    {"==", [](const Value& v, CallArgs& a) { return Equals(v, ArgOr(a, 0, "other", Value())); }},
    {"ne", [](const Value& v, CallArgs& a) { return !Equals(v, ArgOr(a, 0, "other", Value())); }},
    {"!=", [](const Value& v, CallArgs& a) { return !Equals(v, ArgOr(a, 0, "other", Value())); }},
    {"lt", [](const Value& v, CallArgs& a) { return TestNumberCmp(v, a, [](int c) { return c < 0; }); }},
    {"<", [](const Value& v, CallArgs& a) { return TestNumberCmp(v, a, [](int c) { return c < 0; }); }},
    {"le", [](const Value& v, CallArgs& a) { return TestNumberCmp(v, a, [](int c) { return c <= 0; }); }},
    {"<=", [](const Value& v, CallArgs& a) { return TestNumberCmp(v, a, [](int c) { return c <= 0; }); }},
    {"gt", [](const Value& v, CallArgs& a) { return TestNumberCmp(v, a, [](int c) { return c > 0; }); }},
    {">", [](const Value& v, CallArgs& a) { return TestNumberCmp(v, a, [](int c) { return c > 0; }); }},
    {"ge", [](const Value& v, CallArgs& a) { return TestNumberCmp(v, a, [](int c) { return c >= 0; }); }},
    {">=", [](const Value& v, CallArgs& a) { return TestNumberCmp(v, a, [](int c) { return c >= 0; }); }},
    {"in", [](const Value& v, CallArgs& a) { return Contains(ArgOr(a, 0, "seq", Value()), v); }},
    {"odd", [](const Value& v, CallArgs&) {  // Python: value % 2 == 1
       if (v.is_float()) return std::fmod(v.as_float(), 2.0) == 1.0 || std::fmod(v.as_float(), 2.0) == -1.0;
       return NeedInt(v, "odd") % 2 != 0;
     }},
    {"even", [](const Value& v, CallArgs&) {
       if (v.is_float()) return std::fmod(v.as_float(), 2.0) == 0.0;
       return NeedInt(v, "even") % 2 == 0;
     }},
    {"divisibleby", [](const Value& v, CallArgs& a) {
       const int64_t d = NeedInt(ArgOr(a, 0, "num", Value()), "divisibleby");
       if (d == 0) Fail("divisibleby: division by zero");
       return NeedInt(v, "divisibleby") % d == 0;
     }},
    {"lower", [](const Value& v, CallArgs&) { return v.is_string() && AsciiMap(v.str(), Lower) == v.str(); }},
    {"upper", [](const Value& v, CallArgs&) { return v.is_string() && AsciiMap(v.str(), Upper) == v.str(); }},
};

// select/reject/selectattr/rejectattr: args[0] names the test (default: truthiness), the rest are
// the test's arguments.
List FilterBy(const Value& seq, CallArgs& a, bool by_attr, bool keep) {
  size_t k = 0;
  std::string attr;
  if (by_attr) attr = NeedString(ArgOr(a, k++, "attribute", Value()), "selectattr");
  TestFn test = nullptr;
  CallArgs test_args;
  if (k < a.positional.size()) {
    const std::string& name = NeedString(a.positional[k], "select");
    test = FindTest(name);
    if (test == nullptr) Fail("unknown test '" + name + "'");
    test_args.positional.assign(a.positional.begin() + static_cast<std::ptrdiff_t>(k) + 1, a.positional.end());
  }
  List out;
  if (!seq.Truthy()) return out;  // Jinja: `if value:` (none | selectattr(...) is empty)
  for (const Value& item : Iterate(seq)) {
    const Value x = by_attr ? GetAttr(item, attr) : item;
    const bool pass = test ? test(x, test_args) : x.Truthy();
    if (pass == keep) out.push_back(item);
  }
  return out;
}

Value SortList(const Value& seq, CallArgs& a) {
  List l = Iterate(seq);
  const bool reverse = ArgOr(a, 0, "reverse", Value(false)).Truthy();
  const bool case_sensitive = ArgOr(a, 1, "case_sensitive", Value(false)).Truthy();
  const Value attr = ArgOr(a, 2, "attribute", Value());
  auto key = [&](const Value& v) {
    Value x = attr.is_undefined() ? v : GetAttr(v, ToStr(attr));
    if (!case_sensitive && x.is_string()) x = Value(AsciiMap(x.str(), Lower));
    return x;
  };
  std::stable_sort(l.begin(), l.end(), [&](const Value& x, const Value& y) {
    const int c = Compare(key(x), key(y));
    return reverse ? c > 0 : c < 0;
  });
  return Value(std::move(l));
}

Value MinMax(const Value& seq, CallArgs& a, bool want_max) {
  const List l = Iterate(seq);
  if (l.empty()) return Value();
  const bool case_sensitive = ArgOr(a, 0, "case_sensitive", Value(false)).Truthy();
  const Value attr = ArgOr(a, 1, "attribute", Value());
  auto key = [&](const Value& v) {
    Value x = attr.is_undefined() ? v : GetAttr(v, ToStr(attr));
    if (!case_sensitive && x.is_string()) x = Value(AsciiMap(x.str(), Lower));
    return x;
  };
  size_t best = 0;
  for (size_t i = 1; i < l.size(); ++i) {
    const int c = Compare(key(l[i]), key(l[best]));
    if (want_max ? c > 0 : c < 0) best = i;
  }
  return l[best];
}

Value Indent(const Value& v, CallArgs& a) {
  const std::string s = ToStr(v);
  const Value width = ArgOr(a, 0, "width", Value(4));
  const std::string pad = width.is_string() ? width.str() : std::string(static_cast<size_t>(std::max<int64_t>(0, NeedInt(width, "indent"))), ' ');
  const bool first = ArgOr(a, 1, "first", Value(false)).Truthy();
  const bool blank = ArgOr(a, 2, "blank", Value(false)).Truthy();
  std::string out;
  size_t b = 0;
  bool is_first = true;
  while (b <= s.size()) {
    size_t e = s.find('\n', b);
    const bool last = e == std::string::npos;
    if (last) e = s.size();
    const std::string_view line(s.data() + b, e - b);
    if ((is_first ? first : true) && (blank || !line.empty())) out += pad;
    out.append(line);
    if (last) break;
    out += '\n';
    b = e + 1;
    is_first = false;
    CheckStringSize(out.size());
  }
  return Value(std::move(out));
}

Value Round(const Value& v, CallArgs& a) {
  if (!v.is_number()) Fail("round: expected a number");
  const int64_t precision = NeedInt(ArgOr(a, 0, "precision", Value(0)), "round");
  const std::string method = ToStr(ArgOr(a, 1, "method", Value("common")));
  const double scale = std::pow(10.0, static_cast<double>(precision));
  const double x = v.as_float() * scale;
  double r;
  if (method == "common") r = std::nearbyint(x);  // Python round(): half to even
  else if (method == "ceil") r = std::ceil(x);
  else if (method == "floor") r = std::floor(x);
  else Fail("round: method must be common, ceil or floor");
  return Value(r / scale);
}

Value ToInt(const Value& v, CallArgs& a) {
  if (v.is_undefined()) Fail("int: value is undefined");
  const Value def = ArgOr(a, 0, "default", Value(0));
  if (v.is_int() || v.is_bool()) return Value(v.as_int());
  if (v.is_float()) {
    const double f = v.as_float();
    if (!std::isfinite(f) || std::fabs(f) >= 9.2e18) return def;
    return Value(static_cast<int64_t>(f));
  }
  if (v.is_string()) {
    const std::string t = Strip(v.str(), Value(), true, true);
    char* end = nullptr;
    errno = 0;
    const long long i = std::strtoll(t.c_str(), &end, 10);
    if (!t.empty() && *end == '\0' && errno == 0) return Value(static_cast<int64_t>(i));
    const double f = std::strtod(t.c_str(), &end);
    if (!t.empty() && *end == '\0' && std::isfinite(f) && std::fabs(f) < 9.2e18) return Value(static_cast<int64_t>(f));
  }
  return def;
}

Value ToFloat(const Value& v, CallArgs& a) {
  if (v.is_undefined()) Fail("float: value is undefined");
  const Value def = ArgOr(a, 0, "default", Value(0.0));
  if (v.is_number()) return Value(v.as_float());
  if (v.is_string()) {
    const std::string t = Strip(v.str(), Value(), true, true);
    char* end = nullptr;
    const double f = std::strtod(t.c_str(), &end);
    if (!t.empty() && *end == '\0') return Value(f);
  }
  return def;
}

Value Escape(const Value& v) {
  std::string out;
  for (const char c : ToStr(v)) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return Value(std::move(out));
}

const std::pair<const char*, FilterFn> kFilters[] = {
    {"abs", [](const Value& v, CallArgs&) {
       if (v.is_float()) return Value(std::fabs(v.as_float()));
       const int64_t i = NeedInt(v, "abs");
       if (i == std::numeric_limits<int64_t>::min()) Fail("integer overflow");
       return Value(i < 0 ? -i : i);
     }},
    {"attr", [](const Value& v, CallArgs& a) { return GetAttr(v, NeedString(ArgOr(a, 0, "name", Value()), "attr")); }},
    {"capitalize", [](const Value& v, CallArgs&) { return Value(Capitalize(ToStr(v))); }},
    {"count", [](const Value& v, CallArgs&) { return Value(Length(v)); }},
    {"default", [](const Value& v, CallArgs& a) {
       const bool boolean = ArgOr(a, 1, "boolean", Value(false)).Truthy();
       if (v.is_undefined() || (boolean && !v.Truthy())) return ArgOr(a, 0, "default_value", Value(""));
       return v;
     }},
    {"d", [](const Value& v, CallArgs& a) {
       const bool boolean = ArgOr(a, 1, "boolean", Value(false)).Truthy();
       if (v.is_undefined() || (boolean && !v.Truthy())) return ArgOr(a, 0, "default_value", Value(""));
       return v;
     }},
    {"dictsort", [](const Value& v, CallArgs& a) {
       if (!v.is_dict()) Fail("dictsort: expected a dict");
       const bool case_sensitive = ArgOr(a, 0, "case_sensitive", Value(false)).Truthy();
       const bool by_value = ToStr(ArgOr(a, 1, "by", Value("key"))) == "value";
       const bool reverse = ArgOr(a, 2, "reverse", Value(false)).Truthy();
       List l;
       for (const auto& [k, x] : v.dict().items) l.push_back(Value(List{KeyValue(k), x}));
       std::stable_sort(l.begin(), l.end(), [&](const Value& p, const Value& q) {
         Value x = p.list()[by_value ? 1 : 0];
         Value y = q.list()[by_value ? 1 : 0];
         if (!case_sensitive && x.is_string() && y.is_string()) {
           x = Value(AsciiMap(x.str(), Lower));
           y = Value(AsciiMap(y.str(), Lower));
         }
         const int c = Compare(x, y);
         return reverse ? c > 0 : c < 0;
       });
       return Value(std::move(l));
     }},
    {"e", [](const Value& v, CallArgs&) { return Escape(v); }},
    {"escape", [](const Value& v, CallArgs&) { return Escape(v); }},
    {"first", [](const Value& v, CallArgs&) {
       const List l = Iterate(v);
       return l.empty() ? Value() : l.front();
     }},
    {"float", ToFloat},
    {"indent", Indent},
    {"int", ToInt},
    {"items", [](const Value& v, CallArgs&) {
       if (v.is_undefined()) return Value(List{});
       if (!v.is_dict()) Fail("items: expected a dict");
       List l;
       for (const auto& [k, x] : v.dict().items) l.push_back(Value(List{KeyValue(k), x}));
       return Value(std::move(l));
     }},
    {"join", [](const Value& v, CallArgs& a) {
       return Value(Join(v, ToStr(ArgOr(a, 0, "d", Value(""))), ArgOr(a, 1, "attribute", Value())));
     }},
    {"last", [](const Value& v, CallArgs&) {
       const List l = Iterate(v);
       return l.empty() ? Value() : l.back();
     }},
    {"length", [](const Value& v, CallArgs&) { return Value(Length(v)); }},
    {"list", [](const Value& v, CallArgs&) { return Value(Iterate(v)); }},
    {"lower", [](const Value& v, CallArgs&) { return Value(AsciiMap(ToStr(v), Lower)); }},
    {"map", [](const Value& v, CallArgs& a) {
       List out;
       if (!v.Truthy()) return Value(std::move(out));  // Jinja: `if value:`
       const Value* attr = nullptr;
       for (const auto& [k, x] : a.named) {
         if (k == "attribute") attr = &x;
       }
       if (attr != nullptr) {
         const Value def = ArgOr(a, static_cast<size_t>(-1), "default", Value());
         for (const Value& item : Iterate(v)) {
           Value x = GetAttr(item, ToStr(*attr));
           out.push_back(x.is_undefined() ? def : x);
         }
         return Value(std::move(out));
       }
       if (a.positional.empty()) Fail("map: needs a filter name or attribute=");
       const std::string& name = NeedString(a.positional[0], "map");
       const FilterFn f = FindFilter(name);
       if (f == nullptr) Fail("unknown filter '" + name + "'");
       CallArgs rest;
       rest.positional.assign(a.positional.begin() + 1, a.positional.end());
       rest.named = a.named;
       for (const Value& item : Iterate(v)) out.push_back(f(item, rest));
       return Value(std::move(out));
     }},
    {"max", [](const Value& v, CallArgs& a) { return MinMax(v, a, true); }},
    {"min", [](const Value& v, CallArgs& a) { return MinMax(v, a, false); }},
    {"reject", [](const Value& v, CallArgs& a) { return Value(FilterBy(v, a, false, false)); }},
    {"rejectattr", [](const Value& v, CallArgs& a) { return Value(FilterBy(v, a, true, false)); }},
    {"replace", [](const Value& v, CallArgs& a) {
       return Value(Replace(ToStr(v), ToStr(ArgOr(a, 0, "old", Value(""))), ToStr(ArgOr(a, 1, "new", Value(""))),
                            NeedInt(ArgOr(a, 2, "count", Value(-1)), "replace")));
     }},
    {"reverse", [](const Value& v, CallArgs&) {
       if (v.is_string()) return Slice(v, Value::None(), Value::None(), Value(-1));
       List l = Iterate(v);
       std::reverse(l.begin(), l.end());
       return Value(std::move(l));
     }},
    {"round", Round},
    {"safe", [](const Value& v, CallArgs&) { return v; }},
    {"select", [](const Value& v, CallArgs& a) { return Value(FilterBy(v, a, false, true)); }},
    {"selectattr", [](const Value& v, CallArgs& a) { return Value(FilterBy(v, a, true, true)); }},
    {"sort", SortList},
    {"string", [](const Value& v, CallArgs&) { return Value(ToStr(v)); }},
    {"sum", [](const Value& v, CallArgs& a) {
       const Value attr = ArgOr(a, 0, "attribute", Value());
       Value total = ArgOr(a, 1, "start", Value(0));
       for (const Value& item : Iterate(v)) {
         const Value x = attr.is_undefined() ? item : GetAttr(item, ToStr(attr));
         if (!x.is_number() || !total.is_number()) Fail("sum: expected numbers");
         total = (x.is_float() || total.is_float()) ? Value(total.as_float() + x.as_float()) : Value(total.as_int() + x.as_int());
       }
       return total;
     }},
    {"title", [](const Value& v, CallArgs&) { return Value(Title(ToStr(v))); }},
    {"tojson", [](const Value& v, CallArgs& a) {
       const Value indent = ArgOr(a, 0, "indent", Value::None());
       const Value ensure_ascii = ArgOr(a, 1, "ensure_ascii", Value(false));
       const Value seps = ArgOr(a, 2, "separators", Value::None());
       const Value sort_keys = ArgOr(a, 3, "sort_keys", Value(false));
       std::string item_sep, key_sep;
       if (!seps.is_none()) {
         if (!seps.is_list() || seps.list().size() != 2) Fail("tojson: separators must be a pair of strings");
         item_sep = NeedString(seps.list()[0], "tojson");
         key_sep = NeedString(seps.list()[1], "tojson");
       }
       const int ind = indent.is_none() ? -1 : static_cast<int>(std::clamp<int64_t>(NeedInt(indent, "tojson"), 0, 64));
       return Value(ToJson(v, ind, ensure_ascii.Truthy(), seps.is_none() ? nullptr : item_sep.c_str(),
                           seps.is_none() ? nullptr : key_sep.c_str(), sort_keys.Truthy()));
     }},
    {"trim", [](const Value& v, CallArgs& a) { return Value(Strip(ToStr(v), ArgOr(a, 0, "chars", Value()), true, true)); }},
    {"unique", [](const Value& v, CallArgs&) {
       List out;
       for (const Value& x : Iterate(v)) {
         if (std::none_of(out.begin(), out.end(), [&](const Value& y) { return Equals(x, y); })) out.push_back(x);
       }
       return Value(std::move(out));
     }},
    {"upper", [](const Value& v, CallArgs&) { return Value(AsciiMap(ToStr(v), Upper)); }},
    {"wordcount", [](const Value& v, CallArgs&) { return Value(static_cast<int64_t>(Split(ToStr(v), Value(), -1).size())); }},
};

}  // namespace

FilterFn FindFilter(std::string_view name) {
  for (const auto& [n, f] : kFilters) {
    if (name == n) return f;
  }
  return nullptr;
}

TestFn FindTest(std::string_view name) {
  for (const auto& [n, t] : kTests) {
    if (name == n) return t;
  }
  return nullptr;
}

}  // namespace mnemo::jinja::internal
