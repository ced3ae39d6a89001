#include "grammar/grammar.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <unordered_map>

#include "tokenizer/unicode.h"

namespace mnemo::grammar {

void Utf8Sequences(uint32_t lo, uint32_t hi, std::vector<std::vector<std::pair<uint8_t, uint8_t>>>* out) {
  if (lo > hi) return;
  if (hi > 0x10FFFF) hi = 0x10FFFF;
  if (lo > hi) return;
  // Surrogates have no UTF-8 form (and a JSON parser refuses them).
  if (lo <= 0xDFFF && hi >= 0xD800) {
    if (lo < 0xD800) Utf8Sequences(lo, 0xD7FF, out);
    if (hi > 0xDFFF) Utf8Sequences(0xE000, hi, out);
    return;
  }
  // One encoded length per call: split at the last code point of each length.
  for (uint32_t b : {0x7Fu, 0x7FFu, 0xFFFFu}) {
    if (lo <= b && b < hi) {
      Utf8Sequences(lo, b, out);
      Utf8Sequences(b + 1, hi, out);
      return;
    }
  }
  if (hi < 0x80) {
    out->push_back({{static_cast<uint8_t>(lo), static_cast<uint8_t>(hi)}});
    return;
  }
  const int n = hi < 0x800 ? 2 : hi < 0x10000 ? 3 : 4;
  // Split until lo and hi differ only in bytes whose trailing continuation bytes span 80..BF
  // fully, so that the sequence is a product of byte ranges.
  for (int i = 1; i < n; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        Utf8Sequences(lo, lo | m, out);
        Utf8Sequences((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        Utf8Sequences(lo, (hi & ~m) - 1, out);
        Utf8Sequences(hi & ~m, hi, out);
        return;
      }
    }
  }
  auto encode = [n](uint32_t cp, uint8_t* b) {
    if (n == 2) {
      b[0] = 0xC0 | (cp >> 6), b[1] = 0x80 | (cp & 0x3F);
    } else if (n == 3) {
      b[0] = 0xE0 | (cp >> 12), b[1] = 0x80 | ((cp >> 6) & 0x3F), b[2] = 0x80 | (cp & 0x3F);
    } else {
      b[0] = 0xF0 | (cp >> 18), b[1] = 0x80 | ((cp >> 12) & 0x3F), b[2] = 0x80 | ((cp >> 6) & 0x3F),
      b[3] = 0x80 | (cp & 0x3F);
    }
  };
  uint8_t a[4], z[4];
  encode(lo, a);
  encode(hi, z);
  std::vector<std::pair<uint8_t, uint8_t>> seq;
  for (int i = 0; i < n; ++i) seq.push_back({a[i], z[i]});
  out->push_back(std::move(seq));
}

std::string Literal(std::string_view text) {
  std::string s = "\"";
  for (unsigned char c : text) {
    if (c == '"' || c == '\\') {
      s += '\\';
      s += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7F) {
      char buf[8];
      snprintf(buf, sizeof buf, "\\x%02X", c);
      s += buf;
    } else {
      s += static_cast<char>(c);
    }
  }
  return s + "\"";
}

// Builds a Grammar: rules by name, anonymous rules for groups and repetitions, then the checks.
class Builder {
 public:
  int32_t RuleId(const std::string& name) {
    auto [it, fresh] = ids_.try_emplace(name, static_cast<int32_t>(rules_.size()));
    if (fresh) {
      rules_.emplace_back();
      defined_.push_back(false);
      g_.names_.push_back(name);
      first_use_line_.push_back(line_);
    }
    return it->second;
  }
  int32_t NewRule(const std::string& hint) {
    const int32_t id = static_cast<int32_t>(rules_.size());
    rules_.emplace_back();
    defined_.push_back(true);
    g_.names_.push_back(hint + "#" + std::to_string(id));
    first_use_line_.push_back(line_);
    return id;
  }
  bool Define(int32_t id) {
    if (defined_[id]) return false;
    defined_[id] = true;
    return true;
  }
  Status AddAlt(int32_t rule, Grammar::Seq seq) {
    n_items_ += static_cast<int64_t>(seq.size()) + 1;
    if (n_items_ > kMaxElements) return MakeError(StatusCode::kInvalidArgument, "grammar too large (over %d elements)", kMaxElements);
    rules_[rule].push_back(std::move(seq));
    return Status::Ok();
  }
  int32_t Set(const ByteSet& s) {
    for (size_t i = 0; i < g_.sets_.size(); ++i)
      if (g_.sets_[i] == s) return static_cast<int32_t>(i);
    g_.sets_.push_back(s);
    return static_cast<int32_t>(g_.sets_.size() - 1);
  }
  Grammar::Item Byte(uint8_t b) {
    ByteSet s;
    s.Add(b);
    return {Element::kBytes, Set(s)};
  }
  // X repeated min..max times (max < 0: unbounded), as one item.
  Result<Grammar::Item> Repeat(Grammar::Item x, int64_t min, int64_t max) {
    if (min > kMaxRepeat || max > kMaxRepeat)
      return MakeError(StatusCode::kInvalidArgument, "line %d: repetition bound over %d", line_, kMaxRepeat);
    Grammar::Seq seq(static_cast<size_t>(min), x);
    if (max < 0) {  // R ::= x R | ""
      const int32_t r = NewRule("star");
      MNEMO_TRY(AddAlt(r, {x, {Element::kRule, r}}));
      MNEMO_TRY(AddAlt(r, {}));
      seq.push_back({Element::kRule, r});
      chains_.push_back({x, {r}, true});
    } else if (max > min) {  // R_1 ::= x | "";  R_k ::= x R_{k-1} | ""
      int32_t prev = -1;
      Chain chain{x, {-1}, false};
      for (int64_t k = 1; k <= max - min; ++k) {
        const int32_t r = NewRule("opt");
        Grammar::Seq alt{x};
        if (prev >= 0) alt.push_back({Element::kRule, prev});
        MNEMO_TRY(AddAlt(r, std::move(alt)));
        MNEMO_TRY(AddAlt(r, {}));
        prev = r;
        chain.rules.push_back(r);
      }
      seq.push_back({Element::kRule, prev});
      chains_.push_back(std::move(chain));
    }
    if (seq.size() == 1) return seq[0];
    const int32_t r = NewRule("rep");
    MNEMO_TRY(AddAlt(r, std::move(seq)));
    return Grammar::Item{Element::kRule, r};
  }
  void set_line(int line) { line_ = line; }

  Result<Grammar> Finish(std::string_view root) {
    for (size_t r = 0; r < rules_.size(); ++r) {
      if (!defined_[r])
        return MakeError(StatusCode::kInvalidArgument, "line %d: rule '%s' is used but not defined",
                         first_use_line_[r], g_.names_[r].c_str());
    }
    auto it = ids_.find(std::string(root));
    if (it == ids_.end()) return MakeError(StatusCode::kInvalidArgument, "the grammar has no '%.*s' rule", static_cast<int>(root.size()), root.data());
    g_.root_ = it->second;
    // Minimum lengths and nullability (fixpoint: rules may be recursive).
    const size_t n = rules_.size();
    std::vector<int32_t> min_len(n, Grammar::kFar);
    auto seq_len = [&](const Grammar::Seq& s) {
      int64_t sum = 0;
      for (const auto& item : s) sum += item.kind == Element::kBytes ? 1 : min_len[item.arg];
      return static_cast<int32_t>(std::min<int64_t>(sum, Grammar::kFar));
    };
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < n; ++r)
        for (const auto& s : rules_[r]) {
          const int32_t l = seq_len(s);
          if (l < min_len[r]) min_len[r] = l, changed = true;
        }
    }
    for (size_t r = 0; r < n; ++r) {
      if (min_len[r] >= Grammar::kFar)
        return MakeError(StatusCode::kInvalidArgument, "rule '%s' can never end (every alternative recurses)",
                         g_.names_[r].c_str());
    }
    // Left recursion: an edge r -> s when s can start r with nothing consumed before it.
    std::vector<std::vector<int32_t>> left(n);
    for (size_t r = 0; r < n; ++r)
      for (const auto& s : rules_[r])
        for (const auto& item : s) {
          if (item.kind == Element::kBytes) break;
          left[r].push_back(item.arg);
          if (min_len[item.arg] > 0) break;
        }
    std::vector<uint8_t> color(n, 0);  // 0 new, 1 on the path, 2 done
    std::string cycle;
    std::function<bool(int32_t)> dfs = [&](int32_t r) {
      color[r] = 1;
      for (int32_t s : left[r]) {
        if (color[s] == 1) {
          cycle = g_.names_[s];
          return true;
        }
        if (color[s] == 0 && dfs(s)) return true;
      }
      color[r] = 2;
      return false;
    };
    for (size_t r = 0; r < n; ++r)
      if (color[r] == 0 && dfs(static_cast<int32_t>(r)))
        return MakeError(StatusCode::kInvalidArgument,
                         "left recursion through rule '%s' (a rule reaches itself before consuming a byte; "
                         "a repeated item must not match the empty string)", cycle.c_str());
    // Flatten.
    g_.alts_.assign(n, {});
    for (size_t r = 0; r < n; ++r) {
      for (const auto& s : rules_[r]) {
        g_.alts_[r].push_back(static_cast<int32_t>(g_.elems_.size()));
        for (const auto& item : s) g_.elems_.push_back({item.kind, item.arg});
        g_.elems_.push_back({Element::kEnd, static_cast<int32_t>(r)});
      }
    }
    g_.min_from_.assign(g_.elems_.size(), 0);
    for (int64_t p = static_cast<int64_t>(g_.elems_.size()) - 1; p >= 0; --p) {
      const Element& e = g_.elems_[p];
      if (e.kind == Element::kEnd) continue;
      const int64_t cost = e.kind == Element::kBytes ? 1 : min_len[e.arg];
      g_.min_from_[p] = static_cast<int32_t>(std::min<int64_t>(cost + g_.min_from_[p + 1], Grammar::kFar));
    }
    // Chains whose x always consumes a byte: within j bytes, R_j and any longer R behave alike,
    // which is what lets the matcher share one mask computation across the levels.
    g_.chain_pos_.assign(g_.elems_.size(), Grammar::ChainPos{});
    std::map<std::pair<int, int32_t>, int32_t> longest;  // x -> its longest finite chain
    for (const Chain& c : chains_) {
      if ((c.x.kind == Element::kBytes ? 1 : min_len[c.x.arg]) < 1) continue;
      const int32_t id = static_cast<int32_t>(g_.chain_len_.size());
      g_.chain_canon_.push_back(id);
      if (!c.star) {
        auto [it, fresh] = longest.try_emplace({c.x.kind, c.x.arg}, id);
        if (!fresh && static_cast<int32_t>(c.rules.size()) - 1 > g_.chain_len_[it->second]) it->second = id;
      }
      g_.chain_len_.push_back(c.star ? Grammar::kUnbounded : static_cast<int32_t>(c.rules.size()) - 1);
      g_.chain_starts_.emplace_back();
      for (size_t level = c.star ? 0 : 1; level < c.rules.size(); ++level) {
        const int32_t start = g_.alts_[c.rules[level]][0];
        if (!c.star) {
          g_.chain_starts_.back().resize(level + 1, -1);
          g_.chain_starts_.back()[level] = start;
        }
        const int32_t lv = c.star ? Grammar::kUnbounded : static_cast<int32_t>(level);
        g_.chain_pos_[start] = {id, lv, 0};
        if (g_.elems_[start + 1].kind == Element::kRule) g_.chain_pos_[start + 1] = {id, lv, 1};
      }
    }
    for (size_t c = 0, id = 0; c < chains_.size(); ++c) {
      const Chain& ch = chains_[c];
      if ((ch.x.kind == Element::kBytes ? 1 : min_len[ch.x.arg]) < 1) continue;
      if (!ch.star) g_.chain_canon_[id] = longest.at({ch.x.kind, ch.x.arg});
      ++id;
    }
    return std::move(g_);
  }

 private:
  Grammar g_;
  std::unordered_map<std::string, int32_t> ids_;
  std::vector<std::vector<Grammar::Seq>> rules_;
  std::vector<bool> defined_;
  std::vector<int> first_use_line_;
  struct Chain {
    Grammar::Item x;
    std::vector<int32_t> rules;  // x*: {R}; x{m,n}: {-1, R_1, ..., R_(n-m)}
    bool star;
  };
  std::vector<Chain> chains_;
  int64_t n_items_ = 0;
  int line_ = 1;
};

namespace {

bool IsNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}

class Parser {
 public:
  Parser(std::string_view text, Builder* b) : s_(text), b_(b) {}

  Status Run() {
    SkipSpace();
    while (pos_ < s_.size()) {
      std::string name = Name();
      if (name.empty()) return Fail("expected a rule name");
      SkipSpace();
      if (s_.substr(pos_, 3) != "::=") return Fail("expected '::=' after rule name '" + name + "'");
      pos_ += 3;
      b_->set_line(line_);
      const int32_t id = b_->RuleId(name);
      if (!b_->Define(id)) return Fail("rule '" + name + "' is defined twice");
      MNEMO_TRY(Alternatives(id, /*nested=*/false));
      SkipSpace();
    }
    return Status::Ok();
  }

 private:
  Error Fail(const std::string& what) const {
    return MakeError(StatusCode::kInvalidArgument, "grammar line %d: %s", line_, what.c_str());
  }
  void SkipSpace() {
    while (pos_ < s_.size()) {
      const char c = s_[pos_];
      if (c == '#') {
        while (pos_ < s_.size() && s_[pos_] != '\n') ++pos_;
      } else if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
        if (c == '\n') ++line_;
        ++pos_;
      } else {
        break;
      }
    }
  }
  std::string Name() {
    const size_t start = pos_;
    while (pos_ < s_.size() && IsNameChar(s_[pos_])) ++pos_;
    return std::string(s_.substr(start, pos_ - start));
  }
  // True when the text at pos_ starts a new rule (`name ::=`).
  bool AtRuleStart() const {
    size_t p = pos_;
    while (p < s_.size() && IsNameChar(s_[p])) ++p;
    if (p == pos_) return false;
    while (p < s_.size() && (s_[p] == ' ' || s_[p] == '\t')) ++p;
    return s_.substr(p, 3) == "::=";
  }
  Status Alternatives(int32_t rule, bool nested) {
    for (;;) {
      Grammar::Seq seq;
      MNEMO_TRY(Sequence(&seq, nested));
      MNEMO_TRY(b_->AddAlt(rule, std::move(seq)));
      SkipSpace();
      if (pos_ < s_.size() && s_[pos_] == '|') {
        ++pos_;
        continue;
      }
      return Status::Ok();
    }
  }
  Status Sequence(Grammar::Seq* seq, bool nested) {
    for (;;) {
      SkipSpace();
      if (pos_ >= s_.size()) return Status::Ok();
      const char c = s_[pos_];
      if (c == '|' || (c == ')' && nested)) return Status::Ok();
      if (!nested && AtRuleStart()) return Status::Ok();
      const size_t before = seq->size();
      if (c == '"') {
        std::string bytes;
        MNEMO_TRY(LiteralBytes(&bytes));
        for (unsigned char ch : bytes) seq->push_back(b_->Byte(ch));
        // A postfix operator applies to the whole literal.
        if (bytes.size() > 1 && PostfixNext()) {
          const int32_t r = b_->NewRule("lit");
          MNEMO_TRY(b_->AddAlt(r, Grammar::Seq(seq->begin() + static_cast<long>(before), seq->end())));
          seq->resize(before);
          seq->push_back({Element::kRule, r});
        } else if (bytes.empty()) {
          if (PostfixNext()) return Fail("a repetition of the empty string");
          continue;
        }
      } else if (c == '[' || c == '.') {
        Grammar::Item item;
        MNEMO_TRY(Class(&item));
        seq->push_back(item);
      } else if (c == '(') {
        ++pos_;
        const int32_t r = b_->NewRule("group");
        MNEMO_TRY(Alternatives(r, /*nested=*/true));
        SkipSpace();
        if (pos_ >= s_.size() || s_[pos_] != ')') return Fail("expected ')'");
        ++pos_;
        seq->push_back({Element::kRule, r});
      } else if (IsNameChar(c)) {
        std::string name = Name();
        seq->push_back({Element::kRule, b_->RuleId(name)});
      } else {
        return Fail(std::string("unexpected character '") + c + "'");
      }
      MNEMO_TRY(Postfix(seq));
    }
  }
  bool PostfixNext() const {
    return pos_ < s_.size() && (s_[pos_] == '*' || s_[pos_] == '+' || s_[pos_] == '?' || s_[pos_] == '{');
  }
  Status Postfix(Grammar::Seq* seq) {
    while (PostfixNext()) {
      const char c = s_[pos_++];
      int64_t min = 0, max = -1;
      if (c == '+') min = 1;
      if (c == '?') max = 1;
      if (c == '{') {
        auto num = [&](int64_t* v) {
          size_t start = pos_;
          *v = 0;
          while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
            *v = *v * 10 + (s_[pos_++] - '0');
            if (*v > kMaxRepeat) *v = kMaxRepeat + 1;
          }
          return pos_ > start;
        };
        SkipSpace();
        if (!num(&min)) return Fail("expected a number after '{'");
        SkipSpace();
        max = min;
        if (pos_ < s_.size() && s_[pos_] == ',') {
          ++pos_;
          SkipSpace();
          if (!num(&max)) max = -1;
          SkipSpace();
        }
        if (pos_ >= s_.size() || s_[pos_] != '}') return Fail("expected '}'");
        ++pos_;
        if (max >= 0 && max < min) return Fail("repetition {m,n} with n < m");
      }
      auto rep = b_->Repeat(seq->back(), min, max);
      if (!rep.ok()) return rep.error();
      seq->back() = *rep;
    }
    return Status::Ok();
  }
  // Reads one code point (UTF-8) or escape inside a literal or a class.
  Status Char(uint32_t* cp, bool* escaped) {
    *escaped = false;
    if (pos_ >= s_.size()) return Fail("unterminated literal or class");
    unsigned char c = static_cast<unsigned char>(s_[pos_]);
    if (c == '\\') {
      *escaped = true;
      if (++pos_ >= s_.size()) return Fail("unterminated escape");
      const char e = s_[pos_++];
      auto hex = [&](int n) -> Status {
        *cp = 0;
        for (int i = 0; i < n; ++i) {
          if (pos_ >= s_.size()) return Fail("short \\x / \\u escape");
          const char h = s_[pos_++];
          int v = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
          if (v < 0) return Fail("bad hex digit in escape");
          *cp = *cp * 16 + static_cast<uint32_t>(v);
        }
        return Status::Ok();
      };
      switch (e) {
        case 'n': *cp = '\n'; return Status::Ok();
        case 'r': *cp = '\r'; return Status::Ok();
        case 't': *cp = '\t'; return Status::Ok();
        case 'x': return hex(2);
        case 'u': return hex(4);
        case 'U': return hex(8);
        default: *cp = static_cast<unsigned char>(e); return Status::Ok();
      }
    }
    int n = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
    if (n == 0 || pos_ + n > s_.size()) return Fail("invalid UTF-8 in the grammar text");
    *cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (int i = 1; i < n; ++i) *cp = (*cp << 6) | (static_cast<unsigned char>(s_[pos_ + i]) & 0x3F);
    pos_ += n;
    return Status::Ok();
  }
  Status LiteralBytes(std::string* out) {
    ++pos_;  // "
    for (;;) {
      if (pos_ >= s_.size()) return Fail("unterminated literal");
      if (s_[pos_] == '"') {
        ++pos_;
        return Status::Ok();
      }
      const size_t start = pos_;
      uint32_t cp;
      bool escaped;
      MNEMO_TRY(Char(&cp, &escaped));
      if (!escaped) {
        out->append(s_.substr(start, pos_ - start));  // raw bytes as written
      } else if (s_[start + 1] == 'x') {
        out->push_back(static_cast<char>(cp));  // \xHH is a byte
      } else {
        AppendUtf8(cp, out);
      }
    }
  }
  // [...] or `.`: code-point ranges, compiled to one byte set (ASCII only) or a rule of UTF-8
  // byte-range sequences.
  Status Class(Grammar::Item* item) {
    std::vector<std::pair<uint32_t, uint32_t>> ranges;
    bool negate = false;
    if (s_[pos_] == '.') {
      ++pos_;
      ranges.push_back({0, 0x10FFFF});
    } else {
      ++pos_;  // [
      if (pos_ < s_.size() && s_[pos_] == '^') negate = true, ++pos_;
      for (;;) {
        if (pos_ >= s_.size()) return Fail("unterminated character class");
        if (s_[pos_] == ']') {
          ++pos_;
          break;
        }
        uint32_t lo, hi;
        bool escaped;
        MNEMO_TRY(Char(&lo, &escaped));
        hi = lo;
        if (pos_ + 1 < s_.size() && s_[pos_] == '-' && s_[pos_ + 1] != ']') {
          ++pos_;
          MNEMO_TRY(Char(&hi, &escaped));
          if (hi < lo) return Fail("character range with end before start");
        }
        ranges.push_back({lo, hi});
      }
    }
    std::sort(ranges.begin(), ranges.end());
    if (negate) {
      std::vector<std::pair<uint32_t, uint32_t>> comp;
      uint32_t next = 0;
      for (auto [lo, hi] : ranges) {
        if (lo > next) comp.push_back({next, lo - 1});
        next = std::max(next, hi + 1);
      }
      if (next <= 0x10FFFF) comp.push_back({next, 0x10FFFF});
      ranges = std::move(comp);
    }
    std::vector<std::vector<std::pair<uint8_t, uint8_t>>> seqs;
    for (auto [lo, hi] : ranges) Utf8Sequences(lo, hi, &seqs);
    if (seqs.empty()) return Fail("empty character class");
    ByteSet ascii;
    bool any_ascii = false;
    std::vector<Grammar::Seq> multi;
    for (const auto& sq : seqs) {
      if (sq.size() == 1) {
        ascii.AddRange(sq[0].first, sq[0].second);
        any_ascii = true;
        continue;
      }
      Grammar::Seq alt;
      for (auto [a, z] : sq) {
        ByteSet bs;
        bs.AddRange(a, z);
        alt.push_back({Element::kBytes, b_->Set(bs)});
      }
      multi.push_back(std::move(alt));
    }
    if (multi.empty()) {
      *item = {Element::kBytes, b_->Set(ascii)};
      return Status::Ok();
    }
    const int32_t r = b_->NewRule("class");
    if (any_ascii) MNEMO_TRY(b_->AddAlt(r, {{Element::kBytes, b_->Set(ascii)}}));
    for (auto& alt : multi) MNEMO_TRY(b_->AddAlt(r, std::move(alt)));
    *item = {Element::kRule, r};
    return Status::Ok();
  }

  std::string_view s_;
  Builder* b_;
  size_t pos_ = 0;
  int line_ = 1;
};

}  // namespace

Result<Grammar> Grammar::Parse(std::string_view text, std::string_view root) {
  Builder b;
  Parser p(text, &b);
  MNEMO_TRY(p.Run());
  return b.Finish(root);
}

}  // namespace mnemo::grammar
