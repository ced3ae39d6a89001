// Deterministic mutation fuzzing of the GGUF reader inside gtest: every prefix of the header area,
// then random bit flips, overwritten fields (huge counts, lengths, offsets, types), and byte
// insertions/deletions of small valid files. Each variant must parse or return an Error.
#include <unistd.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>

#include "base/rng.h"
#include "format/make_model.h"
#include "format/quantize_model.h"
#include "gguf_bytes.h"
#include "gguf_fuzz_body.h"

namespace mnemo {
namespace {

std::vector<uint8_t> ReadFile(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

// A tiny q8_0 llama model with the stories260K tokenizer (a complete, loadable model).
std::vector<uint8_t> TinyModel() {
  MakeModelOptions o;
  ModelConfig c;
  c.dim = 32, c.n_layers = 1, c.n_heads = 2, c.n_kv_heads = 1, c.head_dim = 16, c.ffn_dim = 32;
  c.vocab_size = 512, c.rope_dims = 16, c.context_length = 64;
  o.config = c;
  o.dtype = DType::Q8_0;
  o.vocab_path = std::string(MNEMO_SHARED_DIR) + "/models/stories260K/stories260K.gguf";
  o.output_path = std::string(MNEMO_BINARY_DIR) + "/fuzz_seed_tiny." + std::to_string(getpid()) + ".gguf";  // ctest runs tests in parallel processes
  Status st = MakeModel(o);
  EXPECT_TRUE(st.ok()) << st.error().message;
  auto b = ReadFile(o.output_path);
  std::remove(o.output_path.c_str());
  return b;
}

// A loadable model whose matrices mix block types (Q4_K_M: q4_K, q6_K; f32 norms), rows of 256.
std::vector<uint8_t> MixedTypesModel() {
  MakeModelOptions o;
  ModelConfig c;
  c.dim = 256, c.n_layers = 1, c.n_heads = 2, c.n_kv_heads = 1, c.head_dim = 128, c.ffn_dim = 256;
  c.vocab_size = 512, c.rope_dims = 128, c.context_length = 64;
  o.config = c;
  o.dtype = DType::F32;
  o.vocab_path = std::string(MNEMO_SHARED_DIR) + "/models/stories260K/stories260K.gguf";
  std::string base = std::string(MNEMO_BINARY_DIR) + "/fuzz_seed_mixed." + std::to_string(getpid());
  o.output_path = base + ".f32.gguf";
  Status st = MakeModel(o);
  EXPECT_TRUE(st.ok()) << st.error().message;
  auto q = QuantizeModel(o.output_path, base + ".gguf", ParseQuantizeTarget("Q4_K_M").value());
  EXPECT_TRUE(q.ok()) << q.error().message;
  auto b = ReadFile(base + ".gguf");
  std::remove(o.output_path.c_str());
  std::remove((base + ".gguf").c_str());
  return b;
}

// Every value type, nested arrays and two tensors.
std::vector<uint8_t> AllTypes() {
  test::GgufBytes g;
  g.Header(3, 2, 7);
  g.KvU32("general.alignment", 16);
  g.Str("i8").Put<uint32_t>(1).Put<int8_t>(-5);
  g.Str("f64").Put<uint32_t>(12).Put<double>(0.25);
  g.KvStr("tokenizer.ggml.model", "llama");
  g.Str("tokenizer.ggml.tokens").Put<uint32_t>(9).Put<uint32_t>(8).Put<uint64_t>(3).Str("<unk>").Str("<s>").Str("a");
  g.Str("tokenizer.ggml.scores").Put<uint32_t>(9).Put<uint32_t>(6).Put<uint64_t>(3).Put(0.f).Put(0.f).Put(-1.f);
  g.Str("nested").Put<uint32_t>(9).Put<uint32_t>(9).Put<uint64_t>(2);
  g.Put<uint32_t>(5).Put<uint64_t>(2).Put<int32_t>(1).Put<int32_t>(2);
  g.Put<uint32_t>(7).Put<uint64_t>(1).Put<uint8_t>(1);
  g.Tensor("a", {32, 2}, 8, 0);  // q8_0, 68 bytes
  g.Tensor("b", {3}, 0, 80);
  g.Align(16).Zeros(80 + 12);
  return g.b;
}

size_t HeaderEnd(const std::vector<uint8_t>& b) {
  auto f = gguf::GgufFile::FromBytes(b.data(), b.size());
  EXPECT_TRUE(f.ok());
  return f.ok() ? size_t(f->data_offset()) : b.size();
}

TEST(GgufFuzz, SeedsAreValid) {
  auto tiny = TinyModel();
  auto all = AllTypes();
  auto mixed = MixedTypesModel();
  EXPECT_TRUE(test::ExerciseGguf(tiny.data(), tiny.size()));
  EXPECT_TRUE(test::ExerciseGguf(all.data(), all.size()));
  EXPECT_TRUE(test::ExerciseGguf(mixed.data(), mixed.size()));
  auto m = ModelFile::FromGguf(gguf::GgufFile::FromBytes(tiny.data(), tiny.size()).value());
  EXPECT_TRUE(m.ok()) << m.error().message;
  auto mm = ModelFile::FromGguf(gguf::GgufFile::FromBytes(mixed.data(), mixed.size()).value());
  ASSERT_TRUE(mm.ok()) << mm.error().message;
  EXPECT_EQ(mm->weights().layers[0].wq.dtype, DType::Q4_K);
  EXPECT_EQ(mm->weights().layers[0].wv.dtype, DType::Q6_K);
}

TEST(GgufFuzz, EveryPrefixOfTheHeaderArea) {
  int ok = 0;
  for (const auto& seed : {TinyModel(), AllTypes()}) {
    size_t end = std::min(seed.size(), HeaderEnd(seed) + 64);
    for (size_t n = 0; n < end; n++) ok += test::ExerciseGguf(seed.data(), n);
  }
  // A prefix can only parse when no tensor data is cut off: none of these do except vocab-only
  // prefixes, which these seeds are not.
  EXPECT_EQ(ok, 0);
}

TEST(GgufFuzz, RandomMutations) {
  const std::vector<std::vector<uint8_t>> seeds = {TinyModel(), AllTypes(), MixedTypesModel()};
  const uint64_t interesting[] = {0, 1, 2, 7, 31, 32, 33, 255, 0x7fffffff, 0x80000000u, 0xffffffffu,
                                  uint64_t(1) << 32, uint64_t(1) << 60, uint64_t(1) << 63, ~uint64_t(0),
                                  ~uint64_t(0) - 7, 0x7fffffffffffffffull};
  Rng rng(1234);
  int parsed = 0;
  // MNEMO_FUZZ_ITERS overrides the count: the sanitizer build (scripts/sanitize.sh) runs fewer,
  // each about 20x slower under ASan.
  const char* iters_env = std::getenv("MNEMO_FUZZ_ITERS");
  const int kIters = iters_env ? std::max(1, std::atoi(iters_env)) : 20000;
  for (int it = 0; it < kIters; it++) {
    const auto& seed = seeds[it % seeds.size()];
    std::vector<uint8_t> b = seed;
    // Most mutations target the header area, where the structure is.
    size_t hdr = std::min(b.size(), HeaderEnd(seed) + 64);
    int n_mut = 1 + int(rng.Next() % 4);
    for (int k = 0; k < n_mut && !b.empty(); k++) {
      size_t region = rng.Next() % 4 == 0 ? b.size() : hdr;
      region = std::min(region, b.size());
      size_t pos = rng.Next() % region;
      switch (rng.Next() % 7) {
        case 0:  // bit flip
          b[pos] ^= uint8_t(1u << (rng.Next() % 8));
          break;
        case 1: {  // interesting u64
          uint64_t v = interesting[rng.Next() % std::size(interesting)];
          std::memcpy(b.data() + pos, &v, std::min<size_t>(8, b.size() - pos));
          break;
        }
        case 2: {  // interesting u32
          uint32_t v = uint32_t(interesting[rng.Next() % std::size(interesting)]);
          std::memcpy(b.data() + pos, &v, std::min<size_t>(4, b.size() - pos));
          break;
        }
        case 3:  // random byte
          b[pos] = uint8_t(rng.Next());
          break;
        case 4:  // delete a run
          b.erase(b.begin() + long(pos), b.begin() + long(std::min(b.size(), pos + 1 + rng.Next() % 16)));
          break;
        case 5:  // truncate anywhere
          b.resize(pos);
          break;
        case 6: {  // a ggml type id (supported, unsupported or undefined) where a u32 was
          uint32_t v = uint32_t(rng.Next() % 42);
          std::memcpy(b.data() + pos, &v, std::min<size_t>(4, b.size() - pos));
          break;
        }
      }
    }
    parsed += test::ExerciseGguf(b.data(), b.size());
  }
  // Some mutations are harmless (a flipped tensor data bit), most are not: both paths ran.
  EXPECT_GT(parsed, kIters / 100);
  EXPECT_LT(parsed, kIters);
}

}  // namespace
}  // namespace mnemo
