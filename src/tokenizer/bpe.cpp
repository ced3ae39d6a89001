// Byte-level BPE (llama.cpp's "gpt2" vocab type: GPT-2, Llama 3, Qwen2, ...).
//
// Encoding: the pre-tokenizer splits the text into words; each word's bytes are spelled with GPT-2's
// byte-to-unicode alphabet (printable Latin-1 bytes stand for themselves, the other 68 bytes for
// U+0100..U+0143, so every byte is one visible character); the word is split into those characters
// and adjacent symbols merge by the rank of "left right" in the merges list, lowest rank first (ties:
// leftmost). Llama 3 vocabs "ignore merges": a word that is itself a token is emitted whole.
#include <array>

#include "tokenizer/pretokenize.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"

namespace mnemo::internal {
namespace {

// GPT-2's bytes_to_unicode: byte -> code point.
std::array<uint32_t, 256> ByteToCodepoint() {
  std::array<uint32_t, 256> map{};
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    map[b] = printable ? b : next++;
  }
  return map;
}

class BpeTokenizer final : public Tokenizer {
 public:
  BpeTokenizer(const Vocab& vocab, PreTokenizer pre, StringMap ranks)
      : Tokenizer(vocab), pre_(pre), ranks_(std::move(ranks)) {
    ignore_merges_ = pre == PreTokenizer::kLlama3;
    const std::array<uint32_t, 256> cps = ByteToCodepoint();
    codepoint_to_byte_.fill(-1);
    for (int b = 0; b < 256; ++b) {
      AppendUtf8(cps[b], &byte_to_utf8_[b]);
      codepoint_to_byte_[cps[b]] = static_cast<int16_t>(b);
    }
  }

 protected:
  void EncodeRaw(std::string_view raw, bool /*after_special*/, std::vector<int32_t>* out) const override {
    std::string mapped;
    std::string key;
    for (const std::string& word : PreTokenize(pre_, raw)) {
      mapped.clear();
      for (const char c : word) mapped += byte_to_utf8_[static_cast<uint8_t>(c)];
      if (ignore_merges_) {
        const int32_t id = TokenId(mapped);
        if (id != kNoToken) {
          out->push_back(id);
          continue;
        }
      }
      const auto priority = [&](std::string_view left, std::string_view right, double* p) {
        key.assign(left);
        key += ' ';
        key.append(right);
        const auto it = ranks_.find(key);
        if (it == ranks_.end()) return false;
        *p = -static_cast<double>(it->second);  // lower rank merges first
        return true;
      };
      const auto emit = [&](std::string_view symbol) {
        const int32_t id = TokenId(symbol);
        if (id != kNoToken) {
          out->push_back(id);
          return;
        }
        // Not a token (a vocab without all 256 byte characters): single bytes that are tokens, if any.
        for (const char c : symbol) {
          const int32_t byte_id = TokenId(std::string_view(&c, 1));
          if (byte_id != kNoToken) out->push_back(byte_id);
        }
      };
      MergeSymbols(mapped, priority, emit);
    }
  }

  std::string NormalPiece(int32_t id) const override {
    const std::string& text = tokens_[id];
    std::string piece;
    piece.reserve(text.size());
    size_t pos = 0;
    while (pos < text.size()) {
      const size_t start = pos;
      uint32_t cp;
      if (!DecodeUtf8(text, &pos, &cp)) {
        piece += text[pos++];  // not UTF-8: keep the byte
        continue;
      }
      if (cp < codepoint_to_byte_.size() && codepoint_to_byte_[cp] >= 0) {
        piece += static_cast<char>(codepoint_to_byte_[cp]);
      } else {
        piece.append(text, start, pos - start);  // outside the byte alphabet: keep as is
      }
    }
    return piece;
  }

 private:
  PreTokenizer pre_;                          // word splitter
  StringMap ranks_;                           // "left right" -> merge rank (0 = merges first)
  bool ignore_merges_ = false;                // emit a word whole when it is a token (Llama 3)
  std::string byte_to_utf8_[256];             // byte -> UTF-8 of its byte-level character
  std::array<int16_t, 324> codepoint_to_byte_;  // byte-level code point (< 324) -> byte, or -1
};

}  // namespace

Result<std::unique_ptr<Tokenizer>> CreateBpeTokenizer(const Vocab& vocab) {
  Result<PreTokenizer> pre = PreTokenizerFromName(vocab.pre);
  if (!pre.ok()) return pre.error();
  StringMap ranks;
  ranks.reserve(vocab.merges.size());
  for (size_t i = 0; i < vocab.merges.size(); ++i) {
    const std::string& merge = vocab.merges[i];
    // "left right"; a left part never starts with the separator, so search from index 1.
    const size_t space = merge.size() > 1 ? merge.find(' ', 1) : std::string::npos;
    if (space == std::string::npos || space + 1 >= merge.size()) {
      return MakeError("vocab: BPE merge %zu ('%s') is not of the form 'left right'", i, merge.c_str());
    }
    ranks.emplace(merge, static_cast<int32_t>(i));  // for duplicates the first (best) rank wins
  }
  return std::unique_ptr<Tokenizer>(new BpeTokenizer(vocab, *pre, std::move(ranks)));
}

}  // namespace mnemo::internal
