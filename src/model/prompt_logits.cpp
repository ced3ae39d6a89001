#include "model/prompt_logits.h"

#include <numeric>

#include "base/block.h"

namespace mnemo {

Result<std::vector<float>> PromptLogits(Model& model, const std::vector<int32_t>& tokens, bool all_positions,
                                        DType kv_dtype) {
  const ModelConfig& c = model.config();
  const int n = static_cast<int>(tokens.size());
  if (n == 0) return MakeError("the prompt has no tokens");
  if (n > c.context_length) return MakeError("the prompt has %d tokens, the model's context is %d", n, c.context_length);
  for (int32_t t : tokens) {
    if (t < 0 || t >= c.vocab_size) return MakeError("token id %d is outside the vocabulary [0, %d)", t, c.vocab_size);
  }
  const int n_blocks = BlocksFor(n);
  KvStorage kv(model.kv_shape(kv_dtype), n_blocks);
  std::vector<int32_t> pos(n);  // [n] positions 0..n-1
  std::iota(pos.begin(), pos.end(), 0);
  Batch b;
  const int s = b.Add(tokens.data(), pos.data(), n, all_positions);
  b.seqs[s].block_table.resize(n_blocks);  // [n_blocks] blocks 0..n_blocks-1 of the private pool
  std::iota(b.seqs[s].block_table.begin(), b.seqs[s].block_table.end(), 0);
  b.seqs[s].n_ctx = n;
  std::vector<float> logits;
  model.Forward(b, kv, logits);
  return logits;
}

}  // namespace mnemo
