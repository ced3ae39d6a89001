// A Llama-family model file opened for inference: its config, its weights (in place in a read-only
// memory map, never copied) and its vocabulary. Two formats: GGUF (architecture "llama") and the
// llama2.c checkpoint (.bin, legacy version 0, f32) with its tokenizer .bin.
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
#include "tokenizer/vocab.h"

namespace mnemo {

struct LlamaConfig {
  int dim = 0;                   // embedding width (model dimension)
  int n_layers = 0;              // transformer blocks
  int n_heads = 0;               // query heads
  int n_kv_heads = 0;            // key/value heads (grouped-query attention when < n_heads)
  int head_dim = 0;              // width of one head (q, k and v)
  int ffn_dim = 0;               // hidden width of the SwiGLU feed-forward
  int vocab_size = 0;            // tokens (rows of the embedding and of the output matrix)
  int rope_dims = 0;             // leading dims of each head that RoPE rotates (adjacent pairs)
  float rope_theta = 10000.f;    // RoPE base frequency
  float rms_eps = 1e-5f;         // RMSNorm epsilon
  int context_length = 0;        // trained context, in tokens
  bool tied_output = false;      // the output matrix is the token embedding (no separate tensor)
};

// A row-major matrix [rows, cols] (or a vector: rows 1) in place in the model file. GGUF dims
// [cols, rows] (ne[0] fastest) map to rows x cols.
struct TensorRef {
  DType dtype = DType::F32;      // element type; Q8_0 rows are cols/32 blocks
  const void* data = nullptr;    // first byte, in the file map
  int64_t rows = 0;              // outer dimension
  int64_t cols = 0;              // inner (contiguous) dimension
  size_t bytes() const { return DTypeBytes(dtype, size_t(rows * cols)); }
};

struct LlamaLayerWeights {
  TensorRef attn_norm;  // [1, dim] f32
  TensorRef wq;         // [n_heads * head_dim, dim]
  TensorRef wk;         // [n_kv_heads * head_dim, dim]
  TensorRef wv;         // [n_kv_heads * head_dim, dim]
  TensorRef wo;         // [dim, n_heads * head_dim]
  TensorRef ffn_norm;   // [1, dim] f32
  TensorRef gate;       // [ffn_dim, dim] (w1)
  TensorRef up;         // [ffn_dim, dim] (w3)
  TensorRef down;       // [dim, ffn_dim] (w2)
};

struct LlamaWeights {
  TensorRef tok_embd;     // [vocab, dim]
  TensorRef output_norm;  // [1, dim] f32
  TensorRef output;       // [vocab, dim]; the same as tok_embd when the config is tied
  std::vector<LlamaLayerWeights> layers;  // [n_layers]
};

enum class ModelFormat { kGguf, kLlama2c };
const char* ModelFormatName(ModelFormat f);

class ModelFile {
 public:
  // Opens a model, detecting the format from the file's first bytes. tokenizer_path applies to
  // llama2.c checkpoints only; when empty, "tokenizer.bin" and then "tok<vocab_size>.bin" next to
  // the model are tried. Every tensor's shape and dtype is checked against the config; norms
  // must be f32, matrices f32, f16, bf16 or q8_0.
  static Result<ModelFile> Open(const std::string& model_path, const std::string& tokenizer_path = "");

  // Builds a model from an already parsed GGUF (taking ownership of it).
  static Result<ModelFile> FromGguf(gguf::GgufFile f);

  ModelFile(ModelFile&&) noexcept = default;
  ModelFile& operator=(ModelFile&&) noexcept = default;
  ModelFile(const ModelFile&) = delete;
  ModelFile& operator=(const ModelFile&) = delete;

  const LlamaConfig& config() const { return config_; }
  const LlamaWeights& weights() const { return weights_; }
  const Vocab& vocab() const { return vocab_; }
  ModelFormat format() const { return format_; }
  const std::string& path() const { return path_; }
  const std::string& name() const { return name_; }  // general.name, or the file name
  // The parsed GGUF, or nullptr for llama2.c checkpoints.
  const gguf::GgufFile* gguf() const { return gguf_.get(); }

 private:
  ModelFile() = default;
  static Result<ModelFile> OpenLlama2c(MappedFile map, const std::string& path, const std::string& tokenizer_path);

  ModelFormat format_ = ModelFormat::kGguf;
  std::string path_;
  std::string name_;
  LlamaConfig config_;
  LlamaWeights weights_;
  Vocab vocab_;
  std::unique_ptr<gguf::GgufFile> gguf_;  // GGUF: owns the map the weights point into
  MappedFile map_;                        // llama2.c: the checkpoint map
};

// Reads a llama2.c tokenizer file (int32 max_token_length, then per token: f32 score, int32 length,
// bytes) for n_vocab tokens, spelled as GGUF does: a space as U+2581, "\n<s>\n" -> "<s>",
// "\n</s>\n" -> "</s>", "<0xXX>" typed kByte, ids 1 and 2 control, id 0 unknown; bos 1, eos 2, unk 0.
Result<Vocab> ReadLlama2cVocab(const std::string& path, int n_vocab);

}  // namespace mnemo
