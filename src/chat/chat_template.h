// Chat prompts from OpenAI-style messages with the model's chat template (GGUF
// `tokenizer.chat_template`, a Hugging Face Jinja template), rendered whole or incrementally.
//
// Rendering context, as transformers' apply_chat_template gives it: `messages` (a list of
// {"role", "content"} dicts), `bos_token`, `eos_token`, `add_generation_prompt`, the functions
// `raise_exception(msg)` and `strftime_now(format)`, plus optional extra variables (e.g. `tools`).
//
// Incremental rendering (the server keeps each conversation's tokens and appends only new turns):
//   turn 1:  prompt = Render(history[0..n_old), /*add_generation_prompt=*/true)
//            log = Encode(prompt); the model then generates the reply tokens G (text g), stopping
//            at an end-of-generation token E (e.g. <|im_end|>, <|eot_id|>, </s>).
//   turn 2:  the client sends history = old messages + {assistant: g} + new messages.
//            a = RenderAppend(history, n_old, true) gives a decomposition of the full rendering:
//              Render(history, true) == prompt + a.reply_prefix + a.reply + a.tail
//            a.reply_prefix + a.reply is what the template wants the model to have generated
//            (e.g. Llama 2: " " + content.strip(); ChatML: content); a.tail starts with the
//            end-of-turn markers that close the reply (e.g. "<|im_end|>\n", " </s>") and ends with
//            the new generation prompt.
//   If RenderAppend fails, the template is not prefix-stable for this conversation (e.g. Mistral
//   v0.3 moves the system prompt into the last user turn, so older turns change): re-render all.
//   If a.reply_prefix + a.reply differs from g (e.g. the template strips the reply and the model
//   ended with a newline), the log differs from a fresh rendering inside the reply: either accept
//   that (the model sees its own tokens) or re-render all. mnemo serve accepts it, cutting only
//   what the template does not render after the reply (src/server/turn_append.h).
//   Otherwise append the tokens of a.tail. If the log already holds E (it was fed back to the
//   model) and a.tail starts with E's text, drop that text from a.tail first.
//   Token-level rule (SentencePiece "llama" vocab; asserted in tests/chat/chat_tokens_test.cpp):
//   - tokenize with parse_special = true, and add_special = false when renders_bos() (Llama 2
//     renders "<s>" itself; add_special would give two BOS); never add_special on appended pieces.
//   - Encode(a) + Encode(b) == Encode(a + b) when b starts with a control token's text (SPM puts
//     its dummy-prefix space at the start of every input and after every control token, and
//     merges never cross one); anywhere else b gets a spurious leading "▁".
//   - ChatML, Llama 3, Gemma, Phi-3 and Mistral tails start with an end-of-turn control token
//     (<|im_end|>, <|eot_id|>, <end_of_turn>, <|end|>, </s>), so Encode(a.tail) appends exactly
//     (by the rule above; only the Llama 2 vocab is in shared/ to test with). Llama 2's tail
//     starts with " </s>": the space ends the reply's raw run (Meta's reference code formats a
//     reply as "answer " + EOS). If the model generated that space, append Encode(tail minus the
//     space); else append the space as a continuation of the run: Encode(run + " ") minus
//     Encode(run), run = the text since the last control token (one turn); then the rest. The
//     old prompt's tokens stay a prefix of the longer text's tokens. One exception found: a
//     blank reply makes the two spaces one piece "▁▁" (the continuation check fails):
//     re-tokenize that turn.
//
// Thread safety: immutable after Create (or after WithFixedTime); Render may run on many threads.
#pragma once

#include <cstddef>
#include <ctime>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"
#include "chat/jinja.h"

namespace mnemo {

// A function call an assistant message made (OpenAI `tool_calls[i]`, Responses `function_call`).
struct ChatToolCall {
  std::string id;         // "call_..." (the client's id, echoed in the tool result's tool_call_id)
  std::string name;       // function name
  std::string arguments;  // JSON text, exactly as generated or sent (templates get it parsed)
};

struct ChatMessage {
  ChatMessage() = default;
  ChatMessage(std::string r, std::string c) : role(std::move(r)), content(std::move(c)) {}
  std::string role;     // "system", "user", "assistant", "tool", ...
  std::string content;  // text; a message with content parts is flattened by the caller
  std::vector<ChatToolCall> tool_calls;  // assistant: the calls it made (templates: message.tool_calls)
  std::string tool_call_id;              // tool: the call this result answers
  std::string name;                      // tool: that call's function name ("" if unknown)
};

// Everything the full rendering adds after the rendering of history[0..n_old) with a generation
// prompt: text() == reply_prefix + reply + tail.
struct ChatAppend {
  std::string reply_prefix;  // template text before the reply content (Llama 2, Mistral v0.3: " ")
  std::string reply;         // history[n_old].content as rendered (possibly stripped); "" if none
  std::string tail;          // after the reply: end-of-turn markers, new turns, generation prompt
  std::string text() const { return reply_prefix + reply + tail; }
};

class ChatTemplate {
 public:
  // Parses `source` (Jinja). bos_token / eos_token: the vocab's BOS / EOS texts (e.g. "<s>",
  // "</s>"), given to the template as variables. Errors: template syntax errors, unsupported tags.
  static Result<ChatTemplate> Create(std::string source, std::string bos_token, std::string eos_token);

  // For models without a template (e.g. stories260K). A plain transcript, no special tokens
  // (tokenize the first piece with add_special = true to get BOS):
  //   "System: {system}\n\nUser: {user}\n\nAssistant: {reply}\n\nUser: {user}\n\nAssistant:"
  // Each message renders as "{Role}: {content | trim}\n\n" (role capitalized: System, User,
  // Assistant, Tool, ...); the generation prompt is "Assistant:" without the space, so the reply
  // text is " {content}" (reply_prefix " "), as an SPM model generates a word with its leading
  // space; a reply echoed back with that space (or without it) renders the same.
  static ChatTemplate Fallback();

  // Makes strftime_now() return this UTC time instead of the current local time (for tests and
  // reproducible prompts). Call before sharing the template between threads.
  ChatTemplate& WithFixedTime(std::time_t t);

  // Renders the whole conversation. extra: more variables for the template (e.g. "tools").
  Result<std::string> Render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                             const jinja::Dict* extra = nullptr) const;

  // The text to append after Render(history[0..n_old), true) to get Render(history,
  // add_generation_prompt), split around the reply history[n_old] when it is an assistant message.
  // Computed from full renderings (cost: three renders), checked: old rendering is a prefix, the
  // reply appears exactly once. Errors: n_old > history.size(), rendering errors, and "not
  // prefix-stable" when the template renders the older turns differently once more turns follow.
  // n_old == 0 gives tail = the whole rendering.
  Result<ChatAppend> RenderAppend(const std::vector<ChatMessage>& history, size_t n_old, bool add_generation_prompt,
                                  const jinja::Dict* extra = nullptr) const;

  // Template family for logs: "llama2", "llama3", "chatml", "mistral", "gemma", "phi3", "command-r",
  // "fallback" or "unknown" (detected from the markers in the source).
  const std::string& family() const { return family_; }
  const std::string& source() const { return template_.source(); }
  const std::string& bos_token() const { return bos_token_; }
  const std::string& eos_token() const { return eos_token_; }
  // Whether renderings start with bos_token (then tokenize them with add_special = false).
  bool renders_bos() const { return renders_bos_; }

 private:
  jinja::Value Context(const std::vector<ChatMessage>& messages, bool add_generation_prompt, const jinja::Dict* extra) const;

  jinja::Template template_;
  std::string bos_token_;
  std::string eos_token_;
  std::string family_;
  bool renders_bos_ = false;
  bool fixed_time_ = false;
  std::time_t time_ = 0;  // fixed strftime_now time (UTC) when fixed_time_
};

// Family name detected from a template's source (see ChatTemplate::family).
std::string DetectChatFamily(const std::string& source);

}  // namespace mnemo
