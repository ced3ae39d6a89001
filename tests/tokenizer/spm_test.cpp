// SentencePiece-style tokenizer against llama.cpp's llama-spm vectors (32,000-token Llama 2 vocab).
#include <gtest/gtest.h>


#include "base/rng.h"
#include "format/gguf.h"
#include "format/gguf_vocab.h"
#include "test_util.h"

namespace mnemo {
namespace {

const std::string kSpm = "ggml-vocab-llama-spm.gguf";

class SpmTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto file = gguf::GgufFile::Open(test::kVocabDir + kSpm);
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
Vocab* SpmTest::vocab_ = nullptr;
Tokenizer* SpmTest::tok_ = nullptr;

TEST_F(SpmTest, MatchesAllLlamaCppVectors) {
  ASSERT_NE(tok_, nullptr);
  const auto vectors = test::ReadVocabVectors(kSpm);
  ASSERT_EQ(vectors.size(), 46u);
  int n_ok = 0;
  for (const auto& v : vectors) {
    const auto ids = tok_->Encode(v.text, /*add_special=*/false);
    EXPECT_EQ(ids, v.ids) << "text: '" << v.text << "'";
    n_ok += ids == v.ids;
  }
  EXPECT_EQ(n_ok, 46);
}

TEST_F(SpmTest, VocabFacts) {
  ASSERT_NE(tok_, nullptr);
  EXPECT_EQ(tok_->n_vocab(), 32000);
  EXPECT_EQ(tok_->bos(), 1);
  EXPECT_EQ(tok_->eos(), 2);
  EXPECT_TRUE(tok_->IsControl(1));
  EXPECT_TRUE(tok_->IsControl(2));
  EXPECT_FALSE(tok_->IsControl(15043));
  EXPECT_TRUE(tok_->IsEog(2));
  EXPECT_FALSE(tok_->IsEog(1));
  EXPECT_TRUE(tok_->IsByte(13));
  EXPECT_EQ(tok_->TokenId("\xE2\x96\x81Hello"), 15043);
  EXPECT_EQ(tok_->TokenId("no-such-token-text"), kNoToken);
  EXPECT_EQ(tok_->TokenText(15043), "\xE2\x96\x81Hello");
  EXPECT_EQ(tok_->TokenToPiece(15043), " Hello");
  EXPECT_EQ(tok_->TokenToPiece(13), "\n");        // <0x0A>
  EXPECT_EQ(tok_->TokenToPiece(29871), " ");      // ▁
  EXPECT_EQ(tok_->TokenToPiece(1), "");           // control
  EXPECT_EQ(tok_->TokenToPiece(1, /*special=*/true), "<s>");
  EXPECT_EQ(tok_->TokenToPiece(0), "");           // unknown
  EXPECT_EQ(tok_->TokenToPiece(-5), "");
  EXPECT_EQ(tok_->TokenToPiece(32000), "");
}

TEST_F(SpmTest, AddSpecialAddsBosOnly) {
  ASSERT_NE(tok_, nullptr);
  EXPECT_EQ(tok_->Encode("Hello world", true), (std::vector<int32_t>{1, 15043, 3186}));
  EXPECT_EQ(tok_->Encode("", true), (std::vector<int32_t>{1}));
  EXPECT_TRUE(tok_->Encode("", false).empty());
}

TEST_F(SpmTest, DecodeUndoesEncodeForAllVectors) {
  ASSERT_NE(tok_, nullptr);
  for (const auto& v : test::ReadVocabVectors(kSpm)) {
    // The reference ids start with the dummy prefix; Decode drops that one space at the start.
    EXPECT_EQ(tok_->Decode(v.ids), v.text);
    EXPECT_EQ(tok_->Decode(tok_->Encode(v.text, true)), v.text);
    // Without stripping (a continuation after other text), the dummy prefix shows as a space.
    std::string joined;
    for (int32_t id : v.ids) joined += tok_->TokenToPiece(id);
    EXPECT_EQ(joined, v.text.empty() ? "" : " " + v.text);
  }
}

TEST_F(SpmTest, DecodeSpecialTokens) {
  ASSERT_NE(tok_, nullptr);
  const std::vector<int32_t> ids = {1, 15043, 3186, 2};
  EXPECT_EQ(tok_->Decode(ids), "Hello world");
  EXPECT_EQ(tok_->Decode(ids, /*skip_special=*/false), "<s> Hello world</s>");
}

TEST_F(SpmTest, ParseSpecial) {
  ASSERT_NE(tok_, nullptr);
  // Recognised only when asked; the dummy prefix goes again after a special token.
  const auto with = tok_->Encode("<s>Hello</s>", false, /*parse_special=*/true);
  EXPECT_EQ(with, (std::vector<int32_t>{1, 15043, 2}));
  const auto without = tok_->Encode("<s>Hello</s>", false, false);
  EXPECT_GT(without.size(), 3u);
  for (int32_t id : without) EXPECT_FALSE(tok_->IsControl(id));
  EXPECT_EQ(tok_->Decode(without), "<s>Hello</s>");
}

TEST_F(SpmTest, InvalidUtf8FallsBackToBytes) {
  ASSERT_NE(tok_, nullptr);
  const std::string bad = "a\xFF" "b\xC3(\xE2\x82";
  const auto ids = tok_->Encode(bad, false);
  EXPECT_EQ(tok_->Decode(ids), bad);  // byte fallback keeps every byte
  for (uint8_t b : {0xFFu, 0xC3u, 0xE2u, 0x82u}) {
    EXPECT_NE(std::find(ids.begin(), ids.end(), 3 + b), ids.end()) << int(b);  // <0xXX> is id 3 + byte
  }
  EXPECT_EQ(tok_->Encode("\xFF", false), (std::vector<int32_t>{29871, 3 + 0xFF}));
}

// The priority-queue merge equals llama2.c's literal O(n^2) algorithm on random text.
TEST_F(SpmTest, MatchesNaiveReferenceOnRandomText) {
  ASSERT_NE(tok_, nullptr);
  const auto strings = test::ReadVocabStrings(kSpm);
  const test::NaiveSpm naive(*vocab_);
  Rng rng(1234);
  for (int trial = 0; trial < 200; ++trial) {
    std::string text;
    const int parts = 1 + static_cast<int>(rng.Next() % 4);
    for (int p = 0; p < parts; ++p) text += strings[rng.Next() % strings.size()];
    EXPECT_EQ(tok_->Encode(text, false), naive.Encode(text)) << "text: '" << text << "'";
  }
}

std::string RandomBytes(Rng& rng) {
  static const char kAlphabet[] = "ab \n\t\xC3\xA9\xE2\x82\xAC\xF0\x9F\x99\x82\xFF\x80";
  std::string s(rng.Next() % 48, '\0');
  for (char& c : s) c = kAlphabet[rng.Next() % (sizeof(kAlphabet) - 1)];
  return s;
}

// Any bytes (mostly invalid UTF-8) encode without crashing, and byte fallback loses nothing.
TEST_F(SpmTest, RandomBytesRoundTrip) {
  ASSERT_NE(tok_, nullptr);
  Rng rng(7);
  for (int trial = 0; trial < 500; ++trial) {
    const std::string text = RandomBytes(rng);
    const auto ids = tok_->Encode(text, true);
    for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < tok_->n_vocab());
    EXPECT_EQ(tok_->Decode(ids), text);
  }
}

// Streaming gives the same text as Decode when the text is valid UTF-8.
TEST_F(SpmTest, StreamDecoderMatchesDecode) {
  ASSERT_NE(tok_, nullptr);
  for (const auto& v : test::ReadVocabVectors(kSpm)) {
    StreamDecoder stream(*tok_);
    std::string out;
    for (int32_t id : tok_->Encode(v.text, true)) out += stream.Push(id);
    out += stream.Flush();
    EXPECT_EQ(out, v.text);
  }
}

std::string LongText(size_t bytes) {
  const auto strings = test::ReadVocabStrings(kSpm);
  std::string text;
  for (size_t i = 0; text.size() < bytes; ++i) text += strings[i % strings.size()] + " ";
  return text;
}

// Encoding is linear in the input: 10x the text costs far less than 100x (what a quadratic merge
// loop costs). A ratio of CPU times in one run, not a wall-clock bound a busy machine would break.
TEST_F(SpmTest, LongInputIsLinear) {
  ASSERT_NE(tok_, nullptr);
  for (const auto& make : {+[](size_t n) { return LongText(n); }, +[](size_t n) { return std::string(n, 'a'); },
                           +[](size_t n) { return std::string(n, ' '); }}) {
    const std::string small = make(10000), large = make(100000);
    const double ratio = test::EncodeCostRatio(*tok_, small, large, true);
    EXPECT_LT(ratio, 30.0) << "10x the input cost " << ratio << "x the time";
    const auto ids = tok_->Encode(large, true);
    EXPECT_GT(ids.size(), 1000u);
    EXPECT_EQ(tok_->Decode(ids), large);
  }
}

}  // namespace
}  // namespace mnemo
