#include "format/quantize_model.h"

#include <omp.h>

#include <algorithm>
#include <cinttypes>
#include <cstring>
#include <optional>

#include "format/gguf_writer.h"

namespace mnemo {
namespace {

// llama-quantize's file types (llama.h's llama_ftype values) and their default tensor type.
struct Preset {
  const char* name;
  DType base;
  uint32_t file_type;
};
constexpr Preset kPresets[] = {
    {"Q4_0", DType::Q4_0, 2},      {"Q4_1", DType::Q4_1, 3},      {"Q5_0", DType::Q5_0, 8},
    {"Q5_1", DType::Q5_1, 9},      {"Q8_0", DType::Q8_0, 7},      {"Q2_K", DType::Q2_K, 10},
    {"Q3_K_S", DType::Q3_K, 11},   {"Q3_K_M", DType::Q3_K, 12},   {"Q4_K_S", DType::Q4_K, 14},
    {"Q4_K_M", DType::Q4_K, 15},   {"Q5_K_S", DType::Q5_K, 16},   {"Q5_K_M", DType::Q5_K, 17},
    {"Q6_K", DType::Q6_K, 18},     {"IQ4_NL", DType::IQ4_NL, 25}, {"IQ4_XS", DType::IQ4_XS, 30},
    {"F16", DType::F16, 1},        {"BF16", DType::BF16, 32},     {"F32", DType::F32, 0},
};

// general.file_type for a single-type (pure) output: the llama_ftype whose default type it is
// (the _S variant for the K-quants).
uint32_t PureFileType(DType t) {
  switch (t) {
    case DType::F32: return 0;
    case DType::F16: return 1;
    case DType::BF16: return 32;
    case DType::Q8_0: return 7;
    case DType::Q4_0: return 2;
    case DType::Q4_1: return 3;
    case DType::Q5_0: return 8;
    case DType::Q5_1: return 9;
    case DType::Q2_K: return 10;
    case DType::Q3_K: return 11;
    case DType::Q4_K: return 14;
    case DType::Q5_K: return 16;
    case DType::Q6_K: return 18;
    case DType::IQ4_NL: return 25;
    case DType::IQ4_XS: return 30;
  }
  return 1;
}

// Tensor categories of llama-quantize's rules, matched on the name as it does (first match wins).
enum class Cat { kOther, kOutput, kTokenEmbd, kAttnV, kAttnK, kAttnQ, kAttnOut, kFfnUp, kFfnGate, kFfnDown };

bool Has(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

Cat Category(const std::string& n) {
  if (n == "output.weight") return Cat::kOutput;
  if (n == "token_embd.weight" || n == "per_layer_token_embd.weight") return Cat::kTokenEmbd;
  // Fused QKV and MLA's kv_b count as attn_v: llama-quantize treats all three as the
  // quantisation-sensitive value projection.
  if (Has(n, "attn_qkv.weight") || Has(n, "attn_kv_b.weight") || Has(n, "attn_v.weight")) return Cat::kAttnV;
  if (Has(n, "attn_k.weight")) return Cat::kAttnK;
  if (Has(n, "attn_q.weight")) return Cat::kAttnQ;
  if (Has(n, "attn_output.weight")) return Cat::kAttnOut;
  if (Has(n, "ffn_up")) return Cat::kFfnUp;
  if (Has(n, "ffn_gate")) return Cat::kFfnGate;
  if (Has(n, "ffn_down")) return Cat::kFfnDown;
  return Cat::kOther;
}

// Dimensions ignoring trailing 1s (ggml_n_dims).
int NDims(const std::vector<int64_t>& dims) {
  int n = int(dims.size());
  while (n > 1 && dims[size_t(n - 1)] == 1) n--;
  return std::max(n, 1);
}

// llama-quantize quantises 2-D (and 3-D) tensors named *weight, except norms, MoE routers and a
// list of small special tensors; everything else is copied as it is.
bool Quantisable(const gguf::TensorInfo& t) {
  const std::string& n = t.name;
  if (NDims(t.dims) < 2) return false;
  if (n.size() < 6 || n.compare(n.size() - 6, 6, "weight") != 0) return false;
  for (const char* keep : {"_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel",
                           "per_layer_model_proj", "ssm_conv1d", "shortconv.conv.weight", "attn_rel_b.weight",
                           "time_mix_", "indexer.k_proj.weight", "indexer.q_proj.weight", ".position_embd",
                           ".rel_pos", ".patch_embd", ".patch_merger"}) {
    if (Has(n, keep)) return false;
  }
  return n != "position_embd.weight" && n != "token_types.weight";
}

// A type whose block fits a row of ncols, as llama-quantize falls back: 256-element types to a
// 32-element one of similar size, and f16 when even that does not fit.
DType Fallback(DType t, int64_t ncols, bool* fell) {
  *fell = false;
  if (ncols % DTypeBlockElems(t) == 0) return t;
  *fell = true;
  DType f = DType::F16;
  switch (t) {
    case DType::IQ4_XS: f = DType::IQ4_NL; break;
    case DType::Q2_K: case DType::Q3_K: f = DType::Q4_0; break;
    case DType::Q4_K: f = DType::Q5_0; break;
    case DType::Q5_K: f = DType::Q5_1; break;
    case DType::Q6_K: f = DType::Q8_0; break;
    default: break;  // llama-quantize has no fallback for the 32-element types (it stops); we use f16
  }
  return ncols % DTypeBlockElems(f) == 0 ? f : DType::F16;
}

// Model facts the mixing rules read.
struct Context {
  const QuantizeTarget* target;
  int n_layer = 0;         // <arch>.block_count
  int n_gqa = 1;           // head_count / head_count_kv
  int n_attn_v = 0;        // attn_v-like tensors in the file
  bool tied = true;        // no output.weight: token_embd doubles as the output matrix
  bool is_70b = false;     // llama.cpp's LLM_TYPE_70B (Llama with 80 layers)
  int i_attn_v = 0, i_ffn_down = 0;  // running counters, in file order, as llama-quantize keeps them
};

// "Use more bits" layers: the first and last eighth, and every third layer in between.
bool UseMoreBits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

// llama-quantize's choice for one quantisable tensor under a preset (llama_tensor_get_type_impl),
// for the presets mnemo offers and dense models (its MoE and Falcon special cases do not apply).
DType PresetType(Context& c, const gguf::TensorInfo& t, Cat cat) {
  const std::string& p = c.target->name;
  DType def = c.target->base;
  DType ty = def;
  if (cat == Cat::kOutput || (c.tied && cat == Cat::kTokenEmbd)) {
    if (t.dims[0] % DTypeBlockElems(def) != 0) return DType::Q8_0;
    return def != DType::Q8_0 ? DType::Q6_K : def;
  }
  if (cat == Cat::kTokenEmbd) return def;
  if (cat == Cat::kAttnV) {
    if (p == "Q2_K") ty = c.n_gqa >= 4 ? DType::Q4_K : DType::Q3_K;
    else if (p == "Q3_K_M") ty = c.i_attn_v < 2 ? DType::Q5_K : DType::Q4_K;
    else if ((p == "IQ4_NL" || p == "IQ4_XS") && c.n_gqa >= 4) ty = DType::Q5_K;
    else if ((p == "Q4_K_M" || p == "Q5_K_M") && UseMoreBits(c.i_attn_v, c.n_attn_v)) ty = DType::Q6_K;
    else if (p == "Q4_K_S" && c.i_attn_v < 4) ty = DType::Q5_K;
    if (c.is_70b && (ty == DType::Q3_K || ty == DType::Q4_K)) ty = DType::Q5_K;
    c.i_attn_v++;
    return ty;
  }
  if (cat == Cat::kFfnDown) {
    int i = c.i_ffn_down++, n = c.n_layer;
    if (p == "Q2_K") ty = DType::Q3_K;
    else if (p == "Q3_K_M") ty = i < n / 16 ? DType::Q5_K : DType::Q4_K;
    else if (p == "Q4_K_M") ty = UseMoreBits(i, n) ? DType::Q6_K : ty;
    else if (i < n / 8 && (p == "IQ4_NL" || p == "IQ4_XS")) ty = DType::Q5_K;
    else if (p == "Q5_K_M" && UseMoreBits(i, n)) ty = DType::Q6_K;
    else if (p == "Q4_K_S" && i < n / 8) ty = DType::Q5_K;
    return ty;
  }
  if (cat == Cat::kAttnOut) {
    if (p == "Q2_K") ty = DType::Q3_K;
    else if (p == "Q3_K_M") ty = DType::Q4_K;
    return ty;
  }
  return ty;
}

int MetaInt(const gguf::GgufFile& f, const std::string& key, int def) {
  const gguf::Value* v = f.Find(key);
  if (!v) return def;
  auto x = v->AsInt();
  return x && *x > 0 && *x < (1 << 30) ? int(*x) : def;
}

}  // namespace

Result<QuantizeTarget> ParseQuantizeTarget(std::string_view name) {
  QuantizeTarget t;
  t.name = std::string(name);
  for (const Preset& p : kPresets) {
    if (name == p.name) {
      t.base = p.base;
      t.preset = IsBlockType(p.base);
      t.file_type = p.file_type;
      return t;
    }
  }
  if (ParseDType(name, &t.base)) {
    t.file_type = PureFileType(t.base);
    return t;
  }
  std::string all;
  for (const auto& n : QuantizeTargetNames()) all += (all.empty() ? "" : ", ") + n;
  return MakeError("unknown quantisation type '%.*s' (one of: %s)", int(name.size()), name.data(), all.c_str());
}

std::vector<std::string> QuantizeTargetNames() {
  std::vector<std::string> v;
  for (DType t : kAllDTypes) v.push_back(DTypeName(t));
  for (const Preset& p : kPresets) v.push_back(p.name);
  return v;
}

Result<std::vector<TensorPlan>> PlanQuantize(const gguf::GgufFile& in, const QuantizeTarget& target) {
  Context c;
  c.target = &target;
  auto arch_r = in.GetStringOr("general.architecture", "llama");
  std::string arch = arch_r.ok() ? *arch_r : "llama";
  c.n_layer = MetaInt(in, arch + ".block_count", 0);
  int heads = MetaInt(in, arch + ".attention.head_count", 1);
  c.n_gqa = std::max(1, heads / MetaInt(in, arch + ".attention.head_count_kv", heads));
  c.is_70b = arch == "llama" && c.n_layer == 80;
  for (const auto& t : in.tensors()) {
    Cat cat = Category(t.name);
    if (cat == Cat::kAttnV) c.n_attn_v++;
    if (cat == Cat::kOutput) c.tied = false;
  }
  std::vector<TensorPlan> plan;
  for (const auto& t : in.tensors()) {
    TensorPlan p{t.name, t.type, t.type, false, false};
    if (Quantisable(t)) {
      DType want = target.base;
      if (IsBlockType(target.base)) {
        if (target.preset) want = PresetType(c, t, Category(t.name));
        bool fell;
        want = Fallback(want, t.dims[0], &fell);
        p.fallback = fell;
      }
      p.out_type = gguf::DTypeToGgml(want);
      if (p.out_type != t.type) {
        if (!t.dtype) {
          auto ti = gguf::GgmlType(t.type);
          return MakeError("tensor '%s' has type %s, which mnemo cannot decode to requantise", t.name.c_str(),
                           ti ? ti->name : "?");
        }
        p.convert = true;
      }
    }
    plan.push_back(std::move(p));
  }
  return plan;
}

Result<QuantizeStats> QuantizeModel(const std::string& in_path, const std::string& out_path,
                                    const QuantizeTarget& target, int threads) {
  auto in = gguf::GgufFile::Open(in_path);
  if (!in.ok()) return in.error();
  auto plan = PlanQuantize(*in, target);
  if (!plan.ok()) return plan.error();

  bool any_block = false;
  for (const auto& p : *plan) {
    auto ti = gguf::GgmlType(p.out_type);
    any_block |= ti && ti->block_elems > 1;
  }
  gguf::GgufWriter w(in->alignment());
  bool wrote_ft = false, wrote_qv = false;
  for (const auto& kv : in->metadata()) {
    if (kv.key == "general.file_type") {
      w.AddU32("general.file_type", target.file_type);
      wrote_ft = true;
    } else if (kv.key == "general.quantization_version") {
      if (any_block) w.AddU32("general.quantization_version", 2);
      wrote_qv = true;
    } else {
      w.AddValue(std::string(kv.key), kv.value);
    }
  }
  if (!wrote_ft) w.AddU32("general.file_type", target.file_type);
  if (!wrote_qv && any_block) w.AddU32("general.quantization_version", 2);
  const auto& tensors = in->tensors();
  for (size_t k = 0; k < tensors.size(); k++) w.AddTensor(tensors[k].name, tensors[k].dims, (*plan)[k].out_type);
  if (Status st = w.Begin(out_path); !st.ok()) return st.error();

  QuantizeStats stats;
  std::vector<float> f32;      // [chunk_rows, ncols]
  std::vector<uint8_t> out;    // [chunk_rows, out row bytes]
  for (size_t k = 0; k < tensors.size(); k++) {
    const gguf::TensorInfo& t = tensors[k];
    const TensorPlan& p = (*plan)[k];
    stats.in_bytes += t.nbytes;
    if (!p.convert) {
      stats.n_copied++;
      stats.out_bytes += t.nbytes;
      if (Status st = w.Append(t.data, t.nbytes); !st.ok()) return st.error();
      continue;
    }
    stats.n_converted++;
    stats.n_fallback += p.fallback;
    DType from = *t.dtype, to = *gguf::GgmlToDType(p.out_type);
    int64_t ncols = t.dims[0], nrows = t.n_elements / std::max<int64_t>(ncols, 1);
    size_t in_row = DTypeBytes(from, size_t(ncols)), out_row = DTypeBytes(to, size_t(ncols));
    int64_t chunk = std::max<int64_t>(1, (int64_t(64) << 20) / 4 / std::max<int64_t>(ncols, 1));
    for (int64_t r0 = 0; r0 < nrows; r0 += chunk) {
      int64_t nr = std::min(chunk, nrows - r0);
      f32.resize(size_t(nr * ncols));
      out.resize(size_t(nr) * out_row);
      const uint8_t* src = static_cast<const uint8_t*>(t.data) + size_t(r0) * in_row;
      int nt = threads > 0 ? threads : omp_get_max_threads();
      // Rows are independent and each is encoded by the same scalar code: the bytes do not depend
      // on the thread count or the schedule.
#pragma omp parallel for num_threads(nt) schedule(dynamic, 4)
      for (int64_t r = 0; r < nr; r++) {
        float* row = f32.data() + size_t(r * ncols);
        ToF32(from, src + size_t(r) * in_row, row, size_t(ncols));
        FromF32(to, row, out.data() + size_t(r) * out_row, size_t(ncols));
      }
      if (Status st = w.Append(out.data(), out.size()); !st.ok()) return st.error();
    }
    stats.out_bytes += uint64_t(nrows) * out_row;
  }
  if (Status st = w.Finish(); !st.ok()) return st.error();
  return stats;
}

}  // namespace mnemo
