// Logits of one prompt, computed in one forward step over a private KV pool: the `mnemo logits`
// command and the golden tests against llama.cpp use it (no engine, no cache in between).
#pragma once

#include <cstdint>
#include <vector>

#include "base/dtype.h"
#include "base/status.h"
#include "model/model.h"

namespace mnemo {

// Runs tokens (positions 0..n-1) through `model` with a KV pool of `kv_dtype`. Returns the last
// position's logits [vocab], or with all_positions every position's [n, vocab]. An empty prompt or
// one longer than the model's context is an error. Cost: one prefill of n tokens; the pool
// (n rounded up to 32 positions, all layers) is allocated per call.
Result<std::vector<float>> PromptLogits(Model& model, const std::vector<int32_t>& tokens, bool all_positions,
                                        DType kv_dtype);

}  // namespace mnemo
