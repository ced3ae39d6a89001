// SentencePiece-style BPE with byte fallback (llama.cpp's "llama" vocab type, llama2.c's tokenizer).
//
// Encoding: spaces become U+2581 "▁", a dummy prefix "▁" goes in front of the text (at the start and
// after each special token, when the vocab says add_space_prefix), the text is split into UTF-8
// characters, and adjacent symbols whose concatenation is a vocab token merge, highest token score
// first (ties: leftmost). A final symbol that is not a token (only possible for a single character)
// becomes its bytes' <0xXX> tokens. This equals llama2.c's run.c `encode` and llama.cpp's SPM session.
#include <cstdio>

#include "tokenizer/tokenizer_impl.h"

namespace mnemo::internal {
namespace {

constexpr std::string_view kSpaceEscape = "\xE2\x96\x81";  // U+2581 LOWER ONE EIGHTH BLOCK

class SpmTokenizer final : public Tokenizer {
 public:
  explicit SpmTokenizer(const Vocab& vocab) : Tokenizer(vocab) {
    add_space_prefix_ = vocab.add_space_prefix;
    for (int b = 0; b < 256; ++b) {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "<0x%02X>", b);
      int32_t id = TokenId(hex);
      if (id == kNoToken) id = TokenId(std::string(1, static_cast<char>(b)));  // the byte itself
      if (id == kNoToken) id = unk_;
      byte_to_id_[b] = id;
    }
  }

 protected:
  void EncodeRaw(std::string_view raw, bool after_special, std::vector<int32_t>* out) const override {
    std::string text;
    text.reserve(raw.size() + 16);
    if (add_space_prefix_ && after_special) text += kSpaceEscape;
    for (const char c : raw) {
      if (c == ' ') {
        text += kSpaceEscape;
      } else {
        text += c;
      }
    }
    const auto priority = [&](std::string_view left, std::string_view right, double* p) {
      const int32_t id = PairId(left, right);
      if (id == kNoToken) return false;
      *p = scores_[id];
      return true;
    };
    const auto emit = [&](std::string_view symbol) {
      const int32_t id = TokenId(symbol);
      if (id != kNoToken) {
        out->push_back(id);
        return;
      }
      for (const char c : symbol) {
        const int32_t byte_id = byte_to_id_[static_cast<uint8_t>(c)];
        if (byte_id != kNoToken) out->push_back(byte_id);
      }
    };
    MergeSymbols(text, priority, emit);
  }

  std::string NormalPiece(int32_t id) const override {
    const std::string& text = tokens_[id];
    if (Type(id) == TokenType::kByte && text.size() == 6 && text.compare(0, 3, "<0x") == 0 && text[5] == '>') {
      unsigned value = 0;
      if (std::sscanf(text.c_str() + 3, "%2x", &value) == 1) return std::string(1, static_cast<char>(value));
    }
    std::string piece;
    piece.reserve(text.size());
    for (size_t i = 0; i < text.size();) {
      if (text.compare(i, kSpaceEscape.size(), kSpaceEscape) == 0) {
        piece += ' ';
        i += kSpaceEscape.size();
      } else {
        piece += text[i++];
      }
    }
    return piece;
  }

 private:
  // Id of the token spelled left + right, or kNoToken. Symbols are adjacent in one buffer, but the
  // lookup needs one contiguous key, so it is assembled in a per-thread scratch string.
  int32_t PairId(std::string_view left, std::string_view right) const {
    if (left.data() + left.size() == right.data()) {
      return TokenId(std::string_view(left.data(), left.size() + right.size()));
    }
    thread_local std::string key;
    key.assign(left);
    key.append(right);
    return TokenId(key);
  }

  int32_t byte_to_id_[256];  // byte -> its fallback token (kNoToken: the byte is dropped)
};

}  // namespace

Result<std::unique_ptr<Tokenizer>> CreateSpmTokenizer(const Vocab& vocab) {
  return std::unique_ptr<Tokenizer>(new SpmTokenizer(vocab));
}

}  // namespace mnemo::internal
