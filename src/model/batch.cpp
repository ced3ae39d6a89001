#include "model/batch.h"

namespace mnemo {

int Batch::Add(const int32_t* toks, const int32_t* pos, int n, bool all_logits) {
  BatchSeq s;
  s.q_begin = n_tokens();
  s.n_q = n;
  s.all_logits = all_logits;
  tokens.insert(tokens.end(), toks, toks + n);
  positions.insert(positions.end(), pos, pos + n);
  seqs.push_back(std::move(s));
  return static_cast<int>(seqs.size()) - 1;
}

int Batch::n_logit_rows() const {
  int r = 0;
  for (const auto& s : seqs) r += s.all_logits ? s.n_q : s.logits ? 1 : 0;
  return r;
}

}  // namespace mnemo
