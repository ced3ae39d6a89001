// Every architecture against llama.cpp: make-model regenerates each tiny f32 model from its seed
// (its sha256 must equal the recorded one), and mnemo's logits must match the logits llama.cpp
// computed on the same file (tests/data/arch_logits, see PROVENANCE.md there).
#include <unistd.h>

#include <cmath>
#include <fstream>

#include "format/make_model.h"
#include "model/prompt_logits.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace mnemo {
namespace {

using testing::ArgMax;
using testing::RelRms;
using testing::Sha256Hex;
using testing::SharedPath;

class ArchGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(ArchGolden, LogitsMatchLlamaCpp) {
  const std::string arch = GetParam();
  std::ifstream in(std::string(MNEMO_SOURCE_DIR) + "/tests/data/arch_logits/" + arch + ".json");
  ASSERT_TRUE(in.good()) << arch;
  const nlohmann::json ref = nlohmann::json::parse(in);

  MakeModelOptions o;
  o.arch = arch;
  o.preset = ref["preset"];
  o.dtype = DType::F32;
  o.seed = ref["seed"];
  o.vocab_path = SharedPath(ref["vocab"]);
  o.output_path = std::string(MNEMO_BINARY_DIR) + "/arch_golden_" + arch + "." + std::to_string(getpid()) + ".gguf";
  Status st = MakeModel(o);
  ASSERT_TRUE(st.ok()) << st.error().message;
  const std::string sha = Sha256Hex(o.output_path);
  ASSERT_EQ(sha, ref["sha256"].get<std::string>())
      << "make-model no longer writes the bytes the llama.cpp reference was computed on: re-record "
         "tests/data/arch_logits (PROVENANCE.md) if the change is intended";

  auto file = ModelFile::Open(o.output_path);
  ASSERT_TRUE(file.ok()) << file.error().message;
  EXPECT_EQ(ArchName(file->config().arch), arch == "llama3" ? std::string("llama") : arch);
  auto tok = Tokenizer::Create(file->vocab());
  ASSERT_TRUE(tok.ok());
  for (auto [precision, bound] : {std::pair{kernels::Precision::kF32, 1e-3}, std::pair{kernels::Precision::kBF16, 0.03}}) {
    const DType kv = precision == kernels::Precision::kF32 ? DType::F32 : DType::BF16;
    for (const auto& c : ref["cases"]) {
      // llama.cpp's -c of this case: phi3 takes its long rope factors past the original context.
      const int n_ctx = c.contains("n_ctx") ? c["n_ctx"].get<int>() : ref["llama_cpp_n_ctx"].get<int>();
      auto model = Model::Create(*file, ModelOptions{precision, n_ctx});
      ASSERT_TRUE(model.ok()) << model.error().message;
      const std::vector<int32_t> ids = (*tok)->Encode(c["prompt"].get<std::string>(), true);
      ASSERT_EQ(ids, c["token_ids"].get<std::vector<int32_t>>()) << arch;
      const std::vector<float> want = c["logits"].get<std::vector<float>>();
      auto got = PromptLogits(**model, ids, false, kv);
      ASSERT_TRUE(got.ok()) << got.error().message;
      ASSERT_EQ(got->size(), want.size());
      const double rel = RelRms(*got, want);
      EXPECT_LE(rel, bound) << arch << " precision " << int(precision) << " n_ctx " << n_ctx << " prompt of " << ids.size()
                          << " tokens";
      EXPECT_EQ(ArgMax(got->data(), int(got->size())), ArgMax(want.data(), int(want.size()))) << arch;
    }
  }
  std::remove(o.output_path.c_str());
}

INSTANTIATE_TEST_SUITE_P(Archs, ArchGolden, ::testing::Values("llama", "llama3", "qwen2", "qwen3", "phi3"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace mnemo
