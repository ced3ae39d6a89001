// Shared helpers for the tokenizer tests: llama.cpp vocab test vectors, vocab loaders, naive
// reference encoders.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"
#include "tokenizer/vocab.h"

namespace mnemo::test {

inline const std::string kVocabDir = std::string(MNEMO_SHARED_DIR) + "/models/vocab/";

struct VocabVector {
  std::string text;          // test string
  std::vector<int32_t> ids;  // expected ids, without BOS/EOS
};

std::string ReadFile(const std::string& path);  // whole file; empty if missing (tests then fail)

// Reads NAME.inp (strings each followed by a line "__ggml_vocab_test__") and NAME.out (one line of
// space-separated ids per string). Returns an empty vector if the counts disagree.
std::vector<VocabVector> ReadVocabVectors(const std::string& name);

// How encoding cost grows with the input: the calling thread's CPU time to encode `large` over that
// to encode `small` (best of 3 each, so a busy machine's preemption does not count). Linear
// encoding gives about large.size() / small.size(); a quadratic one its square.
double EncodeCostRatio(const Tokenizer& tok, const std::string& small, const std::string& large, bool add_special);

// Only the strings of NAME.inp.
std::vector<std::string> ReadVocabStrings(const std::string& name);

// Test-only reader of llama2.c's tok*.bin, mapped to GGUF spelling (see stories260K/PROVENANCE.md):
// int32 max_token_length, then per token f32 score, int32 len, len bytes; ' ' -> U+2581,
// "\n<s>\n" -> "<s>", "\n</s>\n" -> "</s>"; id 0 unknown, 1 BOS, 2 EOS, <0xXX> byte tokens.
bool ReadTok512(const std::string& path, Vocab* vocab);

// Loads a vocab-only GGUF file with the format layer's reader. Returns null (with a gtest failure).
std::unique_ptr<Tokenizer> LoadGgufTokenizer(const std::string& path);

// llama2.c run.c `encode` written out literally (O(n^2) rescans, no BOS): the dummy prefix piece,
// per-character lookup with byte fallback, then repeatedly merge the best-scoring adjacent pair,
// leftmost on ties. Valid UTF-8 input only.
class NaiveSpm {
 public:
  explicit NaiveSpm(const Vocab& vocab);
  std::vector<int32_t> Encode(const std::string& text) const;

 private:
  int32_t Find(const std::string& s) const;
  const Vocab& vocab_;
  std::map<std::string, int32_t> lookup_;
};

// Textbook byte-level BPE on one word already spelled in the byte alphabet: repeatedly merge the
// lowest-ranked adjacent pair, leftmost on ties. Returns the final symbols.
std::vector<std::string> NaiveBpeWord(const std::map<std::string, int>& ranks, const std::string& word);

}  // namespace mnemo::test
