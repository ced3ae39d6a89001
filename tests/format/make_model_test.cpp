#include "format/make_model.h"

#include <unistd.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>

#include "format/gguf.h"
#include "format/gguf_writer.h"

namespace mnemo {
namespace {

const std::string kStories = std::string(MNEMO_SHARED_DIR) + "/models/stories260K/stories260K.gguf";
const std::string kSpm = std::string(MNEMO_SHARED_DIR) + "/models/vocab/ggml-vocab-llama-spm.gguf";

std::string Tmp(const std::string& name) { return std::string(MNEMO_BINARY_DIR) + "/" + std::to_string(getpid()) + "." + name; }

std::string ReadAll(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

TEST(GgufWriter, RoundTripsMetadataAndTensors) {
  auto src = gguf::GgufFile::Open(kStories);
  ASSERT_TRUE(src.ok());
  const std::string path = Tmp("writer_roundtrip.gguf");
  gguf::GgufWriter w(64);
  w.AddU32("general.alignment", 64);
  for (const auto& kv : src->metadata()) w.AddValue(std::string(kv.key), kv.value);
  w.AddI32("x.i32", -3);
  w.AddU64("x.u64", uint64_t(1) << 50);
  w.AddBool("x.bool", true);
  w.AddStringArray("x.strs", {"a", "", "ccc"});
  w.AddF32Array("x.f32s", {1.5f, -2.f});
  w.AddI32Array("x.i32s", {7, -8, 9});
  std::vector<float> a(100), b(64 * 3);
  for (size_t i = 0; i < a.size(); i++) a[i] = float(i) * 0.5f;
  for (size_t i = 0; i < b.size(); i++) b[i] = -float(i);
  std::vector<uint16_t> bh(b.size());
  FromF32(DType::BF16, b.data(), bh.data(), b.size());
  w.AddTensor("a", {100}, gguf::kGgmlF32);
  w.AddTensor("empty", {0}, gguf::kGgmlF32);
  w.AddTensor("b", {64, 3}, gguf::kGgmlBF16);
  ASSERT_TRUE(w.Begin(path).ok());
  // Chunks that straddle the tensor boundary.
  ASSERT_TRUE(w.Append(a.data(), 150).ok());
  std::vector<uint8_t> rest(250 + bh.size() * 2);
  std::memcpy(rest.data(), reinterpret_cast<uint8_t*>(a.data()) + 150, 250);
  std::memcpy(rest.data() + 250, bh.data(), bh.size() * 2);
  ASSERT_TRUE(w.Append(rest.data(), rest.size()).ok());
  EXPECT_EQ(w.remaining_bytes(), 0u);
  ASSERT_TRUE(w.Finish().ok());

  auto f = gguf::GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_EQ(f->alignment(), 64u);
  for (const auto& kv : src->metadata()) {
    const gguf::Value* v = f->Find(kv.key);
    ASSERT_NE(v, nullptr) << kv.key;
    EXPECT_EQ(v->ToString(1000), kv.value.ToString(1000)) << kv.key;
  }
  EXPECT_EQ(*f->GetI64("x.i32"), -3);
  EXPECT_EQ(*f->GetU64("x.u64"), uint64_t(1) << 50);
  EXPECT_TRUE(*f->GetBool("x.bool"));
  EXPECT_EQ(*f->GetStringArray("x.strs"), (std::vector<std::string>{"a", "", "ccc"}));
  EXPECT_EQ(*f->GetF32Array("x.f32s"), (std::vector<float>{1.5f, -2.f}));
  EXPECT_EQ(*f->GetI32Array("x.i32s"), (std::vector<int32_t>{7, -8, 9}));
  ASSERT_EQ(f->tensors().size(), 3u);
  EXPECT_EQ(std::memcmp(f->FindTensor("a")->data, a.data(), 400), 0);
  EXPECT_EQ(f->FindTensor("empty")->nbytes, 0u);
  const gguf::TensorInfo* tb = f->FindTensor("b");
  EXPECT_EQ(tb->dims, (std::vector<int64_t>{64, 3}));
  EXPECT_EQ(tb->offset % 64, 0u);
  EXPECT_EQ(std::memcmp(tb->data, bh.data(), bh.size() * 2), 0);
  std::remove(path.c_str());
}

TEST(GgufWriter, ReportsMisuse) {
  const std::string path = Tmp("writer_misuse.gguf");
  {
    gguf::GgufWriter w;
    w.AddU32("k", 1);
    w.AddU32("k", 2);
    EXPECT_FALSE(w.Begin(path).ok());
  }
  {
    gguf::GgufWriter w;
    w.AddTensor("t", {4}, gguf::kGgmlF32);
    ASSERT_TRUE(w.Begin(path).ok());
    float x[5] = {};
    EXPECT_FALSE(w.Append(x, sizeof x).ok());  // more than declared
  }
  {
    gguf::GgufWriter w;
    w.AddTensor("t", {4}, gguf::kGgmlF32);
    ASSERT_TRUE(w.Begin(path).ok());
    float x[2] = {};
    ASSERT_TRUE(w.Append(x, sizeof x).ok());
    EXPECT_FALSE(w.Finish().ok());  // incomplete
  }
  {
    gguf::GgufWriter w;
    w.AddTensor("t", {40}, gguf::kGgmlQ8_0);  // not whole blocks
    EXPECT_FALSE(w.Begin(path).ok());
  }
  std::ifstream f(path);
  EXPECT_FALSE(f.good());  // nothing left under the final name
}

TEST(MakeModel, Presets) {
  auto c = PresetConfig("llama-1b");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->dim, 2048);
  EXPECT_EQ(c->n_layers, 22);
  EXPECT_EQ(c->n_heads, 32);
  EXPECT_EQ(c->n_kv_heads, 4);
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_EQ(c->ffn_dim, 5632);
  EXPECT_EQ(c->vocab_size, 32000);
  EXPECT_EQ(PresetConfig("llama-25m")->dim, 384);
  EXPECT_EQ(PresetConfig("llama-110m")->n_kv_heads, 4);
  EXPECT_FALSE(PresetConfig("llama-7b").ok());
}

ModelConfig Tiny() {
  ModelConfig c;
  c.dim = 64, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 2, c.head_dim = 16, c.ffn_dim = 96;
  c.vocab_size = 512, c.rope_dims = 16, c.rope_theta = 500000.f, c.rms_eps = 1e-6f, c.context_length = 256;
  return c;
}

std::string MakeTiny(DType dtype, uint64_t seed, const std::string& file) {
  MakeModelOptions o;
  o.config = Tiny();
  o.dtype = dtype;
  o.seed = seed;
  o.vocab_path = kStories;
  o.output_path = Tmp(file);
  Status st = MakeModel(o);
  EXPECT_TRUE(st.ok()) << st.error().message;
  return o.output_path;
}

TEST(MakeModel, TinyModelReadsBackForEveryDtype) {
  std::string p32 = MakeTiny(DType::F32, 7, "mm_f32.gguf");
  auto m32 = ModelFile::Open(p32);
  ASSERT_TRUE(m32.ok()) << m32.error().message;
  const ModelConfig& c = m32->config();
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.n_layers, 2);
  EXPECT_EQ(c.n_kv_heads, 2);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.ffn_dim, 96);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.rope_theta, 500000.f);
  EXPECT_FLOAT_EQ(c.rms_eps, 1e-6f);
  EXPECT_EQ(c.context_length, 256);
  EXPECT_FALSE(c.tied_output);
  EXPECT_EQ(*m32->gguf()->GetU32("general.file_type"), 0u);

  // Real tokenizer copied over.
  auto stories = ModelFile::Open(kStories);
  ASSERT_TRUE(stories.ok());
  EXPECT_EQ(m32->vocab().tokens, stories->vocab().tokens);
  EXPECT_EQ(m32->vocab().scores, stories->vocab().scores);

  // Norms spread around 1 (so that a missing norm weight shows); matrices ~ N(0, 0.02).
  const ModelWeights& w = m32->weights();
  const float* norm = static_cast<const float*>(w.layers[1].ffn_norm.data);
  double ns = 0, ns2 = 0;
  for (int i = 0; i < 64; i++) ns += norm[i], ns2 += double(norm[i] - 1) * (norm[i] - 1);
  EXPECT_NEAR(ns / 64, 1.0, 0.08);
  EXPECT_GT(std::sqrt(ns2 / 64), 0.1);
  const float* q = static_cast<const float*>(w.layers[0].wq.data);
  double s = 0, s2 = 0;
  for (int i = 0; i < 64 * 64; i++) s += q[i], s2 += double(q[i]) * q[i];
  EXPECT_NEAR(s / 4096, 0.0, 0.002);
  EXPECT_NEAR(std::sqrt(s2 / 4096), 0.02, 0.002);

  // Other dtypes hold exactly the conversion of the same f32 values.
  for (DType dt : {DType::F16, DType::BF16, DType::Q8_0}) {
    std::string p = MakeTiny(dt, 7, std::string("mm_") + DTypeName(dt) + ".gguf");
    auto m = ModelFile::Open(p);
    ASSERT_TRUE(m.ok()) << m.error().message;
    EXPECT_EQ(*m->gguf()->GetU32("general.file_type"), GgmlFileType(dt));
    const ModelWeights& v = m->weights();
    EXPECT_EQ(v.layers[0].attn_norm.dtype, DType::F32);
    auto check = [&](const TensorRef& a, const TensorRef& b) {
      ASSERT_EQ(b.dtype, dt);
      size_t n = size_t(a.rows * a.cols);
      std::vector<uint8_t> conv(DTypeBytes(dt, n));
      FromF32(dt, static_cast<const float*>(a.data), conv.data(), n);
      EXPECT_EQ(std::memcmp(conv.data(), b.data, conv.size()), 0) << DTypeName(dt);
    };
    check(w.tok_embd, v.tok_embd);
    check(w.output, v.output);
    check(w.layers[1].down, v.layers[1].down);
    check(w.layers[0].wk, v.layers[0].wk);
    std::remove(p.c_str());
  }
  std::remove(p32.c_str());
}

TEST(MakeModel, DeterministicFromSeed) {
  std::string a = ReadAll(MakeTiny(DType::F16, 1, "mm_a.gguf"));
  std::string b = ReadAll(MakeTiny(DType::F16, 1, "mm_b.gguf"));
  std::string c = ReadAll(MakeTiny(DType::F16, 2, "mm_c.gguf"));
  EXPECT_EQ(a.size(), c.size());
  EXPECT_TRUE(a == b);
  EXPECT_FALSE(a == c);
  for (auto n : {"mm_a.gguf", "mm_b.gguf", "mm_c.gguf"}) std::remove(Tmp(n).c_str());
}

TEST(MakeModel, RejectsBadOptions) {
  MakeModelOptions o;
  o.preset = "llama-25m";
  o.vocab_path = kStories;  // 512 tokens, the preset needs 32000
  o.output_path = Tmp("mm_bad.gguf");
  Status st = MakeModel(o);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("32000"), std::string::npos) << st.error().message;
  o.preset = "nope";
  EXPECT_FALSE(MakeModel(o).ok());
  o.config = Tiny();
  o.config->dim = 48;  // not a multiple of 32
  o.config->head_dim = 12;
  o.config->rope_dims = 12;
  o.dtype = DType::Q8_0;
  EXPECT_FALSE(MakeModel(o).ok());
  o.vocab_path = "/nonexistent.gguf";
  o.dtype = DType::F32;
  EXPECT_FALSE(MakeModel(o).ok());
}

TEST(MakeModel, Llama25mWithRealVocab) {
  MakeModelOptions o;
  o.preset = "llama-25m";
  o.dtype = DType::Q8_0;
  o.vocab_path = kSpm;
  o.output_path = Tmp("mm_25m.gguf");
  Status st = MakeModel(o);
  ASSERT_TRUE(st.ok()) << st.error().message;
  auto m = ModelFile::Open(o.output_path);
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_EQ(m->config().dim, 384);
  EXPECT_EQ(m->config().vocab_size, 32000);
  EXPECT_EQ(m->weights().layers[5].gate.dtype, DType::Q8_0);
  EXPECT_EQ(m->name(), "llama-25m");
  EXPECT_EQ(m->vocab().tokens.size(), 32000u);
  std::remove(o.output_path.c_str());
}

}  // namespace
}  // namespace mnemo
