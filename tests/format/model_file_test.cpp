#include "format/model_file.h"

#include <unistd.h>
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

namespace mnemo {
namespace {

const std::string kDir = std::string(MNEMO_SHARED_DIR) + "/models/stories260K";
const std::string kGguf = kDir + "/stories260K.gguf";
const std::string kBin = kDir + "/stories260K.bin";
const std::string kTok = kDir + "/tok512.bin";

void ExpectConfig(const ModelConfig& c) {
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.n_layers, 5);
  EXPECT_EQ(c.n_heads, 8);
  EXPECT_EQ(c.n_kv_heads, 4);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.ffn_dim, 172);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.rope_dims, 8);
  EXPECT_EQ(c.rope_theta, 10000.f);
  EXPECT_FLOAT_EQ(c.rms_eps, 1e-5f);
}

TEST(ModelFile, OpensStories260KGguf) {
  auto m = ModelFile::Open(kGguf);
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_EQ(m->format(), ModelFormat::kGguf);
  ASSERT_NE(m->gguf(), nullptr);
  ExpectConfig(m->config());
  EXPECT_EQ(m->config().context_length, 2048);
  EXPECT_FALSE(m->config().tied_output);  // output.weight is stored (as a copy)
  const ModelWeights& w = m->weights();
  EXPECT_EQ(w.tok_embd.rows, 512);
  EXPECT_EQ(w.tok_embd.cols, 64);
  ASSERT_EQ(w.layers.size(), 5u);
  EXPECT_EQ(w.layers[0].wk.rows, 32);
  EXPECT_EQ(w.layers[0].down.rows, 64);
  EXPECT_EQ(w.layers[0].down.cols, 172);
  EXPECT_EQ(m->vocab().tokens.size(), 512u);
}

TEST(ModelFile, OpensStories260KBinWithTokenizerFoundNextToIt) {
  auto m = ModelFile::Open(kBin);  // finds tok512.bin by vocab size
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_EQ(m->format(), ModelFormat::kLlama2c);
  EXPECT_EQ(m->gguf(), nullptr);
  ExpectConfig(m->config());
  EXPECT_EQ(m->config().context_length, 512);
  EXPECT_TRUE(m->config().tied_output);
  EXPECT_EQ(m->weights().output.data, m->weights().tok_embd.data);
}

// PROVENANCE.md: all 48 GGUF tensors are bit-identical to the .bin weights.
TEST(ModelFile, GgufAndBinWeightsAreBitIdentical) {
  auto g = ModelFile::Open(kGguf);
  auto b = ModelFile::Open(kBin, kTok);
  ASSERT_TRUE(g.ok()) << g.error().message;
  ASSERT_TRUE(b.ok()) << b.error().message;
  int compared = 0;
  auto same = [&](const TensorRef& x, const TensorRef& y, const std::string& what) {
    ASSERT_EQ(x.dtype, y.dtype) << what;
    ASSERT_EQ(x.rows, y.rows) << what;
    ASSERT_EQ(x.cols, y.cols) << what;
    EXPECT_EQ(std::memcmp(x.data, y.data, x.bytes()), 0) << what;
    compared++;
  };
  const ModelWeights &wg = g->weights(), &wb = b->weights();
  same(wg.tok_embd, wb.tok_embd, "tok_embd");
  same(wg.output_norm, wb.output_norm, "output_norm");
  same(wg.output, wb.output, "output");
  for (int l = 0; l < 5; l++) {
    const auto &x = wg.layers[l], &y = wb.layers[l];
    std::string p = "layer " + std::to_string(l) + " ";
    same(x.attn_norm, y.attn_norm, p + "attn_norm");
    same(x.wq, y.wq, p + "wq");
    same(x.wk, y.wk, p + "wk");
    same(x.wv, y.wv, p + "wv");
    same(x.wo, y.wo, p + "wo");
    same(x.ffn_norm, y.ffn_norm, p + "ffn_norm");
    same(x.gate, y.gate, p + "gate");
    same(x.up, y.up, p + "up");
    same(x.down, y.down, p + "down");
  }
  EXPECT_EQ(compared, 48);
}

// PROVENANCE.md: scores identical, token strings identical after normalisation.
TEST(ModelFile, Llama2cVocabEqualsGgufVocab) {
  auto g = ModelFile::Open(kGguf);
  auto b = ModelFile::Open(kBin, kTok);
  ASSERT_TRUE(g.ok() && b.ok());
  const Vocab &vg = g->vocab(), &vb = b->vocab();
  EXPECT_EQ(vb.model, "llama");
  EXPECT_EQ(vb.tokens, vg.tokens);
  EXPECT_EQ(vb.scores, vg.scores);
  EXPECT_EQ(vb.types, vg.types);
  EXPECT_EQ(vb.bos, vg.bos);
  EXPECT_EQ(vb.eos, vg.eos);
  EXPECT_EQ(vb.unk, vg.unk);
  EXPECT_EQ(vb.add_bos, vg.add_bos);
  EXPECT_EQ(vb.add_space_prefix, vg.add_space_prefix);
}

class TempFile {
 public:
  explicit TempFile(const std::string& name) : path_(std::string(MNEMO_BINARY_DIR) + "/" + std::to_string(getpid()) + "." + name) {}
  ~TempFile() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }
  void Write(const std::string& bytes) { std::ofstream(path_, std::ios::binary) << bytes; }

 private:
  std::string path_;
};

std::string ReadAll(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

TEST(ModelFile, RejectsBrokenLlama2cCheckpoints) {
  std::string bin = ReadAll(kBin);
  TempFile t("model_file_test_broken.bin");
  t.Write(bin.substr(0, bin.size() - 4));
  auto m = ModelFile::Open(t.path(), kTok);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.error().message.find("implies"), std::string::npos) << m.error().message;

  std::string hdr = bin;
  int32_t bad = 7;  // n_heads that does not divide dim
  std::memcpy(hdr.data() + 12, &bad, 4);
  t.Write(hdr);
  EXPECT_FALSE(ModelFile::Open(t.path(), kTok).ok());

  t.Write("hello world, this is not a model at all.");
  m = ModelFile::Open(t.path(), kTok);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.error().message.find("not a GGUF"), std::string::npos) << m.error().message;

  EXPECT_FALSE(ModelFile::Open(kBin, kDir + "/missing.bin").ok());
  EXPECT_FALSE(ModelFile::Open(kGguf, kTok).ok());  // tokenizer only for llama2.c
}

TEST(ModelFile, RejectsBrokenTokenizer) {
  std::string tok = ReadAll(kTok);
  TempFile t("model_file_test_tok.bin");
  t.Write(tok.substr(0, tok.size() - 3));
  EXPECT_FALSE(ReadLlama2cVocab(t.path(), 512).ok());
  EXPECT_FALSE(ReadLlama2cVocab(kTok, 511).ok());  // bytes left over
  EXPECT_FALSE(ReadLlama2cVocab(kTok, 513).ok());
  auto v = ReadLlama2cVocab(kTok, 512);
  ASSERT_TRUE(v.ok()) << v.error().message;
  EXPECT_EQ(v->tokens[1], "<s>");
  EXPECT_EQ(v->tokens[261], "\xe2\x96\x81" "a");
  EXPECT_EQ(v->types[3], int32_t(TokenType::kByte));
}

}  // namespace
}  // namespace mnemo
