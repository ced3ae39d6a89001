#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <limits>

#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"

namespace mnemo {
namespace {

Status CheckSpecialId(const char* what, int32_t id, size_t n) {
  if (id < -1 || id >= static_cast<int64_t>(n)) {
    return MakeError("vocab: %s token id %d is out of range [0, %zu)", what, id, n);
  }
  return Status::Ok();
}

Status CheckVocab(const Vocab& v) {
  const size_t n = v.tokens.size();
  if (n == 0) return MakeError("vocab has no tokens");
  if (n > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return MakeError("vocab has too many tokens (%zu)", n);
  }
  if (!v.scores.empty() && v.scores.size() != n) {
    return MakeError("vocab: %zu scores for %zu tokens", v.scores.size(), n);
  }
  if (!v.types.empty() && v.types.size() != n) {
    return MakeError("vocab: %zu token types for %zu tokens", v.types.size(), n);
  }
  for (size_t i = 0; i < v.types.size(); ++i) {
    if (v.types[i] < 0 || v.types[i] > static_cast<int32_t>(TokenType::kByte)) {
      return MakeError("vocab: token %zu has unknown token type %d", i, v.types[i]);
    }
  }
  MNEMO_TRY(CheckSpecialId("BOS", v.bos, n));
  MNEMO_TRY(CheckSpecialId("EOS", v.eos, n));
  MNEMO_TRY(CheckSpecialId("unknown", v.unk, n));
  MNEMO_TRY(CheckSpecialId("padding", v.pad, n));
  for (int32_t id : v.eog_ids) {
    if (id < 0) return MakeError("vocab: end-of-generation token id %d is negative", id);
    MNEMO_TRY(CheckSpecialId("end-of-generation", id, n));
  }
  if (v.add_bos && v.bos < 0) return MakeError("vocab asks to add BOS but has no BOS token");
  if (v.add_eos && v.eos < 0) return MakeError("vocab asks to add EOS but has no EOS token");
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> Tokenizer::Create(const Vocab& vocab) {
  MNEMO_TRY(CheckVocab(vocab));
  if (vocab.model == "llama") return internal::CreateSpmTokenizer(vocab);
  if (vocab.model == "gpt2") return internal::CreateBpeTokenizer(vocab);
  return MakeError("unsupported tokenizer model '%s' (supported: llama = SentencePiece BPE, gpt2 = byte-level BPE)",
                   vocab.model.c_str());
}

Tokenizer::Tokenizer(const Vocab& vocab)
    : model_(vocab.model),
      tokens_(vocab.tokens),
      bos_(vocab.bos),
      eos_(vocab.eos),
      unk_(vocab.unk),
      add_bos_(vocab.add_bos),
      add_eos_(vocab.add_eos) {
  const size_t n = tokens_.size();
  scores_ = vocab.scores.empty() ? std::vector<float>(n, 0.0f) : vocab.scores;
  types_.resize(n, TokenType::kNormal);
  if (!vocab.types.empty()) {
    for (size_t i = 0; i < n; ++i) types_[i] = static_cast<TokenType>(vocab.types[i]);
  } else {
    // No types in the file: the declared special tokens are the only ones we know to be special.
    for (int32_t id : {bos_, eos_}) {
      if (id >= 0) types_[id] = TokenType::kControl;
    }
    if (unk_ >= 0) types_[unk_] = TokenType::kUnknown;
  }
  token_to_id_.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    if (!tokens_[i].empty()) token_to_id_[tokens_[i]] = static_cast<int32_t>(i);
    // A token's stored text is never shorter than the input it covers: SPM stores a space as U+2581
    // (3 bytes) and a fallback byte as "<0xXX>"; byte-level BPE stores each byte as a 1-2 byte
    // character (an invalid byte, replaced by U+FFFD, as three); special tokens match their text.
    max_token_bytes_ = std::max(max_token_bytes_, tokens_[i].size());
  }
  for (size_t i = 0; i < n; ++i) {
    const TokenType t = types_[i];
    if ((t == TokenType::kControl || t == TokenType::kUserDefined || t == TokenType::kUnknown) &&
        !tokens_[i].empty()) {
      special_ids_.push_back(static_cast<int32_t>(i));
    }
  }
  std::stable_sort(special_ids_.begin(), special_ids_.end(),
                   [&](int32_t a, int32_t b) { return tokens_[a].size() > tokens_[b].size(); });
  is_eog_.assign(n, 0);
  if (eos_ >= 0) is_eog_[eos_] = 1;
  for (int32_t id : vocab.eog_ids) is_eog_[id] = 1;
  for (int32_t id : special_ids_) {
    if (types_[id] == TokenType::kControl) control_ids_.push_back(id);
  }
  // Word restarts (RestartPoint): SPM merges join adjacent symbols only into vocab tokens, so when
  // no token has U+2581 after another character, no merge joins a non-space character and the
  // "▁" after it. Special tokens are matched as text before merging: none may hold a space.
  if (model_ == "llama") {
    const std::string_view kEsc = "\xe2\x96\x81";
    bool ok = true;
    for (size_t i = 0; i < n && ok; ++i) {
      const std::string& t = tokens_[i];
      for (size_t k = t.find(kEsc); k != std::string::npos && ok; k = t.find(kEsc, k + 1)) {
        ok = k == 0 || (k >= kEsc.size() && t.compare(k - kEsc.size(), kEsc.size(), kEsc) == 0);
      }
    }
    for (int32_t id : special_ids_) {
      const std::string& t = tokens_[id];
      ok = ok && t.find(' ') == std::string::npos && t.find(kEsc) == std::string::npos;
    }
    word_restarts_ = ok;
  }
}

size_t Tokenizer::RestartPoint(std::string_view text) const {
  size_t floor = 0;
  if (word_restarts_) {
    const std::string_view kEsc = "\xe2\x96\x81";
    for (size_t i = text.size(); i-- > 1;) {
      if (text[i] != ' ' || text[i - 1] == ' ') continue;
      if (i >= kEsc.size() && text.compare(i - kEsc.size(), kEsc.size(), kEsc) == 0) continue;
      bool special_ends_here = false;  // a special token then precedes the space: a run starts there
      for (int32_t id : special_ids_) {
        const std::string& s = tokens_[id];
        if (s.size() <= i && text.compare(i - s.size(), s.size(), s) == 0) {
          special_ends_here = true;
          break;
        }
      }
      if (special_ends_here) continue;
      floor = i - 1;
      break;
    }
  }
  // A control text that starts before `floor` cannot reach past it (it would hold the space, or end
  // right before it): only the tail needs searching.
  const std::string_view tail = text.substr(floor);
  size_t start = floor;
  for (int32_t id : control_ids_) {
    const size_t k = tail.rfind(tokens_[id]);
    if (k != std::string_view::npos) start = std::max(start, floor + k);
  }
  return start;
}

TokenType Tokenizer::Type(int32_t id) const { return types_[id]; }

bool Tokenizer::IsControl(int32_t id) const {
  return id >= 0 && id < n_vocab() && types_[id] == TokenType::kControl;
}

bool Tokenizer::IsByte(int32_t id) const { return id >= 0 && id < n_vocab() && types_[id] == TokenType::kByte; }

bool Tokenizer::IsEog(int32_t id) const { return id >= 0 && id < n_vocab() && is_eog_[id] != 0; }

int32_t Tokenizer::TokenId(std::string_view text) const {
  const auto it = token_to_id_.find(text);
  return it == token_to_id_.end() ? kNoToken : it->second;
}

const std::string& Tokenizer::TokenText(int32_t id) const {
  MNEMO_CHECK(id >= 0 && id < n_vocab());
  return tokens_[id];
}

std::vector<Tokenizer::Fragment> Tokenizer::Partition(std::string_view text, bool parse_special) const {
  std::vector<Fragment> fragments;
  if (text.empty()) return fragments;
  fragments.push_back({kNoToken, text});
  std::vector<Fragment> next;
  for (const int32_t id : special_ids_) {
    const TokenType type = types_[id];
    if (!parse_special && (type == TokenType::kControl || type == TokenType::kUnknown)) continue;
    const std::string_view special = tokens_[id];
    next.clear();
    bool found = false;
    for (const Fragment& f : fragments) {
      if (f.token != kNoToken) {
        next.push_back(f);
        continue;
      }
      std::string_view rest = f.text;
      for (size_t pos; (pos = rest.find(special)) != std::string_view::npos;) {
        found = true;
        if (pos > 0) next.push_back({kNoToken, rest.substr(0, pos)});
        next.push_back({id, {}});
        rest.remove_prefix(pos + special.size());
      }
      if (!rest.empty()) next.push_back({kNoToken, rest});
    }
    if (found) fragments.swap(next);
  }
  return fragments;
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool add_special, bool parse_special) const {
  std::vector<int32_t> out;
  if (add_special && add_bos_) out.push_back(bos_);
  bool after_special = true;  // the start of the input counts as "after a special token"
  for (const Fragment& f : Partition(text, parse_special)) {
    if (f.token != kNoToken) {
      out.push_back(f.token);
      after_special = true;
    } else {
      EncodeRaw(f.text, after_special, &out);
      after_special = false;
    }
  }
  if (add_special && add_eos_) out.push_back(eos_);
  return out;
}

std::string Tokenizer::TokenToPiece(int32_t id, bool special) const {
  if (id < 0 || id >= n_vocab()) return {};
  switch (types_[id]) {
    case TokenType::kControl:
    case TokenType::kUnknown:
      return special ? tokens_[id] : std::string();
    case TokenType::kUserDefined:
      return tokens_[id];
    case TokenType::kUnused:
      return {};
    default:
      return NormalPiece(id);
  }
}

std::string Tokenizer::DecodePiece(int32_t prev, int32_t id, bool special) const {
  std::string piece = TokenToPiece(id, special);
  // Undo the dummy prefix. With special tokens shown, a visible "<s>" keeps the space after it, as
  // llama.cpp renders it.
  if (add_space_prefix_ && !piece.empty() && piece[0] == ' ' &&
      (prev == kNoToken || (prev == bos_ && !special))) {
    piece.erase(0, 1);
  }
  return piece;
}

std::string Tokenizer::Decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string text;
  int32_t prev = kNoToken;
  for (const int32_t id : ids) {
    text += DecodePiece(prev, id, !skip_special);
    prev = id;
  }
  return text;
}

std::string StreamDecoder::Push(int32_t id) {
  pending_ += tokenizer_->DecodePiece(prev_, id, !skip_special_);
  prev_ = id;
  std::string out;
  size_t i = 0;
  while (i < pending_.size()) {
    const int r = Utf8Check(std::string_view(pending_).substr(i));
    if (r == 0) break;  // incomplete: wait for the next token
    if (r > 0) {
      out.append(pending_, i, static_cast<size_t>(r));
      i += static_cast<size_t>(r);
    } else {
      AppendUtf8(kReplacementChar, &out);
      i += static_cast<size_t>(-r);
    }
  }
  pending_.erase(0, i);
  return out;
}

std::string StreamDecoder::Flush() {
  std::string out;
  if (!pending_.empty()) AppendUtf8(kReplacementChar, &out);  // an incomplete sequence is one subpart
  pending_.clear();
  return out;
}

}  // namespace mnemo
