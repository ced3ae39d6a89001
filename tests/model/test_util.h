// Helpers for model tests: load stories260K, run sequences through the paged forward pass, compare
// logits with llama.cpp's (relative RMS), check the bytes of a generated file (sha256).
#pragma once

#include <gtest/gtest.h>
#include <openssl/evp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
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

// rms(got - ref) / rms(ref - mean(ref)): the bound of the golden tests against llama.cpp (issue 10).
inline double RelRms(const std::vector<float>& got, const std::vector<float>& ref) {
  double mean = 0;
  for (float r : ref) mean += r;
  mean /= double(ref.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); i++) {
    num += (double(got[i]) - ref[i]) * (double(got[i]) - ref[i]);
    den += (ref[i] - mean) * (ref[i] - mean);
  }
  return std::sqrt(num / den);
}

// Lower-case hex sha256 of a file's bytes (reads it whole: test models of a few MiB). Links
// OpenSSL::Crypto.
inline std::string Sha256Hex(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_Digest(bytes.data(), bytes.size(), md, &n, EVP_sha256(), nullptr);
  std::string hex;
  char buf[3];
  for (unsigned int i = 0; i < n; i++) {
    std::snprintf(buf, sizeof buf, "%02x", md[i]);
    hex += buf;
  }
  return hex;
}

}  // namespace mnemo::testing
