// Subcommands of the mnemo binary. Each Register* adds its CLI11 subcommand and its handler.
#pragma once

#include <CLI/CLI.hpp>
#include <vector>

#include "workload/workload.h"

namespace mnemo::app {

// Options every model-running command shares.
struct RuntimeFlags {
  int threads = 0;                  // kernel threads; 0 = all cores
  std::string precision = "bf16";   // linear layers: f32 (exact) or bf16 (fast)
  std::string kv_dtype = "";        // KV element type: f32, f16 or bf16; default f32 for f32 precision, else bf16
  std::string log_level = "warn";   // stderr log level (serve defaults to info)
  int n_ctx = 0;                    // positions per sequence the model is prepared for (phi3 long rope
                                    // factors past the original context); 0 = the file's context_length.
                                    // Set from the command's context flag (--ctx-size, --max-context).
};
void AddRuntimeFlags(CLI::App* cmd, RuntimeFlags* f);

// Tier, policy and scheduler flags of commands that run the engine (serve, chat, bench multiturn).
struct EngineFlags {
  double t0_mb = 256;  // < 0: sized from the machine (serve's default; AutoSizeTiers)
  double t1_mb = 0;    // < 0: sized from the machine
  double t2_mb = 0;    // < 0: sized from the disk (needs disk_dir)
  std::string disk_dir;
  std::string kv_remote;               // redis://HOST[:PORT][/DB]: the shared remote KV tier; empty = none
  std::string kv_remote_fetch = "auto";  // auto: fetch when cheaper than recomputing; always
  int kv_remote_ttl_s = 86400;
  double reserve = 0.1;
  std::string policy = "pensieve";
  std::string cache = "on";
  int max_batch_tokens = 512;
  int max_running = 64;
  int max_waiting = 1024;  // serve: 32
  double max_queue_ms = 0;  // serve: 5000
  int max_context = 0;
  double session_ttl_s = 0;
  int max_sessions = 0;
};
void AddEngineFlags(CLI::App* cmd, EngineFlags* f);

// The synthetic workload's flags, shared by bench multiturn and bench serve (one generator).
void AddWorkloadFlags(CLI::App* cmd, WorkloadConfig* w, int* users, double* rate);

void RegisterGenerate(CLI::App& app);
void RegisterInspect(CLI::App& app);
void RegisterLogits(CLI::App& app);
void RegisterMakeModel(CLI::App& app);
void RegisterQuantize(CLI::App& app);
void RegisterBench(CLI::App& app);
void RegisterBenchMultiturn(CLI::App* bench);
void RegisterBenchConvkv(CLI::App* bench);
void RegisterBenchServe(CLI::App* bench);
void RegisterBenchCache(CLI::App* bench);
void RegisterBenchPolicy(CLI::App* bench);
void RegisterBenchTurns(CLI::App* bench);
void RegisterBenchGrammar(CLI::App* bench);
void RegisterChat(CLI::App& app);
void RegisterServe(CLI::App& app);

// Progress messages on stderr, only when stderr is a terminal.
void Progress(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// The p-quantile (0..1) of v, linearly interpolated between order statistics; 0 when v is empty.
double Percentile(std::vector<double> v, double p);

}  // namespace mnemo::app
