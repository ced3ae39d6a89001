// make-model: writes a Llama GGUF with random weights (deterministic from a seed) and a real
// tokenizer copied from a vocab GGUF, for benchmarks and tests. llama.cpp loads the output.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "base/status.h"
#include "format/model_file.h"

namespace mnemo {

// Named configs: "llama-25m" (dim 384, 6 layers), "llama-110m" (dim 768, 12 layers) and "llama-1b"
// (TinyLlama-1.1B shapes). All use a 32000-token vocab, context 2048, theta 10000, eps 1e-5.
Result<LlamaConfig> PresetConfig(const std::string& name);
std::vector<std::string> PresetNames();

struct MakeModelOptions {
  std::string preset = "llama-25m";  // a PresetConfig name; ignored when config is set
  std::optional<LlamaConfig> config; // custom shapes (tests); vocab_size must match the vocab file
  DType dtype = DType::F16;          // matrices; norms stay f32 as in llama.cpp's files
  uint64_t seed = 0;                 // same seed and config -> byte-identical file
  std::string vocab_path;            // GGUF whose tokenizer.* metadata is copied
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
