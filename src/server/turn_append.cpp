// Aligning a generated reply with the template's rendering, and tokenizing what follows it.
#include "server/turn_append.h"

#include <algorithm>

namespace mnemo {
namespace {

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

// [begin, end) of s without its leading and trailing whitespace.
std::pair<size_t, size_t> Core(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && IsSpace(s[b])) ++b;
  while (e > b && IsSpace(s[e - 1])) --e;
  return {b, e};
}

}  // namespace

ReplyMatch MatchReply(const Tokenizer& tok, int32_t prev, std::span<const int32_t> reply_tokens,
                      std::string_view reply_text, const ChatAppend& a) {
  const std::string x = a.text();
  // Exact: each token's text (a control token's as its text) at its place in the rendering.
  ReplyMatch exact{ReplyMatch::Kind::kEdited, 0, 0};
  int32_t p = prev;
  for (const int32_t id : reply_tokens) {
    const std::string piece = tok.DecodePiece(p, id, /*special=*/true);
    if (x.compare(exact.text_used, piece.size(), piece) != 0) break;
    exact.text_used += piece.size();
    exact.keep++;
    p = id;
  }
  if (exact.keep == reply_tokens.size()) {
    exact.kind = ReplyMatch::Kind::kExact;
    return exact;
  }
  // Whitespace: the reply the client got is the template's reply once both are stripped.
  const std::string r = a.reply_prefix + a.reply;
  const auto [gb, ge] = Core(reply_text);
  const auto [rb, re] = Core(r);
  if (reply_text.substr(gb, ge - gb) != std::string_view(r).substr(rb, re - rb)) return exact;
  // Keep the tokens whose visible text (what the client got) ends at or before the reply's last
  // visible character, up to the last one that shows text: control tokens inside the reply stay,
  // trailing whitespace, stop-string and control tokens go.
  ReplyMatch ws{ReplyMatch::Kind::kWhitespace, 0, 0};
  size_t visible = 0, kept_visible = 0;
  p = prev;
  for (size_t i = 0; i < reply_tokens.size(); ++i) {
    const std::string piece = tok.DecodePiece(p, reply_tokens[i], /*special=*/false);
    if (visible + piece.size() > ge || reply_text.compare(visible, piece.size(), piece) != 0) break;
    visible += piece.size();
    p = reply_tokens[i];
    if (!piece.empty()) {
      ws.keep = i + 1;
      kept_visible = visible;
    }
  }
  if (kept_visible > gb) {
    ws.text_used = rb + (kept_visible - gb);  // the client's leading whitespace stands for the template's
  } else {
    ws.keep = 0;  // nothing of the reply's text is kept
  }
  if (exact.keep > ws.keep) {  // the exact prefix reaches further (e.g. a newline that the tail starts with)
    ws.keep = exact.keep;
    ws.text_used = exact.text_used;
  }
  return ws;
}

std::optional<std::vector<int32_t>> ContinuationTokens(const Tokenizer& tok, std::string_view before,
                                                       std::string_view rest) {
  if (rest.empty()) return std::vector<int32_t>{};
  std::string run(before.substr(tok.RestartPoint(before)));
  const std::vector<int32_t> head = tok.Encode(run, /*add_special=*/false, /*parse_special=*/true);
  run.append(rest);
  std::vector<int32_t> whole = tok.Encode(run, /*add_special=*/false, /*parse_special=*/true);
  if (whole.size() < head.size() || !std::equal(head.begin(), head.end(), whole.begin())) return std::nullopt;
  whole.erase(whole.begin(), whole.begin() + static_cast<std::ptrdiff_t>(head.size()));
  return whole;
}

std::optional<AppendedTurn> AppendAfterReply(const Tokenizer& tok, std::string_view prompt, int32_t prev,
                                             std::span<const int32_t> reply_tokens, std::string_view reply_text,
                                             const ChatAppend& a) {
  AppendedTurn out;
  out.match = MatchReply(tok, prev, reply_tokens, reply_text, a);
  // Only the prompt's text from its restart point on matters (Tokenizer::RestartPoint: the restart
  // point of prompt + more text is at or after it, and lies at the same place in the suffix).
  prompt.remove_prefix(tok.RestartPoint(prompt));
  std::string whole(prompt);
  whole += a.text();
  for (size_t used : {out.match.text_used, size_t{0}}) {
    const size_t split = prompt.size() + used;
    auto tokens = ContinuationTokens(tok, std::string_view(whole).substr(0, split),
                                     std::string_view(whole).substr(split));
    if (tokens) {
      out.keep = used == out.match.text_used ? out.match.keep : 0;
      out.tokens = std::move(*tokens);
      return out;
    }
    if (out.match.text_used == 0) break;
  }
  return std::nullopt;
}

}  // namespace mnemo
