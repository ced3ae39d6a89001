// Tokenizer::max_token_bytes(): no encoding of any text has fewer than text.size() /
// max_token_bytes() tokens (the server refuses an over-long prompt on that bound before tokenizing
// it). Checked where the bound is tightest: the longest token's own text repeated, SPM's U+2581 (3
// bytes a space stands for), invalid UTF-8 (BPE replaces each byte by U+FFFD), special-token texts.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "base/rng.h"
#include "format/gguf.h"
#include "format/gguf_vocab.h"
#include "test_util.h"

namespace mnemo {
namespace {

std::unique_ptr<Tokenizer> Load(const std::string& name) {
  auto file = gguf::GgufFile::Open(test::kVocabDir + name);
  if (!file.ok()) return nullptr;
  auto vocab = gguf::ReadVocab(*file);
  if (!vocab.ok()) return nullptr;
  auto tok = Tokenizer::Create(*vocab);
  return tok.ok() ? std::move(*tok) : nullptr;
}

void ExpectBound(const Tokenizer& tok, const std::string& text, const std::string& what) {
  const size_t bound = text.size() / tok.max_token_bytes();
  for (bool special : {false, true}) {
    EXPECT_GE(tok.Encode(text, /*add_special=*/false, special).size(), bound)
        << what << " (" << text.size() << " bytes, parse_special " << special << ")";
  }
}

class MinTokens : public ::testing::TestWithParam<std::string> {};

TEST_P(MinTokens, NoTextEncodesToFewerTokensThanTheBound) {
  auto tok = Load(GetParam());
  ASSERT_NE(tok, nullptr) << GetParam();
  ASSERT_GE(tok->max_token_bytes(), 4u);
  // The longest token texts, each repeated: the fewest tokens per byte any text can reach.
  std::vector<int32_t> ids(tok->n_vocab());
  for (int32_t i = 0; i < tok->n_vocab(); i++) ids[i] = i;
  std::sort(ids.begin(), ids.end(),
            [&](int32_t a, int32_t b) { return tok->TokenText(a).size() > tok->TokenText(b).size(); });
  EXPECT_EQ(tok->TokenText(ids[0]).size(), tok->max_token_bytes());
  for (int k = 0; k < 20; k++) {
    std::string text;
    for (int r = 0; r < 8; r++) text += tok->TokenText(ids[k]);
    ExpectBound(*tok, text, "token " + std::to_string(ids[k]) + " x8");
    ExpectBound(*tok, tok->Decode(std::vector<int32_t>(8, ids[k]), false), "decoded token " + std::to_string(ids[k]));
  }
  // Random mixtures of the awkward pieces.
  const std::vector<std::string> parts = {" ", "  ", "\xe2\x96\x81", "\xff", "\xc3", "\n", "<s>", "</s>",
                                          "<|endoftext|>", "<0x0A>", "the", " the", "\xe4\xb8\xad", "a"};
  Rng rng(7);
  for (int t = 0; t < 300; t++) {
    std::string text;
    const int n = 1 + static_cast<int>(rng.Next() % 200);
    for (int i = 0; i < n; i++) text += parts[rng.Next() % parts.size()];
    ExpectBound(*tok, text, "mixture " + std::to_string(t));
  }
  for (const std::string& s : test::ReadVocabStrings(GetParam())) ExpectBound(*tok, s, "vector");
}

INSTANTIATE_TEST_SUITE_P(Vocabs, MinTokens,
                         ::testing::Values("ggml-vocab-llama-spm.gguf", "ggml-vocab-gpt-2.gguf"));

}  // namespace
}  // namespace mnemo
