// Tokenizers built from a Vocab: SentencePiece-style BPE with byte fallback (model "llama", also
// llama2.c's tok*.bin) and byte-level BPE (model "gpt2": GPT-2, Llama 3, Qwen2). Their output matches
// llama.cpp's tokenizer (its test vectors) and llama2.c's run.c token for token.
//
// Thread safety: a Tokenizer is immutable after Create; all const methods may be called from any
// number of threads at once. A StreamDecoder belongs to one thread (one response stream).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "tokenizer/vocab.h"

namespace mnemo {

inline constexpr int32_t kNoToken = -1;

namespace internal {
// std::string -> int32_t map that can be searched with a std::string_view (no temporary string).
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StringMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;
}  // namespace internal

class Tokenizer {
 public:
  // Validates the vocab (known model and pre-tokenizer, array sizes, special ids in range, parsable
  // merges) and builds the lookup tables. Copies what it needs: the Vocab may be freed afterwards.
  // Cost: O(n_vocab + n_merges) time and memory.
  static Result<std::unique_ptr<Tokenizer>> Create(const Vocab& vocab);

  virtual ~Tokenizer() = default;
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Encodes text (any bytes; invalid UTF-8 never fails: SPM byte-falls-back each stray byte, so
  // Decode gives the bytes back; BPE replaces each by U+FFFD first, as llama.cpp does). add_special: prepend BOS / append EOS as the
  // vocab's add_bos / add_eos say. parse_special: also recognise control-token texts such as "<s>"
  // in the input (user-defined tokens are always recognised). Cost: O(n log n) in the text length.
  std::vector<int32_t> Encode(std::string_view text, bool add_special, bool parse_special = false) const;

  // The bytes a token stands for in decoded text: SPM "▁" -> ' ' and "<0x0A>" -> byte 0x0A; BPE maps
  // its byte-level characters back to bytes. Control and unknown tokens give "" unless `special`,
  // then their text. A piece may be an incomplete UTF-8 sequence (byte tokens). Bad ids give "".
  std::string TokenToPiece(int32_t id, bool special = false) const;

  // The piece of `id` as it appears in decoded text when it follows token `prev` (kNoToken at the
  // start of the text): for SPM vocabs with a dummy prefix, one leading space is dropped at the start
  // of the text and right after BOS (llama.cpp drops it for the first token, run.c after BOS).
  std::string DecodePiece(int32_t prev, int32_t id, bool special = false) const;

  // Concatenated DecodePiece of ids (the bytes, not necessarily valid UTF-8). skip_special: control
  // tokens give "" (else their text). For SPM, Decode(Encode(s, true)) == s for any bytes s without
  // U+2581 (which decodes as a space) and without special-token text when parsing it.
  std::string Decode(std::span<const int32_t> ids, bool skip_special = true) const;

  // Where tokenization restarts in `text` (parse_special on, no BOS / EOS added): a position p such
  // that for every continuation y, Encode(text + y) and Encode(text[p..] + y) end in the same
  // tokens after the part that text[0, p) and text[p..] tokenize to, i.e.
  //   Encode(text[p..] + y) minus Encode(text[p..]) == Encode(text + y) minus Encode(text)
  // (one is a prefix exactly when the other is). p is the later of
  //  - the start of the last control-token text (tokenization restarts after a control token), and
  //  - SPM vocabs whose tokens never hold U+2581 after another character, and whose special tokens
  //    hold no space: one byte before the last ' ' that follows a non-space byte (not the end of a
  //    U+2581 character, not the end of a special token's text). No merge can cross the start of
  //    such a word ("c▁" is in no token), so what follows it tokenizes alone; the byte before it
  //    keeps the dummy prefix that a run start gets away from the word.
  // 0 when neither exists. Cost: SPM, O(bytes after p) (+ the special texts per candidate space);
  // otherwise a backward search for each control text (O(|text|) when none occurs).
  size_t RestartPoint(std::string_view text) const;
  // Whether RestartPoint uses word starts (the SPM condition above holds for this vocab).
  bool restarts_at_words() const { return word_restarts_; }

  int32_t bos() const { return bos_; }
  int32_t eos() const { return eos_; }
  int32_t unk() const { return unk_; }
  int32_t n_vocab() const { return static_cast<int32_t>(tokens_.size()); }
  // The most bytes of input text one token can stand for (the longest token text, at least 4):
  // Encode(text) has at least text.size() / max_token_bytes() tokens, known without tokenizing.
  size_t max_token_bytes() const { return max_token_bytes_; }
  const std::string& model() const { return model_; }  // "llama" or "gpt2"
  bool IsControl(int32_t id) const;  // control (BOS, EOS, chat markers); false for bad ids
  bool IsByte(int32_t id) const;     // SPM <0xXX> byte-fallback token
  // End of generation: EOS, and control tokens that end a turn ("<|eot_id|>", "<|im_end|>",
  // "<|endoftext|>", "<end_of_turn>", "<|end|>", "<|eom_id|>"). Note that llama2.c's run.c stops on BOS
  // for TinyStories models; that is the caller's policy, not a vocab fact.
  bool IsEog(int32_t id) const;
  // Exact token text (as stored in the vocab, SPM spaces as U+2581) -> id, or kNoToken.
  int32_t TokenId(std::string_view text) const;
  const std::string& TokenText(int32_t id) const;  // precondition: 0 <= id < n_vocab()

 protected:
  explicit Tokenizer(const Vocab& vocab);
  // Tokenizes one run of raw text (no special tokens in it). after_special: the run is at the start
  // of the input or right after a special token (SPM adds its dummy prefix there).
  virtual void EncodeRaw(std::string_view text, bool after_special, std::vector<int32_t>* out) const = 0;
  // Piece of a normal token (type normal, or any type not handled by TokenToPiece itself).
  virtual std::string NormalPiece(int32_t id) const = 0;
  TokenType Type(int32_t id) const;

  using StringMap = internal::StringMap;

  std::string model_;                  // "llama" or "gpt2"
  std::vector<std::string> tokens_;    // [n_vocab] token text
  std::vector<float> scores_;          // [n_vocab] SPM merge priority (0 when the vocab has none)
  std::vector<TokenType> types_;       // [n_vocab]
  StringMap token_to_id_;              // text -> id; for duplicate texts the last id wins (llama.cpp)
  std::vector<int32_t> special_ids_;   // control / user-defined / unknown ids, longest text first
  size_t max_token_bytes_ = 4;
  std::vector<uint8_t> is_eog_;        // [n_vocab] 1 for end-of-generation tokens
  int32_t bos_ = kNoToken;
  int32_t eos_ = kNoToken;
  int32_t unk_ = kNoToken;
  bool add_bos_ = false;
  bool add_eos_ = false;
  bool add_space_prefix_ = false;  // SPM dummy prefix (also: strip one space when decoding)
  bool word_restarts_ = false;     // RestartPoint may cut before a space-initial word (SPM only)
  std::vector<int32_t> control_ids_;  // control tokens with text (RestartPoint)

 private:
  // Splits text at special-token occurrences (longest token texts first, as llama.cpp does).
  struct Fragment {
    int32_t token;          // kNoToken for raw text
    std::string_view text;  // raw text when token == kNoToken
  };
  std::vector<Fragment> Partition(std::string_view text, bool parse_special) const;
};

// Incremental detokenizer for streaming: feed ids one by one, get text that only ever contains
// complete UTF-8 characters (a byte-fallback token can end in the middle of a character, which then
// waits for the next token). Bytes that can never form valid UTF-8 come out as U+FFFD (one per
// maximal invalid subpart); for valid output the concatenation of Push()es and Flush() equals
// Tokenizer::Decode of the same ids after `prev_token`.
class StreamDecoder {
 public:
  // prev_token: the token before the first one pushed (e.g. the last prompt token), or kNoToken when
  // the first pushed token starts the text. The tokenizer must outlive the decoder.
  explicit StreamDecoder(const Tokenizer& tokenizer, int32_t prev_token = kNoToken, bool skip_special = true)
      : tokenizer_(&tokenizer), prev_(prev_token), skip_special_(skip_special) {}

  std::string Push(int32_t id);  // returns the newly completed text (possibly empty)
  std::string Flush();           // returns what is still held back; an incomplete tail becomes U+FFFD

 private:
  const Tokenizer* tokenizer_;
  int32_t prev_;         // last token pushed (or the one given at construction)
  bool skip_special_;    // control tokens decode to ""
  std::string pending_;  // bytes not yet returned: at most 3, an incomplete UTF-8 sequence
};

}  // namespace mnemo
