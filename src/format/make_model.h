// make-model: writes a GGUF of any supported architecture with random weights (deterministic from
// a seed) and a real tokenizer copied from a vocab GGUF, for benchmarks and tests. llama.cpp loads
// the output. Every feature is visible in the weights: norm weights spread around 1, biases
// clearly non-zero, rope frequency factors not all ones.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "base/status.h"
#include "format/model_file.h"

namespace mnemo {

// Architectures make-model writes: "llama", "llama3" (llama with llama3 rope frequency factors
// and tied embeddings), "qwen2", "qwen3", "phi3", "gemma2", "gemma3".
std::vector<std::string> MakeModelArchs();

// Presets of an architecture: "tiny" (2 layers, every matrix width a multiple of 256, vocab from
// the vocab file), "small" (4 layers, width 512), and realistic shapes: llama "llama-25m",
// "llama-110m", "llama-1b" (TinyLlama-1.1B; these three use a 32000-token vocab); llama3
// "llama-3.2-1b"; qwen2 "qwen2.5-0.5b"; qwen3 "qwen3-0.6b"; phi3 "phi-3-mini"; gemma2
// "gemma-2-2b"; gemma3 "gemma-3-1b". Gemma's tiny presets have 4 layers, sliding windows of 24
// (gemma2) and 20 (gemma3) tokens and soft-caps that change ordinary scores and logits. vocab_size 0
// means "as many tokens as the vocab file has".
Result<ModelConfig> PresetConfig(const std::string& arch, const std::string& preset);
std::vector<std::string> PresetNames(const std::string& arch);

// The llama arch's presets (older interface).
Result<ModelConfig> PresetConfig(const std::string& preset);
std::vector<std::string> PresetNames();

struct MakeModelOptions {
  std::string arch = "llama";        // a MakeModelArchs name; ignored when config is set
  std::string preset = "llama-25m";  // a PresetConfig name of arch; ignored when config is set
  std::optional<ModelConfig> config; // custom shapes (tests); vocab_size 0 or the vocab file's size;
                                     // empty `layers` are filled uniformly
  DType dtype = DType::F16;          // matrices; norms, biases and rope factors stay f32 as in llama.cpp's files
  uint64_t seed = 0;                 // same seed and config -> byte-identical file
  std::string vocab_path;            // GGUF whose tokenizer.* metadata is copied
  std::string chat_template;         // tokenizer.chat_template to write instead of the vocab's (if any);
                                     // empty: the vocab's
  std::string output_path;           // the GGUF to write (replaced atomically)
  std::string name;                  // general.name; defaults to the preset name or "custom"
  float weight_std = 0.02f;          // standard deviation of the normal matrix weights
};

// Writes the model, streaming tensor data (memory stays bounded for multi-GB outputs). Q8_0 needs
// every matrix width (dim, ffn_dim, n_heads * head_dim) to be a multiple of 32.
Status MakeModel(const MakeModelOptions& opt);

// ggml file type (general.file_type) for a dtype: 0 f32, 1 f16, 7 q8_0, 32 bf16.
uint32_t GgmlFileType(DType t);

}  // namespace mnemo
