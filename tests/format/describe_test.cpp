#include "format/describe.h"

#include <gtest/gtest.h>

namespace mnemo {
namespace {

const std::string kModels = std::string(MNEMO_SHARED_DIR) + "/models";

bool Has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(Describe, Stories260KGguf) {
  auto d = DescribeFile(kModels + "/stories260K/stories260K.gguf");
  ASSERT_TRUE(d.ok()) << d.error().message;
  EXPECT_TRUE(Has(*d, "gguf v3")) << *d;
  EXPECT_TRUE(Has(*d, "dim 64, layers 5, heads 8, kv heads 4, head dim 8, ffn 172, vocab 512")) << *d;
  EXPECT_TRUE(Has(*d, "rope theta 10000")) << *d;
  EXPECT_TRUE(Has(*d, "context 2048")) << *d;
  // 260,032 parameters plus the separate output copy (512 * 64).
  EXPECT_TRUE(Has(*d, "(292800)")) << *d;
  EXPECT_TRUE(Has(*d, "512 tokens")) << *d;
  EXPECT_TRUE(Has(*d, "bos 1 \"<s>\", eos 2 \"</s>\", unk 0 \"<unk>\", pad none")) << *d;
  EXPECT_TRUE(Has(*d, "chat template none")) << *d;
  EXPECT_TRUE(Has(*d, "tensors:      48,")) << *d;
}

TEST(Describe, Stories260KBin) {
  auto d = DescribeFile(kModels + "/stories260K/stories260K.bin");
  ASSERT_TRUE(d.ok()) << d.error().message;
  EXPECT_TRUE(Has(*d, "llama2.c")) << *d;
  EXPECT_TRUE(Has(*d, "(260032)")) << *d;  // PROVENANCE.md's parameter count
  EXPECT_TRUE(Has(*d, "tied to embedding")) << *d;
  EXPECT_TRUE(Has(*d, "tensors:      47,")) << *d;
}

TEST(Describe, VocabOnlyGgufIsDescribedAsAContainer) {
  auto d = DescribeFile(kModels + "/vocab/ggml-vocab-llama-spm.gguf");
  ASSERT_TRUE(d.ok()) << d.error().message;
  EXPECT_TRUE(Has(*d, "tokenizer.ggml.model")) << *d;
  EXPECT_TRUE(Has(*d, "[string x 32000:")) << *d;
  EXPECT_TRUE(Has(*d, "not loadable as a model")) << *d;
  EXPECT_FALSE(DescribeFile("/nonexistent").ok());
}

}  // namespace
}  // namespace mnemo
