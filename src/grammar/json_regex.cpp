#include "grammar/json_regex.h"

#include <algorithm>
#include <deque>
#include <map>

#include "tokenizer/unicode.h"

namespace mnemo::grammar {
namespace {

constexpr uint32_t kMaxCp = 0x10FFFF;

Ranges Norm(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges out;
  for (auto [lo, hi] : r) {
    // Surrogates have no JSON form (json-hex4 refuses them, UTF-8 cannot carry them).
    if (lo <= 0xDFFF && hi >= 0xD800) {
      if (lo < 0xD800) out.push_back({lo, 0xD7FF});
      if (hi > 0xDFFF) out.push_back({0xE000, hi});
      continue;
    }
    out.push_back({lo, hi});
  }
  std::sort(out.begin(), out.end());
  Ranges merged;
  for (auto [lo, hi] : out) {
    if (!merged.empty() && lo <= merged.back().second + 1) merged.back().second = std::max(merged.back().second, hi);
    else merged.push_back({lo, hi});
  }
  return merged;
}

Ranges Complement(const Ranges& r) {
  Ranges out;
  uint32_t next = 0;
  for (auto [lo, hi] : r) {
    if (lo > next) out.push_back({next, lo - 1});
    next = hi + 1;
  }
  if (next <= kMaxCp) out.push_back({next, kMaxCp});
  return Norm(out);
}

Ranges Intersect(const Ranges& a, const Ranges& b) {
  Ranges out;
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const uint32_t lo = std::max(a[i].first, b[j].first), hi = std::min(a[i].second, b[j].second);
    if (lo <= hi) out.push_back({lo, hi});
    if (a[i].second < b[j].second) ++i;
    else ++j;
  }
  return out;
}

Ranges Minus(const Ranges& a, const Ranges& b) { return Intersect(a, Complement(b)); }
Ranges Union(Ranges a, const Ranges& b) {
  a.insert(a.end(), b.begin(), b.end());
  return Norm(std::move(a));
}
bool Has(const Ranges& r, uint32_t c) {
  for (auto [lo, hi] : r)
    if (lo <= c && c <= hi) return true;
  return false;
}
uint64_t Size(const Ranges& r) {
  uint64_t n = 0;
  for (auto [lo, hi] : r) n += hi - lo + 1;
  return n;
}

const Ranges& AnyChar() {
  static const Ranges r = Norm({{0, kMaxCp}});
  return r;
}
Ranges Digits() { return {{'0', '9'}}; }
Ranges Word() { return Norm({{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}}); }
// ECMA-262 WhiteSpace and LineTerminator.
Ranges Space() {
  return Norm({{0x09, 0x0D}, {0x20, 0x20}, {0xA0, 0xA0}, {0x1680, 0x1680}, {0x2000, 0x200A}, {0x2028, 0x2029},
               {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}});
}
// `.`: anything but a line terminator.
Ranges Dot() { return Minus(AnyChar(), {{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}}); }

Regex Chars(Ranges r) {
  Regex re;
  re.kind = Regex::kChars;
  re.chars = std::move(r);
  return re;
}
Regex Repeat(Regex x, int32_t min, int32_t max) {
  Regex re;
  re.kind = Regex::kRepeat;
  re.min = min;
  re.max = max;
  re.kids.push_back(std::move(x));
  return re;
}
Regex Seq(std::vector<Regex> kids) {
  Regex re;
  re.kind = Regex::kSeq;
  re.kids = std::move(kids);
  return re;
}

// Recursive descent over the pattern's code points.
class PatternParser {
 public:
  explicit PatternParser(std::string_view p) : s_(DecodeUtf8Lenient(p)) {}

  Result<Regex> Run() {
    Regex top;
    top.kind = Regex::kAlt;
    for (;;) {
      // A top-level alternative: its anchors say whether any characters may come before / after.
      const bool start = Eat('^');
      bool end = false;
      auto body = Alternative(/*top=*/true, &end);
      if (!body.ok()) return body.error();
      std::vector<Regex> seq;
      if (!start) seq.push_back(Repeat(Chars(AnyChar()), 0, -1));
      seq.push_back(std::move(*body));
      if (!end) seq.push_back(Repeat(Chars(AnyChar()), 0, -1));
      top.kids.push_back(Seq(std::move(seq)));
      if (i_ >= s_.size()) break;
      if (s_[i_] == ')') return Fail("unbalanced ')'");
      ++i_;  // |
    }
    return top.kids.size() == 1 ? std::move(top.kids[0]) : std::move(top);
  }

 private:
  Error Fail(const std::string& what) const {
    return MakeError(StatusCode::kInvalidArgument, "%s (pattern offset %zu)", what.c_str(), i_);
  }
  bool Eat(uint32_t c) {
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  bool At(const char* text) const {
    for (size_t k = 0; text[k]; ++k)
      if (i_ + k >= s_.size() || s_[i_ + k] != static_cast<unsigned char>(text[k])) return false;
    return true;
  }

  Result<Regex> Disjunction() {
    Regex alt;
    alt.kind = Regex::kAlt;
    for (;;) {
      auto a = Alternative(/*top=*/false, nullptr);
      if (!a.ok()) return a.error();
      alt.kids.push_back(std::move(*a));
      if (!Eat('|')) break;
    }
    return alt.kids.size() == 1 ? std::move(alt.kids[0]) : std::move(alt);
  }

  // Terms up to '|', ')' or the end. At the top level a '$' just before those ends the
  // alternative anchored (*end).
  Result<Regex> Alternative(bool top, bool* end) {
    std::vector<Regex> seq;
    while (i_ < s_.size() && s_[i_] != '|' && s_[i_] != ')') {
      const uint32_t c = s_[i_];
      if (c == '$') {
        ++i_;
        if (top && (i_ >= s_.size() || s_[i_] == '|')) {
          *end = true;
          break;
        }
        --i_;
        return Fail("'$' is supported only at the end of the pattern or of a top-level alternative");
      }
      if (c == '^') return Fail("'^' is supported only at the start of the pattern or of a top-level alternative");
      if (c == '*' || c == '+' || c == '?') return Fail("nothing to repeat");
      auto atom = Atom();
      if (!atom.ok()) return atom.error();
      auto q = Quantified(std::move(*atom));
      if (!q.ok()) return q.error();
      seq.push_back(std::move(*q));
    }
    if (!top && i_ >= s_.size() && depth_ > 0) return Fail("missing ')'");
    return seq.size() == 1 ? std::move(seq[0]) : Seq(std::move(seq));
  }

  // {n}, {n,}, {n,m} at i_ (advancing past it), or false when the text there is no quantifier
  // (then '{' is a literal, as ECMA-262's Annex B reads it).
  bool Braces(int64_t* min, int64_t* max) {
    size_t j = i_ + 1;
    auto num = [&](int64_t* v) {
      const size_t start = j;
      *v = 0;
      while (j < s_.size() && s_[j] >= '0' && s_[j] <= '9') *v = std::min<int64_t>(*v * 10 + (s_[j++] - '0'), 1 << 30);
      return j > start;
    };
    if (!num(min)) return false;
    *max = *min;
    if (j < s_.size() && s_[j] == ',') {
      ++j;
      if (!num(max)) *max = -1;
    }
    if (j >= s_.size() || s_[j] != '}') return false;
    i_ = j + 1;
    return true;
  }

  Result<Regex> Quantified(Regex atom) {
    int64_t min = 1, max = 1;
    if (Eat('*')) min = 0, max = -1;
    else if (Eat('+')) min = 1, max = -1;
    else if (Eat('?')) min = 0, max = 1;
    else if (i_ < s_.size() && s_[i_] == '{' && Braces(&min, &max)) {
      if (max >= 0 && max < min) return Fail("quantifier {n,m} with m < n");
      if (min > kMaxCount || max > kMaxCount) return Fail("counted repetition over " + std::to_string(kMaxCount));
    } else {
      return atom;
    }
    Eat('?');  // lazy: the same language
    if (i_ < s_.size() && (s_[i_] == '*' || s_[i_] == '+' || s_[i_] == '?' || (s_[i_] == '{' && At("{") && BracesAhead())))
      return Fail("nothing to repeat");
    if (min == 1 && max == 1) return atom;
    return Repeat(std::move(atom), static_cast<int32_t>(min), static_cast<int32_t>(max));
  }
  bool BracesAhead() {
    const size_t save = i_;
    int64_t a, b;
    const bool q = Braces(&a, &b);
    i_ = save;
    return q;
  }

  Result<Regex> Atom() {
    const uint32_t c = s_[i_];
    if (c == '(') {
      ++i_;
      if (At("?=") || At("?!") || At("?<=") || At("?<!")) return Fail("lookaround is not supported");
      if (Eat('?')) {
        if (Eat(':')) {
        } else if (Eat('<')) {  // a named group: only its name is new
          while (i_ < s_.size() && s_[i_] != '>') ++i_;
          if (!Eat('>')) return Fail("unterminated group name");
        } else {
          return Fail("unsupported group syntax '(?'");
        }
      }
      if (++depth_ > kMaxGroupDepth) return Fail("groups nested over " + std::to_string(kMaxGroupDepth) + " deep");
      auto d = Disjunction();
      --depth_;
      if (!d.ok()) return d.error();
      if (!Eat(')')) return Fail("missing ')'");
      return d;
    }
    if (c == '.') {
      ++i_;
      return Chars(Dot());
    }
    if (c == '[') return Class();
    if (c == '\\') {
      Ranges r;
      MNEMO_TRY(Escape(&r, /*in_class=*/false));
      return Chars(std::move(r));
    }
    if (c == '{' && BracesAhead()) return Fail("nothing to repeat");
    if (c >= 0xD800 && c <= 0xDFFF) return Fail("a lone surrogate cannot be written in JSON");
    ++i_;
    return Chars({{c, c}});
  }

  Result<Regex> Class() {
    ++i_;  // [
    const bool negate = Eat('^');
    Ranges set;
    for (;;) {
      if (i_ >= s_.size()) return Fail("unterminated character class");
      if (Eat(']')) break;
      Ranges lo;
      MNEMO_TRY(ClassAtom(&lo));
      if (i_ + 1 < s_.size() && s_[i_] == '-' && s_[i_ + 1] != ']') {
        ++i_;
        Ranges hi;
        MNEMO_TRY(ClassAtom(&hi));
        if (lo.size() != 1 || hi.size() != 1 || lo[0].first != lo[0].second || hi[0].first != hi[0].second)
          return Fail("a class range needs single characters at both ends");
        if (hi[0].first < lo[0].first) return Fail("class range out of order");
        lo = {{lo[0].first, hi[0].first}};
      }
      set.insert(set.end(), lo.begin(), lo.end());
    }
    set = Norm(std::move(set));
    if (negate) set = Complement(set);
    if (set.empty()) return Fail("a character class that matches nothing");
    return Chars(std::move(set));
  }

  Status ClassAtom(Ranges* out) {
    if (s_[i_] == '\\') return Escape(out, /*in_class=*/true);
    const uint32_t c = s_[i_++];
    *out = {{c, c}};
    return Status::Ok();
  }

  Status Hex(int n, uint32_t* v) {
    *v = 0;
    for (int k = 0; k < n; ++k) {
      if (i_ >= s_.size()) return Fail("short hex escape");
      const uint32_t h = s_[i_++];
      const int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
      if (d < 0) return Fail("bad hex digit in an escape");
      *v = *v * 16 + static_cast<uint32_t>(d);
    }
    return Status::Ok();
  }

  // After '\\': a class escape or one character.
  Status Escape(Ranges* out, bool in_class) {
    ++i_;
    if (i_ >= s_.size()) return Fail("'\\' at the end of the pattern");
    const uint32_t e = s_[i_++];
    auto one = [&](uint32_t c) {
      *out = {{c, c}};
      return Status::Ok();
    };
    switch (e) {
      case 'd': *out = Digits(); return Status::Ok();
      case 'D': *out = Complement(Digits()); return Status::Ok();
      case 'w': *out = Word(); return Status::Ok();
      case 'W': *out = Complement(Word()); return Status::Ok();
      case 's': *out = Space(); return Status::Ok();
      case 'S': *out = Complement(Space()); return Status::Ok();
      case 't': return one('\t');
      case 'n': return one('\n');
      case 'r': return one('\r');
      case 'f': return one('\f');
      case 'v': return one('\v');
      case 'b':
        if (in_class) return one('\b');
        --i_;
        return Fail("'\\b' (a word boundary) is not supported");
      case 'B': --i_; return Fail("'\\B' is not supported");
      case 'p': case 'P': --i_; return Fail("unicode property escapes are not supported");
      case 'k': --i_; return Fail("backreferences are not supported");
      case 'c': {
        if (i_ < s_.size() && ((s_[i_] >= 'a' && s_[i_] <= 'z') || (s_[i_] >= 'A' && s_[i_] <= 'Z'))) return one(s_[i_++] % 32);
        return Fail("bad '\\c' escape");
      }
      case 'x': {
        uint32_t v;
        MNEMO_TRY(Hex(2, &v));
        return one(v);
      }
      case 'u': {
        uint32_t v;
        if (Eat('{')) {
          v = 0;
          int n = 0;
          while (i_ < s_.size() && s_[i_] != '}' && n < 7) {
            uint32_t d;
            MNEMO_TRY(Hex(1, &d));
            v = v * 16 + d, ++n;
          }
          if (!Eat('}') || n == 0 || v > kMaxCp) return Fail("bad '\\u{...}' escape");
        } else {
          MNEMO_TRY(Hex(4, &v));
          // A surrogate pair written as two escapes is one character.
          if (v >= 0xD800 && v <= 0xDBFF && At("\\u")) {
            const size_t save = i_;
            i_ += 2;
            uint32_t lo;
            if (Hex(4, &lo).ok() && lo >= 0xDC00 && lo <= 0xDFFF) return one(0x10000 + ((v - 0xD800) << 10) + (lo - 0xDC00));
            i_ = save;
          }
        }
        if (v >= 0xD800 && v <= 0xDFFF) return Fail("a lone surrogate cannot be written in JSON");
        return one(v);
      }
      case '0':
        if (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') return Fail("octal escapes are not supported");
        return one(0);
      default:
        if (e >= '1' && e <= '9') {
          --i_;
          return Fail("backreferences are not supported");
        }
        // Identity escapes: punctuation stands for itself; a letter escape we do not know is
        // refused rather than guessed.
        if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z')) {
          --i_;
          return Fail(std::string("unknown escape '\\") + static_cast<char>(e) + "'");
        }
        return one(e);
    }
  }

  std::vector<uint32_t> s_;
  size_t i_ = 0;
  int depth_ = 0;
};

bool Nullable(const Regex& re) {
  switch (re.kind) {
    case Regex::kChars: return false;
    case Regex::kSeq:
      for (const auto& k : re.kids)
        if (!Nullable(k)) return false;
      return true;
    case Regex::kAlt:
      for (const auto& k : re.kids)
        if (Nullable(k)) return true;
      return false;
    case Regex::kRepeat: return re.min == 0 || Nullable(re.kids[0]);
  }
  return true;
}

// Character positions after expanding counted repetitions (saturating).
int64_t Expanded(const Regex& re) {
  switch (re.kind) {
    case Regex::kChars: return 1;
    case Regex::kSeq:
    case Regex::kAlt: {
      int64_t n = 0;
      for (const auto& k : re.kids) n = std::min<int64_t>(n + Expanded(k), 1LL << 40);
      return n;
    }
    case Regex::kRepeat: return std::min<int64_t>(Expanded(re.kids[0]) * std::max(std::max(re.min, re.max), 1), 1LL << 40);
  }
  return 0;
}

std::string Cp(uint32_t c) {
  char buf[16];
  if (c <= 0xFFFF) snprintf(buf, sizeof buf, "\\u%04X", c);
  else snprintf(buf, sizeof buf, "\\U%08X", c);
  return buf;
}

std::string ClassText(const Ranges& r) {
  std::string s = "[";
  for (auto [lo, hi] : r) s += lo == hi ? Cp(lo) : Cp(lo) + "-" + Cp(hi);
  return s + "]";
}

// A hex digit class for digit values a..b, both letter cases.
std::string HexClass(int a, int b) {
  const char* d = "0123456789abcdef";
  const char* u = "0123456789ABCDEF";
  std::string s;
  if (a <= 9) s += a == std::min(b, 9) ? std::string(1, d[a]) : std::string(1, d[a]) + "-" + d[std::min(b, 9)];
  if (b >= 10) {
    const int lo = std::max(a, 10);
    s += lo == b ? std::string(1, d[lo]) + u[lo] : std::string(1, d[lo]) + "-" + d[b] + u[lo] + "-" + u[b];
  }
  return " [" + s + "]";
}

// Alternatives for the 4-digit hex numbers [a, b] (digit values, most significant first), like
// SameLength in json_schema.cpp in base 16.
void HexSame(const std::vector<int>& a, const std::vector<int>& b, const std::string& prefix, std::vector<std::string>* out) {
  if (a.empty()) {
    out->push_back(prefix);
    return;
  }
  const std::vector<int> ra(a.begin() + 1, a.end()), rb(b.begin() + 1, b.end());
  const int rest = static_cast<int>(ra.size());
  auto any = [](int k) { return k == 0 ? std::string() : k == 1 ? std::string(" [0-9a-fA-F]") : " [0-9a-fA-F]{" + std::to_string(k) + "}"; };
  if (a[0] == b[0]) return HexSame(ra, rb, prefix + HexClass(a[0], a[0]), out);
  const bool low_full = std::all_of(ra.begin(), ra.end(), [](int x) { return x == 0; });
  const bool high_full = std::all_of(rb.begin(), rb.end(), [](int x) { return x == 15; });
  int mid_lo = a[0], mid_hi = b[0];
  if (!low_full) {
    HexSame(ra, std::vector<int>(rest, 15), prefix + HexClass(a[0], a[0]), out);
    ++mid_lo;
  }
  if (!high_full) --mid_hi;
  if (mid_lo <= mid_hi) out->push_back(prefix + HexClass(mid_lo, mid_hi) + any(rest));
  if (!high_full) HexSame(std::vector<int>(rest, 0), rb, prefix + HexClass(b[0], b[0]), out);
}

std::vector<int> Hex4(uint32_t v) { return {int(v >> 12 & 15), int(v >> 8 & 15), int(v >> 4 & 15), int(v & 15)}; }

std::string JoinAlts(const std::vector<std::string>& alts) {
  std::string s;
  for (size_t i = 0; i < alts.size(); ++i) s += (i ? " |" : "") + alts[i];
  return s;
}

// Thompson construction with empty moves, then closed over them (BuildNfa).
struct EpsNfa {
  std::vector<std::vector<std::pair<int32_t, int32_t>>> chars;  // [state] (set index, to)
  std::vector<std::vector<int32_t>> eps;                       // [state]
  std::vector<Ranges> sets;
  int32_t New() {
    chars.emplace_back();
    eps.emplace_back();
    return static_cast<int32_t>(chars.size() - 1);
  }
  // A fragment from `s` to a new end state.
  int32_t Build(const Regex& re, int32_t s) {
    switch (re.kind) {
      case Regex::kChars: {
        const int32_t e = New();
        sets.push_back(re.chars);
        chars[s].push_back({static_cast<int32_t>(sets.size() - 1), e});
        return e;
      }
      case Regex::kSeq:
        for (const auto& k : re.kids) s = Build(k, s);
        return s;
      case Regex::kAlt: {
        const int32_t e = New();
        for (const auto& k : re.kids) {
          const int32_t ks = New();
          eps[s].push_back(ks);
          eps[Build(k, ks)].push_back(e);
        }
        return e;
      }
      case Regex::kRepeat: {
        for (int32_t i = 0; i < re.min; ++i) s = Build(re.kids[0], s);
        const int32_t e = New();
        if (re.max < 0) {
          const int32_t loop = New();
          eps[s].push_back(loop);
          eps[Build(re.kids[0], loop)].push_back(loop);
          eps[loop].push_back(e);
          return e;
        }
        eps[s].push_back(e);
        for (int32_t i = re.min; i < re.max; ++i) {
          s = Build(re.kids[0], s);
          eps[s].push_back(e);
        }
        return e;
      }
    }
    return s;
  }
};

}  // namespace

Result<Regex> ParsePattern(std::string_view pattern) {
  PatternParser p(pattern);
  auto re = p.Run();
  if (!re.ok()) return re.error();
  if (Expanded(*re) > kMaxExpanded)
    return MakeError(StatusCode::kInvalidArgument, "the pattern is too large once its repetitions are counted out (over %lld characters)",
                     static_cast<long long>(kMaxExpanded));
  return re;
}

// Each format as an anchored pattern of the subset above, written from its RFC's grammar (ranges
// real: months 01-12, days per month with leap years, hours 00-23, minutes 00-59, seconds 00-59).
const char* FormatPattern(std::string_view format) {
#define MNEMO_DATE \
  "(\\d{4}-((0[13578]|1[02])-(0[1-9]|[12]\\d|3[01])|(0[469]|11)-(0[1-9]|[12]\\d|30)|02-(0[1-9]|1\\d|2[0-8]))" \
  "|(\\d\\d(0[48]|[2468][048]|[13579][26])|([02468][048]|[13579][26])00)-02-29)"
#define MNEMO_TIME "([01]\\d|2[0-3]):[0-5]\\d:[0-5]\\d(\\.\\d{1,6})?(Z|[+-]([01]\\d|2[0-3]):[0-5]\\d)"
#define MNEMO_LABEL(n) "[A-Za-z0-9]([A-Za-z0-9-]{0," #n "}[A-Za-z0-9])?"
#define MNEMO_H16 "[0-9a-fA-F]{1,4}"
#define MNEMO_PCHAR "([A-Za-z0-9._~!$&'()*+,;=:@-]|%[0-9A-Fa-f]{2})"
  static const std::pair<const char*, const char*> kFormats[] = {
      {"date", "^" MNEMO_DATE "$"},
      {"time", "^" MNEMO_TIME "$"},
      {"date-time", "^" MNEMO_DATE "T" MNEMO_TIME "$"},
      // JSON Schema's appendix A (ISO 8601's subset it defines).
      {"duration",
       "^P((\\d{1,6}D|\\d{1,6}M(\\d{1,6}D)?|\\d{1,6}Y(\\d{1,6}M(\\d{1,6}D)?)?)"
       "(T(\\d{1,6}H(\\d{1,6}M(\\d{1,6}S)?)?|\\d{1,6}M(\\d{1,6}S)?|\\d{1,6}S))?"
       "|T(\\d{1,6}H(\\d{1,6}M(\\d{1,6}S)?)?|\\d{1,6}M(\\d{1,6}S)?|\\d{1,6}S)|\\d{1,6}W)$"},
      // A dot-atom local part of 1-3 atoms of at most 20 characters, a domain of 2-5 labels of at
      // most 36: at most 247 characters in all (RFC 5321 allows 254).
      {"email", "^[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]{1,20}(\\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]{1,20}){0,2}@" MNEMO_LABEL(34)
                "(\\." MNEMO_LABEL(34) "){1,4}$"},
      // RFC 1123: a label of at most 63 characters, then at most 4 more of at most 40 (at most 227
      // characters in all; RFC 1123 allows 253).
      {"hostname", "^" MNEMO_LABEL(61) "(\\." MNEMO_LABEL(38) "){0,4}$"},
      {"ipv4", "^(25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)(\\.(25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)){3}$"},
      // Eight groups, or i groups, "::" and at most 7 - i more (no embedded IPv4).
      {"ipv6", "^((" MNEMO_H16 ":){7}" MNEMO_H16 "|::(" MNEMO_H16 "(:" MNEMO_H16 "){0,6})?|(" MNEMO_H16 ":){1}:(" MNEMO_H16
               "(:" MNEMO_H16 "){0,5})?|(" MNEMO_H16 ":){2}:(" MNEMO_H16 "(:" MNEMO_H16 "){0,4})?|(" MNEMO_H16 ":){3}:(" MNEMO_H16
               "(:" MNEMO_H16 "){0,3})?|(" MNEMO_H16 ":){4}:(" MNEMO_H16 "(:" MNEMO_H16 "){0,2})?|(" MNEMO_H16 ":){5}:(" MNEMO_H16
               "(:" MNEMO_H16 ")?)?|(" MNEMO_H16 ":){6}:(" MNEMO_H16 ")?|(" MNEMO_H16 ":){7}:)$"},
      {"uuid", "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"},
      // RFC 3986 absolute URIs: scheme ":" then "//" authority (reg-name, port) and path-abempty,
      // or path-absolute / path-rootless / empty; then query and fragment.
      {"uri", "^[A-Za-z][A-Za-z0-9+.-]{0,15}:(//([A-Za-z0-9._~!$&'()*+,;=-]|%[0-9A-Fa-f]{2})*(:\\d{1,5})?(/" MNEMO_PCHAR
              "*)*|/(" MNEMO_PCHAR "+(/" MNEMO_PCHAR "*)*)?|" MNEMO_PCHAR "+(/" MNEMO_PCHAR "*)*)?(\\?(" MNEMO_PCHAR
              "|[/?])*)?(#(" MNEMO_PCHAR "|[/?])*)?$"},
  };
#undef MNEMO_DATE
#undef MNEMO_TIME
#undef MNEMO_LABEL
#undef MNEMO_H16
#undef MNEMO_PCHAR
  // Formats whose languages hold ours: an ASCII email is an idn-email, an absolute URI a URI
  // reference and an IRI.
  if (format == "idn-email") format = "email";
  if (format == "idn-hostname") format = "hostname";
  if (format == "uri-reference" || format == "iri" || format == "iri-reference") format = "uri";
  for (const auto& [name, pattern] : kFormats)
    if (format == name) return pattern;
  return nullptr;
}

bool FormatImpliesPattern(std::string_view format, std::string_view pattern) {
  // zod 4's patterns (z.string().duration(), z.hostname()) use lookahead; every value of our
  // formats matches them (tests/grammar/json_regex_test.cpp checks with std::regex).
  static const std::pair<const char*, const char*> kImplied[] = {
      {"duration", R"(^P(?:(\d+W)|(?!.*W)(?=\d|T\d)(\d+Y)?(\d+M)?(\d+D)?(T(?=\d)(\d+H)?(\d+M)?(\d+([.,]\d+)?S)?)?)$)"},
      {"hostname", R"(^(?=.{1,253}\.?$)[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[-0-9a-zA-Z]{0,61}[0-9a-zA-Z])?)*\.?$)"},
  };
  for (const auto& [f, p] : kImplied)
    if (format == f && pattern == p) return true;
  return false;
}

std::pair<int64_t, int64_t> LengthRange(const Regex& re) {
  switch (re.kind) {
    case Regex::kChars: return {1, 1};
    case Regex::kSeq: {
      int64_t lo = 0, hi = 0;
      for (const auto& k : re.kids) {
        auto [a, b] = LengthRange(k);
        lo += a;
        hi = hi < 0 || b < 0 ? -1 : hi + b;
      }
      return {lo, hi};
    }
    case Regex::kAlt: {
      int64_t lo = INT64_MAX, hi = 0;
      for (const auto& k : re.kids) {
        auto [a, b] = LengthRange(k);
        lo = std::min(lo, a);
        hi = hi < 0 || b < 0 ? -1 : std::max(hi, b);
      }
      return {re.kids.empty() ? 0 : lo, hi};
    }
    case Regex::kRepeat: {
      auto [a, b] = LengthRange(re.kids[0]);
      return {a * re.min, re.max < 0 ? (b == 0 ? 0 : -1) : b < 0 ? -1 : b * re.max};
    }
  }
  return {0, -1};
}

std::string EncodeSet(const Ranges& set) {
  std::vector<std::string> alts;
  const Ranges raw = Minus(set, {{0, 0x1F}, {'"', '"'}, {'\\', '\\'}});
  if (!raw.empty()) alts.push_back(std::string(" ").append(ClassText(raw)));
  Ranges short_esc;
  for (auto [c, e] : {std::pair<uint32_t, char>{'"', '"'}, {'\\', '\\'}, {'/', '/'}, {'\b', 'b'}, {'\f', 'f'}, {'\n', 'n'},
                      {'\r', 'r'}, {'\t', 't'}})
    if (Has(set, c)) short_esc.push_back({static_cast<uint8_t>(e), static_cast<uint8_t>(e)});
  if (!short_esc.empty()) alts.push_back(" \"\\\\\" " + ClassText(Norm(short_esc)));
  // \uXXXX: every member for the wide sets, else the control characters without a short form.
  const bool wide = Size(set) > 0x8000;
  const Ranges hex = wide ? Intersect(set, {{0, 0xFFFF}}) : Minus(Intersect(set, {{0, 0x1F}}), {{8, 10}, {12, 13}});
  if (!hex.empty()) {
    std::vector<std::string> h;
    for (auto [lo, hi] : hex) HexSame(Hex4(lo), Hex4(hi), "", &h);
    alts.push_back(" \"\\\\u\" (" + JoinAlts(h) + " )");
  }
  return JoinAlts(alts).substr(1);
}

std::string RegexExpr(const Regex& re, const RuleSink& sink) {
  switch (re.kind) {
    case Regex::kChars: return sink.shared("char", EncodeSet(re.chars));
    case Regex::kSeq: {
      if (re.kids.empty()) return "\"\"";
      std::string s;
      for (const auto& k : re.kids) {
        const std::string e = RegexExpr(k, sink);
        if (e.empty()) return "";
        s += (s.empty() ? "" : " ") + e;
      }
      return re.kids.size() == 1 ? s : "( " + s + " )";
    }
    case Regex::kAlt: {
      std::string s;
      for (const auto& k : re.kids) {
        const std::string e = RegexExpr(k, sink);
        if (e.empty()) return "";
        s += (s.empty() ? "" : " | ") + e;
      }
      return "( " + s + " )";
    }
    case Regex::kRepeat: {
      if (Nullable(re.kids[0])) return "";
      const std::string e = RegexExpr(re.kids[0], sink);
      if (e.empty()) return "";
      std::string q = re.max < 0 ? (re.min == 0 ? "*" : re.min == 1 ? "+" : "{" + std::to_string(re.min) + ",}")
                                 : "{" + std::to_string(re.min) + "," + std::to_string(re.max) + "}";
      return "( " + e + " )" + q;
    }
  }
  return "";
}

Result<Nfa> BuildNfa(const Regex& re) {
  EpsNfa en;
  const int32_t start = en.New();
  const int32_t final_state = en.Build(re, start);
  const size_t n = en.chars.size();
  // Closure over empty moves from every state reached by a character (and the start).
  Nfa nfa;
  std::vector<int32_t> id(n, -1);
  std::deque<int32_t> todo;
  auto intern = [&](int32_t s) {
    if (id[s] < 0) {
      id[s] = static_cast<int32_t>(nfa.out.size());
      nfa.out.emplace_back();
      nfa.accept.push_back(false);
      todo.push_back(s);
    }
    return id[s];
  };
  intern(start);
  std::vector<int32_t> seen(n, -1), stack;
  int64_t transitions = 0;
  while (!todo.empty()) {
    const int32_t s = todo.front();
    todo.pop_front();
    const int32_t me = id[s];
    stack = {s};
    seen[s] = s;
    std::map<int32_t, Ranges> edges;  // target -> characters
    while (!stack.empty()) {
      const int32_t q = stack.back();
      stack.pop_back();
      if (q == final_state) nfa.accept[me] = true;
      for (auto [set, to] : en.chars[q]) {
        auto& r = edges[intern(to)];
        r = Union(r, en.sets[set]);
      }
      for (int32_t t : en.eps[q])
        if (seen[t] != s) seen[t] = s, stack.push_back(t);
    }
    for (auto& [to, set] : edges)
      if (!set.empty()) nfa.out[me].push_back({std::move(set), to});
    transitions += static_cast<int64_t>(edges.size());
    if (transitions > kMaxTransitions)
      return MakeError(StatusCode::kInvalidArgument, "the pattern is too complex (over %lld transitions)", static_cast<long long>(kMaxTransitions));
  }
  return nfa;
}

bool NfaMatches(const Nfa& nfa, const std::vector<uint32_t>& code_points) {
  std::vector<int32_t> cur = {0}, next;
  for (uint32_t c : code_points) {
    next.clear();
    for (int32_t s : cur)
      for (const auto& e : nfa.out[s])
        if (Has(e.set, c)) next.push_back(e.to);
    std::sort(next.begin(), next.end());
    next.erase(std::unique(next.begin(), next.end()), next.end());
    cur.swap(next);
    if (cur.empty()) return false;
  }
  for (int32_t s : cur)
    if (nfa.accept[s]) return true;
  return false;
}

namespace {

// The product of NFAs and a length counter, trimmed to the states that can still accept.
struct Product {
  std::vector<std::vector<std::pair<Ranges, int32_t>>> out;  // [states] (characters, to)
  std::vector<bool> accept;                                  // [states]
  std::vector<bool> live;                                    // [states]: an accepting state is reachable
  bool overflow = false;                                     // over the limits: nothing else set
  int64_t overflow_length = 0;  // with a counter, the length being expanded when the limits hit
};

// counter: track lengths (capped at max_len, or at min_len when max_len < 0: past it every length
// is alike); without it lengths are not constrained.
Product MakeProduct(const std::vector<const Nfa*>& nfas, bool counter, int64_t min_len, int64_t max_len) {
  using Key = std::vector<int32_t>;  // one state per NFA, then the length
  const size_t k = nfas.size();
  Product p;
  std::map<Key, int32_t> ids;
  std::vector<Key> keys;
  auto intern = [&](const Key& key) -> int32_t {
    auto [it, fresh] = ids.try_emplace(key, static_cast<int32_t>(keys.size()));
    if (fresh) keys.push_back(key);
    return it->second;
  };
  intern(Key(k + 1, 0));
  int64_t transitions = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    const Key key = keys[i];
    if (keys.size() > static_cast<size_t>(kMaxProductStates) || transitions > kMaxTransitions) {
      p.overflow = true;
      p.overflow_length = key[k];
      return p;
    }
    bool acc = !counter || key[k] >= min_len;
    for (size_t j = 0; j < k; ++j) acc = acc && nfas[j]->accept[key[j]];
    p.accept.push_back(acc);
    p.out.emplace_back();
    const int64_t len = key[k] + 1;
    if (counter && max_len >= 0 && len > max_len) continue;
    std::map<int32_t, Ranges> edges;
    Key to(k + 1, 0);
    if (counter) to[k] = static_cast<int32_t>(max_len >= 0 ? len : std::min(len, min_len));
    // Every combination of one edge per NFA whose characters intersect.
    std::function<void(size_t, const Ranges&)> combine = [&](size_t j, const Ranges& chars) {
      if (j == k) {
        auto& r = edges[intern(to)];
        r = Union(r, chars);
        return;
      }
      for (const auto& e : nfas[j]->out[key[j]]) {
        Ranges both = Intersect(chars, e.set);
        if (both.empty()) continue;
        to[j] = e.to;
        combine(j + 1, both);
      }
    };
    combine(0, AnyChar());
    transitions += static_cast<int64_t>(edges.size());
    for (auto& [t, set] : edges) p.out[i].push_back({std::move(set), t});
  }
  const size_t n = keys.size();
  std::vector<std::vector<int32_t>> in(n);
  for (size_t i = 0; i < n; ++i)
    for (const auto& e : p.out[i]) in[e.second].push_back(static_cast<int32_t>(i));
  p.live.assign(n, false);
  std::vector<int32_t> stack;
  for (size_t i = 0; i < n; ++i)
    if (p.accept[i]) p.live[i] = true, stack.push_back(static_cast<int32_t>(i));
  while (!stack.empty()) {
    const int32_t s = stack.back();
    stack.pop_back();
    for (int32_t q : in[s])
      if (!p.live[q]) p.live[q] = true, stack.push_back(q);
  }
  return p;
}

// Shortest and longest accepted string of a trimmed product (longest -1: a cycle, unbounded).
// Iterative (products run to thousands of states deep): BFS for the shortest, Kahn's order for
// the longest.
std::pair<int64_t, int64_t> ProductLengths(const Product& p) {
  const size_t n = p.out.size();
  std::vector<int64_t> dist(n, -1);
  std::deque<int32_t> q = {0};
  dist[0] = 0;
  int64_t shortest = -1;
  while (!q.empty()) {
    const int32_t s = q.front();
    q.pop_front();
    if (p.accept[s] && shortest < 0) shortest = dist[s];
    for (const auto& e : p.out[s])
      if (p.live[e.second] && dist[e.second] < 0) dist[e.second] = dist[s] + 1, q.push_back(e.second);
  }
  std::vector<int32_t> indeg(n, 0);
  size_t live = 0;
  for (size_t s = 0; s < n; ++s) {
    if (!p.live[s]) continue;
    ++live;
    for (const auto& e : p.out[s])
      if (p.live[e.second]) ++indeg[e.second];
  }
  std::vector<int64_t> longest(n, 0);
  std::vector<int32_t> order;
  for (size_t s = 0; s < n; ++s)
    if (p.live[s] && indeg[s] == 0) order.push_back(static_cast<int32_t>(s));
  int64_t most = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    const int32_t s = order[i];
    if (p.accept[s]) most = std::max(most, longest[s]);
    for (const auto& e : p.out[s]) {
      if (!p.live[e.second]) continue;
      longest[e.second] = std::max(longest[e.second], longest[s] + 1);
      if (--indeg[e.second] == 0) order.push_back(e.second);
    }
  }
  return {shortest, order.size() < live ? -1 : most};
}

}  // namespace

Result<std::string> IntersectionExpr(const std::vector<const Nfa*>& nfas, int64_t min_len, int64_t max_len, const RuleSink& sink) {
  auto too_large = [] {
    return MakeError(StatusCode::kInvalidArgument,
                     "format, pattern and length bounds together need over %d states or %lld transitions; drop one or "
                     "simplify the pattern",
                     kMaxProductStates, static_cast<long long>(kMaxTransitions));
  };
  // Without a counter first: the bounds may hold for every string already (a format's lengths).
  Product p = MakeProduct(nfas, false, 0, -1);
  if (p.overflow) return too_large();
  if (!p.live[0]) return MakeError(StatusCode::kInvalidArgument, "no string satisfies the format and the pattern together");
  const auto [shortest, longest] = ProductLengths(p);
  if (shortest < min_len || (max_len >= 0 && (longest < 0 || longest > max_len))) {
    // With a counter. A long maxLength over a cyclic language costs states per length, so past
    // the limits the length is capped lower: the strings are shorter than allowed, never
    // invalid. States are found in order of length (each transition adds one), so every state
    // shorter than the length the limits hit at was already within them: that length - 1 fits.
    p = MakeProduct(nfas, true, min_len, max_len);
    if (p.overflow) {
      const int64_t cap = p.overflow_length - 1;
      if (max_len < 0 || cap < std::max<int64_t>(min_len, kMinLengthCap)) return too_large();
      p = MakeProduct(nfas, true, min_len, cap);
      if (p.overflow) return too_large();
    }
    if (!p.live[0]) return MakeError(StatusCode::kInvalidArgument, "no string satisfies the format, pattern and length bounds together");
  }
  const size_t n = p.out.size();
  std::vector<std::string> names(n);
  for (size_t i = 0; i < n; ++i)
    if (p.live[i]) names[i] = sink.reserve("str");
  for (size_t i = 0; i < n; ++i) {
    if (!p.live[i]) continue;
    std::vector<std::string> alts;
    if (p.accept[i]) alts.push_back(" \"\"");
    for (const auto& [set, t] : p.out[i])
      if (p.live[t]) alts.push_back(std::string(" ").append(sink.shared("char", EncodeSet(set))).append(" ").append(names[t]));
    sink.define(names[i], JoinAlts(alts).substr(1));
  }
  return names[0];
}

}  // namespace mnemo::grammar
