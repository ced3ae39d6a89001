// The work done on one fuzz input, shared by the gtest mutation fuzzer and the libFuzzer target:
// parse, and when parsing succeeds, touch everything the parse handed out (every tensor byte
// range, every value, the vocab and the model view), so that a bad bound shows up under ASan.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "format/gguf.h"
#include "format/gguf_vocab.h"
#include "format/model_file.h"

namespace mnemo::test {

// Returns true when the input parsed as GGUF. Never crashes on any input (that is the property).
inline bool ExerciseGguf(const uint8_t* data, size_t size) {
  auto f = gguf::GgufFile::FromBytes(data, size);
  if (!f.ok()) {
    if (f.error().message.empty()) __builtin_trap();  // an error must say something
    return false;
  }
  volatile uint8_t sink = 0;
  for (const auto& t : f->tensors()) {
    if (t.nbytes > 0) {
      auto* p = static_cast<const uint8_t*>(t.data);
      sink = sink + p[0] + p[t.nbytes - 1];
    }
  }
  size_t chars = 0;
  for (const auto& kv : f->metadata()) chars += kv.value.ToString().size() + kv.key.size();
  sink = sink + uint8_t(chars);
  auto vocab = gguf::ReadVocab(*f);
  if (vocab.ok()) sink = sink + uint8_t(vocab->tokens.size());
  auto m = ModelFile::FromGguf(std::move(f).value());
  if (m.ok()) {
    const ModelWeights& w = m->weights();
    std::vector<float> row;
    auto touch = [&](const TensorRef& r) {
      auto* p = static_cast<const uint8_t*>(r.data);
      sink = sink + p[0] + p[r.bytes() - 1];
      // Decode the first and last rows: every dtype ModelFile accepts must decode whole rows.
      row.resize(size_t(r.cols));
      ToF32(r.dtype, p, row.data(), row.size());
      ToF32(r.dtype, p + (r.rows - 1) * int64_t(DTypeBytes(r.dtype, size_t(r.cols))), row.data(), row.size());
      sink = sink + uint8_t(row[0] != 0);
    };
    touch(w.tok_embd);
    touch(w.output);
    for (const auto& l : w.layers) {
      for (const TensorRef* r : {&l.attn_norm, &l.wq, &l.wk, &l.wv, &l.wqkv, &l.bq, &l.bk, &l.bv, &l.q_norm, &l.k_norm,
                                 &l.wo, &l.attn_post_norm, &l.ffn_norm, &l.gate, &l.up, &l.down, &l.ffn_post_norm}) {
        if (r->present()) touch(*r);
      }
    }
  }
  return true;
}

}  // namespace mnemo::test
