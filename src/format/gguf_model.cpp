// ModelFile::FromGguf: GGUF metadata and tensors -> ModelConfig and ModelWeights, for every
// supported architecture. The facts encoded here (key names, defaults, rope modes, which tensors an
// architecture has) follow how llama.cpp reads the same files; see docs/architecture.md.
//
// Structure: (1) the generic hyperparameters under "<arch>." keys, (2) ApplyArchFeatures sets the
// architecture's feature flags, (3) rotary scaling, (4) tensors, loaded by feature (not by name of
// architecture), (5) every tensor in the file must have been used.
#include <cinttypes>
#include <cmath>
#include <set>

#include "format/gguf_vocab.h"
#include "format/model_file.h"

namespace mnemo {
namespace {

std::string BaseName(const std::string& p) {
  size_t s = p.rfind('/');
  return s == std::string::npos ? p : p.substr(s + 1);
}

std::string DimsString(const std::vector<int64_t>& dims) {
  std::string s;
  for (int64_t d : dims) {
    s += s.empty() ? "[" : ", ";
    s += std::to_string(d);
  }
  s += ']';
  return s;
}

Result<int> GgufInt(const gguf::GgufFile& f, const std::string& key, std::optional<int> def = std::nullopt) {
  if (!f.Has(key)) {
    if (def) return *def;
    return MakeError("metadata key '%s' is missing", key.c_str());
  }
  const gguf::Value* v = f.Find(key);
  if (v->type == gguf::ValueType::kArray) {
    return MakeError("metadata key '%s' is an array (per-layer values are not supported)", key.c_str());
  }
  auto x = f.GetU32(key);
  if (!x) return x.error();
  if (*x > (1u << 30)) return MakeError("metadata key '%s' = %u is too large", key.c_str(), *x);
  return int(*x);
}

// Reads tensors by name, checking shape and type, and records which were used.
class TensorReader {
 public:
  explicit TensorReader(const gguf::GgufFile& f) : f_(f) {}

  bool Has(const std::string& name) const { return f_.FindTensor(name) != nullptr; }

  // A [rows, cols] matrix (GGUF dims [cols, rows]), or with vector=true a [1, cols] f32 vector
  // (GGUF dims [cols]: norms, biases, rope factors).
  Result<TensorRef> Get(const std::string& name, int64_t rows, int64_t cols, bool vector = false) {
    const gguf::TensorInfo* t = f_.FindTensor(name);
    if (!t) return MakeError("tensor '%s' is missing", name.c_str());
    used_.insert(name);
    std::vector<int64_t> want = vector ? std::vector<int64_t>{cols} : std::vector<int64_t>{cols, rows};
    if (t->dims != want) {
      return MakeError("tensor '%s' has GGUF dims %s, expected %s (row-major [%" PRId64 ", %" PRId64 "])",
                       name.c_str(), DimsString(t->dims).c_str(), DimsString(want).c_str(), rows, cols);
    }
    auto type = gguf::GgmlType(t->type);
    const char* tname = type ? type->name : "?";
    if (!t->dtype) {
      return MakeError("tensor '%s' has type %s, which mnemo does not support", name.c_str(), tname);
    }
    if (vector && *t->dtype != DType::F32) {
      return MakeError("vector tensor '%s' has type %s; norms, biases and rope factors must be f32", name.c_str(),
                       tname);
    }
    return TensorRef{*t->dtype, t->data, vector ? 1 : rows, cols};
  }

  // Reads an f32 vector tensor's values.
  Result<std::vector<float>> Floats(const std::string& name, int64_t n) {
    auto t = Get(name, 1, n, true);
    if (!t) return t.error();
    const auto* p = static_cast<const float*>(t->data);
    return std::vector<float>(p, p + n);
  }

  // The first tensor of the file that no Get asked for, or empty.
  std::string FirstUnused() const {
    for (const gguf::TensorInfo& t : f_.tensors()) {
      if (!used_.count(t.name)) return t.name;
    }
    return {};
  }

 private:
  const gguf::GgufFile& f_;
  std::set<std::string> used_;
};

// Sets the feature fields of `c` that follow from the architecture (and, where llama.cpp decides
// by the presence of a tensor, from the file).
Status ApplyArchFeatures(const gguf::GgufFile& f, ModelConfig& c) {
  switch (c.arch) {
    case Arch::kLlama:  // Llama 1-3, Mistral, SmolLM: the defaults; Q/K/V biases when the file has them
      c.rope_style = RopeStyle::kAdjacent;
      c.qkv_bias = f.FindTensor("blk.0.attn_q.bias") != nullptr;
      break;
    case Arch::kQwen2:
      c.rope_style = RopeStyle::kNeox;
      c.qkv_bias = true;
      break;
    case Arch::kQwen3:
      c.rope_style = RopeStyle::kNeox;
      c.qk_norm = true;
      break;
    case Arch::kPhi3:  // fused QKV and gate/up (see the tensors); llama.cpp ignores phi3's sliding window
      c.rope_style = RopeStyle::kNeox;
      break;
    case Arch::kGemma2:
    case Arch::kGemma3: {
      // Both: NEOX rotary, RMSNorm after the attention and FFN outputs too, GELU-tanh gated FFN,
      // embeddings scaled by sqrt(dim). Norm weights are used as stored: Gemma's RMSNorm scales by
      // (1 + w), and llama.cpp's converter writes 1 + w into the file.
      const std::string a = std::string(ArchName(c.arch)) + ".";
      c.rope_style = RopeStyle::kNeox;
      c.post_norms = true;
      c.ffn_act = FfnActivation::kGeluTanh;
      c.embed_scale = std::sqrt(float(c.dim));
      // llama.cpp scales queries by 1 / sqrt(head_dim), except for the 27B models (recognised by
      // their layer count: 46 gemma2, 62 gemma3), whose query_pre_attn_scalar is dim / n_heads; it
      // reads no key for it.
      const bool is_27b = c.n_layers == (c.arch == Arch::kGemma2 ? 46 : 62);
      c.attn_scale = 1.0f / std::sqrt(float(is_27b ? c.dim / c.n_heads : c.head_dim));
      if (c.arch == Arch::kGemma2) {
        // Always soft-capped (llama.cpp's defaults 50 and 30 when the keys are absent); tied output.
        auto attn = f.GetF32Or(a + "attn_logit_softcapping", 50.f);
        if (!attn) return attn.error();
        auto fin = f.GetF32Or(a + "final_logit_softcapping", 30.f);
        if (!fin) return fin.error();
        c.attn_softcap = *attn;
        c.final_softcap = *fin;
        if (f.FindTensor("output.weight")) return MakeError("gemma2 has no output.weight (its output is tied)");
      } else {
        c.qk_norm = true;
        auto fin = f.GetF32Or(a + "final_logit_softcapping", 0.f);
        if (!fin) return fin.error();
        c.final_softcap = *fin;
      }
      if (!(c.attn_softcap >= 0) || !(c.final_softcap >= 0)) return MakeError("negative soft-cap");
      break;
    }
  }
  return Status::Ok();
}

// Gemma's interleaved layers, after FillUniformLayers: with a sliding window of W tokens and a
// period P, layer l is local (window W) when l % P < P - 1, global otherwise (llama.cpp's
// set_swa_pattern). gemma2: W = attention.sliding_window (default 4096), P = 2, local layers keep
// the global rotary; gemma3: no key or W = 0 means every layer global; P = 6; local layers rotate
// with rope.freq_base_swa (default 10000) and no position scaling.
Status ApplySlidingWindows(const gguf::GgufFile& f, ModelConfig& c) {
  if (c.arch != Arch::kGemma2 && c.arch != Arch::kGemma3) return Status::Ok();
  const std::string a = std::string(ArchName(c.arch)) + ".";
  const bool g2 = c.arch == Arch::kGemma2;
  auto window = GgufInt(f, a + "attention.sliding_window", g2 ? 4096 : 0);
  if (!window) return window.error();
  if (*window == 0) {
    if (g2) return MakeError("gemma2 sliding window is 0");
    return Status::Ok();
  }
  auto period = GgufInt(f, a + "attention.sliding_window_pattern", g2 ? 2 : 6);
  if (!period) return period.error();
  auto base = f.GetF32Or(a + "rope.freq_base_swa", g2 ? c.rope_theta : 10000.f);
  if (!base) return base.error();
  if (!(*base > 0)) return MakeError("rope.freq_base_swa = %g", *base);
  for (int l = 0; l < c.n_layers; l++) {
    const bool local = *period == 0 || l % *period < *period - 1;
    if (!local) continue;
    LayerConfig& L = c.layers[size_t(l)];
    L.sliding_window = *window;
    L.rope.theta = *base;
    if (!g2) L.rope.freq_scale = 1.f;
  }
  return Status::Ok();
}

// Rotary scaling: <arch>.rope.scaling.{type, factor, attn_factor, original_context_length} and the
// frequency factor tensors. Fills `extra` (applied to every layer) and c.rope_factors_long.
Status ReadRopeScaling(const gguf::GgufFile& f, TensorReader& tr, const std::string& a, ModelConfig& c,
                       RopeConfig& extra) {
  std::string type = "linear";  // llama.cpp's default when the key is absent (factor 0: no scaling)
  if (f.Has(a + "rope.scaling.type")) {
    auto t = f.GetString(a + "rope.scaling.type");
    if (!t) return t.error();
    type = *t;
  }
  if (type != "none" && type != "linear" && type != "longrope") {
    return MakeError("RoPE scaling '%s' is not supported (none, linear, longrope)", type.c_str());
  }
  float factor = 0;
  for (const std::string& key : {a + "rope.scaling.factor", a + "rope.scale_linear"}) {
    if (!f.Has(key)) continue;
    auto v = f.GetF32Or(key, 0.f);
    if (!v) return v.error();
    factor = *v;
    break;
  }
  if (factor < 0) return MakeError("rope scaling factor %g is negative", factor);
  extra.freq_scale = (type == "none" || factor == 0) ? 1.f : 1.f / factor;
  auto attn = f.GetF32Or(a + "rope.scaling.attn_factor", 1.f);
  if (!attn) return attn.error();
  extra.attn_factor = *attn;
  auto orig = GgufInt(f, a + "rope.scaling.original_context_length", c.context_length);
  if (!orig) return orig.error();
  c.rope_orig_context = *orig;

  const int pairs = c.rope_dims / 2;
  if (type == "longrope") {
    if (tr.Has("rope_factors_short.weight")) {
      auto s = tr.Floats("rope_factors_short.weight", pairs);
      if (!s) return s.error();
      extra.freq_factors = std::move(s).value();
    }
    if (tr.Has("rope_factors_long.weight")) {
      auto l = tr.Floats("rope_factors_long.weight", pairs);
      if (!l) return l.error();
      c.rope_factors_long = std::move(l).value();
    }
  } else if (tr.Has("rope_freqs.weight")) {  // llama3-style per-pair frequency divisors
    auto r = tr.Floats("rope_freqs.weight", pairs);
    if (!r) return r.error();
    extra.freq_factors = std::move(r).value();
  }
  return Status::Ok();
}

Status ReadLayerTensors(TensorReader& tr, const ModelConfig& c, int l, LayerWeights& L) {
  const int64_t dim = c.dim, q = c.q_dim(), kv = c.kv_dim(), ffn = c.ffn_dim;
  const std::string p = "blk." + std::to_string(l) + ".";
  auto get = [&](const std::string& n, int64_t rows, int64_t cols, bool vec, TensorRef* out) -> Status {
    auto t = tr.Get(p + n, rows, cols, vec);
    if (!t) return t.error();
    *out = *t;
    return Status::Ok();
  };
  MNEMO_TRY(get("attn_norm.weight", 1, dim, true, &L.attn_norm));
  if (tr.Has(p + "attn_qkv.weight")) {
    MNEMO_TRY(get("attn_qkv.weight", q + 2 * kv, dim, false, &L.wqkv));
  } else {
    MNEMO_TRY(get("attn_q.weight", q, dim, false, &L.wq));
    MNEMO_TRY(get("attn_k.weight", kv, dim, false, &L.wk));
    MNEMO_TRY(get("attn_v.weight", kv, dim, false, &L.wv));
  }
  if (c.qkv_bias) {
    if (L.wqkv.present()) return MakeError("layer %d: Q/K/V biases with a fused attn_qkv are not supported", l);
    MNEMO_TRY(get("attn_q.bias", 1, q, true, &L.bq));
    MNEMO_TRY(get("attn_k.bias", 1, kv, true, &L.bk));
    MNEMO_TRY(get("attn_v.bias", 1, kv, true, &L.bv));
  }
  if (c.qk_norm) {
    MNEMO_TRY(get("attn_q_norm.weight", 1, c.head_dim, true, &L.q_norm));
    MNEMO_TRY(get("attn_k_norm.weight", 1, c.head_dim, true, &L.k_norm));
  }
  MNEMO_TRY(get("attn_output.weight", dim, q, false, &L.wo));
  if (c.post_norms) MNEMO_TRY(get("post_attention_norm.weight", 1, dim, true, &L.attn_post_norm));
  MNEMO_TRY(get("ffn_norm.weight", 1, dim, true, &L.ffn_norm));
  if (tr.Has(p + "ffn_gate.weight")) {
    MNEMO_TRY(get("ffn_gate.weight", ffn, dim, false, &L.gate));
    MNEMO_TRY(get("ffn_up.weight", ffn, dim, false, &L.up));
  } else {  // phi3: ffn_up holds the gate rows, then the up rows
    MNEMO_TRY(get("ffn_up.weight", 2 * ffn, dim, false, &L.up));
  }
  MNEMO_TRY(get("ffn_down.weight", dim, ffn, false, &L.down));
  if (c.post_norms) MNEMO_TRY(get("post_ffw_norm.weight", 1, dim, true, &L.ffn_post_norm));
  return Status::Ok();
}

}  // namespace

Result<ModelFile> ModelFile::FromGguf(gguf::GgufFile g) {
  ModelFile m;
  m.format_ = ModelFormat::kGguf;
  m.path_ = g.path();
  const std::string& path = m.path_;
  m.gguf_ = std::make_unique<gguf::GgufFile>(std::move(g));
  const gguf::GgufFile& f = *m.gguf_;
  auto fail = [&](const Error& e) { return MakeError("%s: %s", path.c_str(), e.message.c_str()); };

  auto arch_name = f.GetString("general.architecture");
  if (!arch_name) return fail(arch_name.error());
  std::optional<Arch> arch = ArchFromName(*arch_name);
  if (!arch) {
    return MakeError("%s: architecture '%s' is not supported (llama, qwen2, qwen3, phi3, gemma2, gemma3)", path.c_str(),
                     arch_name->c_str());
  }
  const std::string a = *arch_name + ".";
  auto name = f.GetStringOr("general.name", BaseName(path));
  if (!name) return fail(name.error());
  m.name_ = *name;
  auto experts = GgufInt(f, a + "expert_count", 0);
  if (!experts) return fail(experts.error());
  if (*experts > 0) return MakeError("%s: mixture-of-experts models are not supported", path.c_str());

  auto vocab = gguf::ReadVocab(f);
  if (!vocab) return fail(vocab.error());
  m.vocab_ = std::move(vocab).value();

  ModelConfig& c = m.config_;
  c.arch = *arch;
  struct IntKey {
    const char* key;
    int* dst;
  };
  for (const IntKey& k : {IntKey{"embedding_length", &c.dim}, IntKey{"block_count", &c.n_layers},
                          IntKey{"attention.head_count", &c.n_heads}, IntKey{"feed_forward_length", &c.ffn_dim},
                          IntKey{"context_length", &c.context_length}}) {
    auto v = GgufInt(f, a + k.key);
    if (!v) return fail(v.error());
    *k.dst = *v;
  }
  if (c.n_heads <= 0) return MakeError("%s: %sattention.head_count is 0", path.c_str(), a.c_str());
  auto kv = GgufInt(f, a + "attention.head_count_kv", c.n_heads);
  if (!kv) return fail(kv.error());
  c.n_kv_heads = *kv;
  auto hd = GgufInt(f, a + "attention.key_length", c.dim / c.n_heads);
  if (!hd) return fail(hd.error());
  c.head_dim = *hd;
  auto vd = GgufInt(f, a + "attention.value_length", c.head_dim);
  if (!vd) return fail(vd.error());
  if (*vd != c.head_dim) {
    return MakeError("%s: value_length %d != key_length %d is not supported", path.c_str(), *vd, c.head_dim);
  }
  if (!f.Has(a + "attention.key_length") && c.dim % c.n_heads != 0) {
    return MakeError("%s: embedding_length %d is not a multiple of head_count %d", path.c_str(), c.dim, c.n_heads);
  }
  auto rd = GgufInt(f, a + "rope.dimension_count", c.head_dim);
  if (!rd) return fail(rd.error());
  c.rope_dims = *rd;
  auto theta = f.GetF32Or(a + "rope.freq_base", 10000.f);
  if (!theta) return fail(theta.error());
  c.rope_theta = *theta;
  auto eps = f.GetF32Or(a + "attention.layer_norm_rms_epsilon", 1e-5f);
  if (!eps) return fail(eps.error());
  c.rms_eps = *eps;
  auto nv = GgufInt(f, a + "vocab_size", int(m.vocab_.tokens.size()));
  if (!nv) return fail(nv.error());
  c.vocab_size = *nv;
  if (size_t(c.vocab_size) != m.vocab_.tokens.size()) {
    return MakeError("%s: %svocab_size %d differs from the %zu tokenizer tokens", path.c_str(), a.c_str(),
                     c.vocab_size, m.vocab_.tokens.size());
  }
  c.tied_output = f.FindTensor("output.weight") == nullptr;
  if (Status st = ApplyArchFeatures(f, c); !st.ok()) return fail(st.error());

  TensorReader tr(f);
  RopeConfig rope_extra;
  if (c.rope_dims <= 0 || c.rope_dims > c.head_dim || c.rope_dims % 2 != 0) {
    return MakeError("%s: rope dimension_count %d must be even and <= head dim %d", path.c_str(), c.rope_dims,
                     c.head_dim);
  }
  if (Status st = ReadRopeScaling(f, tr, a, c, rope_extra); !st.ok()) return fail(st.error());
  FillUniformLayers(c, rope_extra);
  if (Status st = ApplySlidingWindows(f, c); !st.ok()) return fail(st.error());
  if (Status st = ValidateConfig(c); !st.ok()) return fail(st.error());

  ModelWeights& w = m.weights_;
  auto get = [&](const std::string& n, int64_t rows, int64_t cols, bool vec, TensorRef* out) -> Status {
    auto t = tr.Get(n, rows, cols, vec);
    if (!t) return fail(t.error());
    *out = *t;
    return Status::Ok();
  };
  MNEMO_TRY(get("token_embd.weight", c.vocab_size, c.dim, false, &w.tok_embd));
  MNEMO_TRY(get("output_norm.weight", 1, c.dim, true, &w.output_norm));
  if (c.tied_output) {
    w.output = w.tok_embd;
  } else {
    MNEMO_TRY(get("output.weight", c.vocab_size, c.dim, false, &w.output));
  }
  w.layers.resize(c.n_layers);
  for (int l = 0; l < c.n_layers; l++) {
    if (Status st = ReadLayerTensors(tr, c, l, w.layers[l]); !st.ok()) return fail(st.error());
  }
  if (std::string u = tr.FirstUnused(); !u.empty()) {
    return MakeError("%s: tensor '%s' is not used by mnemo's %s model (an unsupported variant?)", path.c_str(),
                     u.c_str(), arch_name->c_str());
  }
  return m;
}

}  // namespace mnemo
