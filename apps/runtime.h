// Loading a model for a command: file, tokenizer, prepared weights, runtime settings.
#pragma once

#include <memory>
#include <string>

#include "base/status.h"
#include "commands.h"
#include "engine/engine.h"
#include "format/model_file.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace mnemo::app {

struct Runtime {
  std::unique_ptr<ModelFile> file;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<Model> model;
  DType kv_dtype = DType::BF16;
};

// Applies the thread count, opens the model (and llama2.c tokenizer file if given), builds the
// tokenizer and prepares the weights for the chosen precision.
Result<Runtime> LoadRuntime(const std::string& model_path, const std::string& tokenizer_path,
                            const RuntimeFlags& flags);

// The engine configuration the flags describe, for a runtime's KV dtype.
EngineConfig MakeEngineConfig(const EngineFlags& f, DType kv_dtype);

// A runtime with an engine running on it (chat, serve). The engine is declared last, so it stops
// before the model and tokenizer it uses go away.
struct EngineRuntime {
  Runtime rt;
  std::unique_ptr<Engine> engine;
};
Result<EngineRuntime> StartEngine(const std::string& model_path, const std::string& tokenizer_path,
                                  const RuntimeFlags& runtime, const EngineFlags& engine);

}  // namespace mnemo::app
