// Helpers for model tests: load stories260K, run sequences through the paged forward pass.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/block.h"
#include "base/rng.h"
#include "format/model_file.h"
#include "model/model.h"

namespace mnemo::testing {

inline std::string SharedPath(const std::string& rel) { return std::string(MNEMO_SHARED_DIR) + "/" + rel; }

inline std::vector<nlohmann::json> ReadJsonl(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  std::vector<nlohmann::json> out;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  }
  return out;
}

// A model with its file kept alive.
struct Loaded {
  std::unique_ptr<ModelFile> file;
  std::unique_ptr<Model> model;
};

inline Loaded Load(const std::string& model_rel, const std::string& tok_rel, kernels::Precision p) {
  auto f = ModelFile::Open(SharedPath(model_rel), tok_rel.empty() ? "" : SharedPath(tok_rel));
  EXPECT_TRUE(f.ok()) << (f.ok() ? "" : f.error().message);
  Loaded l;
  l.file = std::make_unique<ModelFile>(std::move(f.value()));
  auto m = Model::Create(*l.file, ModelOptions{p});
  EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.error().message);
  l.model = std::move(m.value());
  return l;
}

// One sequence's KV bookkeeping over a pool whose free blocks are handed out in a given order.
struct Seq {
  std::vector<int32_t> table;  // block ids by position / 32
  int n_ctx = 0;               // positions written so far
};

// Hands out block ids in a shuffled order (scattered) or in order (contiguous).
class Blocks {
 public:
  Blocks(int n, bool scattered, uint64_t seed) : ids_(n) {
    std::iota(ids_.begin(), ids_.end(), 0);
    if (scattered) {
      Rng rng(seed);
      for (int i = n - 1; i > 0; i--) std::swap(ids_[i], ids_[rng.Next() % (i + 1)]);
    }
  }
  void Grow(Seq& s, int n_ctx) {
    while (int(s.table.size()) * kBlockTokens < n_ctx) s.table.push_back(ids_.at(next_++));
  }

 private:
  std::vector<int32_t> ids_;
  size_t next_ = 0;
};

// Feeds tokens[from, to) of a sequence as one batch entry; returns logits [to - from, vocab].
inline std::vector<float> Step(Model& m, KvStorage& kv, Blocks& blocks, Seq& s,
                               const std::vector<int32_t>& tokens, int from, int to) {
  Batch b;
  std::vector<int32_t> pos(to - from);
  std::iota(pos.begin(), pos.end(), from);
  int i = b.Add(tokens.data() + from, pos.data(), to - from, true);
  s.n_ctx = std::max(s.n_ctx, to);
  blocks.Grow(s, s.n_ctx);
  b.seqs[i].block_table = s.table;
  b.seqs[i].n_ctx = s.n_ctx;
  std::vector<float> logits;
  m.Forward(b, kv, logits);
  return logits;
}

inline int ArgMax(const float* x, int n) { return int(std::max_element(x, x + n) - x); }

}  // namespace mnemo::testing
