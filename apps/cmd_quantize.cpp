// mnemo quantize IN.gguf OUT.gguf --type T: rewrite a model's matrices in another tensor type.
#include <cstdio>

#include "commands.h"
#include "format/quantize_model.h"

namespace mnemo::app {

void RegisterQuantize(CLI::App& app) {
  struct Flags {
    std::string in, out, type;
    int threads = 0;
  };
  auto f = std::make_shared<Flags>();
  auto* cmd = app.add_subcommand("quantize", "rewrite a GGUF model's matrices in another type or llama-quantize preset");
  cmd->add_option("IN", f->in, "input GGUF")->required()->check(CLI::ExistingFile);
  cmd->add_option("OUT", f->out, "output GGUF (replaced atomically)")->required();
  std::string names;
  for (const auto& n : QuantizeTargetNames()) names += (names.empty() ? "" : ", ") + n;
  cmd->add_option("--type", f->type,
                  "a tensor type for every matrix (lower case: " + names.substr(0, names.find("Q4_0") - 2) +
                      ") or a llama-quantize preset with its mixing rules (Q4_K_M, Q5_K_M, Q6_K, ...)")
      ->required();
  cmd->add_option("--threads", f->threads, "threads (0 = all cores); the output does not depend on it");
  cmd->callback([f] {
    auto target = ParseQuantizeTarget(f->type);
    if (!target.ok()) {
      std::fprintf(stderr, "error: %s\n", target.error().message.c_str());
      throw CLI::RuntimeError(1);
    }
    auto st = QuantizeModel(f->in, f->out, *target, f->threads);
    if (!st.ok()) {
      std::fprintf(stderr, "error: %s\n", st.error().message.c_str());
      throw CLI::RuntimeError(1);
    }
    std::printf("%s: %d tensors converted (%d with a fallback type), %d copied; %.1f MiB -> %.1f MiB\n",
                f->out.c_str(), st->n_converted, st->n_fallback, st->n_copied, double(st->in_bytes) / (1 << 20),
                double(st->out_bytes) / (1 << 20));
  });
}

}  // namespace mnemo::app
