// llama2.c's tok512 (stories260K) against run.c's reference outputs, and the streaming decoder.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "test_util.h"
#include "tokenizer/unicode.h"

namespace mnemo {
namespace {

const std::string kModelDir = std::string(MNEMO_SHARED_DIR) + "/models/stories260K/";

class Tok512Test : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    vocab_ = new Vocab();
    ASSERT_TRUE(test::ReadTok512(kModelDir + "tok512.bin", vocab_));
    auto tok = Tokenizer::Create(*vocab_);
    ASSERT_TRUE(tok.ok()) << tok.error().message;
    tok_ = tok->release();
  }
  static void TearDownTestSuite() {
    delete tok_;
    delete vocab_;
  }
  static std::vector<nlohmann::json> Reference() {
    std::vector<nlohmann::json> lines;
    std::istringstream in(test::ReadFile(std::string(MNEMO_SHARED_DIR) + "/reference/stories260K_greedy.jsonl"));
    for (std::string line; std::getline(in, line);) {
      if (!line.empty()) lines.push_back(nlohmann::json::parse(line));
    }
    return lines;
  }
  // Prompt ids plus generated ids, without the final BOS that stopped run.c (it is not printed).
  static std::vector<int32_t> AllIds(const nlohmann::json& ref) {
    auto ids = ref["prompt_token_ids"].get<std::vector<int32_t>>();
    auto gen = ref["generated_token_ids"].get<std::vector<int32_t>>();
    if (ref["stop"] == "bos") {
      EXPECT_EQ(gen.back(), 1);
      gen.pop_back();
    }
    ids.insert(ids.end(), gen.begin(), gen.end());
    return ids;
  }
  static Vocab* vocab_;
  static Tokenizer* tok_;
};
Vocab* Tok512Test::vocab_ = nullptr;
Tokenizer* Tok512Test::tok_ = nullptr;

TEST_F(Tok512Test, VocabFacts) {
  ASSERT_NE(tok_, nullptr);
  EXPECT_EQ(tok_->n_vocab(), 512);
  EXPECT_EQ(tok_->TokenId("<0x0A>"), 13);
  EXPECT_EQ(tok_->TokenToPiece(13), "\n");
  EXPECT_EQ(tok_->Encode("Once upon a time", true), (std::vector<int32_t>{1, 403, 407, 261, 378}));
  EXPECT_EQ(tok_->Encode("\n", false), (std::vector<int32_t>{410, 13}));
}

TEST_F(Tok512Test, EncodesEveryReferencePrompt) {
  ASSERT_NE(tok_, nullptr);
  const auto refs = Reference();
  ASSERT_EQ(refs.size(), 9u);
  for (const auto& ref : refs) {
    const std::string prompt = ref["prompt"];
    EXPECT_EQ(tok_->Encode(prompt, /*add_special=*/true), ref["prompt_token_ids"].get<std::vector<int32_t>>())
        << "prompt: '" << prompt << "'";
  }
}

TEST_F(Tok512Test, DecodesEveryReferenceContinuation) {
  ASSERT_NE(tok_, nullptr);
  for (const auto& ref : Reference()) {
    const std::string expected = ref["text_unfiltered"];
    const auto ids = AllIds(ref);
    EXPECT_EQ(tok_->Decode(ids), expected) << "prompt: '" << ref["prompt"] << "'";

    // Streaming the generated tokens after the prompt gives the same continuation, and every chunk
    // is complete UTF-8.
    const auto prompt_ids = ref["prompt_token_ids"].get<std::vector<int32_t>>();
    StreamDecoder stream(*tok_, prompt_ids.back());
    std::string streamed;
    for (size_t i = prompt_ids.size(); i < ids.size(); ++i) {
      const std::string chunk = stream.Push(ids[i]);
      for (size_t p = 0; p < chunk.size();) {
        const int n = Utf8Check(std::string_view(chunk).substr(p));
        ASSERT_GT(n, 0) << "chunk is not complete UTF-8";
        p += static_cast<size_t>(n);
      }
      streamed += chunk;
    }
    streamed += stream.Flush();
    const std::string prompt_text = tok_->Decode(prompt_ids);
    EXPECT_EQ(prompt_text + streamed, expected);
  }
}

// The same model's GGUF (converted by llama.cpp) carries the same tokenizer: encodings agree.
TEST_F(Tok512Test, GgufVocabOfStories260KAgrees) {
  ASSERT_NE(tok_, nullptr);
  auto gguf_tok = test::LoadGgufTokenizer(kModelDir + "stories260K.gguf");
  ASSERT_NE(gguf_tok, nullptr);
  EXPECT_EQ(gguf_tok->n_vocab(), 512);
  for (const auto& ref : Reference()) {
    const std::string prompt = ref["prompt"];
    EXPECT_EQ(gguf_tok->Encode(prompt, true), ref["prompt_token_ids"].get<std::vector<int32_t>>()) << prompt;
    EXPECT_EQ(gguf_tok->Decode(AllIds(ref)), ref["text_unfiltered"].get<std::string>());
  }
}

TEST_F(Tok512Test, MatchesNaiveRunCEncoder) {
  ASSERT_NE(tok_, nullptr);
  const test::NaiveSpm naive(*vocab_);
  for (const auto& ref : Reference()) {
    const std::string text = ref["text_unfiltered"];
    auto expected = naive.Encode(text);
    expected.insert(expected.begin(), 1);
    EXPECT_EQ(tok_->Encode(text, true), expected);
  }
}

TEST_F(Tok512Test, StreamDecoderHoldsSplitCharacters) {
  ASSERT_NE(tok_, nullptr);
  // "ë" has no piece in tok512: it is byte tokens <0xC3> <0xAB> (ids 198, 174).
  const auto ids = tok_->Encode("Zoë", true);
  ASSERT_EQ(ids, (std::vector<int32_t>{1, 410, 469, 414, 198, 174}));
  StreamDecoder stream(*tok_);
  std::vector<std::string> chunks;
  for (int32_t id : ids) chunks.push_back(stream.Push(id));
  EXPECT_EQ(chunks, (std::vector<std::string>{"", "", "Z", "o", "", "\xC3\xAB"}));
  EXPECT_EQ(stream.Flush(), "");

  // 🙂 = F0 9F 99 82 arrives in four tokens.
  StreamDecoder emoji(*tok_, /*prev_token=*/414);
  std::string out;
  for (uint8_t b : {0xF0, 0x9F, 0x99}) {
    EXPECT_EQ(emoji.Push(3 + b), "");
  }
  EXPECT_EQ(emoji.Push(3 + 0x82), "\xF0\x9F\x99\x82");
}

TEST_F(Tok512Test, StreamDecoderReplacesInvalidBytes) {
  ASSERT_NE(tok_, nullptr);
  StreamDecoder stream(*tok_, 414);
  EXPECT_EQ(stream.Push(3 + 0xFF), "\xEF\xBF\xBD");  // can never start a character
  EXPECT_EQ(stream.Push(3 + 0xC3), "");              // may still complete
  EXPECT_EQ(stream.Push(414), "\xEF\xBF\xBD" "o");   // did not: one U+FFFD, then the text
  EXPECT_EQ(stream.Push(3 + 0xE2), "");
  EXPECT_EQ(stream.Flush(), "\xEF\xBF\xBD");         // incomplete at the end
  EXPECT_EQ(stream.Flush(), "");
}

TEST_F(Tok512Test, StreamDecoderStripsDummyPrefixOnlyAtTheStart) {
  ASSERT_NE(tok_, nullptr);
  StreamDecoder at_start(*tok_);
  EXPECT_EQ(at_start.Push(1), "");
  EXPECT_EQ(at_start.Push(403), "Once");
  EXPECT_EQ(at_start.Push(407), " upon");
  StreamDecoder after_bos(*tok_, /*prev_token=*/1);
  EXPECT_EQ(after_bos.Push(403), "Once");
  StreamDecoder continuation(*tok_, /*prev_token=*/403);
  EXPECT_EQ(continuation.Push(407), " upon");
}

}  // namespace
}  // namespace mnemo
