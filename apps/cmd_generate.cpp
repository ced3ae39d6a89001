// mnemo generate: text from a prompt with one model, printed as it comes or as one JSON object.
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "engine/generate.h"
#include "runtime.h"

namespace mnemo::app {
namespace {

struct GenerateFlags {
  std::string model, tokenizer, prompt;
  int max_tokens = 128;
  int ctx_size = 0;
  bool json = false;
  bool ignore_eos = false;
  SamplingParams sampling;
  std::vector<std::string> stop;
  RuntimeFlags runtime;
};

int RunGenerate(const GenerateFlags& f) {
  RuntimeFlags runtime = f.runtime;
  runtime.n_ctx = f.ctx_size;  // the context drives phi3's choice of rope factors, as in llama.cpp
  auto rt = LoadRuntime(f.model, f.tokenizer, runtime);
  if (!rt.ok()) {
    std::fprintf(stderr, "error: %s\n", rt.error().message.c_str());
    return 1;
  }
  const Tokenizer& tok = *rt->tokenizer;
  GenerateRequest req;
  req.prompt = tok.Encode(f.prompt, /*add_special=*/true);
  req.max_tokens = f.max_tokens;
  req.sampling = f.sampling;
  req.stop = f.stop;
  req.ignore_eos = f.ignore_eos;
  // A sampled BOS starts a new document (llama2.c models separate stories with it): stop there.
  if (tok.bos() >= 0) req.stop_tokens.push_back(tok.bos());
  int ctx = f.ctx_size > 0 ? f.ctx_size : rt->model->config().context_length;
  Generator gen(*rt->model, tok, rt->kv_dtype, ctx);
  auto on_text = [&](std::string_view s) {
    if (!f.json) {
      std::fwrite(s.data(), 1, s.size(), stdout);
      std::fflush(stdout);
    }
  };
  auto res = gen.Generate(req, on_text);
  if (!res.ok()) {
    std::fprintf(stderr, "error: %s\n", res.error().message.c_str());
    return 1;
  }
  if (f.json) {
    nlohmann::json j;
    j["prompt_token_ids"] = req.prompt;
    j["generated_token_ids"] = res->tokens;
    j["text"] = res->text;
    j["finish_reason"] = FinishReasonName(res->finish_reason);
    j["prefill_seconds"] = res->prefill_seconds;
    j["decode_seconds"] = res->decode_seconds;
    std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << std::endl;
  } else {
    std::printf("\n");
    std::fprintf(stderr, "[%zu prompt tokens in %.3f s, %zu generated in %.3f s: %.1f tok/s, finish: %s]\n",
                 req.prompt.size(), res->prefill_seconds, res->tokens.size(), res->decode_seconds,
                 res->decode_seconds > 0 ? res->tokens.size() / res->decode_seconds : 0.0,
                 FinishReasonName(res->finish_reason));
  }
  return 0;
}

}  // namespace

void RegisterGenerate(CLI::App& app) {
  auto f = std::make_shared<GenerateFlags>();
  f->sampling.temperature = 0.8f;
  auto* cmd = app.add_subcommand("generate", "generate text from a prompt");
  cmd->add_option("--model", f->model, "model file (GGUF or llama2.c .bin)")->required()->check(CLI::ExistingFile);
  cmd->add_option("--tokenizer", f->tokenizer, "llama2.c tokenizer file (tok512.bin) for .bin models")
      ->check(CLI::ExistingFile);
  cmd->add_option("--prompt", f->prompt, "prompt text");
  cmd->add_option("--max-tokens", f->max_tokens, "tokens to generate at most")->check(CLI::NonNegativeNumber);
  cmd->add_option("--ctx-size", f->ctx_size, "context positions (default: the model's)");
  cmd->add_option("--temperature", f->sampling.temperature, "0 = greedy");
  cmd->add_option("--top-k", f->sampling.top_k, "0 = off");
  cmd->add_option("--top-p", f->sampling.top_p, "1 = off");
  cmd->add_option("--min-p", f->sampling.min_p, "0 = off");
  cmd->add_option("--repeat-penalty", f->sampling.repetition_penalty, "1 = off");
  cmd->add_option("--frequency-penalty", f->sampling.frequency_penalty, "OpenAI frequency penalty");
  cmd->add_option("--presence-penalty", f->sampling.presence_penalty, "OpenAI presence penalty");
  cmd->add_option("--seed", f->sampling.seed, "random seed");
  cmd->add_option("--stop", f->stop, "stop string (repeatable, at most 4)");
  cmd->add_flag("--ignore-eos", f->ignore_eos, "do not stop at end-of-sequence tokens");
  cmd->add_flag("--json", f->json, "print one JSON object with token ids and text");
  AddRuntimeFlags(cmd, &f->runtime);
  cmd->callback([f] {
    int rc = RunGenerate(*f);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace mnemo::app
