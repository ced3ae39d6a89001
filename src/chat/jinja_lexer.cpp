// Lexer: template text and tags, whitespace control, expression tokens.
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "chat/jinja_internal.h"

namespace mnemo::jinja::internal {

void Fail(size_t pos, std::string message) { throw JinjaError{std::move(message), pos}; }
void Fail(std::string message) { throw JinjaError{std::move(message), kNoPos}; }

std::string Where(std::string_view source, size_t pos) {
  if (pos == kNoPos || pos > source.size()) return "unknown position";
  size_t line = 1;
  size_t line_start = 0;
  for (size_t i = 0; i < pos; ++i) {
    if (source[i] == '\n') {
      ++line;
      line_start = i + 1;
    }
  }
  return "line " + std::to_string(line) + ", column " + std::to_string(pos - line_start + 1);
}

namespace {

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool IsNameChar(char c) { return IsNameStart(c) || IsDigit(c); }

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) cp = 0xFFFD;
  if (cp < 0x80) {
    *out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    *out += static_cast<char>(0xC0 | (cp >> 6));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    *out += static_cast<char>(0xE0 | (cp >> 12));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    *out += static_cast<char>(0xF0 | (cp >> 18));
    *out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

class Lexer {
 public:
  explicit Lexer(std::string_view src) : src_(src) {}

  std::vector<Token> Run() {
    std::string text;       // text since the last tag
    size_t text_pos = 0;    // where it starts
    bool strip_next = false;  // previous tag ended with '-': drop leading whitespace of the text
    while (i_ < src_.size()) {
      const size_t open = FindOpen(i_);
      text.append(src_.substr(i_, open - i_));
      i_ = open;
      if (strip_next) {
        size_t k = 0;
        while (k < text.size() && IsSpace(text[k])) ++k;
        if (k > 0) line_start_ = text[k - 1] == '\n';
        text.erase(0, k);
        text_pos += k;
        strip_next = false;
      }
      if (open == src_.size()) break;
      const char kind = src_[open + 1];  // '{', '%' or '#'
      const char mod = open + 2 < src_.size() ? src_[open + 2] : '\0';
      if (mod == '-') {
        while (!text.empty() && IsSpace(text.back())) text.pop_back();
      } else if (kind != '{' && mod != '+') {
        LStripBlock(&text);
      }
      if (!text.empty()) out_.push_back(Token{Tok::kText, text_pos, text});
      text.clear();
      i_ = open + 2 + ((mod == '-' || (mod == '+' && kind != '{')) ? 1 : 0);

      bool strip_after = false;
      if (kind == '#') {
        strip_after = Comment(open);
      } else {
        const size_t first_token = out_.size();
        strip_after = Tag(open, kind == '{');
        if (kind == '%' && out_.size() == first_token + 3 && out_[first_token + 1].kind == Tok::kName &&
            out_[first_token + 1].text == "raw") {
          out_.resize(first_token);
          strip_after = Raw(open, strip_after);
        }
      }
      strip_next = strip_after;
      text_pos = i_;
    }
    if (!text.empty()) out_.push_back(Token{Tok::kText, text_pos, text});
    out_.push_back(Token{Tok::kEnd, src_.size(), ""});
    return std::move(out_);
  }

 private:
  size_t FindOpen(size_t from) const {
    for (size_t k = from; k + 1 < src_.size(); ++k) {
      if (src_[k] == '{' && (src_[k + 1] == '{' || src_[k + 1] == '%' || src_[k + 1] == '#')) return k;
    }
    return src_.size();
  }

  // lstrip_blocks: spaces and tabs between the start of a line and a block tag go away.
  void LStripBlock(std::string* text) const {
    const size_t nl = text->rfind('\n');
    const size_t line = nl == std::string::npos ? 0 : nl + 1;
    if (line == 0 && !line_start_) return;
    for (size_t k = line; k < text->size(); ++k) {
      if ((*text)[k] != ' ' && (*text)[k] != '\t') return;
    }
    text->resize(line);
  }

  // After a block or comment end: trim_blocks drops one newline, unless the tag ended with '+'.
  // Returns true when the tag ended with '-' (strip the following whitespace).
  bool AfterBlockEnd(char mod) {
    line_start_ = false;
    if (mod == '-') return true;
    if (mod != '+' && i_ < src_.size() && src_[i_] == '\n') {
      ++i_;
      line_start_ = true;
    }
    return false;
  }

  bool Comment(size_t open) {
    const size_t close = src_.find("#}", i_);
    if (close == std::string_view::npos) Fail(open, "unterminated comment");
    const char mod = close > i_ && (src_[close - 1] == '-' || src_[close - 1] == '+') ? src_[close - 1] : '\0';
    i_ = close + 2;
    return AfterBlockEnd(mod);
  }

  // Lexes the expression tokens of a {{ }} or {% %} tag. Returns true when it ended with '-'.
  bool Tag(size_t open, bool is_var) {
    out_.push_back(Token{is_var ? Tok::kVarBegin : Tok::kBlockBegin, open, ""});
    int depth = 0;  // open ( [ {
    while (true) {
      while (i_ < src_.size() && IsSpace(src_[i_])) ++i_;
      if (i_ >= src_.size()) Fail(open, is_var ? "unterminated '{{'" : "unterminated '{%'");
      const char c = src_[i_];
      if (depth == 0) {
        const char* close = is_var ? "}}" : "%}";
        char mod = '\0';
        size_t k = i_;
        if ((c == '-' || (c == '+' && !is_var)) && src_.compare(i_ + 1, 2, close) == 0) {
          mod = c;
          ++k;
        }
        if (src_.compare(k, 2, close) == 0) {
          out_.push_back(Token{is_var ? Tok::kVarEnd : Tok::kBlockEnd, i_, ""});
          i_ = k + 2;
          if (is_var) {
            line_start_ = false;
            return mod == '-';
          }
          return AfterBlockEnd(mod);
        }
      }
      const size_t start = i_;
      if (IsNameStart(c)) {
        while (i_ < src_.size() && IsNameChar(src_[i_])) ++i_;
        out_.push_back(Token{Tok::kName, start, std::string(src_.substr(start, i_ - start))});
      } else if (IsDigit(c)) {
        Number();
      } else if (c == '\'' || c == '"') {
        out_.push_back(Token{Tok::kString, start, String()});
      } else {
        static const char* const kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~",
                                           "<",  ">",  "=",  "(",  ")",  "[",  "]", "{", "}", ",", ".", ":", "|"};
        const char* op = nullptr;
        for (const char* o : kOps) {
          if (src_.compare(i_, std::strlen(o), o) == 0) {
            op = o;
            break;
          }
        }
        if (op == nullptr) Fail(i_, std::string("unexpected character '") + c + "' in tag");
        if (op[0] == '(' || op[0] == '[' || op[0] == '{') ++depth;
        if ((op[0] == ')' || op[0] == ']' || op[0] == '}') && depth > 0) --depth;
        i_ += std::strlen(op);
        out_.push_back(Token{Tok::kOp, start, op});
      }
    }
  }

  void Number() {
    const size_t start = i_;
    std::string digits;
    auto take_digits = [&]() {
      while (i_ < src_.size() && (IsDigit(src_[i_]) || (src_[i_] == '_' && i_ + 1 < src_.size() && IsDigit(src_[i_ + 1])))) {
        if (src_[i_] != '_') digits += src_[i_];
        ++i_;
      }
    };
    take_digits();
    bool is_float = false;
    if (i_ + 1 < src_.size() && src_[i_] == '.' && IsDigit(src_[i_ + 1])) {
      is_float = true;
      digits += '.';
      ++i_;
      take_digits();
    }
    if (i_ < src_.size() && (src_[i_] == 'e' || src_[i_] == 'E')) {
      size_t k = i_ + 1;
      if (k < src_.size() && (src_[k] == '+' || src_[k] == '-')) ++k;
      if (k < src_.size() && IsDigit(src_[k])) {
        is_float = true;
        digits += 'e';
        digits.append(src_.substr(i_ + 1, k - i_ - 1));
        i_ = k;
        take_digits();
      }
    }
    Token t{is_float ? Tok::kFloat : Tok::kInt, start, digits};
    if (is_float) {
      t.f = std::strtod(digits.c_str(), nullptr);
    } else {
      errno = 0;
      t.i = std::strtoll(digits.c_str(), nullptr, 10);
      if (errno == ERANGE) Fail(start, "integer literal out of range");
    }
    out_.push_back(std::move(t));
  }

  // Python string literal with backslash escapes (unicode-escape semantics).
  std::string String() {
    const size_t start = i_;
    const char quote = src_[i_++];
    std::string s;
    while (true) {
      if (i_ >= src_.size()) Fail(start, "unterminated string literal");
      const char c = src_[i_++];
      if (c == quote) return s;
      if (c != '\\') {
        s += c;
        continue;
      }
      if (i_ >= src_.size()) Fail(start, "unterminated string literal");
      const char e = src_[i_++];
      switch (e) {
        case 'n': s += '\n'; break;
        case 't': s += '\t'; break;
        case 'r': s += '\r'; break;
        case '\\': s += '\\'; break;
        case '\'': s += '\''; break;
        case '"': s += '"'; break;
        case 'a': s += '\a'; break;
        case 'b': s += '\b'; break;
        case 'f': s += '\f'; break;
        case 'v': s += '\v'; break;
        case '\n': break;  // line continuation
        case 'x':
        case 'u':
        case 'U': {
          const int n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          uint32_t cp = 0;
          for (int k = 0; k < n; ++k) {
            const int h = i_ < src_.size() ? HexValue(src_[i_]) : -1;
            if (h < 0) Fail(i_ - 2 - k, std::string("bad \\") + e + " escape in string literal");
            cp = cp * 16 + static_cast<uint32_t>(h);
            ++i_;
          }
          AppendUtf8(cp, &s);
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            uint32_t cp = static_cast<uint32_t>(e - '0');
            for (int k = 0; k < 2 && i_ < src_.size() && src_[i_] >= '0' && src_[i_] <= '7'; ++k) {
              cp = cp * 8 + static_cast<uint32_t>(src_[i_++] - '0');
            }
            AppendUtf8(cp, &s);
          } else {
            s += '\\';  // unknown escapes stay as written, as in Python
            s += e;
          }
      }
    }
  }

  // {% raw %}: everything up to {% endraw %} is text.
  bool Raw(size_t open, bool strip_after) {
    size_t k = i_;
    while (true) {
      k = src_.find("{%", k);
      if (k == std::string_view::npos) Fail(open, "unterminated raw block");
      size_t j = k + 2;
      const bool strip_before = j < src_.size() && src_[j] == '-';
      if (j < src_.size() && (src_[j] == '-' || src_[j] == '+')) ++j;
      while (j < src_.size() && IsSpace(src_[j])) ++j;
      if (src_.compare(j, 6, "endraw") != 0) {
        k += 2;
        continue;
      }
      j += 6;
      while (j < src_.size() && IsSpace(src_[j])) ++j;
      char mod = '\0';
      if (j < src_.size() && (src_[j] == '-' || src_[j] == '+')) mod = src_[j++];
      if (src_.compare(j, 2, "%}") != 0) Fail(k, "malformed endraw tag");
      std::string text(src_.substr(i_, k - i_));
      if (strip_after) {
        size_t n = 0;
        while (n < text.size() && IsSpace(text[n])) ++n;
        text.erase(0, n);
      }
      if (strip_before) {
        while (!text.empty() && IsSpace(text.back())) text.pop_back();
      } else if (mod != '+') {
        LStripBlock(&text);
      }
      if (!text.empty()) out_.push_back(Token{Tok::kText, i_, text});
      i_ = j + 2;
      return AfterBlockEnd(mod);
    }
  }

  std::string_view src_;
  size_t i_ = 0;
  bool line_start_ = true;  // the text being read starts at the beginning of a line
  std::vector<Token> out_;
};

}  // namespace

std::string NormalizeNewlines(std::string_view source) {
  std::string s;
  s.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      s += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      s += source[i];
    }
  }
  if (!s.empty() && s.back() == '\n') s.pop_back();  // Jinja's keep_trailing_newline=False
  return s;
}

std::vector<Token> Lex(std::string_view source) { return Lexer(source).Run(); }

}  // namespace mnemo::jinja::internal
