// Human-readable summaries of model files (for `mnemo inspect`).
#pragma once

#include <string>

#include "base/status.h"
#include "format/gguf.h"
#include "format/model_file.h"

namespace mnemo {

// Architecture, config, parameter count, tokenizer (model, size, special ids, flags, chat
// template present?) and a tensor summary (count, bytes per dtype). Multi-line, ends with '\n'.
std::string DescribeModel(const ModelFile& m);

// A GGUF file at the container level: version, alignment, every metadata key (long arrays and
// strings abbreviated) and every tensor (name, type, dims) when list_tensors is set.
std::string DescribeGguf(const gguf::GgufFile& f, bool list_tensors);

// Opens path as a model and describes it. A GGUF that is not a loadable model (a vocab-only
// file, another architecture) is described at the container level with the reason it is not
// loadable. Errors only when the file cannot be read at all.
Result<std::string> DescribeFile(const std::string& path, const std::string& tokenizer_path = "");

}  // namespace mnemo
