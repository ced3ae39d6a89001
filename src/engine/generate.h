// Single-sequence generation: prefill a prompt in chunks, then decode token by token, with
// sampling, stop tokens and stop strings. The multi-session engine loop builds on the same steps;
// this is what `mnemo generate` and the engine benchmark drive.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "engine/request.h"
#include "kv/kv_storage.h"
#include "model/model.h"
#include "sampling/sampler.h"
#include "tokenizer/tokenizer.h"

namespace mnemo {

struct GenerateRequest {
  std::vector<int32_t> prompt;       // token ids, BOS included if wanted
  int max_tokens = 128;              // generated tokens at most (clamped to the context)
  SamplingParams sampling;           // greedy when temperature == 0
  std::vector<std::string> stop;     // stop strings (not emitted)
  std::vector<int32_t> stop_tokens;  // extra stop token ids (EOS/EOG always stop unless ignore_eos)
  bool ignore_eos = false;           // keep going past EOS / end-of-generation tokens
  int prefill_chunk = 512;           // prompt tokens per forward step
};

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated ids, the stop token included if one was sampled
  std::string text;             // generated text, stop string and what follows removed
  FinishReason finish_reason = FinishReason::kLength;  // kStop (stop token or string) or kLength
  double prefill_seconds = 0;   // wall time of the prompt's forward steps
  double decode_seconds = 0;    // wall time of the generation steps
};

class Generator {
 public:
  // model and tokenizer must outlive the Generator. The KV pool holds `max_context` positions.
  Generator(Model& model, const Tokenizer& tokenizer, DType kv_dtype, int max_context);

  // on_text receives generated text as soon as it is final (UTF-8 complete, not part of a stop).
  Result<GenerateResult> Generate(const GenerateRequest& req,
                                  const std::function<void(std::string_view)>& on_text = {});

 private:
  Model& model_;
  const Tokenizer& tok_;
  int max_context_;
  KvStorage kv_;
};

}  // namespace mnemo
