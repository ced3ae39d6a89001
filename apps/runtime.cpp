#include "runtime.h"

#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "base/cpu.h"
#include "base/log.h"

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
  cmd->add_option("--log-level", f->log_level, "stderr log level")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}))
      ->capture_default_str();
}

void AddEngineFlags(CLI::App* cmd, EngineFlags* f) {
  cmd->add_option("--kv-t0-mb", f->t0_mb, "compute-tier KV pool (MB)")->check(CLI::PositiveNumber);
  // (serve's defaults, when these are not given, are in its help footer)
  cmd->add_option("--kv-t1-mb", f->t1_mb, "host-tier KV pool (MB); 0 = none")->check(CLI::NonNegativeNumber);
  cmd->add_option("--kv-disk-mb", f->t2_mb, "disk-tier KV (MB); 0 = none")->check(CLI::NonNegativeNumber);
  cmd->add_option("--kv-disk-dir", f->disk_dir, "directory of the disk tier");
  cmd->add_option("--kv-remote", f->kv_remote,
                  "shared remote KV tier, a cache: redis://HOST[:PORT][/DB] (Redis 7; see docs/deploy.md)");
  cmd->add_option("--kv-remote-fetch", f->kv_remote_fetch,
                  "auto: fetch a chunk from the remote tier when that is cheaper than recomputing it; always")
      ->check(CLI::IsMember({"auto", "always"}))
      ->capture_default_str();
  cmd->add_option("--kv-remote-ttl", f->kv_remote_ttl_s, "seconds a chunk stays in the remote tier")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--kv-reserve", f->reserve, "share of T0 reserved for generated tokens")->check(CLI::Range(0.0, 0.9));
  cmd->add_option("--policy", f->policy, "eviction policy")->check(CLI::IsMember({"pensieve", "lru"}));
  cmd->add_option("--cache", f->cache, "on: keep KV across turns; off: recompute every turn")
      ->check(CLI::IsMember({"on", "off"}));
  cmd->add_option("--max-batch-tokens", f->max_batch_tokens, "tokens per forward step")->check(CLI::PositiveNumber);
  cmd->add_option("--max-running", f->max_running, "turns in the batch at once")->check(CLI::PositiveNumber);
  cmd->add_option("--max-waiting", f->max_waiting, "turns waiting for admission (not running) before new ones get 429")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--max-queue-ms", f->max_queue_ms,
                  "a turn expected to wait longer for admission gets 429, one that waited longer is ended; 0 = no bound")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--max-context", f->max_context, "positions per session (default: the model's)");
  cmd->add_option("--session-ttl", f->session_ttl_s, "seconds before an idle session is deleted; 0 = never");
  cmd->add_option("--max-sessions", f->max_sessions, "sessions kept at most; 0 = no bound");
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  double idx = p * (v.size() - 1);
  size_t lo = static_cast<size_t>(idx);
  size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (idx - lo);
}

void AddWorkloadFlags(CLI::App* cmd, WorkloadConfig* w, int* users, double* rate) {
  cmd->add_option("--seed", w->seed, "workload seed");
  cmd->add_option("--conversations", w->conversations, "conversations in the run")->check(CLI::PositiveNumber);
  cmd->add_option("--mean-turns", w->mean_turns, "mean turns per conversation");
  cmd->add_option("--max-turns", w->max_turns, "cap on turns per conversation");
  cmd->add_option("--input-median", w->input_median, "user message tokens, lognormal median");
  cmd->add_option("--input-sigma", w->input_sigma, "user message tokens, lognormal sigma");
  cmd->add_option("--output-median", w->output_median, "reply tokens, lognormal median");
  cmd->add_option("--output-sigma", w->output_sigma, "reply tokens, lognormal sigma");
  cmd->add_option("--system-tokens", w->system_tokens, "system prompt length (words)");
  cmd->add_option("--think-time", w->think_mean_s, "mean think time between turns (s, exponential)");
  cmd->add_option("--users", *users, "concurrent users (closed loop)")->check(CLI::PositiveNumber);
  cmd->add_option("--rate", *rate, "new conversations per second (Poisson, open loop) instead of --users");
}

EngineConfig MakeEngineConfig(const EngineFlags& f, DType kv_dtype) {
  EngineConfig c;
  c.kv_dtype = kv_dtype;
  c.t0_mb = f.t0_mb;
  c.t1_mb = f.t1_mb;
  c.t2_mb = f.t2_mb;
  c.disk_dir = f.disk_dir;
  c.kv_remote = f.kv_remote;
  c.kv_remote_always = f.kv_remote_fetch == "always";
  c.kv_remote_ttl_s = f.kv_remote_ttl_s;
  c.reserve_fraction = f.reserve;
  c.policy = f.policy;
  c.cache = f.cache == "on";
  c.max_batch_tokens = f.max_batch_tokens;
  c.max_running = f.max_running;
  c.max_waiting = f.max_waiting;
  c.max_queue_s = f.max_queue_ms / 1000.0;
  c.max_context = f.max_context;
  c.session_ttl_s = f.session_ttl_s;
  c.max_sessions = f.max_sessions;
  return c;
}

namespace {

// MemAvailable from /proc/meminfo, in MB; 0 if unknown.
double AvailableMemoryMb() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  double kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit) {
    if (key == "MemAvailable:") return kb / 1024.0;
  }
  return 0;
}

}  // namespace

void AutoSizeTiers(EngineFlags* f, double bytes_per_token, int max_context) {
  const double avail = AvailableMemoryMb();
  const double quarter = avail > 0 ? avail / 4 : 1024;
  if (f->t0_mb < 0) f->t0_mb = std::max(4.0, std::min(quarter, 64.0 * max_context * bytes_per_token / 1048576.0));
  if (f->t1_mb < 0) f->t1_mb = std::min(quarter, 4 * f->t0_mb);
  if (f->t2_mb < 0) {
    f->t2_mb = 0;
    std::error_code ec;
    if (!f->disk_dir.empty()) {
      auto parent = std::filesystem::absolute(f->disk_dir, ec).parent_path();
      auto space = std::filesystem::space(parent, ec);
      if (!ec) f->t2_mb = std::min(4096.0, space.available / 4.0 / 1048576.0);
    }
  }
}

Result<EngineRuntime> StartEngine(const std::string& model_path, const std::string& tokenizer_path,
                                  const RuntimeFlags& runtime, const EngineFlags& flags) {
  RuntimeFlags model_flags = runtime;
  if (flags.max_context > 0) model_flags.n_ctx = flags.max_context;
  auto rt = LoadRuntime(model_path, tokenizer_path, model_flags);
  if (!rt.ok()) return rt.error();
  EngineFlags engine = flags;
  const KvShape shape = rt->model->kv_shape(rt->kv_dtype);
  const int ctx = engine.max_context > 0 ? std::min(engine.max_context, rt->model->config().context_length)
                                         : rt->model->config().context_length;
  AutoSizeTiers(&engine, static_cast<double>(shape.BlockBytes()) / kBlockTokens, ctx);
  if (engine.t2_mb <= 0) engine.disk_dir.clear();
  spdlog::info("KV tiers: T0 {:.0f} MB, T1 {}, T2 {} ({} KB per 32-token block, {} positions per session)",
               engine.t0_mb, engine.t1_mb > 0 ? fmt::format("{:.0f} MB", engine.t1_mb) : std::string("off"),
               engine.t2_mb > 0 ? fmt::format("{:.0f} MB in {}", engine.t2_mb, engine.disk_dir) : std::string("off"),
               shape.BlockBytes() / 1024, ctx);
  EngineConfig ec = MakeEngineConfig(engine, rt->kv_dtype);
  if (!engine.kv_remote.empty()) {
    // (Without the scheme: a line with "://HOST:PORT" is the one that announces the server's address.)
    const std::string at = engine.kv_remote.rfind("redis://", 0) == 0 ? engine.kv_remote.substr(8) : engine.kv_remote;
    spdlog::info("remote KV tier: Redis at {} (fetch: {})", at, engine.kv_remote_fetch);
  }
  // The disk tier outlives the process and the remote tier is shared: their KV must be this model's.
  if (engine.t2_mb > 0 || !engine.kv_remote.empty()) {
    const uint64_t parts[3] = {rt->file->Fingerprint(), static_cast<uint64_t>(rt->kv_dtype),
                               static_cast<uint64_t>(model_flags.precision == "f32")};
    ec.kv_identity = XXH3_64bits(parts, sizeof parts);
  }
  auto e = Engine::Create(*rt->model, *rt->tokenizer, ec);
  if (!e.ok()) return e.error();
  return EngineRuntime{std::move(rt.value()), std::move(e.value())};
}

Result<Runtime> LoadRuntime(const std::string& model_path, const std::string& tokenizer_path,
                            const RuntimeFlags& flags) {
  InitLogging();
  MNEMO_TRY(SetLogLevel(flags.log_level));
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
  opts.n_ctx = flags.n_ctx;
  auto model = Model::Create(*rt.file, opts);
  if (!model.ok()) return model.error();
  rt.model = std::move(model.value());
  std::string kv = flags.kv_dtype.empty() ? (flags.precision == "f32" ? "f32" : "bf16") : flags.kv_dtype;
  ParseDType(kv, &rt.kv_dtype);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  Progress(" done in %.2f s\n", s);
  return rt;
}

}  // namespace mnemo::app
