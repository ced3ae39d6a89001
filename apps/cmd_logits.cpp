// mnemo logits: the raw next-token logits of a prompt as one JSON object (for comparisons against
// other engines; scripts depend on the flag and field names).
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "model/prompt_logits.h"
#include "runtime.h"

namespace mnemo::app {
namespace {

struct LogitsFlags {
  std::string model, tokenizer, prompt;
  bool all_positions = false;
  bool json = false;
  RuntimeFlags runtime;
};

int RunLogits(const LogitsFlags& f) {
  auto rt = LoadRuntime(f.model, f.tokenizer, f.runtime);
  if (!rt.ok()) {
    std::fprintf(stderr, "error: %s\n", rt.error().message.c_str());
    return 1;
  }
  // BOS as `generate` adds it (when the vocab asks for it).
  const std::vector<int32_t> tokens = rt->tokenizer->Encode(f.prompt, /*add_special=*/true);
  auto logits = PromptLogits(*rt->model, tokens, f.all_positions, rt->kv_dtype);
  if (!logits.ok()) {
    std::fprintf(stderr, "error: %s\n", logits.error().message.c_str());
    return 1;
  }
  const size_t vocab = size_t(rt->model->config().vocab_size);
  nlohmann::json j;
  j["prompt_token_ids"] = tokens;
  if (f.all_positions) {
    nlohmann::json rows = nlohmann::json::array();
    for (size_t r = 0; r < tokens.size(); r++) {
      rows.push_back(std::vector<float>(logits->begin() + r * vocab, logits->begin() + (r + 1) * vocab));
    }
    j["logits"] = std::move(rows);
  } else {
    j["logits"] = *logits;
  }
  if (f.json) {
    std::cout << j.dump() << std::endl;
  } else {
    std::cout << j.dump(1) << std::endl;
  }
  return 0;
}

}  // namespace

void RegisterLogits(CLI::App& app) {
  auto f = std::make_shared<LogitsFlags>();
  f->runtime.precision = "f32";
  auto* cmd = app.add_subcommand("logits", "print a prompt's next-token logits as JSON");
  cmd->add_option("--model", f->model, "model file (GGUF or llama2.c .bin)")->required()->check(CLI::ExistingFile);
  cmd->add_option("--tokenizer", f->tokenizer, "llama2.c tokenizer file for .bin models")->check(CLI::ExistingFile);
  cmd->add_option("--prompt", f->prompt, "prompt text")->required();
  cmd->add_option("--ctx-size", f->runtime.n_ctx,
                  "context positions the model is prepared for (default: the model's; phi3 picks its long "
                  "rope factors past the original context, as llama.cpp's -c)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--all-positions", f->all_positions, "logits of every prompt position (a list of lists)");
  cmd->add_flag("--json", f->json, "one JSON object on one line");
  AddRuntimeFlags(cmd, &f->runtime);
  cmd->callback([f] {
    if (int rc = RunLogits(*f); rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace mnemo::app
