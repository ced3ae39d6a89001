#include "runtime.h"

#include <unistd.h>

#include <chrono>
#include <cstdarg>
#include <cstdio>

#include "base/cpu.h"

namespace mnemo::app {

void Progress(const char* fmt, ...) {
  if (!isatty(STDERR_FILENO)) return;
  va_list ap;
  va_start(ap, fmt);
  std::vfprintf(stderr, fmt, ap);
  va_end(ap);
}

void AddRuntimeFlags(CLI::App* cmd, RuntimeFlags* f) {
  cmd->add_option("--threads", f->threads, "kernel threads (default: all cores)")->check(CLI::NonNegativeNumber);
  cmd->add_option("--precision", f->precision, "linear layers: f32 (exact) or bf16 (fast)")
      ->check(CLI::IsMember({"f32", "bf16"}));
  cmd->add_option("--kv-dtype", f->kv_dtype, "KV cache element type: f32, f16 or bf16")
      ->check(CLI::IsMember({"f32", "f16", "bf16"}));
}

Result<Runtime> LoadRuntime(const std::string& model_path, const std::string& tokenizer_path,
                            const RuntimeFlags& flags) {
  SetNumThreads(flags.threads);
  auto t0 = std::chrono::steady_clock::now();
  Progress("loading %s ...", model_path.c_str());
  Runtime rt;
  auto file = ModelFile::Open(model_path, tokenizer_path);
  if (!file.ok()) return file.error();
  rt.file = std::make_unique<ModelFile>(std::move(file.value()));
  auto tok = Tokenizer::Create(rt.file->vocab());
  if (!tok.ok()) return tok.error();
  rt.tokenizer = std::move(tok.value());
  ModelOptions opts;
  opts.precision = flags.precision == "f32" ? kernels::Precision::kF32 : kernels::Precision::kBF16;
  auto model = LlamaModel::Create(*rt.file, opts);
  if (!model.ok()) return model.error();
  rt.model = std::move(model.value());
  std::string kv = flags.kv_dtype.empty() ? (flags.precision == "f32" ? "f32" : "bf16") : flags.kv_dtype;
  ParseDType(kv, &rt.kv_dtype);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  Progress(" done in %.2f s\n", s);
  return rt;
}

}  // namespace mnemo::app
