// mnemo: one binary, one subcommand per job.
#include <cstdio>

#include "commands.h"

int main(int argc, char** argv) {
  CLI::App app{"mnemo: a stateful LLM serving engine for multi-turn conversations"};
  app.require_subcommand(1);
  mnemo::app::RegisterGenerate(app);
  mnemo::app::RegisterInspect(app);
  mnemo::app::RegisterMakeModel(app);
  mnemo::app::RegisterChat(app);
  mnemo::app::RegisterServe(app);
  mnemo::app::RegisterBench(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return 0;
}
