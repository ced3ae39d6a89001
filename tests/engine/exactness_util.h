// Shared by the engine's exactness tests: a greedy turn request and the check that an engine turn
// equals recomputation of the conversation from its raw tokens.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace mnemo::testing {

// What recomputation from raw tokens produced: the greedy tokens and the first step's logits.
struct Reference {
  std::vector<int32_t> tokens;
  std::vector<float> first_logits;  // [vocab]
};

// A greedy turn on session s that generates exactly max_tokens tokens and captures its logits.
inline TurnRequest Greedy(SessionId s, std::vector<int32_t> append, int max_tokens) {
  TurnRequest r;
  r.session = s;
  r.append = std::move(append);
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0;
  r.ignore_eos = true;
  r.capture_logits = true;
  return r;
}

// The turn ran to its length, generated the reference's tokens, and its first logits are within
// 1e-4 of the reference's (end-of-generation ids, masked to -inf by ignore_eos, are skipped).
inline void ExpectMatches(const TurnResult& got, const Reference& want, const std::string& what) {
  ASSERT_EQ(got.finish_reason, FinishReason::kLength) << what << " " << got.error.message;
  EXPECT_EQ(got.tokens, want.tokens) << what;
  ASSERT_EQ(got.first_logits.size(), want.first_logits.size()) << what;
  double d = 0;
  for (size_t i = 0; i < want.first_logits.size(); i++) {
    if (std::isinf(got.first_logits[i])) continue;
    d = std::max(d, double(std::fabs(got.first_logits[i] - want.first_logits[i])));
  }
  EXPECT_LE(d, 1e-4) << what;
}

}  // namespace mnemo::testing
