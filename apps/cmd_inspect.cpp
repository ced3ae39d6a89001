// mnemo inspect / make-model: model file tools.
#include <cstdio>
#include <fstream>
#include <iterator>

#include "commands.h"
#include "format/describe.h"
#include "format/make_model.h"

namespace mnemo::app {

void RegisterInspect(CLI::App& app) {
  struct Flags {
    std::string path, tokenizer;
  };
  auto f = std::make_shared<Flags>();
  auto* cmd = app.add_subcommand("inspect", "print a model's architecture, tokenizer and tensors");
  cmd->add_option("FILE", f->path, "model file (GGUF or llama2.c .bin)")->required()->check(CLI::ExistingFile);
  cmd->add_option("--tokenizer", f->tokenizer, "llama2.c tokenizer file for .bin models");
  cmd->callback([f] {
    auto text = DescribeFile(f->path, f->tokenizer);
    if (!text.ok()) {
      std::fprintf(stderr, "error: %s\n", text.error().message.c_str());
      throw CLI::RuntimeError(1);
    }
    std::fputs(text->c_str(), stdout);
  });
}

void RegisterMakeModel(CLI::App& app) {
  struct Flags {
    MakeModelOptions opt;
    std::string dtype = "f16";
    std::string chat_template_path;
    int context_length = 0;
  };
  auto f = std::make_shared<Flags>();
  auto* cmd = app.add_subcommand("make-model", "write a GGUF with random weights of a realistic shape");
  std::string archs, presets;
  for (const auto& a : MakeModelArchs()) {
    archs += (archs.empty() ? "" : ", ") + a;
    std::string names;
    for (const auto& p : PresetNames(a)) names += (names.empty() ? "" : " ") + p;
    presets += "; " + a + ": " + names;
  }
  cmd->add_option("--arch", f->opt.arch, "architecture: " + archs + " (default llama)")
      ->check(CLI::IsMember(MakeModelArchs()));
  cmd->add_option("--preset", f->opt.preset, "shape, per architecture" + presets)->required();
  cmd->add_option("--dtype", f->dtype, "matrix type: f32, f16, bf16 or q8_0")
      ->check(CLI::IsMember({"f32", "f16", "bf16", "q8_0"}));
  cmd->add_option("--seed", f->opt.seed, "random seed");
  cmd->add_option("--vocab", f->opt.vocab_path, "GGUF to take the tokenizer from")->required()->check(CLI::ExistingFile);
  cmd->add_option("--out", f->opt.output_path, "output GGUF")->required();
  cmd->add_option("--context-length", f->context_length, "positions the model declares (default: the preset's)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--chat-template", f->chat_template_path, "Jinja file written as tokenizer.chat_template "
                  "(default: the vocab's)")->check(CLI::ExistingFile);
  cmd->callback([f] {
    ParseDType(f->dtype, &f->opt.dtype);
    if (!f->chat_template_path.empty()) {
      std::ifstream in(f->chat_template_path, std::ios::binary);
      f->opt.chat_template.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
      if (!in.good() && !in.eof()) {
        std::fprintf(stderr, "error: cannot read %s\n", f->chat_template_path.c_str());
        throw CLI::RuntimeError(1);
      }
    }
    if (f->context_length > 0) {
      auto c = PresetConfig(f->opt.arch, f->opt.preset);
      if (!c.ok()) {
        std::fprintf(stderr, "error: %s\n", c.error().message.c_str());
        throw CLI::RuntimeError(1);
      }
      c->context_length = f->context_length;
      f->opt.config = *c;
      f->opt.name = f->opt.preset;
    }
    Status st = MakeModel(f->opt);
    if (!st.ok()) {
      std::fprintf(stderr, "error: %s\n", st.error().message.c_str());
      throw CLI::RuntimeError(1);
    }
  });
}

}  // namespace mnemo::app
