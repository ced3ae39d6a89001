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

// Serve's default tiers, for flags left < 0 (the rule is in `mnemo serve --help`):
//   T0 = min(1/4 of MemAvailable, the KV of 64 full-length contexts), at least 4 MB;
//   T1 = min(1/4 of MemAvailable, 4 x T0);
//   T2 = min(4096 MB, 1/4 of the free space of disk_dir's file system), 0 without disk_dir.
// bytes_per_token: KV bytes of one position (all layers); max_context: positions per session.
void AutoSizeTiers(EngineFlags* f, double bytes_per_token, int max_context);

// A runtime with an engine running on it (chat, serve). The engine is declared last, so it stops
// before the model and tokenizer it uses go away.
struct EngineRuntime {
  Runtime rt;
  std::unique_ptr<Engine> engine;
};
Result<EngineRuntime> StartEngine(const std::string& model_path, const std::string& tokenizer_path,
                                  const RuntimeFlags& runtime, const EngineFlags& engine);

}  // namespace mnemo::app
