// Vocabulary data as stored in model files (GGUF tokenizer.ggml.* keys, or llama2.c tok*.bin
// mapped to the same spelling). Plain data: the tokenizers are built from it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mnemo {

enum class TokenType : int32_t {  // GGUF tokenizer.ggml.token_type values
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

struct Vocab {
  std::string model;                 // "llama" (SentencePiece BPE with byte fallback) or "gpt2" (byte-level BPE)
  std::string pre;                   // BPE pre-tokenizer: "default", "gpt-2", "llama-bpe", "qwen2", ...
  std::vector<std::string> tokens;   // [n_vocab] token text; SPM spells a space as U+2581
  std::vector<float> scores;         // [n_vocab] or empty; SPM merge priority (higher first)
  std::vector<int32_t> types;        // [n_vocab] TokenType values, or empty (all normal)
  std::vector<std::string> merges;   // BPE merges "left right", highest priority first
  int32_t bos = -1;                  // -1: none
  int32_t eos = -1;
  int32_t unk = -1;
  int32_t pad = -1;
  std::vector<int32_t> eog_ids;      // ids that end a turn (eos, eot, eom and the end-of-turn tokens
                                     // llama.cpp recognises by text); eos is implied when empty
  bool add_bos = true;               // prepend BOS when encoding a prompt
  bool add_eos = false;
  bool add_space_prefix = true;      // SPM: prepend U+2581 to the text (the dummy prefix)
  std::string chat_template;         // tokenizer.chat_template, or empty
};

}  // namespace mnemo
