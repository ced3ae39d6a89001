// Byte-level BPE against llama.cpp's gpt-2 vectors (50,257 tokens, 50,000 merges), and vocab errors.
#include <gtest/gtest.h>


#include "base/rng.h"
#include "format/gguf.h"
#include "format/gguf_vocab.h"
#include "test_util.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/unicode.h"

namespace mnemo {
namespace {

const std::string kGpt2 = "ggml-vocab-gpt-2.gguf";

class BpeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto file = gguf::GgufFile::Open(test::kVocabDir + kGpt2);
    ASSERT_TRUE(file.ok()) << file.error().message;
    auto vocab = gguf::ReadVocab(*file);
    ASSERT_TRUE(vocab.ok()) << vocab.error().message;
    vocab_ = new Vocab(std::move(*vocab));
    auto tok = Tokenizer::Create(*vocab_);
    ASSERT_TRUE(tok.ok()) << tok.error().message;
    tok_ = tok->release();
  }
  static void TearDownTestSuite() {
    delete tok_;
    delete vocab_;
  }
  static Vocab* vocab_;
  static Tokenizer* tok_;
};
Vocab* BpeTest::vocab_ = nullptr;
Tokenizer* BpeTest::tok_ = nullptr;

TEST_F(BpeTest, MatchesAllLlamaCppVectors) {
  ASSERT_NE(tok_, nullptr);
  const auto vectors = test::ReadVocabVectors(kGpt2);
  ASSERT_EQ(vectors.size(), 46u);
  int n_ok = 0;
  for (const auto& v : vectors) {
    const auto ids = tok_->Encode(v.text, /*add_special=*/false);
    EXPECT_EQ(ids, v.ids) << "text: '" << v.text << "'";
    n_ok += ids == v.ids;
  }
  EXPECT_EQ(n_ok, 46);
}

TEST_F(BpeTest, DecodeUndoesEncodeForAllVectors) {
  ASSERT_NE(tok_, nullptr);
  for (const auto& v : test::ReadVocabVectors(kGpt2)) {
    EXPECT_EQ(tok_->Decode(v.ids), v.text);  // no dummy prefix in byte-level BPE
    EXPECT_EQ(tok_->Decode(tok_->Encode(v.text, true)), v.text);
  }
}

TEST_F(BpeTest, VocabFacts) {
  ASSERT_NE(tok_, nullptr);
  EXPECT_EQ(tok_->model(), "gpt2");
  EXPECT_EQ(tok_->n_vocab(), 50257);
  EXPECT_EQ(tok_->eos(), 50256);
  EXPECT_TRUE(tok_->IsControl(50256));
  EXPECT_TRUE(tok_->IsEog(50256));
  EXPECT_EQ(tok_->TokenId("\xC4\xA0" "Hello"), 18435);  // "ĠHello"
  EXPECT_EQ(tok_->TokenToPiece(18435), " Hello");
  EXPECT_EQ(tok_->TokenToPiece(198), "\n");            // "Ċ"
  EXPECT_EQ(tok_->TokenToPiece(50256), "");
  EXPECT_EQ(tok_->TokenToPiece(50256, true), "<|endoftext|>");
}

TEST_F(BpeTest, ParseSpecial) {
  ASSERT_NE(tok_, nullptr);
  const auto with = tok_->Encode("Hi<|endoftext|>Hi", false, /*parse_special=*/true);
  ASSERT_EQ(with.size(), 3u);
  EXPECT_EQ(with[1], 50256);
  EXPECT_EQ(with[0], with[2]);
  const auto without = tok_->Encode("Hi<|endoftext|>Hi", false, false);
  EXPECT_EQ(std::count(without.begin(), without.end(), 50256), 0);
  EXPECT_EQ(tok_->Decode(without), "Hi<|endoftext|>Hi");
  EXPECT_EQ(tok_->Decode(with), "HiHi");
  EXPECT_EQ(tok_->Decode(with, /*skip_special=*/false), "Hi<|endoftext|>Hi");
}

TEST_F(BpeTest, InvalidUtf8BecomesReplacementChar) {
  ASSERT_NE(tok_, nullptr);
  EXPECT_EQ(tok_->Encode("a\xFF" "b", false), tok_->Encode("a\xEF\xBF\xBD" "b", false));
  EXPECT_EQ(tok_->Decode(tok_->Encode("x\xC3", false)), "x\xEF\xBF\xBD");
}

TEST_F(BpeTest, RandomBytesNeverCrash) {
  ASSERT_NE(tok_, nullptr);
  static const char kAlphabet[] = "ab 3'\n\t\xC3\xA9\xE2\x82\xAC\xF0\x9F\x99\x82\xFF\x80";
  Rng rng(11);
  for (int trial = 0; trial < 500; ++trial) {
    std::string text(rng.Next() % 48, '\0');
    for (char& c : text) c = kAlphabet[rng.Next() % (sizeof(kAlphabet) - 1)];
    const auto ids = tok_->Encode(text, false);
    // Invalid bytes became U+FFFD; everything else survives byte for byte.
    std::string expected;
    for (uint32_t cp : DecodeUtf8Lenient(text)) AppendUtf8(cp, &expected);
    EXPECT_EQ(tok_->Decode(ids), expected);
  }
}

// The priority-queue merge equals textbook BPE (repeated lowest-rank scans) on random text.
TEST_F(BpeTest, MatchesNaiveReferenceOnRandomText) {
  ASSERT_NE(tok_, nullptr);
  std::map<std::string, int> ranks;
  for (size_t i = 0; i < vocab_->merges.size(); ++i) ranks.emplace(vocab_->merges[i], static_cast<int>(i));
  std::string byte_char[256];  // GPT-2 byte alphabet, rebuilt here from its definition
  for (int b = 0, extra = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    const uint32_t cp = printable ? b : 256 + extra++;
    byte_char[b] = cp < 0x80 ? std::string(1, static_cast<char>(cp))
                             : std::string{static_cast<char>(0xC0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3F))};
  }
  const auto strings = test::ReadVocabStrings(kGpt2);
  Rng rng(99);
  for (int trial = 0; trial < 100; ++trial) {
    std::string text;
    const int parts = 1 + static_cast<int>(rng.Next() % 3);
    for (int p = 0; p < parts; ++p) text += strings[rng.Next() % strings.size()];
    std::vector<int32_t> expected;
    for (const std::string& word : PreTokenize(PreTokenizer::kGpt2, text)) {
      std::string mapped;
      for (char c : word) mapped += byte_char[static_cast<uint8_t>(c)];
      for (const std::string& sym : test::NaiveBpeWord(ranks, mapped)) expected.push_back(tok_->TokenId(sym));
    }
    EXPECT_EQ(tok_->Encode(text, false), expected) << "text: '" << text << "'";
  }
}

// Encoding is linear in the input (see SpmTest.LongInputIsLinear).
TEST_F(BpeTest, LongInputIsLinear) {
  ASSERT_NE(tok_, nullptr);
  const auto strings = test::ReadVocabStrings(kGpt2);
  auto mixed = [&](size_t n) {
    std::string text;
    for (size_t i = 0; text.size() < n; ++i) text += strings[i % strings.size()] + " ";
    return text;
  };
  for (const auto& [small, large] : {std::pair{mixed(10000), mixed(100000)},
                                     std::pair{std::string(10000, 'a'), std::string(100000, 'a')},
                                     std::pair{std::string(10000, '\n'), std::string(100000, '\n')}}) {
    const double ratio = test::EncodeCostRatio(*tok_, small, large, false);
    EXPECT_LT(ratio, 30.0) << "10x the input cost " << ratio << "x the time";
    EXPECT_EQ(tok_->Decode(tok_->Encode(large, false)), large);
  }
}

// --- Vocab validation (model-free) ---

Vocab TinySpm() {
  Vocab v;
  v.model = "llama";
  v.tokens = {"<unk>", "<s>", "</s>", "\xE2\x96\x81", "a", "\xE2\x96\x81" "a"};
  v.scores = {0, 0, 0, -1, -2, -3};
  v.types = {2, 3, 3, 1, 1, 1};
  v.unk = 0;
  v.bos = 1;
  v.eos = 2;
  return v;
}

TEST(TokenizerCreate, TinyVocabWorksAndDropsBytesWithoutFallback) {
  auto tok = Tokenizer::Create(TinySpm());
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  EXPECT_EQ((*tok)->Encode("a a", true), (std::vector<int32_t>{1, 5, 5}));
  // "b" is neither a token nor byte-fallback-able: it maps to <unk>, as llama.cpp's byte_to_token.
  EXPECT_EQ((*tok)->Encode("b", false), (std::vector<int32_t>{3, 0}));
}

void ExpectError(const Vocab& v, const std::string& needle) {
  auto tok = Tokenizer::Create(v);
  ASSERT_FALSE(tok.ok()) << "expected an error mentioning '" << needle << "'";
  EXPECT_NE(tok.error().message.find(needle), std::string::npos) << tok.error().message;
}

TEST(TokenizerCreate, RejectsBadVocabs) {
  Vocab v = TinySpm();
  v.model = "bert";
  ExpectError(v, "bert");
  v = TinySpm();
  v.tokens.clear();
  ExpectError(v, "no tokens");
  v = TinySpm();
  v.scores.pop_back();
  ExpectError(v, "scores");
  v = TinySpm();
  v.types.push_back(1);
  ExpectError(v, "types");
  v = TinySpm();
  v.types[4] = 9;
  ExpectError(v, "token type 9");
  v = TinySpm();
  v.bos = 6;
  ExpectError(v, "BOS");
  v = TinySpm();
  v.bos = -1;
  ExpectError(v, "no BOS");
  Vocab b;
  b.model = "gpt2";
  b.pre = "gpt-2";
  b.add_bos = false;
  b.tokens = {"a", "b", "ab"};
  b.merges = {"a b"};
  EXPECT_TRUE(Tokenizer::Create(b).ok());
  b.merges = {"ab"};
  ExpectError(b, "merge 0");
  b.merges = {"a b"};
  b.pre = "unknown-pre";
  ExpectError(b, "unknown-pre");
}

}  // namespace
}  // namespace mnemo
