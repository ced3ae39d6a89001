// mnemo: one binary, one subcommand per job.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "commands.h"

int main(int argc, char** argv) {
  // OpenMP workers (oneDNN's, in prefill GEMMs; our own kernels use base/thread_pool.h) sleep at
  // barriers instead of spinning. With spinning (libgomp's default), a waiting worker takes the
  // core from the thread still working whenever anything else runs (the server's HTTP and
  // transfer threads, other processes): measured when the decode kernels still used OpenMP,
  // decode fell from 54 to 1.4-4.7 tokens/s under load. libgomp reads the policy when it loads,
  // so the process re-executes itself once with it set; an explicit OMP_WAIT_POLICY in the
  // environment is respected.
  if (!std::getenv("OMP_WAIT_POLICY")) {
    setenv("OMP_WAIT_POLICY", "passive", 1);
    execv("/proc/self/exe", argv);  // returns only on failure: then carry on with the default
  }
  CLI::App app{"mnemo: a stateful LLM serving engine for multi-turn conversations"};
  app.require_subcommand(1);
  mnemo::app::RegisterGenerate(app);
  mnemo::app::RegisterInspect(app);
  mnemo::app::RegisterLogits(app);
  mnemo::app::RegisterMakeModel(app);
  mnemo::app::RegisterQuantize(app);
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
