// Pre-tokenizers of byte-level BPE vocabularies: split text into words before BPE merging.
// Each one is a hand-written matcher equivalent to a published regex (leftmost match, alternatives in
// order, greedy quantifiers with backtracking), run over code points with the Unicode classes of
// unicode.h. No std::regex: it has no \p{L} / \p{N}.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace mnemo {

enum class PreTokenizer {
  // GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  kGpt2,
  // Llama 3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
  //          ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
  kLlama3,
  // Qwen2: as Llama 3, but single digits (\p{N} instead of \p{N}{1,3}).
  kQwen2,
};

// Maps a GGUF tokenizer.ggml.pre name to a pre-tokenizer: "default"/"gpt-2" -> kGpt2,
// "llama-bpe"/"llama3"/"llama-v3" -> kLlama3, "qwen2"/"deepseek-r1-qwen" -> kQwen2.
Result<PreTokenizer> PreTokenizerFromName(std::string_view name);

// Splits text into words whose concatenation is the text, except that bytes which are not valid
// UTF-8 are replaced by U+FFFD first (as llama.cpp does). Words are UTF-8 strings.
std::vector<std::string> PreTokenize(PreTokenizer kind, std::string_view text);

}  // namespace mnemo
