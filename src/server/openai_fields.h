// OpenAI request members mnemo knows but does not act on (or acts on outside the generation
// parameters): each is accepted with its neutral value and refused with a clear 400
// unsupported_parameter (naming it) otherwise, so a client never gets an output that silently
// ignores what it asked for. Unknown members stay a 400 from CheckFields.
//
// Accepted and ignored (no effect on the output; docs/api.md): prompt_cache_key (mnemo matches
// prompt prefixes itself), safety_identifier, reasoning_effort / reasoning, verbosity, prediction
// (a speed hint), service_tier, user, metadata on chat. Implemented here: logit_bias, and which
// logprobs a turn reports (TurnRequest::logprobs).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>

#include "server/service.h"

namespace mnemo::http {

enum class Endpoint : uint8_t { kChat, kCompletions, kResponses };

// Checks the known-but-neutral members of `body` for `ep`, applies logit_bias to req->sampling
// (token ids checked against n_vocab) and sets req->logprobs. Call after CheckFields.
std::optional<ApiError> ParseKnownFields(const nlohmann::json& body, Endpoint ep, int n_vocab, TurnRequest* req);

}  // namespace mnemo::http
