#include "tokenizer/pretokenize.h"

#include <cstdint>

#include "tokenizer/unicode.h"

namespace mnemo {
namespace {

enum : uint8_t { kL = 1, kN = 2, kWs = 4 };

// Code points of the text with their classes; out-of-range positions read as "nothing".
struct CodepointText {
  std::vector<uint32_t> cps;   // [n]
  std::vector<uint8_t> flags;  // [n] kL | kN | kWs
  size_t n = 0;

  explicit CodepointText(std::string_view text) : cps(DecodeUtf8Lenient(text)), n(cps.size()) {
    flags.resize(n);
    for (size_t i = 0; i < n; ++i) {
      const uint32_t c = cps[i];
      const UnicodeClass k = GetUnicodeClass(c);
      flags[i] = static_cast<uint8_t>((k == UnicodeClass::kLetter ? kL : 0) |
                                      (k == UnicodeClass::kNumber ? kN : 0) | (IsWhiteSpace(c) ? kWs : 0));
    }
  }
  uint32_t At(size_t i) const { return i < n ? cps[i] : 0; }
  bool L(size_t i) const { return i < n && (flags[i] & kL); }
  bool N(size_t i) const { return i < n && (flags[i] & kN); }
  bool Ws(size_t i) const { return i < n && (flags[i] & kWs); }
  // [^\s\p{L}\p{N}]
  bool Other(size_t i) const { return i < n && !(flags[i] & (kL | kN | kWs)); }
  bool Newline(size_t i) const { return i < n && (cps[i] == '\r' || cps[i] == '\n'); }

  // End of the run starting at i of positions satisfying pred.
  template <class Pred>
  size_t Run(size_t i, Pred pred) const {
    while (pred(i)) ++i;
    return i;
  }
  size_t RunL(size_t i) const { return Run(i, [&](size_t k) { return L(k); }); }
  size_t RunN(size_t i) const { return Run(i, [&](size_t k) { return N(k); }); }
  size_t RunWs(size_t i) const { return Run(i, [&](size_t k) { return Ws(k); }); }
  size_t RunOther(size_t i) const { return Run(i, [&](size_t k) { return Other(k); }); }
  size_t RunNewline(size_t i) const { return Run(i, [&](size_t k) { return Newline(k); }); }
};

// Length of 's|'t|'re|'ve|'m|'ll|'d at i (ASCII case-insensitive if asked), or 0.
size_t MatchContraction(const CodepointText& t, size_t i, bool ignore_case) {
  if (t.At(i) != '\'') return 0;
  const auto lower = [&](size_t k) {
    uint32_t c = t.At(k);
    if (ignore_case && c >= 'A' && c <= 'Z') c += 'a' - 'A';
    return c;
  };
  const uint32_t c1 = lower(i + 1);
  if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
  const uint32_t c2 = lower(i + 2);
  if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return 3;
  return 0;
}

// \s+(?!\S)|\s+ at i, where t.Ws(i): a whitespace run keeps its last character for the next word
// (" Hello" stays together) unless the run ends the text or is a single character.
size_t MatchTrailingSpace(const CodepointText& t, size_t i) {
  const size_t e = t.RunWs(i);
  if (e == t.n || e - i == 1) return e - i;
  return e - 1 - i;
}

// GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
size_t MatchGpt2(const CodepointText& t, size_t i) {
  if (size_t len = MatchContraction(t, i, /*ignore_case=*/false)) return len;
  // The optional space only helps when what follows it matches; without it, position i (a space)
  // cannot start \p{L}, \p{N} or [^\s...], so trying "with space" first is the whole backtracking.
  const size_t j = t.At(i) == ' ' ? i + 1 : i;
  if (t.L(j)) return t.RunL(j) - i;
  if (t.N(j)) return t.RunN(j) - i;
  if (t.Other(j)) return t.RunOther(j) - i;
  if (t.Ws(i)) return MatchTrailingSpace(t, i);
  return 1;  // unreachable: every code point is L, N, whitespace or other
}

// Llama 3 / Qwen2:
// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max_digits}|
//  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
size_t MatchLlama3(const CodepointText& t, size_t i, size_t max_digits) {
  if (size_t len = MatchContraction(t, i, /*ignore_case=*/true)) return len;
  if (t.L(i)) return t.RunL(i) - i;
  if (!t.Newline(i) && !t.N(i) && t.L(i + 1)) return t.RunL(i + 1) - i;  // one prefix char + letters
  if (t.N(i)) {
    size_t e = i + 1;
    while (e - i < max_digits && t.N(e)) ++e;
    return e - i;
  }
  const size_t j = t.At(i) == ' ' && t.Other(i + 1) ? i + 1 : i;
  if (t.Other(j)) return t.RunNewline(t.RunOther(j)) - i;
  if (t.Ws(i)) {
    // \s*[\r\n]+ backtracks to the last newline of the whitespace run.
    const size_t e = t.RunWs(i);
    size_t end_nl = 0;
    for (size_t k = i; k < e; ++k) {
      if (t.Newline(k)) end_nl = k + 1;
    }
    if (end_nl != 0) return end_nl - i;
    return MatchTrailingSpace(t, i);
  }
  return 1;  // unreachable
}

}  // namespace

Result<PreTokenizer> PreTokenizerFromName(std::string_view name) {
  if (name == "default" || name == "gpt-2" || name.empty()) return PreTokenizer::kGpt2;
  if (name == "llama-bpe" || name == "llama3" || name == "llama-v3") return PreTokenizer::kLlama3;
  if (name == "qwen2" || name == "deepseek-r1-qwen") return PreTokenizer::kQwen2;
  return MakeError("unsupported BPE pre-tokenizer '%.*s' (supported: default, gpt-2, llama-bpe, llama3, "
                   "llama-v3, qwen2, deepseek-r1-qwen)",
                   static_cast<int>(name.size()), name.data());
}

std::vector<std::string> PreTokenize(PreTokenizer kind, std::string_view text) {
  const CodepointText t(text);
  std::vector<std::string> words;
  size_t i = 0;
  while (i < t.n) {
    size_t len = 0;
    switch (kind) {
      case PreTokenizer::kGpt2:
        len = MatchGpt2(t, i);
        break;
      case PreTokenizer::kLlama3:
        len = MatchLlama3(t, i, 3);
        break;
      case PreTokenizer::kQwen2:
        len = MatchLlama3(t, i, 1);
        break;
    }
    std::string word;
    for (size_t k = i; k < i + len; ++k) AppendUtf8(t.cps[k], &word);
    words.push_back(std::move(word));
    i += len;
  }
  return words;
}

}  // namespace mnemo
