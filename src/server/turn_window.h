// A conversation's messages summarised for the next turn: what rendering the text after a reply
// needs, kept in O(one turn) instead of the whole history.
//
// The chat template renders a conversation M; a turn appends after its reply M[r] (r = the prompt's
// message count) the text a = ChatTemplate::RenderAppend(M, r). Rendering M costs O(history) per
// turn. Most templates render the text after a reply from the messages near it, the first
// messages (system prompt, first user turn) and the index parity (Llama 2 checks that roles
// alternate by position) alone. For those, RenderAppend over a window
//   W = M[0, h) + M[d, n)      (h = HeadSize: leading system messages and the first other one;
//                               d = one or two messages before the reply, (d - h) even)
// gives the same split. Whether a template is one of those is checked once, by comparing both on
// probe conversations (TemplateRendersWindows); the server then renders windows for turns that
// continue a session's latest turn, and the whole conversation otherwise.
//
// A prompt's identity is a chained XXH3-128 hash over its messages (roles and contents), so that a
// client resending the whole history (stateless chat) finds the session whose latest prompt it
// extends with one pass over the bytes (no rendering), and a turn continued from its window extends
// the hash with the new messages only.
//
// Thread safety: pure functions and values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "chat/chat_template.h"

namespace mnemo {

struct MessageHash {
  uint64_t lo = 0, hi = 0;
  bool operator==(const MessageHash& o) const { return lo == o.lo && hi == o.hi; }
  std::string Hex() const;  // 32 hex digits
};

// hash(M[0, k + 1)) = XXH3-128(hash(M[0, k)) ++ role ++ '\0' ++ content). Cost: O(bytes).
MessageHash ExtendHash(MessageHash h, const ChatMessage& m);
MessageHash HashMessages(std::span<const ChatMessage> m, MessageHash h = {});

// Leading system messages + 1 (the first other message), at most `limit`.
size_t HeadSize(std::span<const ChatMessage> m, size_t limit);

// The window of a turn's prompt M[0, n) (the messages rendered with the generation prompt).
struct TurnWindow {
  MessageHash prompt_hash;          // HashMessages(M[0, n))
  size_t n = 0;                     // messages in the prompt
  std::vector<ChatMessage> head;    // M[0, h), h = HeadSize(M, n)
  std::vector<ChatMessage> recent;  // M[max(h, n - 2), n)
};

// The window of a whole prompt. Cost: hashing it, O(bytes); copies one turn.
TurnWindow WindowOfPrompt(std::span<const ChatMessage> prompt);
// The window of the next prompt, M + reply + more, from M's window. Cost: O(reply + more).
TurnWindow ExtendWindow(const TurnWindow& w, const ChatMessage& reply, std::span<const ChatMessage> more);

// The messages to render for M + reply + more instead of the whole (see the header comment), and
// *n_old, the reply's index in them.
std::vector<ChatMessage> WindowMessages(const TurnWindow& w, const ChatMessage& reply, std::span<const ChatMessage> more,
                                        size_t* n_old);

// Whether RenderAppend over windows agrees with RenderAppend over whole conversations for this
// template: probe conversations with and without a system prompt, 1 to 6 exchanges, one or two new
// messages, compared field by field (both failing counts as agreeing: the server then renders
// whole). Templates that call strftime_now are refused (the date may change between two turns and
// alter the prefix, which only a whole rendering notices). Cost: about 150 small renders.
bool TemplateRendersWindows(const ChatTemplate& t);

}  // namespace mnemo
