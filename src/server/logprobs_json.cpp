#include "server/logprobs_json.h"

#include <cmath>
#include <string>

#include "tokenizer/unicode.h"

namespace mnemo::http {
namespace {

using Json = nlohmann::json;

// A logprob as JSON can carry it.
double Finite(float logprob) { return std::isfinite(logprob) ? static_cast<double>(logprob) : -9999.0; }

std::string Piece(const Tokenizer& tok, int32_t id) { return tok.TokenToPiece(id, /*special=*/true); }

// The piece as valid UTF-8: each maximal invalid or incomplete subpart becomes U+FFFD.
std::string ValidText(std::string_view bytes) {
  std::string out;
  size_t i = 0;
  while (i < bytes.size()) {
    const int n = Utf8Check(bytes.substr(i));
    if (n > 0) {
      out.append(bytes.substr(i, static_cast<size_t>(n)));
      i += static_cast<size_t>(n);
    } else {
      AppendUtf8(kReplacementChar, &out);
      i += n < 0 ? static_cast<size_t>(-n) : bytes.size() - i;  // 0: an incomplete tail, replaced whole
    }
  }
  return out;
}

Json TokenJson(const Tokenizer& tok, const TokenLogprob& t) {
  const std::string piece = Piece(tok, t.id);
  Json bytes = Json::array();
  for (unsigned char c : piece) bytes.push_back(static_cast<int>(c));
  return Json{{"token", ValidText(piece)}, {"logprob", Finite(t.logprob)}, {"bytes", std::move(bytes)}};
}

}  // namespace

Json LogprobEntry(const Tokenizer& tok, const PositionLogprobs& p) {
  Json j = TokenJson(tok, p.chosen);
  Json alts = Json::array();
  for (size_t k = 0; k < p.top.size(); k++) alts.push_back(TokenJson(tok, p.top[k]));
  j["top_logprobs"] = std::move(alts);
  return j;
}

Json ResponsesLogprobs(const Tokenizer& tok, std::span<const PositionLogprobs> ps) {
  Json out = Json::array();
  for (const PositionLogprobs& p : ps) out.push_back(LogprobEntry(tok, p));
  return out;
}

Json ChatLogprobs(const Tokenizer& tok, std::span<const PositionLogprobs> ps) {
  return Json{{"content", ResponsesLogprobs(tok, ps)}, {"refusal", nullptr}};
}

Json CompletionLogprobs(const Tokenizer& tok, std::span<const PositionLogprobs> ps, size_t offset) {
  Json tokens = Json::array(), logprobs = Json::array(), tops = Json::array(), offsets = Json::array();
  for (const PositionLogprobs& p : ps) {
    const std::string piece = Piece(tok, p.chosen.id);
    tokens.push_back(ValidText(piece));
    logprobs.push_back(Finite(p.chosen.logprob));
    Json alts = Json::object();
    for (size_t k = 0; k < p.top.size(); k++) {
      alts[ValidText(Piece(tok, p.top[k].id))] = Finite(p.top[k].logprob);
    }
    tops.push_back(std::move(alts));
    offsets.push_back(offset);
    offset += piece.size();
  }
  return Json{{"tokens", std::move(tokens)}, {"token_logprobs", std::move(logprobs)}, {"top_logprobs", std::move(tops)},
              {"text_offset", std::move(offsets)}};
}

size_t PiecesBytes(const Tokenizer& tok, std::span<const PositionLogprobs> ps) {
  size_t n = 0;
  for (const PositionLogprobs& p : ps) n += Piece(tok, p.chosen.id).size();
  return n;
}

}  // namespace mnemo::http
