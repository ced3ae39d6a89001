// Unicode tables, UTF-8 helpers and the BPE pre-tokenizers (model-free).
#include <gtest/gtest.h>

#include <numeric>

#include "test_util.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/unicode.h"

namespace mnemo {
namespace {

using Words = std::vector<std::string>;

TEST(UnicodeTables, RangesAreSortedAndDisjoint) {
  for (int i = 0; i < unicode_data::kNumClassRanges; ++i) {
    const ClassRange& r = unicode_data::kClassRanges[i];
    ASSERT_LE(r.first, r.last);
    ASSERT_LE(r.last, 0x10FFFFu);
    ASSERT_NE(r.klass, UnicodeClass::kOther);
    if (i > 0) {
      ASSERT_LT(unicode_data::kClassRanges[i - 1].last, r.first) << i;
    }
  }
  // Compact: ranges, not one entry per code point.
  EXPECT_LT(unicode_data::kNumClassRanges, 4000);
}

TEST(UnicodeTables, MajorCategories) {
  EXPECT_EQ(GetUnicodeClass('a'), UnicodeClass::kLetter);
  EXPECT_EQ(GetUnicodeClass(0xC9), UnicodeClass::kLetter);     // É
  EXPECT_EQ(GetUnicodeClass(0x4E2D), UnicodeClass::kLetter);   // 中
  EXPECT_EQ(GetUnicodeClass(0x1780), UnicodeClass::kLetter);   // Khmer KA
  EXPECT_EQ(GetUnicodeClass(0x17B6), UnicodeClass::kMark);     // Khmer vowel sign AA (Mc)
  EXPECT_EQ(GetUnicodeClass(0x0301), UnicodeClass::kMark);     // combining acute
  EXPECT_EQ(GetUnicodeClass('7'), UnicodeClass::kNumber);
  EXPECT_EQ(GetUnicodeClass(0x0663), UnicodeClass::kNumber);   // Arabic-Indic three (Nd)
  EXPECT_EQ(GetUnicodeClass(0x216B), UnicodeClass::kNumber);   // Roman numeral twelve (Nl)
  EXPECT_EQ(GetUnicodeClass(0xBD), UnicodeClass::kNumber);     // ½ (No)
  EXPECT_EQ(GetUnicodeClass('!'), UnicodeClass::kPunctuation);
  EXPECT_EQ(GetUnicodeClass(0x3002), UnicodeClass::kPunctuation);  // 。
  EXPECT_EQ(GetUnicodeClass('$'), UnicodeClass::kSymbol);
  EXPECT_EQ(GetUnicodeClass(0x1F642), UnicodeClass::kSymbol);  // 🙂
  EXPECT_EQ(GetUnicodeClass(' '), UnicodeClass::kSeparator);
  EXPECT_EQ(GetUnicodeClass(0x3000), UnicodeClass::kSeparator);
  EXPECT_EQ(GetUnicodeClass('\n'), UnicodeClass::kOther);
  EXPECT_EQ(GetUnicodeClass(0x200D), UnicodeClass::kOther);    // ZWJ (Cf)
  EXPECT_EQ(GetUnicodeClass(0x0378), UnicodeClass::kOther);    // unassigned
  EXPECT_EQ(GetUnicodeClass(0xE000), UnicodeClass::kOther);    // private use
  EXPECT_EQ(GetUnicodeClass(0x10FFFF), UnicodeClass::kOther);
  // The ASCII fast path agrees with the table for every ASCII code point.
  for (uint32_t c = 0; c < 0x80; ++c) {
    const bool letter = (c | 0x20) >= 'a' && (c | 0x20) <= 'z';
    const bool digit = c >= '0' && c <= '9';
    EXPECT_EQ(IsLetter(c), letter) << c;
    EXPECT_EQ(IsNumber(c), digit) << c;
  }
}

TEST(UnicodeTables, WhiteSpace) {
  for (uint32_t c : {0x09u, 0x0Au, 0x0Bu, 0x0Cu, 0x0Du, 0x20u, 0x85u, 0xA0u, 0x1680u, 0x2000u, 0x200Au,
                     0x2028u, 0x2029u, 0x202Fu, 0x205Fu, 0x3000u}) {
    EXPECT_TRUE(IsWhiteSpace(c)) << std::hex << c;
  }
  for (uint32_t c : {0x08u, 0x0Eu, 0x1Cu, 0x41u, 0x200Bu, 0x200Du, 0xFEFFu, 0x2581u}) {
    EXPECT_FALSE(IsWhiteSpace(c)) << std::hex << c;
  }
}

TEST(Utf8, DecodeLenientReplacesInvalidBytesOneByOne) {
  EXPECT_EQ(DecodeUtf8Lenient("a\xC3\xA9\xF0\x9F\x99\x82"), (std::vector<uint32_t>{'a', 0xE9, 0x1F642}));
  EXPECT_EQ(DecodeUtf8Lenient("a\xFF" "b"), (std::vector<uint32_t>{'a', 0xFFFD, 'b'}));
  EXPECT_EQ(DecodeUtf8Lenient("\xE2\x82"), (std::vector<uint32_t>{0xFFFD, 0xFFFD}));
  EXPECT_EQ(DecodeUtf8Lenient("\x80\x80" "c"), (std::vector<uint32_t>{0xFFFD, 0xFFFD, 'c'}));
  EXPECT_TRUE(DecodeUtf8Lenient("").empty());
}

TEST(Utf8, AppendRoundTrips) {
  for (uint32_t cp : {0x0u, 0x41u, 0x7Fu, 0x80u, 0x7FFu, 0x800u, 0xFFFFu, 0x10000u, 0x10FFFFu}) {
    std::string s;
    AppendUtf8(cp, &s);
    size_t pos = 0;
    uint32_t back = 0;
    ASSERT_TRUE(DecodeUtf8(s, &pos, &back));
    EXPECT_EQ(back, cp);
    EXPECT_EQ(pos, s.size());
    EXPECT_EQ(Utf8Check(s), static_cast<int>(s.size()));
  }
}

TEST(Utf8, CheckFindsCompleteIncompleteAndInvalid) {
  EXPECT_EQ(Utf8Check("a"), 1);
  EXPECT_EQ(Utf8Check("\xC3\xA9x"), 2);
  EXPECT_EQ(Utf8Check("\xF0\x9F\x99\x82"), 4);
  EXPECT_EQ(Utf8Check("\xC3"), 0);
  EXPECT_EQ(Utf8Check("\xF0\x9F\x99"), 0);
  EXPECT_EQ(Utf8Check("\xC3" "A"), -1);
  EXPECT_EQ(Utf8Check("\xE2\x82" "A"), -2);
  EXPECT_EQ(Utf8Check("\xF0\x9F\x99" "A"), -3);
  EXPECT_EQ(Utf8Check("\x80"), -1);
  EXPECT_EQ(Utf8Check("\xC0\x80"), -1);      // overlong
  EXPECT_EQ(Utf8Check("\xE0\x80\x80"), -1);  // overlong
  EXPECT_EQ(Utf8Check("\xED\xA0\x80"), -1);  // surrogate
  EXPECT_EQ(Utf8Check("\xF4\x90\x80\x80"), -1);  // above U+10FFFF
  EXPECT_EQ(Utf8Check("\xFF"), -1);
}

Words Split(PreTokenizer kind, std::string_view text) { return PreTokenize(kind, text); }

TEST(PreTokenize, Gpt2HandSplits) {
  const auto k = PreTokenizer::kGpt2;
  EXPECT_EQ(Split(k, "Hello world"), (Words{"Hello", " world"}));
  EXPECT_EQ(Split(k, "  Hello"), (Words{" ", " Hello"}));
  EXPECT_EQ(Split(k, "   "), (Words{"   "}));
  EXPECT_EQ(Split(k, "x \ty"), (Words{"x", " ", "\t", "y"}));
  EXPECT_EQ(Split(k, "I've been 'told"), (Words{"I", "'ve", " been", " '", "told"}));
  EXPECT_EQ(Split(k, "I'VE"), (Words{"I", "'", "VE"}));  // case-sensitive contractions
  EXPECT_EQ(Split(k, "Hello, y'all!"), (Words{"Hello", ",", " y", "'", "all", "!"}));
  EXPECT_EQ(Split(k, "3333 3.3"), (Words{"3333", " 3", ".", "3"}));
  EXPECT_EQ(Split(k, "\n ="), (Words{"\n", " ="}));
  EXPECT_EQ(Split(k, "a\n\n b"), (Words{"a", "\n\n", " b"}));
  EXPECT_EQ(Split(k, "naïve café"), (Words{"naïve", " café"}));
  EXPECT_TRUE(Split(k, "").empty());
}

TEST(PreTokenize, Llama3HandSplits) {
  const auto k = PreTokenizer::kLlama3;
  EXPECT_EQ(Split(k, "333333333"), (Words{"333", "333", "333"}));
  EXPECT_EQ(Split(k, "33333"), (Words{"333", "33"}));
  EXPECT_EQ(Split(k, "Hello, y'all!"), (Words{"Hello", ",", " y", "'all", "!"}));
  EXPECT_EQ(Split(k, "I'VE 'll"), (Words{"I", "'VE", " '", "ll"}));  // case-insensitive contractions
  EXPECT_EQ(Split(k, "Hello\n\nWorld"), (Words{"Hello", "\n\n", "World"}));
  EXPECT_EQ(Split(k, " \n  x"), (Words{" \n", " ", " x"}));
  EXPECT_EQ(Split(k, "(x) ..\n\ny"), (Words{"(x", ")", " ..\n\n", "y"}));
  EXPECT_EQ(Split(k, "\tword"), (Words{"\tword"}));  // any non-letter/number/newline may lead a word
  EXPECT_EQ(Split(k, "\nword"), (Words{"\n", "word"}));
  EXPECT_EQ(Split(k, "   "), (Words{"   "}));
}

TEST(PreTokenize, Qwen2SplitsDigitsSingly) {
  const auto k = PreTokenizer::kQwen2;
  EXPECT_EQ(Split(k, "333 12"), (Words{"3", "3", "3", " ", "1", "2"}));
  EXPECT_EQ(Split(k, "Hello, y'all!"), (Words{"Hello", ",", " y", "'all", "!"}));
}

TEST(PreTokenize, InvalidUtf8BecomesReplacementChar) {
  EXPECT_EQ(Split(PreTokenizer::kGpt2, "a\xFF" "b"), (Words{"a", "\xEF\xBF\xBD", "b"}));
}

TEST(PreTokenize, NamesMapToKinds) {
  EXPECT_EQ(*PreTokenizerFromName("gpt-2"), PreTokenizer::kGpt2);
  EXPECT_EQ(*PreTokenizerFromName("default"), PreTokenizer::kGpt2);
  EXPECT_EQ(*PreTokenizerFromName("llama-bpe"), PreTokenizer::kLlama3);
  EXPECT_EQ(*PreTokenizerFromName("qwen2"), PreTokenizer::kQwen2);
  const auto bad = PreTokenizerFromName("tekken");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("tekken"), std::string::npos);
}

// Over the llama.cpp test strings: words concatenate back to the input, and no pre-tokenizer makes
// more words than the reference has tokens (tokens never cross word boundaries). For Llama 3 and
// Qwen2, every 1-3 digit number is a single token, so on the digit-only strings the counts must be
// equal (GPT-2 lacks long digit tokens).
void CheckAgainstReference(PreTokenizer kind, const std::string& name, int* n_equal) {
  const auto vectors = test::ReadVocabVectors(name);
  ASSERT_EQ(vectors.size(), 46u) << name;
  *n_equal = 0;
  for (const auto& v : vectors) {
    const Words words = Split(kind, v.text);
    EXPECT_EQ(std::accumulate(words.begin(), words.end(), std::string()), v.text);
    EXPECT_LE(words.size(), v.ids.size()) << name << " on '" << v.text << "'";
    if (kind != PreTokenizer::kGpt2 && !v.text.empty() && v.text.find_first_not_of('3') == std::string::npos) {
      EXPECT_EQ(words.size(), v.ids.size()) << name << " on '" << v.text << "'";
    }
    *n_equal += words.size() == v.ids.size();
  }
}

TEST(PreTokenize, Gpt2ConsistentWithReference) {
  int n_equal = 0;
  CheckAgainstReference(PreTokenizer::kGpt2, "ggml-vocab-gpt-2.gguf", &n_equal);
  RecordProperty("strings_with_one_token_per_word", n_equal);
}

TEST(PreTokenize, Llama3ConsistentWithReference) {
  int n_equal = 0;
  CheckAgainstReference(PreTokenizer::kLlama3, "ggml-vocab-llama-bpe.gguf", &n_equal);
  RecordProperty("strings_with_one_token_per_word", n_equal);
}

TEST(PreTokenize, Qwen2ConsistentWithReference) {
  int n_equal = 0;
  CheckAgainstReference(PreTokenizer::kQwen2, "ggml-vocab-qwen2.gguf", &n_equal);
  RecordProperty("strings_with_one_token_per_word", n_equal);
}

}  // namespace
}  // namespace mnemo
