// Appending a chat turn to a session's exact token log, without re-tokenizing the history.
//
// A session's log holds the tokens the model actually saw: the rendered prompt of its last turn
// (text P) and then the reply tokens G the model generated, which the client got as text g. The
// next request renders as P + a.text() with a = ChatTemplate::RenderAppend(history, n_old, true)
// (a.reply_prefix + a.reply is the template's rendering of the reply g, a.tail closes it and adds
// the new turns). Re-tokenizing that text does not in general give back G (tokenization of
// detokenized text is not the identity: a model may spell a word in pieces, generate a control
// token the client never sees, or a stop string the client never gets; the template may trim or add
// whitespace around the reply), so a token-prefix match would diverge inside the reply. Instead:
//
//  1. MatchReply aligns G with the text the template renders after P. Exact: every token's text
//     (control tokens as their text) lies verbatim at its place in P + a.text(); the log is kept
//     whole and only the rest of the text is appended. Whitespace: the reply the client got and
//     the template's reply agree once leading and trailing whitespace is stripped; the tokens up to
//     the reply's last visible character are kept (the model sees its own reply, control tokens
//     within it included, with its own leading whitespace) and trailing whitespace, stop-string
//     and control tokens after it are cut. Edited: the client changed the reply; the longest
//     exactly aligned token prefix is kept (the caller forks there).
//  2. ContinuationTokens tokenizes the rest of the text as it tokenizes inside the whole text:
//     Encode(run + rest) minus Encode(run), where run is the text before it from its restart point on
//     (Tokenizer::RestartPoint: after a control token, see tests/chat/chat_tokens_test.cpp; for SPM
//     vocabs also before a word).
//     With generated tokens that are the canonical ones, log + appended == Encode(whole rendering).
//
// Thread safety: pure functions of their arguments.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "chat/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace mnemo {

struct ReplyMatch {
  enum class Kind {
    kExact,       // all reply tokens are kept; the text is exactly the template's
    kWhitespace,  // the reply is the client's, up to whitespace around it; `keep` tokens are kept
    kEdited,      // the client's reply differs; `keep` tokens agree exactly
  };
  Kind kind = Kind::kEdited;
  size_t keep = 0;       // reply tokens kept, a prefix of them
  size_t text_used = 0;  // bytes of a.text() that the kept tokens stand for: append a.text().substr(text_used)
};

// Aligns the reply tokens (prev: the log token before them) and the reply text the client got with
// the template's rendering of the next request. Cost: O(|reply_tokens| + |a.text()|).
ReplyMatch MatchReply(const Tokenizer& tok, int32_t prev, std::span<const int32_t> reply_tokens,
                      std::string_view reply_text, const ChatAppend& a);

// The tokens `rest` adds after `before` in the tokenization of before + rest (parse_special, no BOS
// or EOS added): Encode(run + rest) minus Encode(run), run = `before` from its restart point on
// (Tokenizer::RestartPoint: the last control token text, or for SPM vocabs a word start).
// nullopt when Encode(run) is not a prefix of Encode(run + rest) (the end of `before` is not a
// token boundary of the whole text). Cost: tokenizing run + rest twice (run: one turn's text or
// one word, not the history, when the template writes control tokens or the vocab restarts at words).
std::optional<std::vector<int32_t>> ContinuationTokens(const Tokenizer& tok, std::string_view before,
                                                       std::string_view rest);

// The whole step for a turn that follows a reply: MatchReply, then ContinuationTokens for the text
// after the kept tokens. When that text does not start at a token boundary (e.g. Llama 2's blank
// reply: "▁" then " </s>" tokenizes as "▁▁" "</s>" together), the reply's tokens are dropped and
// the text re-tokenized from the end of the prompt. nullopt when that fails too.
struct AppendedTurn {
  ReplyMatch match;             // how the reply aligned with the rendering
  size_t keep = 0;              // reply tokens kept: match.keep, or 0 after re-tokenizing the reply
  std::vector<int32_t> tokens;  // to append after them
};
// Cost: O(|a.text()| + reply) plus the prompt's text after its restart point.
std::optional<AppendedTurn> AppendAfterReply(const Tokenizer& tok, std::string_view prompt, int32_t prev,
                                             std::span<const int32_t> reply_tokens, std::string_view reply_text,
                                             const ChatAppend& a);

}  // namespace mnemo
