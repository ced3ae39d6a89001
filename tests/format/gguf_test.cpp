#include "format/gguf.h"

#include <gtest/gtest.h>

#include <cmath>

#include "format/gguf_vocab.h"
#include "gguf_bytes.h"

namespace mnemo::gguf {
namespace {

const std::string kShared = MNEMO_SHARED_DIR;
const std::string kStories = kShared + "/models/stories260K/stories260K.gguf";
const std::string kSpm = kShared + "/models/vocab/ggml-vocab-llama-spm.gguf";
const std::string kGpt2 = kShared + "/models/vocab/ggml-vocab-gpt-2.gguf";

using test::GgufBytes;

TEST(Gguf, ReadsStories260KHeaderAndMetadata) {
  auto f = GgufFile::Open(kStories);
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->metadata().size(), 19u);
  EXPECT_EQ(f->tensors().size(), 48u);
  EXPECT_EQ(f->alignment(), 32u);
  EXPECT_EQ(f->data_offset(), 14176u);
  EXPECT_EQ(*f->GetString("general.architecture"), "llama");
  EXPECT_EQ(*f->GetU32("llama.context_length"), 2048u);
  EXPECT_EQ(*f->GetU32("llama.embedding_length"), 64u);
  EXPECT_EQ(*f->GetU32("llama.feed_forward_length"), 172u);
  EXPECT_EQ(*f->GetU32("llama.attention.head_count_kv"), 4u);
  EXPECT_FLOAT_EQ(*f->GetF32("llama.attention.layer_norm_rms_epsilon"), 1e-5f);
  EXPECT_EQ(*f->GetU32("tokenizer.ggml.seperator_token_id"), 4294967295u);
  EXPECT_FALSE(f->Has("llama.rope.freq_base"));
  EXPECT_EQ(*f->GetArrayLength("tokenizer.ggml.tokens"), 512u);
}

TEST(Gguf, TensorInfosOfStories260K) {
  auto f = GgufFile::Open(kStories);
  ASSERT_TRUE(f.ok()) << f.error().message;
  const auto& ts = f->tensors();
  EXPECT_EQ(ts[0].name, "token_embd.weight");
  EXPECT_EQ(ts[1].name, "output_norm.weight");
  const TensorInfo* emb = f->FindTensor("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->dims, (std::vector<int64_t>{64, 512}));
  EXPECT_EQ(emb->type, kGgmlF32);
  EXPECT_EQ(emb->dtype, DType::F32);
  EXPECT_EQ(emb->nbytes, 64u * 512 * 4);
  EXPECT_EQ(emb->offset, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(emb->data) % 32, 0u);
  const TensorInfo* down = f->FindTensor("blk.4.ffn_down.weight");
  ASSERT_NE(down, nullptr);
  EXPECT_EQ(down->dims, (std::vector<int64_t>{172, 64}));
  EXPECT_EQ(f->FindTensor("nope"), nullptr);
  // The tensors tile the data section up to the end of the file.
  uint64_t total = 0;
  for (const auto& t : ts) total += (t.nbytes + 31) / 32 * 32;
  EXPECT_EQ(f->data_offset() + total, f->file_size());
}

TEST(Gguf, TypedGettersGiveClearErrors) {
  auto f = GgufFile::Open(kStories);
  ASSERT_TRUE(f.ok());
  auto missing = f->GetU32("llama.rope.freq_base");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("llama.rope.freq_base"), std::string::npos);
  auto wrong = f->GetU32("general.architecture");
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.error().message.find("type string"), std::string::npos);
  EXPECT_FALSE(f->GetString("llama.block_count").ok());
  EXPECT_FALSE(f->GetF32Array("tokenizer.ggml.tokens").ok());
  EXPECT_FLOAT_EQ(*f->GetF32Or("llama.rope.freq_base", 10000.f), 10000.f);
  EXPECT_FALSE(f->GetF32Or("general.name", 1.f).ok());
}

TEST(Gguf, RejectsBadHeaders) {
  auto err = [](const GgufBytes& g) {
    auto f = GgufFile::FromBytes(g.b.data(), g.b.size());
    EXPECT_FALSE(f.ok());
    return f.ok() ? std::string() : f.error().message;
  };
  EXPECT_NE(err(GgufBytes{{'G', 'G'}}).find("too short"), std::string::npos);
  EXPECT_NE(err(GgufBytes{{'G', 'G', 'M', 'L', 0, 0, 0, 0}}).find("not a GGUF"), std::string::npos);
  EXPECT_NE(err(GgufBytes().Header(1, 0, 0)).find("version 1"), std::string::npos);
  EXPECT_NE(err(GgufBytes().Header(4, 0, 0)).find("version 4"), std::string::npos);
  EXPECT_NE(err(GgufBytes().Header(0x03000000, 0, 0)).find("big-endian"), std::string::npos);
  EXPECT_NE(err(GgufBytes().Header(3, uint64_t(1) << 60, 0)).find("tensor count"), std::string::npos);
  EXPECT_NE(err(GgufBytes().Header(3, 0, ~uint64_t(0))).find("metadata count"), std::string::npos);
  // A string length past the end of the file.
  EXPECT_NE(err(GgufBytes().Header(3, 0, 1).Put<uint64_t>(1000).Zeros(20)).find("past the end"), std::string::npos);
  // Unknown value type, bad bool, huge array.
  EXPECT_NE(err(GgufBytes().Header(3, 0, 1).Str("k").Put<uint32_t>(13).Zeros(8)).find("unknown value type"),
            std::string::npos);
  EXPECT_NE(err(GgufBytes().Header(3, 0, 1).Str("k").Put<uint32_t>(7).Put<uint8_t>(2)).find("bool"),
            std::string::npos);
  EXPECT_NE(err(GgufBytes().Header(3, 0, 1).Str("k").Put<uint32_t>(9).Put<uint32_t>(8).Put<uint64_t>(uint64_t(1) << 61))
                .find("past the end"),
            std::string::npos);
  EXPECT_NE(err(GgufBytes().Header(3, 0, 2).KvU32("a", 1).KvU32("a", 2)).find("duplicate"), std::string::npos);
  EXPECT_NE(err(GgufBytes().Header(3, 0, 1).KvU32("general.alignment", 3)).find("alignment"), std::string::npos);
}

TEST(Gguf, RejectsBadTensors) {
  auto err = [](const GgufBytes& g) {
    auto f = GgufFile::FromBytes(g.b.data(), g.b.size());
    EXPECT_FALSE(f.ok());
    return f.ok() ? std::string() : f.error().message;
  };
  // Data past the end of the file.
  EXPECT_NE(err(GgufBytes().Header(3, 1, 0).Tensor("t", {8}, 0, 0).Align(32).Zeros(16)).find("past the end"),
            std::string::npos);
  // Misaligned offset.
  EXPECT_NE(err(GgufBytes().Header(3, 1, 0).Tensor("t", {4}, 0, 4).Align(32).Zeros(64)).find("alignment"),
            std::string::npos);
  // Overlap.
  EXPECT_NE(err(GgufBytes().Header(3, 2, 0).Tensor("a", {16}, 0, 0).Tensor("b", {16}, 0, 32).Align(32).Zeros(128))
                .find("overlap"),
            std::string::npos);
  EXPECT_NE(err(GgufBytes().Header(3, 2, 0).Tensor("a", {4}, 0, 0).Tensor("a", {4}, 0, 32).Align(32).Zeros(64))
                .find("duplicate"),
            std::string::npos);
  EXPECT_NE(err(GgufBytes().Header(3, 1, 0).Tensor("t", {4}, 99, 0).Align(32).Zeros(64)).find("unknown ggml type"),
            std::string::npos);
  EXPECT_NE(err(GgufBytes().Header(3, 1, 0).Tensor("t", {4}, 4, 0).Align(32).Zeros(64)).find("unknown ggml type"),
            std::string::npos);
  EXPECT_NE(err(GgufBytes().Header(3, 1, 0).Tensor("t", {40}, 8, 0).Align(32).Zeros(64)).find("block size"),
            std::string::npos);
  EXPECT_NE(err(GgufBytes().Header(3, 1, 0).Tensor("t", {1, 2, 3, 4, 5}, 0, 0)).find("dimensions"), std::string::npos);
  EXPECT_NE(err(GgufBytes().Header(3, 1, 0).Tensor("t", {uint64_t(1) << 40, uint64_t(1) << 40}, 0, 0)).find("overflows"),
            std::string::npos);
  EXPECT_NE(err(GgufBytes().Header(3, 1, 0).Tensor("t", {uint64_t(1) << 40}, 0, 0).Align(32).Zeros(64)).find("do not fit"),
            std::string::npos);
}

TEST(Gguf, ParsesAllValueTypesAndUnsupportedTensorTypes) {
  GgufBytes g;
  g.Header(2, 2, 13);
  g.Str("u8").Put<uint32_t>(0).Put<uint8_t>(200);
  g.Str("i8").Put<uint32_t>(1).Put<int8_t>(-5);
  g.Str("u16").Put<uint32_t>(2).Put<uint16_t>(60000);
  g.Str("i16").Put<uint32_t>(3).Put<int16_t>(-300);
  g.Str("u32").Put<uint32_t>(4).Put<uint32_t>(4000000000u);
  g.Str("i32").Put<uint32_t>(5).Put<int32_t>(-7);
  g.Str("f32").Put<uint32_t>(6).Put<float>(1.5f);
  g.Str("bool").Put<uint32_t>(7).Put<uint8_t>(1);
  g.Str("str").Put<uint32_t>(8).Str("hello");
  g.Str("u64").Put<uint32_t>(10).Put<uint64_t>(uint64_t(1) << 40);
  g.Str("i64").Put<uint32_t>(11).Put<int64_t>(-(int64_t(1) << 40));
  g.Str("f64").Put<uint32_t>(12).Put<double>(0.25);
  // [[1, 2], [3]] as nested i32 arrays.
  g.Str("nested").Put<uint32_t>(9).Put<uint32_t>(9).Put<uint64_t>(2);
  g.Put<uint32_t>(5).Put<uint64_t>(2).Put<int32_t>(1).Put<int32_t>(2);
  g.Put<uint32_t>(5).Put<uint64_t>(1).Put<int32_t>(3);
  g.Tensor("q4", {64, 2}, 12 - 10, 0);  // q4_0: 2 rows of 2 blocks of 18 bytes
  g.Tensor("bf", {4}, 30, 96);
  g.Align(32).Zeros(96 + 8);
  auto f = GgufFile::FromBytes(g.b.data(), g.b.size());
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_EQ(f->version(), 2u);
  EXPECT_EQ(*f->GetU32("u8"), 200u);
  EXPECT_EQ(*f->GetI64("i8"), -5);
  EXPECT_EQ(*f->GetU32("u16"), 60000u);
  EXPECT_EQ(*f->GetI64("i16"), -300);
  EXPECT_EQ(*f->GetU32("u32"), 4000000000u);
  EXPECT_FALSE(f->GetU32("i32").ok());  // negative
  EXPECT_FLOAT_EQ(*f->GetF32("f32"), 1.5f);
  EXPECT_TRUE(*f->GetBool("bool"));
  EXPECT_EQ(*f->GetString("str"), "hello");
  EXPECT_FALSE(f->GetU32("u64").ok());  // does not fit
  EXPECT_EQ(*f->GetU64("u64"), uint64_t(1) << 40);
  EXPECT_EQ(*f->GetI64("i64"), -(int64_t(1) << 40));
  EXPECT_FLOAT_EQ(*f->GetF32("f64"), 0.25f);
  const Value* nested = f->Find("nested");
  ASSERT_NE(nested, nullptr);
  ASSERT_EQ(nested->arrays.size(), 2u);
  EXPECT_EQ(nested->arrays[0].count, 2u);
  EXPECT_EQ(nested->arrays[0].NumberAt(1), 2.0);
  EXPECT_EQ(nested->arrays[1].NumberAt(0), 3.0);
  const TensorInfo* q4 = f->FindTensor("q4");
  ASSERT_NE(q4, nullptr);
  EXPECT_EQ(q4->nbytes, 72u);
  EXPECT_EQ(q4->dtype, DType::Q4_0);
  EXPECT_EQ(f->FindTensor("bf")->dtype, DType::BF16);
}

TEST(Gguf, GgmlTypeIdsMapToDTypesBothWays) {
  for (DType t : kAllDTypes) {
    uint32_t id = DTypeToGgml(t);
    EXPECT_EQ(GgmlToDType(id), t) << DTypeName(t);
    auto info = GgmlType(id);
    ASSERT_TRUE(info.has_value());
    EXPECT_STREQ(info->name, DTypeName(t));
    EXPECT_EQ(info->block_elems, DTypeBlockElems(t));
    EXPECT_EQ(info->block_bytes, DTypeBlockBytes(t));
  }
  // Types ggml defines that mnemo does not decode.
  for (uint32_t id : {9u, 15u, 16u, 17u, 18u, 19u, 21u, 22u, 24u, 26u, 29u, 34u, 35u, 39u}) {
    EXPECT_TRUE(GgmlType(id).has_value()) << id;
    EXPECT_FALSE(GgmlToDType(id).has_value()) << id;
  }
}

TEST(Gguf, RowNotAWholeNumberOfBlocksNamesTensorAndType) {
  auto err = [](GgufBytes g) {
    auto f = GgufFile::FromBytes(g.b.data(), g.b.size());
    return f.ok() ? std::string() : f.error().message;
  };
  std::string e = err(GgufBytes().Header(3, 1, 0).Tensor("blk.0.attn_q.weight", {128, 2}, 12, 0).Align(32).Zeros(288));
  EXPECT_NE(e.find("blk.0.attn_q.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("q4_K"), std::string::npos) << e;
  e = err(GgufBytes().Header(3, 1, 0).Tensor("w", {48, 1}, 20, 0).Align(32).Zeros(64));
  EXPECT_NE(e.find("iq4_nl"), std::string::npos) << e;
}

TEST(Gguf, OpenReportsMissingFile) {
  auto f = GgufFile::Open("/nonexistent/x.gguf");
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.error().message.find("/nonexistent/x.gguf"), std::string::npos);
}

TEST(GgufVocab, LlamaSpm) {
  auto f = GgufFile::Open(kSpm);
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_TRUE(f->tensors().empty());
  auto v = ReadVocab(*f);
  ASSERT_TRUE(v.ok()) << v.error().message;
  EXPECT_EQ(v->model, "llama");
  EXPECT_EQ(v->pre, "default");
  ASSERT_EQ(v->tokens.size(), 32000u);
  EXPECT_EQ(v->scores.size(), 32000u);
  EXPECT_EQ(v->types.size(), 32000u);
  EXPECT_EQ(v->tokens[0], "<unk>");
  EXPECT_EQ(v->tokens[1], "<s>");
  EXPECT_EQ(v->tokens[2], "</s>");
  EXPECT_EQ(v->tokens[3], "<0x00>");
  EXPECT_EQ(v->types[3], int32_t(TokenType::kByte));
  EXPECT_EQ(v->types[1], int32_t(TokenType::kControl));
  EXPECT_EQ(v->bos, 1);
  EXPECT_EQ(v->eos, 2);
  EXPECT_EQ(v->unk, 0);
  EXPECT_TRUE(v->add_bos);
  EXPECT_FALSE(v->add_eos);
  EXPECT_TRUE(v->add_space_prefix);
  EXPECT_TRUE(v->merges.empty());
}

TEST(GgufVocab, Gpt2) {
  auto f = GgufFile::Open(kGpt2);
  ASSERT_TRUE(f.ok()) << f.error().message;
  auto v = ReadVocab(*f);
  ASSERT_TRUE(v.ok()) << v.error().message;
  EXPECT_EQ(v->model, "gpt2");
  EXPECT_EQ(v->pre, "gpt-2");
  EXPECT_EQ(v->tokens.size(), 50257u);
  EXPECT_EQ(v->merges.size(), 50000u);
  EXPECT_EQ(v->bos, 50256);
  EXPECT_EQ(v->eos, 50256);
  EXPECT_FALSE(v->add_space_prefix);
  EXPECT_EQ(v->merges[0].find(' ') != std::string::npos, true);
}

TEST(GgufVocab, Stories260KDefaults) {
  auto f = GgufFile::Open(kStories);
  ASSERT_TRUE(f.ok()) << f.error().message;
  auto v = ReadVocab(*f);
  ASSERT_TRUE(v.ok()) << v.error().message;
  EXPECT_EQ(v->model, "llama");
  ASSERT_EQ(v->tokens.size(), 512u);
  EXPECT_EQ(v->tokens[259], "\xe2\x96\x81t");  // "▁t"
  EXPECT_EQ(v->scores[0], 0.f);
  EXPECT_EQ(v->scores[260], -1.f);
  EXPECT_EQ(v->scores[511], -252.f);
  EXPECT_EQ(v->types[0], int32_t(TokenType::kUnknown));
  EXPECT_EQ(v->types[258], int32_t(TokenType::kByte));
  EXPECT_EQ(v->types[259], int32_t(TokenType::kNormal));
  EXPECT_EQ(v->bos, 1);
  EXPECT_EQ(v->eos, 2);
  EXPECT_EQ(v->unk, 0);
  EXPECT_EQ(v->pad, -1);  // 0xFFFFFFFF in the file
  EXPECT_TRUE(v->add_bos);  // key absent: SPM default
  EXPECT_TRUE(v->chat_template.empty());
}

TEST(GgufVocab, RejectsBadTokenizerMetadata) {
  auto vocab = [](const GgufBytes& g) {
    auto f = GgufFile::FromBytes(g.b.data(), g.b.size());
    EXPECT_TRUE(f.ok()) << f.error().message;
    return ReadVocab(*f);
  };
  EXPECT_FALSE(vocab(GgufBytes().Header(3, 0, 0)).ok());  // no tokens
  EXPECT_FALSE(vocab(GgufBytes().Header(3, 0, 1).KvStr("tokenizer.ggml.model", "bert")).ok());
  GgufBytes g;
  g.Header(3, 0, 2).Str("tokenizer.ggml.tokens").Put<uint32_t>(9).Put<uint32_t>(8).Put<uint64_t>(2).Str("a").Str("b");
  g.Str("tokenizer.ggml.scores").Put<uint32_t>(9).Put<uint32_t>(6).Put<uint64_t>(1).Put<float>(0);
  auto v = vocab(g);
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.error().message.find("scores"), std::string::npos);
}

}  // namespace
}  // namespace mnemo::gguf
