// mnemo quantize: rewrites a GGUF model with its matrices in another tensor type, either one type
// for every matrix or one of llama-quantize's presets (Q4_K_M, ...) with its per-tensor mixing
// rules (which tensors get more bits), so that the output matches what llama-quantize would choose.
// The quantisers are ours (base/quant.h); output bytes are deterministic for a given input.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/dtype.h"
#include "base/status.h"
#include "format/gguf.h"

namespace mnemo {

// What to quantise to. A lower-case dtype name ("q4_K", "iq4_xs", "f16", ...) puts every
// quantisable tensor in that one type (llama-quantize --pure); an upper-case preset name
// ("Q4_K_M", "Q4_0", "IQ4_XS", ...) applies llama-quantize's mixing rules around its default type.
struct QuantizeTarget {
  std::string name;         // as given
  DType base = DType::F16;  // the default type of matrices
  bool preset = false;      // llama-quantize mixing rules apply
  uint32_t file_type = 1;   // general.file_type (llama_ftype) written to the output
};
Result<QuantizeTarget> ParseQuantizeTarget(std::string_view name);
// Names accepted by ParseQuantizeTarget: dtype names, then presets.
std::vector<std::string> QuantizeTargetNames();

// The type chosen for one tensor of the input.
struct TensorPlan {
  std::string name;
  uint32_t in_type = 0;  // ggml type id in the input
  uint32_t out_type = 0; // ggml type id in the output
  bool convert = false;  // data is re-encoded (false: bytes copied as they are)
  bool fallback = false; // the row length did not fit the chosen type; a fallback type was used
};

// Chooses every tensor's output type (no data is read). Errors: an input tensor of a type mnemo
// cannot decode that would need converting.
Result<std::vector<TensorPlan>> PlanQuantize(const gguf::GgufFile& in, const QuantizeTarget& target);

struct QuantizeStats {
  uint64_t in_bytes = 0, out_bytes = 0;  // tensor data
  int n_converted = 0, n_copied = 0, n_fallback = 0;
};

// Reads in_path, writes out_path (atomically: via out_path.tmp). Metadata is copied except
// general.file_type (set from the target) and general.quantization_version (2 when any tensor is
// a block type). Rows are quantised in parallel on `threads` threads (0: OpenMP's default); the
// output does not depend on the thread count. Memory: one chunk of rows (<= 64 MiB of f32).
Result<QuantizeStats> QuantizeModel(const std::string& in_path, const std::string& out_path,
                                    const QuantizeTarget& target, int threads = 0);

}  // namespace mnemo
