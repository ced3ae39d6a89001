#include "format/model_config.h"

namespace mnemo {
namespace {

struct ArchEntry {
  Arch arch;
  const char* name;
};
constexpr ArchEntry kArchs[] = {{Arch::kLlama, "llama"}, {Arch::kQwen2, "qwen2"},   {Arch::kQwen3, "qwen3"},
                                {Arch::kPhi3, "phi3"},   {Arch::kGemma2, "gemma2"}, {Arch::kGemma3, "gemma3"}};

}  // namespace

const char* ArchName(Arch a) {
  for (const ArchEntry& e : kArchs) {
    if (e.arch == a) return e.name;
  }
  return "?";
}

std::optional<Arch> ArchFromName(const std::string& s) {
  for (const ArchEntry& e : kArchs) {
    if (s == e.name) return e.arch;
  }
  return std::nullopt;
}

const char* RopeStyleName(RopeStyle s) { return s == RopeStyle::kNeox ? "neox" : "adjacent"; }

bool ModelConfig::has_sliding_window() const {
  for (const LayerConfig& l : layers) {
    if (l.sliding_window > 0) return true;
  }
  return false;
}

void FillUniformLayers(ModelConfig& c, const RopeConfig& rope_extra) {
  RopeConfig r = rope_extra;
  r.style = c.rope_style;
  r.dims = c.rope_dims;
  r.theta = c.rope_theta;
  c.layers.assign(size_t(c.n_layers > 0 ? c.n_layers : 0), LayerConfig{0, r});
}

Status ValidateConfig(const ModelConfig& c) {
  auto bad = [](const char* what, long v) { return MakeError("invalid model config: %s = %ld", what, v); };
  if (c.dim <= 0) return bad("dim", c.dim);
  if (c.n_layers <= 0) return bad("n_layers", c.n_layers);
  if (c.n_heads <= 0) return bad("n_heads", c.n_heads);
  if (c.n_kv_heads <= 0 || c.n_heads % c.n_kv_heads != 0) {
    return MakeError("invalid model config: n_kv_heads = %d must divide n_heads = %d", c.n_kv_heads, c.n_heads);
  }
  if (c.head_dim <= 0) return bad("head_dim", c.head_dim);
  if (c.ffn_dim <= 0) return bad("ffn_dim", c.ffn_dim);
  if (c.vocab_size <= 0) return bad("vocab_size", c.vocab_size);
  if (c.rms_eps <= 0 || !(c.rms_eps < 1)) return MakeError("invalid model config: rms_eps = %g", c.rms_eps);
  if (c.context_length <= 0) return bad("context_length", c.context_length);
  if (c.layers.size() != size_t(c.n_layers)) {
    return MakeError("invalid model config: %zu layer entries for %d layers", c.layers.size(), c.n_layers);
  }
  for (size_t l = 0; l < c.layers.size(); l++) {
    const RopeConfig& r = c.layers[l].rope;
    if (r.dims <= 0 || r.dims > c.head_dim || r.dims % 2 != 0) {
      return MakeError("invalid model config: layer %zu rope_dims = %d must be even and <= head_dim = %d", l, r.dims,
                       c.head_dim);
    }
    if (!(r.theta > 0)) return MakeError("invalid model config: layer %zu rope_theta = %g", l, r.theta);
    if (!(r.freq_scale > 0)) return MakeError("invalid model config: layer %zu rope freq_scale = %g", l, r.freq_scale);
    if (!r.freq_factors.empty() && r.freq_factors.size() != size_t(r.dims / 2)) {
      return MakeError("invalid model config: layer %zu has %zu rope frequency factors for %d rotated pairs", l,
                       r.freq_factors.size(), r.dims / 2);
    }
    for (float f : r.freq_factors) {
      if (!(f > 0)) return MakeError("invalid model config: layer %zu rope frequency factor %g is not positive", l, f);
    }
    if (c.layers[l].sliding_window < 0) return bad("sliding_window", c.layers[l].sliding_window);
  }
  if (!c.rope_factors_long.empty() && c.rope_factors_long.size() != size_t(c.rope_dims / 2)) {
    return MakeError("invalid model config: %zu long rope factors for %d rotated pairs", c.rope_factors_long.size(),
                     c.rope_dims / 2);
  }
  if (c.attn_softcap < 0 || c.final_softcap < 0) return MakeError("invalid model config: negative soft-cap");
  return Status::Ok();
}

}  // namespace mnemo
