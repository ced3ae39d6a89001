// OpenAI's logprobs shapes from the engine's PositionLogprobs (sampling/sampler.h: the model's raw
// distribution), for chat completions, Responses and legacy completions.
//
// A token is reported by its piece (Tokenizer::TokenToPiece with control tokens' text): `token`
// is that piece as valid UTF-8 (a byte-fallback token that is part of a character reads U+FFFD),
// `bytes` its exact bytes. A logprob of -inf (a token the model gives no chance) is -9999.0, as
// OpenAI reports it (JSON has no infinity).
#pragma once

#include <nlohmann/json.hpp>
#include <span>
#include <vector>

#include "sampling/sampler.h"
#include "tokenizer/tokenizer.h"

namespace mnemo::http {

// One chat / Responses entry: {"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob",
// "bytes"}, ...]} (the alternatives the engine kept, most likely first).
nlohmann::json LogprobEntry(const Tokenizer& tok, const PositionLogprobs& p);

// Chat completions' choice `logprobs`: {"content": [entries], "refusal": null}.
nlohmann::json ChatLogprobs(const Tokenizer& tok, std::span<const PositionLogprobs> ps);

// Responses' output_text part `logprobs` (and a delta event's): [entries].
nlohmann::json ResponsesLogprobs(const Tokenizer& tok, std::span<const PositionLogprobs> ps);

// Legacy completions' choice `logprobs`: {"tokens", "token_logprobs", "top_logprobs" (one
// {piece: logprob} object per token), "text_offset"}; text_offset counts bytes from the start of
// the completion's text, starting at `offset` (what earlier stream chunks covered).
nlohmann::json CompletionLogprobs(const Tokenizer& tok, std::span<const PositionLogprobs> ps,
                                  size_t offset = 0);
// The bytes the pieces of ps span (to carry text_offset across stream chunks).
size_t PiecesBytes(const Tokenizer& tok, std::span<const PositionLogprobs> ps);

}  // namespace mnemo::http
