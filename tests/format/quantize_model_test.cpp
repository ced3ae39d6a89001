// mnemo quantize: llama-quantize's mixing rules per preset, row-length fallbacks, deterministic
// bytes, and outputs that load back with values close to the input.
#include "format/quantize_model.h"

#include <unistd.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>

#include "format/gguf_writer.h"
#include "format/make_model.h"
#include "format/model_file.h"

namespace mnemo {
namespace {

const std::string kStories = std::string(MNEMO_SHARED_DIR) + "/models/stories260K/stories260K.gguf";

std::string Tmp(const std::string& name) { return std::string(MNEMO_BINARY_DIR) + "/" + std::to_string(getpid()) + "." + name; }

std::string ReadAll(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// 8 layers (so that "use more bits" picks layers 0, 3, 6, 7), GQA 4, rows of 256 except where
// a test changes dim.
std::string MakeModelFile(const std::string& file, int dim, bool tied, DType dtype = DType::F16) {
  MakeModelOptions o;
  ModelConfig c;
  c.dim = dim, c.n_layers = 8, c.n_heads = 4, c.n_kv_heads = 1, c.head_dim = dim / 4, c.ffn_dim = 512;
  c.vocab_size = 512, c.rope_dims = dim / 4, c.context_length = 256, c.tied_output = tied;
  o.config = c;
  o.dtype = dtype;
  o.seed = 5;
  o.vocab_path = kStories;
  o.output_path = Tmp(file);
  Status st = MakeModel(o);
  EXPECT_TRUE(st.ok()) << st.error().message;
  return o.output_path;
}

std::map<std::string, std::string> PlanTypes(const std::string& path, const std::string& target) {
  auto f = gguf::GgufFile::Open(path);
  EXPECT_TRUE(f.ok());
  auto t = ParseQuantizeTarget(target);
  EXPECT_TRUE(t.ok());
  auto plan = PlanQuantize(*f, *t);
  EXPECT_TRUE(plan.ok()) << plan.error().message;
  std::map<std::string, std::string> m;
  for (const auto& p : *plan) m[p.name] = gguf::GgmlType(p.out_type)->name;
  return m;
}

TEST(QuantizeModel, Q4KMGivesMoreBitsToOutputAttnVAndFfnDownInChosenLayers) {
  auto m = PlanTypes(MakeModelFile("qm_256.gguf", 256, false), "Q4_K_M");
  EXPECT_EQ(m["output.weight"], "q6_K");
  EXPECT_EQ(m["token_embd.weight"], "q4_K");
  EXPECT_EQ(m["output_norm.weight"], "f32");
  for (int i = 0; i < 8; i++) {
    std::string b = "blk." + std::to_string(i) + ".";
    bool more = i == 0 || i == 3 || i == 6 || i == 7;
    EXPECT_EQ(m[b + "attn_v.weight"], more ? "q6_K" : "q4_K") << i;
    EXPECT_EQ(m[b + "ffn_down.weight"], more ? "q6_K" : "q4_K") << i;
    for (const char* n : {"attn_q.weight", "attn_k.weight", "attn_output.weight", "ffn_gate.weight", "ffn_up.weight"})
      EXPECT_EQ(m[b + n], "q4_K") << b + n;
    EXPECT_EQ(m[b + "attn_norm.weight"], "f32");
  }
}

TEST(QuantizeModel, OtherPresetRules) {
  std::string path = MakeModelFile("qm_256.gguf", 256, false);
  auto q2 = PlanTypes(path, "Q2_K");  // GQA 4: attn_v at q4_K
  EXPECT_EQ(q2["blk.1.attn_v.weight"], "q4_K");
  EXPECT_EQ(q2["blk.1.ffn_down.weight"], "q3_K");
  EXPECT_EQ(q2["blk.1.attn_output.weight"], "q3_K");
  EXPECT_EQ(q2["blk.1.attn_q.weight"], "q2_K");
  auto q3 = PlanTypes(path, "Q3_K_M");
  EXPECT_EQ(q3["blk.0.attn_v.weight"], "q5_K");
  EXPECT_EQ(q3["blk.1.attn_v.weight"], "q5_K");
  EXPECT_EQ(q3["blk.2.attn_v.weight"], "q4_K");
  EXPECT_EQ(q3["blk.0.ffn_down.weight"], "q4_K");  // n_layer / 16 = 0 layers at q5_K
  EXPECT_EQ(q3["blk.4.attn_output.weight"], "q4_K");
  auto q4s = PlanTypes(path, "Q4_K_S");
  EXPECT_EQ(q4s["blk.3.attn_v.weight"], "q5_K");
  EXPECT_EQ(q4s["blk.4.attn_v.weight"], "q4_K");
  EXPECT_EQ(q4s["blk.0.ffn_down.weight"], "q5_K");
  EXPECT_EQ(q4s["blk.1.ffn_down.weight"], "q4_K");
  auto q5m = PlanTypes(path, "Q5_K_M");
  EXPECT_EQ(q5m["blk.7.ffn_down.weight"], "q6_K");
  EXPECT_EQ(q5m["blk.1.ffn_down.weight"], "q5_K");
  auto xs = PlanTypes(path, "IQ4_XS");
  EXPECT_EQ(xs["blk.2.attn_v.weight"], "q5_K");
  EXPECT_EQ(xs["blk.0.ffn_down.weight"], "q5_K");
  EXPECT_EQ(xs["blk.1.ffn_down.weight"], "iq4_xs");
  EXPECT_EQ(xs["output.weight"], "q6_K");
  auto q40 = PlanTypes(path, "Q4_0");
  EXPECT_EQ(q40["output.weight"], "q6_K");
  EXPECT_EQ(q40["blk.0.ffn_down.weight"], "q4_0");
  auto q80 = PlanTypes(path, "Q8_0");
  EXPECT_EQ(q80["output.weight"], "q8_0");
  // A single type is pure: every matrix in it, norms untouched.
  auto pure = PlanTypes(path, "q4_K");
  EXPECT_EQ(pure["output.weight"], "q4_K");
  EXPECT_EQ(pure["blk.0.attn_v.weight"], "q4_K");
  EXPECT_EQ(pure["blk.0.ffn_norm.weight"], "f32");
  auto f16 = PlanTypes(path, "bf16");
  EXPECT_EQ(f16["output.weight"], "bf16");
}

TEST(QuantizeModel, TiedEmbeddingTakesTheOutputType) {
  auto m = PlanTypes(MakeModelFile("qm_tied.gguf", 256, true), "Q4_K_M");
  EXPECT_EQ(m.count("output.weight"), 0u);
  EXPECT_EQ(m["token_embd.weight"], "q6_K");
}

TEST(QuantizeModel, RowsNotAMultipleOf256FallBack) {
  std::string path = MakeModelFile("qm_96.gguf", 96, false);  // rows of 96: not 256, but 32
  auto m = PlanTypes(path, "Q4_K_M");
  EXPECT_EQ(m["blk.1.attn_q.weight"], "q5_0");   // q4_K -> q5_0
  EXPECT_EQ(m["blk.0.attn_v.weight"], "q8_0");   // q6_K -> q8_0
  EXPECT_EQ(m["blk.1.ffn_down.weight"], "q4_K"); // rows of ffn_dim 512 fit
  EXPECT_EQ(m["output.weight"], "q8_0");         // the output rule: rows not a multiple of 256 -> q8_0
  auto x = PlanTypes(path, "iq4_xs");
  EXPECT_EQ(x["blk.1.attn_q.weight"], "iq4_nl");
  auto k5 = PlanTypes(path, "q5_K");
  EXPECT_EQ(k5["blk.1.attn_q.weight"], "q5_1");
  auto k2 = PlanTypes(path, "q2_K");
  EXPECT_EQ(k2["blk.1.attn_q.weight"], "q4_0");
}

TEST(QuantizeModel, RejectsUnknownTargets) {
  EXPECT_FALSE(ParseQuantizeTarget("q4_k_m").ok());
  EXPECT_FALSE(ParseQuantizeTarget("iq2_xxs").ok());
  EXPECT_FALSE(ParseQuantizeTarget("").ok());
  EXPECT_TRUE(ParseQuantizeTarget("Q4_K_M").ok());
  EXPECT_TRUE(ParseQuantizeTarget("q6_K").ok());
}

TEST(QuantizeModel, OutputIsDeterministicAndLoadsCloseToTheInput) {
  std::string in = MakeModelFile("qm_in32.gguf", 256, false, DType::F32);
  auto target = ParseQuantizeTarget("Q4_K_M");
  ASSERT_TRUE(target.ok());
  std::string a = Tmp("qm_a.gguf"), b = Tmp("qm_b.gguf");
  auto sa = QuantizeModel(in, a, *target, 1);
  ASSERT_TRUE(sa.ok()) << sa.error().message;
  auto sb = QuantizeModel(in, b, *target, 2);
  ASSERT_TRUE(sb.ok()) << sb.error().message;
  EXPECT_EQ(sa->n_fallback, 0);
  EXPECT_GT(sa->n_converted, 50);
  EXPECT_LT(sa->out_bytes * 5, sa->in_bytes);  // ~4.9 bits per weight vs 32
  EXPECT_TRUE(ReadAll(a) == ReadAll(b));

  auto m32 = ModelFile::Open(in);
  auto mq = ModelFile::Open(a);
  ASSERT_TRUE(m32.ok());
  ASSERT_TRUE(mq.ok()) << mq.error().message;
  EXPECT_EQ(mq->gguf()->GetU32("general.file_type").value(), 15u);
  EXPECT_EQ(mq->gguf()->GetU32("general.quantization_version").value(), 2u);
  const TensorRef& w32 = m32->weights().layers[3].wv;
  const TensorRef& wq = mq->weights().layers[3].wv;
  EXPECT_EQ(wq.dtype, DType::Q6_K);
  std::vector<float> x(size_t(w32.rows * w32.cols)), y(x.size());
  ToF32(w32.dtype, w32.data, x.data(), x.size());
  ToF32(wq.dtype, wq.data, y.data(), y.size());
  double se = 0, s2 = 0;
  for (size_t i = 0; i < x.size(); i++) se += (x[i] - y[i]) * (x[i] - y[i]), s2 += x[i] * x[i];
  EXPECT_LT(std::sqrt(se / s2), 0.02);  // q6_K
  // Re-quantising to f32 gives back exactly the decoded values.
  std::string c = Tmp("qm_c.gguf");
  ASSERT_TRUE(QuantizeModel(a, c, *ParseQuantizeTarget("f32"), 0).ok());
  auto mc = ModelFile::Open(c);
  ASSERT_TRUE(mc.ok());
  EXPECT_EQ(mc->weights().layers[3].wv.dtype, DType::F32);
  EXPECT_EQ(std::memcmp(mc->weights().layers[3].wv.data, y.data(), y.size() * 4), 0);
  for (const auto& p : {in, a, b, c}) std::remove(p.c_str());
}

// A 1-layer f32 model with rows of 256, for the dtype acceptance tests.
std::string SmallF32(const std::string& file) {
  MakeModelOptions o;
  ModelConfig c;
  c.dim = 256, c.n_layers = 1, c.n_heads = 2, c.n_kv_heads = 1, c.head_dim = 128, c.ffn_dim = 256;
  c.vocab_size = 512, c.rope_dims = 128, c.context_length = 64;
  o.config = c;
  o.dtype = DType::F32;
  o.vocab_path = kStories;
  o.output_path = Tmp(file);
  EXPECT_TRUE(MakeModel(o).ok());
  return o.output_path;
}

TEST(ModelFileTypes, EverySupportedTypeLoadsPerTensor) {
  std::string in = SmallF32("mft_in.gguf");
  for (DType t : kAllDTypes) {
    std::string out = Tmp(std::string("mft_") + DTypeName(t) + ".gguf");
    auto st = QuantizeModel(in, out, *ParseQuantizeTarget(DTypeName(t)), 1);
    ASSERT_TRUE(st.ok()) << DTypeName(t) << ": " << st.error().message;
    auto m = ModelFile::Open(out);
    ASSERT_TRUE(m.ok()) << DTypeName(t) << ": " << m.error().message;
    EXPECT_EQ(m->weights().layers[0].wq.dtype, t);
    EXPECT_EQ(m->weights().output.dtype, t);
    EXPECT_EQ(m->weights().layers[0].attn_norm.dtype, DType::F32);
    std::remove(out.c_str());
  }
  std::remove(in.c_str());
}

// Rewrites `in` with tensor `name` declared as ggml type `type` (zero data of the right size).
std::string WithTensorType(const std::string& in, const std::string& out, const std::string& name, uint32_t type) {
  auto f = gguf::GgufFile::Open(in);
  EXPECT_TRUE(f.ok());
  gguf::GgufWriter w(f->alignment());
  for (const auto& kv : f->metadata()) w.AddValue(std::string(kv.key), kv.value);
  for (const auto& t : f->tensors()) w.AddTensor(t.name, t.dims, t.name == name ? type : t.type);
  EXPECT_TRUE(w.Begin(out).ok());
  for (const auto& t : f->tensors()) {
    if (t.name == name) {
      auto ti = gguf::GgmlType(type);
      std::vector<uint8_t> zeros(size_t(t.n_elements / ti->block_elems * ti->block_bytes));
      EXPECT_TRUE(w.Append(zeros.data(), zeros.size()).ok());
    } else {
      EXPECT_TRUE(w.Append(t.data, t.nbytes).ok());
    }
  }
  EXPECT_TRUE(w.Finish().ok());
  return out;
}

TEST(ModelFileTypes, UnsupportedTypeIsAnErrorNamingTensorAndType) {
  std::string in = SmallF32("mft_in2.gguf");
  struct Case {
    uint32_t id;
    const char* name;
  };
  for (Case c : {Case{16, "iq2_xxs"}, Case{34, "tq1_0"}, Case{39, "mxfp4"}, Case{9, "q8_1"}, Case{15, "q8_K"}}) {
    std::string out = WithTensorType(in, Tmp("mft_bad.gguf"), "blk.0.ffn_up.weight", c.id);
    auto m = ModelFile::Open(out);
    ASSERT_FALSE(m.ok()) << c.name;
    EXPECT_NE(m.error().message.find("blk.0.ffn_up.weight"), std::string::npos) << m.error().message;
    EXPECT_NE(m.error().message.find(c.name), std::string::npos) << m.error().message;
    // Requantising such a file is refused the same way (the tensor cannot be decoded).
    auto q = QuantizeModel(out, Tmp("mft_bad_q.gguf"), *ParseQuantizeTarget("Q4_K_M"));
    ASSERT_FALSE(q.ok());
    EXPECT_NE(q.error().message.find(c.name), std::string::npos) << q.error().message;
    std::remove(out.c_str());
  }
  // A norm in a block type is refused too (norms stay f32).
  std::string out = WithTensorType(in, Tmp("mft_bad.gguf"), "blk.0.attn_norm.weight", 2);
  auto m = ModelFile::Open(out);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.error().message.find("attn_norm"), std::string::npos) << m.error().message;
  std::remove(out.c_str());
  std::remove(in.c_str());
}

}  // namespace
}  // namespace mnemo
