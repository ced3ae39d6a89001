// Every tensor type against llama.cpp (issue 10): the tiny llama model (make-model, seed 1) written
// by `mnemo quantize --type T` for each type and three llama-quantize presets (plus a qwen2 Q4_K_M:
// NEOX rotary and Q/K/V biases on K-quant weights), regenerated here and checked byte for byte
// (sha256) against the files llama.cpp ran. tests/data/type_logits/<arch>-<type>.json holds llama.cpp's
// last-position logits of two prompts (one short, one over two 32-token KV blocks) on the
// quantized file and on its F32 twin (llama-quantize --allow-requantize Q.gguf twin.gguf F32:
// the same dequantized weights computed in f32); see PROVENANCE.md there.
//
// Bounds, relative RMS of the logits (rms(Δ) / rms(ref − mean(ref))):
//   exact path (Precision::kF32, f32 K/V) against the twin: <= 1e-3, same top-1;
//   fast path (Precision::kBF16, bf16 K/V: int8 activations against block weights) against the
//   twin and against llama.cpp on the quantized file: <= 0.03, same top-1. (llama.cpp's own run
//   of the quantized file is up to 0.02 from its twin: it rounds activations to 8 bits too; that
//   figure is printed beside mnemo's.)
// ctest runs this binary a second time under MNEMO_KERNELS_PORTABLE=1, so the fast path is
// checked on both kernel dispatch paths. That run checks the fast path on the short prompt only:
// the scalar int8 GEMV (GemvQRef) runs the same code for any number of tokens and would take
// most of the test's time on the long one; the exact path and attention's portable kernels are
// tested against the AVX-512 ones in kernels_test.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "format/make_model.h"
#include "format/quantize_model.h"
#include "model/prompt_logits.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace mnemo::testing {
namespace {

using kernels::Precision;

// Removes a file when the test ends, pass or fail.
struct TempFile {
  std::string path;
  ~TempFile() { std::filesystem::remove(path); }
};

// As src/kernels/cpu/dispatch.cpp reads it.
bool PortableKernels() {
  const char* env = std::getenv("MNEMO_KERNELS_PORTABLE");
  return env != nullptr && *env != '\0' && std::strcmp(env, "0") != 0;
}

class TypeGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(TypeGolden, LogitsMatchLlamaCpp) {
  const std::string name = GetParam();  // "<arch>-<type>"
  std::ifstream in(std::string(MNEMO_SOURCE_DIR) + "/tests/data/type_logits/" + name + ".json");
  ASSERT_TRUE(in.good()) << name;
  const nlohmann::json ref = nlohmann::json::parse(in);
  const std::string stem = std::string(MNEMO_BINARY_DIR) + "/type_golden_" + name + "." + std::to_string(getpid());

  // `mnemo make-model --arch A --preset tiny --dtype f32 --seed 1 --vocab stories260K.gguf`.
  TempFile f32{stem + ".f32.gguf"}, q{stem + ".gguf"};
  MakeModelOptions o;
  o.arch = ref["arch"];
  o.preset = ref["preset"];
  o.dtype = DType::F32;
  o.seed = ref["seed"];
  o.vocab_path = SharedPath(ref["vocab"]);
  o.output_path = f32.path;
  Status st = MakeModel(o);
  ASSERT_TRUE(st.ok()) << st.error().message;
  ASSERT_EQ(Sha256Hex(f32.path), ref["f32_sha256"].get<std::string>())
      << "make-model no longer writes the f32 model the llama.cpp reference was computed from: "
         "re-record tests/data/type_logits (PROVENANCE.md) if the change is intended";
  // `mnemo quantize f32.gguf q.gguf --type T`.
  auto target = ParseQuantizeTarget(ref["type"].get<std::string>());
  ASSERT_TRUE(target.ok()) << target.error().message;
  auto qs = QuantizeModel(f32.path, q.path, *target, 2);
  ASSERT_TRUE(qs.ok()) << qs.error().message;
  ASSERT_EQ(Sha256Hex(q.path), ref["sha256"].get<std::string>())
      << "mnemo quantize --type " << ref["type"].get<std::string>()
      << " no longer writes the file llama.cpp ran: re-record tests/data/type_logits (PROVENANCE.md) if the "
         "change is intended";

  auto file = ModelFile::Open(q.path);
  ASSERT_TRUE(file.ok()) << file.error().message;
  auto tok = Tokenizer::Create(file->vocab());
  ASSERT_TRUE(tok.ok());
  const bool portable = PortableKernels();
  auto fast = Model::Create(*file, ModelOptions{Precision::kBF16, 512});
  ASSERT_TRUE(fast.ok()) << fast.error().message;
  std::unique_ptr<Model> exact;
  if (!portable) {
    auto m = Model::Create(*file, ModelOptions{Precision::kF32, 512});
    ASSERT_TRUE(m.ok()) << m.error().message;
    exact = std::move(*m);
  }
  for (const auto& c : ref["cases"]) {
    if (portable && &c != &ref["cases"].front()) break;
    const std::vector<int32_t> ids = c["token_ids"].get<std::vector<int32_t>>();
    SCOPED_TRACE(name + ", prompt of " + std::to_string(ids.size()) + " tokens");
    ASSERT_EQ((*tok)->Encode(c["prompt"].get<std::string>(), true), ids);
    const std::vector<float> twin = c["logits_twin"].get<std::vector<float>>();  // [n_vocab]
    const std::vector<float> lq = c["logits_q"].get<std::vector<float>>();       // [n_vocab]
    const int top = ArgMax(twin.data(), int(twin.size()));
    auto f = PromptLogits(**fast, ids, false, DType::BF16);
    ASSERT_TRUE(f.ok()) << f.error().message;
    ASSERT_EQ(f->size(), twin.size());
    const double fast_twin = RelRms(*f, twin), fast_q = RelRms(*f, lq);
    std::printf("%-13s %2zu tokens%s: fast vs twin %.4f, vs Q %.4f | llama.cpp Q vs twin %.4f", name.c_str(), ids.size(),
                portable ? " (portable kernels)" : "", fast_twin, fast_q, RelRms(lq, twin));
    EXPECT_LE(fast_twin, 0.03);
    EXPECT_LE(fast_q, 0.03);  // the issue allows either reference; both hold (at most 0.023 when recorded)
    EXPECT_EQ(ArgMax(f->data(), int(f->size())), top);
    if (!portable) {
      auto e = PromptLogits(*exact, ids, false, DType::F32);
      ASSERT_TRUE(e.ok()) << e.error().message;
      ASSERT_EQ(e->size(), twin.size());
      const double exact_twin = RelRms(*e, twin);
      std::printf(" | exact vs twin %.2e", exact_twin);
      EXPECT_LE(exact_twin, 1e-3);
      EXPECT_EQ(ArgMax(e->data(), int(e->size())), top);
    }
    std::printf("\n");
  }
}

INSTANTIATE_TEST_SUITE_P(Types, TypeGolden,
                         ::testing::Values("llama-f16", "llama-bf16", "llama-q8_0", "llama-q4_0", "llama-q4_1",
                                           "llama-q5_0", "llama-q5_1", "llama-q2_K", "llama-q3_K", "llama-q4_K",
                                           "llama-q5_K", "llama-q6_K", "llama-iq4_nl", "llama-iq4_xs",
                                           "llama-Q4_K_M", "llama-Q3_K_M", "llama-Q2_K", "qwen2-Q4_K_M"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& ch : s) ch = ch == '-' ? '_' : ch;
                           return s;
                         });

}  // namespace
}  // namespace mnemo::testing
