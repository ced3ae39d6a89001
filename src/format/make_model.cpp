#include "format/make_model.h"

#include <cstring>

#include "base/rng.h"
#include "format/gguf.h"
#include "format/gguf_writer.h"

namespace mnemo {
namespace {

// Elements generated from one Rng stream. A multiple of 32 (whole Q8_0 blocks), and the unit of
// parallel work: each chunk has its own seed, so the output does not depend on the thread count.
constexpr int64_t kChunk = 1 << 16;
// Chunks generated per write (about 16 MB of f32 scratch).
constexpr int64_t kChunksPerBatch = 64;

uint64_t Mix(uint64_t a, uint64_t b) {
  uint64_t z = a ^ (b + 0x9e3779b97f4a7c15ull + (a << 6) + (a >> 2));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

struct Plan {
  std::string name;
  int64_t rows, cols;  // row-major [rows, cols]
  bool norm;           // f32 ones
};

std::vector<Plan> TensorPlan(const LlamaConfig& c) {
  const int64_t dim = c.dim, q = int64_t(c.n_heads) * c.head_dim, kv = int64_t(c.n_kv_heads) * c.head_dim;
  std::vector<Plan> p = {{"token_embd.weight", c.vocab_size, dim, false}, {"output_norm.weight", 1, dim, true}};
  if (!c.tied_output) p.push_back({"output.weight", c.vocab_size, dim, false});
  for (int l = 0; l < c.n_layers; l++) {
    std::string b = "blk." + std::to_string(l) + ".";
    p.push_back({b + "attn_norm.weight", 1, dim, true});
    p.push_back({b + "attn_q.weight", q, dim, false});
    p.push_back({b + "attn_k.weight", kv, dim, false});
    p.push_back({b + "attn_v.weight", kv, dim, false});
    p.push_back({b + "attn_output.weight", dim, q, false});
    p.push_back({b + "ffn_norm.weight", 1, dim, true});
    p.push_back({b + "ffn_gate.weight", c.ffn_dim, dim, false});
    p.push_back({b + "ffn_up.weight", c.ffn_dim, dim, false});
    p.push_back({b + "ffn_down.weight", dim, c.ffn_dim, false});
  }
  return p;
}

// Generates one tensor's values chunk by chunk, converts them and appends them to the writer.
Status WriteTensor(gguf::GgufWriter& w, const Plan& t, DType dtype, uint64_t seed, float stdev) {
  const int64_t n = t.rows * t.cols;
  std::vector<float> f32(size_t(std::min(n, kChunk * kChunksPerBatch)));
  std::vector<uint8_t> out(DTypeBytes(dtype, f32.size()));
  for (int64_t start = 0; start < n; start += int64_t(f32.size())) {
    const int64_t len = std::min<int64_t>(int64_t(f32.size()), n - start);
    if (t.norm) {
      std::fill(f32.begin(), f32.begin() + len, 1.0f);
      MNEMO_TRY(w.Append(f32.data(), size_t(len) * 4));
      continue;
    }
    const int64_t n_chunks = (len + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static)
    for (int64_t k = 0; k < n_chunks; k++) {
      const int64_t c0 = k * kChunk, c1 = std::min(len, c0 + kChunk);
      Rng rng(Mix(seed, uint64_t(start + c0) / kChunk));
      for (int64_t i = c0; i < c1; i++) f32[size_t(i)] = float(rng.Normal()) * stdev;
      FromF32(dtype, f32.data() + c0, out.data() + DTypeBytes(dtype, size_t(c0)), size_t(c1 - c0));
    }
    MNEMO_TRY(w.Append(out.data(), DTypeBytes(dtype, size_t(len))));
  }
  return Status::Ok();
}

}  // namespace

std::vector<std::string> PresetNames() { return {"llama-25m", "llama-110m", "llama-1b"}; }

Result<LlamaConfig> PresetConfig(const std::string& name) {
  LlamaConfig c;
  c.vocab_size = 32000;
  c.context_length = 2048;
  c.rope_theta = 10000.f;
  c.rms_eps = 1e-5f;
  c.tied_output = false;
  if (name == "llama-25m") {
    c.dim = 384, c.n_layers = 6, c.n_heads = 6, c.n_kv_heads = 2, c.ffn_dim = 1024;
  } else if (name == "llama-110m") {
    c.dim = 768, c.n_layers = 12, c.n_heads = 12, c.n_kv_heads = 4, c.ffn_dim = 2048;
  } else if (name == "llama-1b") {
    c.dim = 2048, c.n_layers = 22, c.n_heads = 32, c.n_kv_heads = 4, c.ffn_dim = 5632;
  } else {
    return MakeError("unknown model preset '%s' (llama-25m, llama-110m, llama-1b)", name.c_str());
  }
  c.head_dim = c.dim / c.n_heads;
  c.rope_dims = c.head_dim;
  return c;
}

uint32_t GgmlFileType(DType t) {
  switch (t) {
    case DType::F32: return 0;
    case DType::F16: return 1;
    case DType::Q8_0: return 7;
    case DType::BF16: return 32;
  }
  return 0;
}

Status MakeModel(const MakeModelOptions& opt) {
  LlamaConfig c;
  std::string name = opt.name;
  if (opt.config) {
    c = *opt.config;
    if (name.empty()) name = "custom";
  } else {
    auto p = PresetConfig(opt.preset);
    if (!p) return p.error();
    c = *p;
    if (name.empty()) name = opt.preset;
  }
  if (c.dim <= 0 || c.n_layers <= 0 || c.n_heads <= 0 || c.n_kv_heads <= 0 || c.head_dim <= 0 || c.ffn_dim <= 0 ||
      c.vocab_size <= 0 || c.n_heads % c.n_kv_heads != 0 || c.rope_dims <= 0 || c.rope_dims > c.head_dim) {
    return MakeError("make-model: invalid config");
  }
  if (opt.dtype == DType::Q8_0 &&
      (c.dim % kQ8Block != 0 || c.ffn_dim % kQ8Block != 0 || (c.n_heads * c.head_dim) % kQ8Block != 0)) {
    return MakeError("make-model: q8_0 needs dim, ffn_dim and n_heads * head_dim to be multiples of 32");
  }
  if (opt.output_path.empty()) return MakeError("make-model: no output path");

  auto vocab = gguf::GgufFile::Open(opt.vocab_path);
  if (!vocab) return vocab.error();
  auto n_tokens = vocab->GetArrayLength("tokenizer.ggml.tokens");
  if (!n_tokens) return MakeError("%s: %s", opt.vocab_path.c_str(), n_tokens.error().message.c_str());
  if (*n_tokens != uint64_t(c.vocab_size)) {
    return MakeError("make-model: %s has %llu tokens, the model needs %d", opt.vocab_path.c_str(),
                     (unsigned long long)*n_tokens, c.vocab_size);
  }

  gguf::GgufWriter w(32);
  w.AddString("general.architecture", "llama");
  w.AddString("general.name", name);
  w.AddU32("general.file_type", GgmlFileType(opt.dtype));
  w.AddU32("general.alignment", 32);
  w.AddU32("llama.context_length", uint32_t(c.context_length));
  w.AddU32("llama.embedding_length", uint32_t(c.dim));
  w.AddU32("llama.block_count", uint32_t(c.n_layers));
  w.AddU32("llama.feed_forward_length", uint32_t(c.ffn_dim));
  w.AddU32("llama.rope.dimension_count", uint32_t(c.rope_dims));
  w.AddU32("llama.attention.head_count", uint32_t(c.n_heads));
  w.AddU32("llama.attention.head_count_kv", uint32_t(c.n_kv_heads));
  if (c.head_dim * c.n_heads != c.dim) {
    w.AddU32("llama.attention.key_length", uint32_t(c.head_dim));
    w.AddU32("llama.attention.value_length", uint32_t(c.head_dim));
  }
  w.AddF32("llama.attention.layer_norm_rms_epsilon", c.rms_eps);
  w.AddF32("llama.rope.freq_base", c.rope_theta);
  w.AddU32("llama.vocab_size", uint32_t(c.vocab_size));
  for (const auto& kv : vocab->metadata()) {
    if (kv.key.substr(0, 10) == "tokenizer.") w.AddValue(std::string(kv.key), kv.value);
  }

  std::vector<Plan> plan = TensorPlan(c);
  for (const Plan& t : plan) {
    uint32_t type = t.norm ? gguf::kGgmlF32 : gguf::DTypeToGgml(opt.dtype);
    std::vector<int64_t> dims = t.norm ? std::vector<int64_t>{t.cols} : std::vector<int64_t>{t.cols, t.rows};
    w.AddTensor(t.name, dims, type);
  }
  MNEMO_TRY(w.Begin(opt.output_path));
  for (size_t k = 0; k < plan.size(); k++) {
    MNEMO_TRY(WriteTensor(w, plan[k], plan[k].norm ? DType::F32 : opt.dtype, Mix(opt.seed, k), opt.weight_std));
  }
  return w.Finish();
}

}  // namespace mnemo
