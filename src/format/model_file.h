// A decoder-only transformer file opened for inference: its config, its weights (in place in a
// read-only memory map, never copied) and its vocabulary. Two formats: GGUF (architectures llama,
// qwen2, qwen3, phi3; see gguf_model.cpp) and the llama2.c checkpoint (.bin, legacy version 0, f32)
// with its tokenizer .bin.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "base/status.h"
#include "format/gguf.h"
#include "format/mapped_file.h"
#include "format/model_config.h"
#include "tokenizer/vocab.h"

namespace mnemo {

// A row-major matrix [rows, cols] (or a vector: rows 1) in place in the model file. GGUF dims
// [cols, rows] (ne[0] fastest) map to rows x cols.
struct TensorRef {
  DType dtype = DType::F32;      // element type; Q8_0 rows are cols/32 blocks
  const void* data = nullptr;    // first byte, in the file map
  int64_t rows = 0;              // outer dimension
  int64_t cols = 0;              // inner (contiguous) dimension
  size_t bytes() const { return DTypeBytes(dtype, size_t(rows * cols)); }
  bool present() const { return data != nullptr; }
};

// One layer's tensors. Optional ones are empty (data == nullptr) when the config does not use them.
struct LayerWeights {
  TensorRef attn_norm;       // [1, dim] f32
  TensorRef wq;              // [q_dim, dim]; empty when wqkv is set
  TensorRef wk;              // [kv_dim, dim]; empty when wqkv is set
  TensorRef wv;              // [kv_dim, dim]; empty when wqkv is set
  TensorRef wqkv;            // [q_dim + 2 * kv_dim, dim]: Q, K, V rows fused in the file (phi3), or empty
  TensorRef bq, bk, bv;      // [1, q_dim], [1, kv_dim], [1, kv_dim] f32 biases (qkv_bias), or empty
  TensorRef q_norm, k_norm;  // [1, head_dim] f32 per-head RMSNorm weights (qk_norm), or empty
  TensorRef wo;              // [dim, q_dim]
  TensorRef attn_post_norm;  // [1, dim] f32 (post_norms), or empty
  TensorRef ffn_norm;        // [1, dim] f32
  TensorRef gate;            // [ffn_dim, dim] (w1); empty when `up` holds both (phi3)
  TensorRef up;              // [ffn_dim, dim] (w3), or [2 * ffn_dim, dim]: gate rows then up rows
  TensorRef down;            // [dim, ffn_dim] (w2)
  TensorRef ffn_post_norm;   // [1, dim] f32 (post_norms), or empty
};

struct ModelWeights {
  TensorRef tok_embd;     // [vocab, dim]
  TensorRef output_norm;  // [1, dim] f32
  TensorRef output;       // [vocab, dim]; the same as tok_embd when the config is tied
  std::vector<LayerWeights> layers;  // [n_layers]
};

// Older names, kept while callers move over.
using LlamaLayerWeights = LayerWeights;
using LlamaWeights = ModelWeights;

enum class ModelFormat { kGguf, kLlama2c };
const char* ModelFormatName(ModelFormat f);

class ModelFile {
 public:
  // Opens a model, detecting the format from the file's first bytes. tokenizer_path applies to
  // llama2.c checkpoints only; when empty, "tokenizer.bin" and then "tok<vocab_size>.bin" next to
  // the model are tried. Every tensor's shape and dtype is checked against the config; norms and
  // biases must be f32; a GGUF tensor the architecture does not use is an error.
  static Result<ModelFile> Open(const std::string& model_path, const std::string& tokenizer_path = "");

  // Builds a model from an already parsed GGUF (taking ownership of it).
  static Result<ModelFile> FromGguf(gguf::GgufFile f);

  ModelFile(ModelFile&&) noexcept = default;
  ModelFile& operator=(ModelFile&&) noexcept = default;
  ModelFile(const ModelFile&) = delete;
  ModelFile& operator=(const ModelFile&) = delete;

  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  const Vocab& vocab() const { return vocab_; }
  ModelFormat format() const { return format_; }
  const std::string& path() const { return path_; }
  const std::string& name() const { return name_; }  // general.name, or the file name
  // The parsed GGUF, or nullptr for llama2.c checkpoints.
  const gguf::GgufFile* gguf() const { return gguf_.get(); }
  // A 64-bit hash of everything a token's KV depends on: every tensor's name, shape, type and
  // bytes, and the vocabulary. Two files with equal fingerprints compute the same KV for the same
  // tokens; a re-quantized or fine-tuned file differs. Reads every weight byte once (XXH3, memory
  // speed once the pages are in: ~0.1 s per GB), so it is computed when asked, not at Open.
  uint64_t Fingerprint() const;

 private:
  ModelFile() = default;
  static Result<ModelFile> OpenLlama2c(MappedFile map, const std::string& path, const std::string& tokenizer_path);

  ModelFormat format_ = ModelFormat::kGguf;
  std::string path_;
  std::string name_;
  ModelConfig config_;
  ModelWeights weights_;
  Vocab vocab_;
  std::unique_ptr<gguf::GgufFile> gguf_;  // GGUF: owns the map the weights point into
  MappedFile map_;                        // llama2.c: the checkpoint map
};

// A 64-bit hash of a vocabulary's tokens, types and special ids: token ids mean the same text under
// two vocabularies with equal fingerprints.
uint64_t VocabFingerprint(const Vocab& v);

// Reads a llama2.c tokenizer file (int32 max_token_length, then per token: f32 score, int32 length,
// bytes) for n_vocab tokens, spelled as GGUF does: a space as U+2581, "\n<s>\n" -> "<s>",
// "\n</s>\n" -> "</s>", "<0xXX>" typed kByte, ids 1 and 2 control, id 0 unknown; bos 1, eos 2, unk 0.
Result<Vocab> ReadLlama2cVocab(const std::string& path, int n_vocab);

}  // namespace mnemo
