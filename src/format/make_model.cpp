#include "format/make_model.h"

#include <cmath>
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

// How a tensor's values are drawn.
enum class Fill {
  kMatrix,  // N(0, weight_std), in the file's dtype
  kNorm,    // f32 N(1, 0.2): visibly not all ones
  kBias,    // f32 N(0, 0.5): large enough to move every projection
  kValues,  // f32 given values (rope frequency factors)
};

struct Plan {
  std::string name;
  int64_t rows, cols;         // row-major [rows, cols]; vectors have rows 1 and GGUF dims [cols]
  Fill fill;
  std::vector<float> values;  // kValues: [cols]
};

// Llama 3's rope frequency factors (the published "llama3" rope scaling rule, as its converters
// bake it into rope_freqs.weight): pairs whose wavelength is short against the original context
// keep their frequency, long ones are slowed down by `factor`, with a smooth ramp in between.
std::vector<float> Llama3RopeFactors(int dims, float theta, float factor, float low, float high, int orig_ctx) {
  std::vector<float> f(dims / 2);
  const double low_wavelen = orig_ctx / low, high_wavelen = orig_ctx / high;
  for (int i = 0; i < dims / 2; i++) {
    const double freq = 1.0 / std::pow(double(theta), 2.0 * i / dims);
    const double wavelen = 2 * M_PI / freq;
    if (wavelen < high_wavelen) {
      f[i] = 1.f;
    } else if (wavelen > low_wavelen) {
      f[i] = factor;
    } else {
      const double smooth = (orig_ctx / wavelen - low) / (high - low);
      f[i] = float(1.0 / ((1 - smooth) / factor + smooth));
    }
  }
  return f;
}

// Gemma's values beyond the shape, per preset.
struct GemmaExtras {
  int window;            // attention.sliding_window (tokens)
  int period;            // every period-th layer is global (attention.sliding_window_pattern)
  float swa_theta;       // gemma3: rope.freq_base_swa of the local layers
  float attn_softcap;    // gemma2: attn_logit_softcapping
  float final_softcap;   // final_logit_softcapping (0: none, gemma3 only)
};

// Sets gemma's features and interleaved layers on c (after FillUniformLayers), as the GGUF loader
// reads them back (gguf_model.cpp).
void SetGemmaFeatures(const GemmaExtras& g, ModelConfig& c) {
  c.post_norms = true;
  c.ffn_act = FfnActivation::kGeluTanh;
  c.embed_scale = std::sqrt(float(c.dim));
  c.attn_scale = 1.0f / std::sqrt(float(c.head_dim));
  c.qk_norm = c.arch == Arch::kGemma3;
  c.attn_softcap = c.arch == Arch::kGemma2 ? g.attn_softcap : 0.f;
  c.final_softcap = g.final_softcap;
  for (int l = 0; l < c.n_layers; l++) {
    if (l % g.period == g.period - 1) continue;  // global
    c.layers[size_t(l)].sliding_window = g.window;
    if (c.arch == Arch::kGemma3) {
      c.layers[size_t(l)].rope.theta = g.swa_theta;
      c.layers[size_t(l)].rope.freq_scale = 1.f;
    }
  }
}

// Sets the features of an architecture on a shape (as the GGUF loader would read them back).
void SetArchFeatures(const std::string& arch, ModelConfig& c) {
  RopeConfig extra;
  c.arch = *ArchFromName(arch == "llama3" ? "llama" : arch);
  if (arch == "llama3") {
    // Llama 3.1/3.2's rule; tiny shapes use a short original context so that the ramp covers
    // pairs a short prompt can tell apart.
    const int orig = c.context_length >= 65536 ? 8192 : 32;
    extra.freq_factors = Llama3RopeFactors(c.rope_dims, c.rope_theta, 32.f, 1.f, 4.f, orig);
  } else if (arch == "qwen2") {
    c.rope_style = RopeStyle::kNeox;
    c.qkv_bias = true;
  } else if (arch == "qwen3") {
    c.rope_style = RopeStyle::kNeox;
    c.qk_norm = true;
  } else if (arch == "phi3") {
    // longrope: short factors below the original context, long ones past it, and the magnitude
    // factor Phi-3's converter derives from the context ratio.
    c.rope_style = RopeStyle::kNeox;
    c.rope_orig_context = c.context_length / 2;
    const int pairs = c.rope_dims / 2;
    extra.freq_factors.resize(pairs);
    c.rope_factors_long.resize(pairs);
    for (int i = 0; i < pairs; i++) {
      extra.freq_factors[i] = 1.f + 0.75f * float(i) / float(pairs) + 0.25f * std::sin(float(i));
      c.rope_factors_long[i] = 1.f + 15.f * float(i * i) / float(pairs * pairs);
    }
    const double scale = double(c.context_length) / c.rope_orig_context;
    extra.attn_factor = float(std::sqrt(1 + std::log(scale) / std::log(double(c.rope_orig_context))));
  } else if (arch == "gemma2" || arch == "gemma3") {
    c.rope_style = RopeStyle::kNeox;
  }
  FillUniformLayers(c, extra);
}

struct Shape {
  int dim, n_layers, n_heads, n_kv_heads, head_dim, ffn_dim, vocab, ctx;
  float theta, eps;
  bool tied;
};

ModelConfig FromShape(const Shape& s) {
  ModelConfig c;
  c.dim = s.dim, c.n_layers = s.n_layers, c.n_heads = s.n_heads, c.n_kv_heads = s.n_kv_heads;
  c.head_dim = s.head_dim, c.ffn_dim = s.ffn_dim, c.vocab_size = s.vocab, c.context_length = s.ctx;
  c.rope_dims = s.head_dim, c.rope_theta = s.theta, c.rms_eps = s.eps, c.tied_output = s.tied;
  return c;
}

struct PresetEntry {
  const char* arch;
  const char* name;
  Shape shape;
};

// Realistic shapes follow the published configs of the named models (vocab from the vocab file).
const PresetEntry kPresets[] = {
    {"llama", "tiny", {256, 2, 4, 2, 64, 768, 0, 512, 10000.f, 1e-5f, false}},
    {"llama", "small", {512, 4, 8, 4, 64, 1536, 0, 2048, 10000.f, 1e-5f, false}},
    {"llama", "llama-25m", {384, 6, 6, 2, 64, 1024, 32000, 2048, 10000.f, 1e-5f, false}},
    {"llama", "llama-110m", {768, 12, 12, 4, 64, 2048, 32000, 2048, 10000.f, 1e-5f, false}},
    {"llama", "llama-1b", {2048, 22, 32, 4, 64, 5632, 32000, 2048, 10000.f, 1e-5f, false}},
    {"llama3", "tiny", {256, 2, 4, 2, 64, 768, 0, 512, 500000.f, 1e-5f, true}},
    {"llama3", "small", {512, 4, 8, 2, 64, 1536, 0, 2048, 500000.f, 1e-5f, true}},
    {"llama3", "llama-3.2-1b", {2048, 16, 32, 8, 64, 8192, 0, 131072, 500000.f, 1e-5f, true}},
    {"qwen2", "tiny", {256, 2, 4, 2, 64, 768, 0, 512, 1000000.f, 1e-6f, true}},
    {"qwen2", "small", {512, 4, 8, 2, 64, 1536, 0, 2048, 1000000.f, 1e-6f, true}},
    {"qwen2", "qwen2.5-0.5b", {896, 24, 14, 2, 64, 4864, 0, 32768, 1000000.f, 1e-6f, true}},
    {"qwen3", "tiny", {256, 2, 4, 2, 128, 768, 0, 512, 1000000.f, 1e-6f, true}},
    {"qwen3", "small", {512, 4, 8, 4, 128, 1536, 0, 2048, 1000000.f, 1e-6f, true}},
    {"qwen3", "qwen3-0.6b", {1024, 28, 16, 8, 128, 3072, 0, 40960, 1000000.f, 1e-6f, true}},
    {"phi3", "tiny", {256, 2, 4, 2, 64, 768, 0, 1024, 10000.f, 1e-5f, false}},
    {"phi3", "small", {512, 4, 8, 8, 64, 1536, 0, 4096, 10000.f, 1e-5f, false}},
    {"phi3", "phi-3-mini", {3072, 32, 32, 32, 96, 8192, 0, 4096, 10000.f, 1e-5f, false}},
    {"gemma2", "tiny", {256, 4, 4, 2, 64, 768, 0, 512, 10000.f, 1e-6f, true}},
    {"gemma2", "small", {512, 4, 8, 4, 64, 1536, 0, 2048, 10000.f, 1e-6f, true}},
    {"gemma2", "gemma-2-2b", {2304, 26, 8, 4, 256, 9216, 0, 8192, 10000.f, 1e-6f, true}},
    {"gemma3", "tiny", {256, 4, 4, 2, 64, 768, 0, 512, 1000000.f, 1e-6f, true}},
    {"gemma3", "small", {512, 6, 8, 4, 64, 1536, 0, 2048, 1000000.f, 1e-6f, true}},
    {"gemma3", "gemma-3-1b", {1152, 26, 4, 1, 256, 6912, 0, 32768, 1000000.f, 1e-6f, true}},
};

// Windows and soft-caps of the gemma presets. Tiny ones: windows of at most 32 tokens that do not
// fall on a block boundary, a global layer every 2nd (gemma2) / 3rd (gemma3, written as
// sliding_window_pattern) layer, and soft-caps near the size of the scores and logits these
// random weights give (attention scores ~0.1, logits ~0.3 rms), so that they change them. The
// realistic ones follow the published configs.
struct GemmaPreset {
  const char* arch;
  const char* name;
  GemmaExtras extras;
};
const GemmaPreset kGemmaPresets[] = {
    {"gemma2", "tiny", {24, 2, 10000.f, 0.15f, 1.0f}},
    {"gemma2", "small", {64, 2, 10000.f, 0.3f, 2.0f}},
    {"gemma2", "gemma-2-2b", {4096, 2, 10000.f, 50.f, 30.f}},
    {"gemma3", "tiny", {20, 3, 20000.f, 0.f, 1.0f}},
    {"gemma3", "small", {48, 6, 10000.f, 0.f, 0.f}},
    {"gemma3", "gemma-3-1b", {512, 6, 10000.f, 0.f, 0.f}},
};

// The tensors of a config, in file order, named as llama.cpp names them.
std::vector<Plan> TensorPlan(const ModelConfig& c) {
  const int64_t dim = c.dim, q = c.q_dim(), kv = c.kv_dim(), ffn = c.ffn_dim;
  const bool fused = c.arch == Arch::kPhi3;  // phi3 files fuse Q/K/V and gate/up
  std::vector<Plan> p = {{"token_embd.weight", c.vocab_size, dim, Fill::kMatrix, {}},
                         {"output_norm.weight", 1, dim, Fill::kNorm, {}}};
  if (!c.tied_output) p.push_back({"output.weight", c.vocab_size, dim, Fill::kMatrix, {}});
  const RopeConfig& r = c.layers[0].rope;
  if (!c.rope_factors_long.empty()) {
    p.push_back({"rope_factors_long.weight", 1, int64_t(c.rope_factors_long.size()), Fill::kValues,
                 c.rope_factors_long});
    p.push_back({"rope_factors_short.weight", 1, int64_t(r.freq_factors.size()), Fill::kValues, r.freq_factors});
  } else if (!r.freq_factors.empty()) {
    p.push_back({"rope_freqs.weight", 1, int64_t(r.freq_factors.size()), Fill::kValues, r.freq_factors});
  }
  for (int l = 0; l < c.n_layers; l++) {
    std::string b = "blk." + std::to_string(l) + ".";
    p.push_back({b + "attn_norm.weight", 1, dim, Fill::kNorm, {}});
    if (fused) {
      p.push_back({b + "attn_qkv.weight", q + 2 * kv, dim, Fill::kMatrix, {}});
    } else {
      p.push_back({b + "attn_q.weight", q, dim, Fill::kMatrix, {}});
      p.push_back({b + "attn_k.weight", kv, dim, Fill::kMatrix, {}});
      p.push_back({b + "attn_v.weight", kv, dim, Fill::kMatrix, {}});
    }
    if (c.qkv_bias) {
      p.push_back({b + "attn_q.bias", 1, q, Fill::kBias, {}});
      p.push_back({b + "attn_k.bias", 1, kv, Fill::kBias, {}});
      p.push_back({b + "attn_v.bias", 1, kv, Fill::kBias, {}});
    }
    if (c.qk_norm) {
      p.push_back({b + "attn_q_norm.weight", 1, c.head_dim, Fill::kNorm, {}});
      p.push_back({b + "attn_k_norm.weight", 1, c.head_dim, Fill::kNorm, {}});
    }
    p.push_back({b + "attn_output.weight", dim, q, Fill::kMatrix, {}});
    if (c.post_norms) p.push_back({b + "post_attention_norm.weight", 1, dim, Fill::kNorm, {}});
    p.push_back({b + "ffn_norm.weight", 1, dim, Fill::kNorm, {}});
    if (fused) {
      p.push_back({b + "ffn_up.weight", 2 * ffn, dim, Fill::kMatrix, {}});
    } else {
      p.push_back({b + "ffn_gate.weight", ffn, dim, Fill::kMatrix, {}});
      p.push_back({b + "ffn_up.weight", ffn, dim, Fill::kMatrix, {}});
    }
    p.push_back({b + "ffn_down.weight", dim, ffn, Fill::kMatrix, {}});
    if (c.post_norms) p.push_back({b + "post_ffw_norm.weight", 1, dim, Fill::kNorm, {}});
  }
  return p;
}

// Generates one tensor's values chunk by chunk, converts them and appends them to the writer.
Status WriteTensor(gguf::GgufWriter& w, const Plan& t, DType dtype, uint64_t seed, float stdev) {
  if (t.fill == Fill::kValues) return w.Append(t.values.data(), t.values.size() * 4);
  float mean = 0;
  if (t.fill != Fill::kMatrix) {
    dtype = DType::F32;
    mean = t.fill == Fill::kNorm ? 1.f : 0.f;
    stdev = t.fill == Fill::kNorm ? 0.2f : 0.5f;
  }
  const int64_t n = t.rows * t.cols;
  std::vector<float> f32(size_t(std::min(n, kChunk * kChunksPerBatch)));
  std::vector<uint8_t> out(DTypeBytes(dtype, f32.size()));
  for (int64_t start = 0; start < n; start += int64_t(f32.size())) {
    const int64_t len = std::min<int64_t>(int64_t(f32.size()), n - start);
    const int64_t n_chunks = (len + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static)
    for (int64_t k = 0; k < n_chunks; k++) {
      const int64_t c0 = k * kChunk, c1 = std::min(len, c0 + kChunk);
      Rng rng(Mix(seed, uint64_t(start + c0) / kChunk));
      for (int64_t i = c0; i < c1; i++) f32[size_t(i)] = mean + float(rng.Normal()) * stdev;
      FromF32(dtype, f32.data() + c0, out.data() + DTypeBytes(dtype, size_t(c0)), size_t(c1 - c0));
    }
    MNEMO_TRY(w.Append(out.data(), DTypeBytes(dtype, size_t(len))));
  }
  return Status::Ok();
}

// The architecture's metadata keys (prefix "<arch>.").
void AddArchMetadata(gguf::GgufWriter& w, const ModelConfig& c) {
  const std::string a = std::string(ArchName(c.arch)) + ".";
  w.AddU32(a + "context_length", uint32_t(c.context_length));
  w.AddU32(a + "embedding_length", uint32_t(c.dim));
  w.AddU32(a + "block_count", uint32_t(c.n_layers));
  w.AddU32(a + "feed_forward_length", uint32_t(c.ffn_dim));
  w.AddU32(a + "rope.dimension_count", uint32_t(c.rope_dims));
  w.AddU32(a + "attention.head_count", uint32_t(c.n_heads));
  w.AddU32(a + "attention.head_count_kv", uint32_t(c.n_kv_heads));
  if (c.head_dim * c.n_heads != c.dim) {
    w.AddU32(a + "attention.key_length", uint32_t(c.head_dim));
    w.AddU32(a + "attention.value_length", uint32_t(c.head_dim));
  }
  w.AddF32(a + "attention.layer_norm_rms_epsilon", c.rms_eps);
  w.AddF32(a + "rope.freq_base", c.rope_theta);
  const RopeConfig& r = c.layers[0].rope;
  if (!c.rope_factors_long.empty()) {
    w.AddString(a + "rope.scaling.type", "longrope");
    w.AddF32(a + "rope.scaling.attn_factor", r.attn_factor);
    w.AddU32(a + "rope.scaling.original_context_length", uint32_t(c.rope_orig_context));
  } else if (r.freq_scale != 1.f) {
    w.AddString(a + "rope.scaling.type", "linear");
    w.AddF32(a + "rope.scaling.factor", 1.f / r.freq_scale);
  }
  w.AddU32(a + "vocab_size", uint32_t(c.vocab_size));
  if (c.arch == Arch::kGemma2 || c.arch == Arch::kGemma3) {
    // The window and the period from the layers (SetGemmaFeatures' pattern), the local base.
    int window = 0, period = 0, first_local = -1;
    for (int l = 0; l < c.n_layers; l++) {
      if (c.layers[size_t(l)].sliding_window > 0) {
        window = c.layers[size_t(l)].sliding_window;
        if (first_local < 0) first_local = l;
      } else if (period == 0) {
        period = l + 1;
      }
    }
    if (window > 0) {
      w.AddU32(a + "attention.sliding_window", uint32_t(window));
      const int def = c.arch == Arch::kGemma2 ? 2 : 6;
      if (period > 0 && period != def) w.AddU32(a + "attention.sliding_window_pattern", uint32_t(period));
      if (c.arch == Arch::kGemma3) w.AddF32(a + "rope.freq_base_swa", c.layers[size_t(first_local)].rope.theta);
    }
    if (c.arch == Arch::kGemma2) w.AddF32(a + "attn_logit_softcapping", c.attn_softcap);
    // gemma2 always caps (llama.cpp's default 30 when absent), gemma3 only when the key is there.
    if (c.arch == Arch::kGemma2 || c.final_softcap > 0) {
      w.AddF32(a + "final_logit_softcapping", c.final_softcap);
    }
  }
}

}  // namespace

std::vector<std::string> MakeModelArchs() { return {"llama", "llama3", "qwen2", "qwen3", "phi3", "gemma2", "gemma3"}; }

std::vector<std::string> PresetNames(const std::string& arch) {
  std::vector<std::string> out;
  for (const PresetEntry& e : kPresets) {
    if (arch == e.arch) out.push_back(e.name);
  }
  return out;
}

Result<ModelConfig> PresetConfig(const std::string& arch, const std::string& preset) {
  for (const PresetEntry& e : kPresets) {
    if (arch != e.arch || preset != e.name) continue;
    ModelConfig c = FromShape(e.shape);
    SetArchFeatures(arch, c);
    for (const GemmaPreset& g : kGemmaPresets) {
      if (arch == g.arch && preset == g.name) SetGemmaFeatures(g.extras, c);
    }
    return c;
  }
  std::string names;
  for (const std::string& n : PresetNames(arch)) names += (names.empty() ? "" : ", ") + n;
  if (names.empty()) return MakeError("make-model: unknown architecture '%s'", arch.c_str());
  return MakeError("unknown model preset '%s' for %s (%s)", preset.c_str(), arch.c_str(), names.c_str());
}

std::vector<std::string> PresetNames() { return {"llama-25m", "llama-110m", "llama-1b"}; }

Result<ModelConfig> PresetConfig(const std::string& name) {
  for (const std::string& n : PresetNames()) {
    if (n == name) return PresetConfig("llama", name);
  }
  return MakeError("unknown model preset '%s' (llama-25m, llama-110m, llama-1b)", name.c_str());
}

uint32_t GgmlFileType(DType t) {
  switch (t) {
    case DType::F32: return 0;
    case DType::F16: return 1;
    case DType::Q8_0: return 7;
    case DType::BF16: return 32;
    default: return 0;
  }
}

Status MakeModel(const MakeModelOptions& opt) {
  ModelConfig c;
  std::string name = opt.name;
  if (opt.config) {
    c = *opt.config;
    if (c.layers.empty()) FillUniformLayers(c);
    if (name.empty()) name = "custom";
  } else {
    auto p = PresetConfig(opt.arch, opt.preset);
    if (!p) return p.error();
    c = *p;
    if (name.empty()) name = opt.preset;
  }
  if (opt.output_path.empty()) return MakeError("make-model: no output path");
  auto vocab = gguf::GgufFile::Open(opt.vocab_path);
  if (!vocab) return vocab.error();
  auto n_tokens = vocab->GetArrayLength("tokenizer.ggml.tokens");
  if (!n_tokens) return MakeError("%s: %s", opt.vocab_path.c_str(), n_tokens.error().message.c_str());
  if (c.vocab_size == 0) c.vocab_size = int(*n_tokens);
  if (*n_tokens != uint64_t(c.vocab_size)) {
    return MakeError("make-model: %s has %llu tokens, the model needs %d", opt.vocab_path.c_str(),
                     (unsigned long long)*n_tokens, c.vocab_size);
  }
  if (Status st = ValidateConfig(c); !st.ok()) return MakeError("make-model: %s", st.error().message.c_str());
  if (opt.dtype == DType::Q8_0 && (c.dim % kQ8Block != 0 || c.ffn_dim % kQ8Block != 0 || c.q_dim() % kQ8Block != 0)) {
    return MakeError("make-model: q8_0 needs dim, ffn_dim and n_heads * head_dim to be multiples of 32");
  }

  gguf::GgufWriter w(32);
  w.AddString("general.architecture", ArchName(c.arch));
  w.AddString("general.name", name);
  w.AddU32("general.file_type", GgmlFileType(opt.dtype));
  w.AddU32("general.alignment", 32);
  AddArchMetadata(w, c);
  for (const auto& kv : vocab->metadata()) {
    if (kv.key.substr(0, 10) != "tokenizer.") continue;
    if (!opt.chat_template.empty() && kv.key == "tokenizer.chat_template") continue;
    w.AddValue(std::string(kv.key), kv.value);
  }
  if (!opt.chat_template.empty()) w.AddString("tokenizer.chat_template", opt.chat_template);

  std::vector<Plan> plan = TensorPlan(c);
  for (const Plan& t : plan) {
    const bool vec = t.fill != Fill::kMatrix;
    uint32_t type = vec ? gguf::kGgmlF32 : gguf::DTypeToGgml(opt.dtype);
    std::vector<int64_t> dims = vec ? std::vector<int64_t>{t.cols} : std::vector<int64_t>{t.cols, t.rows};
    w.AddTensor(t.name, dims, type);
  }
  MNEMO_TRY(w.Begin(opt.output_path));
  for (size_t k = 0; k < plan.size(); k++) {
    MNEMO_TRY(WriteTensor(w, plan[k], opt.dtype, Mix(opt.seed, k), opt.weight_std));
  }
  return w.Finish();
}

}  // namespace mnemo
