// mnemo serve: the OpenAI-compatible stateful HTTP server.
#include <errno.h>
#include <malloc.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include <cstdio>
#include <filesystem>

#include "base/log.h"
#include "commands.h"
#include "runtime.h"
#include "server/api_server.h"

namespace mnemo::app {
namespace {

// "fp_" + 12 hex digits naming what decides the outputs: the model file (weights and vocabulary),
// the numerics (precision, KV dtype) and this build (a hash of the running executable, so that any
// rebuild changes it). Cost: reading the weights and the executable once at start.
std::string SystemFingerprint(const Runtime& rt, const std::string& precision) {
  uint64_t exe = 0;
  if (std::FILE* f = std::fopen("/proc/self/exe", "rb")) {
    XXH3_state_t* st = XXH3_createState();
    XXH3_64bits_reset(st);
    char buf[1 << 16];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) XXH3_64bits_update(st, buf, n);
    exe = XXH3_64bits_digest(st);
    XXH3_freeState(st);
    std::fclose(f);
  }
  const uint64_t parts[4] = {rt.file->Fingerprint(), exe, static_cast<uint64_t>(rt.kv_dtype),
                             XXH3_64bits(precision.data(), precision.size())};
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(XXH3_64bits(parts, sizeof parts)));
  return "fp_" + std::string(hex, 12);
}

struct ServeFlags {
  std::string model, tokenizer, db, model_name;
  ServerConfig server;
  double max_body_mb = 8;
  double drain_s = 0;  // after SIGTERM/SIGINT: /ready fails this long before the server stops
  bool render_whole = false;
  ContextRequest context;
  RuntimeFlags runtime;
  EngineFlags engine;
};

int RunServe(ServeFlags& f) {
  // SIGINT / SIGTERM are taken by sigwait below; every thread started from here inherits the mask.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  signal(SIGPIPE, SIG_IGN);
  // Fixed malloc thresholds: blocks of 1 MB or more are their own mappings, unmapped when freed.
  // glibc's default raises its mmap threshold after each such block is freed (up to 32 MB) and its
  // trim threshold to twice that, so a hostile 7 MB body's buffers then came from the worker
  // thread's arena, whose top malloc_trim never shrinks: ~13 MB stayed resident per worker and
  // request path (RSS 30 -> 185 MB over 14 rejected chat requests; 30 MB flat with these; issue 13).
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  mallopt(M_TRIM_THRESHOLD, 2 << 20);

  // The disk tier lives beside the store (a temporary store gets none: its sessions die with it).
  // (Also when only its size is given.)
  // A PostgreSQL store names no local path: its replicas' disk tiers need --kv-disk-dir.
  const bool shared_db = Store::IsPostgresSpec(f.db);
  if (f.engine.t2_mb != 0 && f.engine.disk_dir.empty() && !f.db.empty() && !shared_db) f.engine.disk_dir = f.db + ".kv";
  if (f.engine.t2_mb < 0 && f.engine.disk_dir.empty()) f.engine.t2_mb = 0;
  auto started = StartEngine(f.model, f.tokenizer, f.runtime, f.engine);
  if (!started.ok()) {
    std::fprintf(stderr, "error: %s\n", started.error().message.c_str());
    return 1;
  }
  Runtime& rt = started->rt;
  // Without --db the store lives in a temporary file: the API works, nothing survives a restart.
  std::string db = f.db;
  bool temp_db = db.empty();
  if (temp_db) db = (std::filesystem::temp_directory_path() / ("mnemo-" + std::to_string(getpid()) + ".db")).string();
  auto store = Store::Open(db);
  if (!store.ok()) {
    std::fprintf(stderr, "error: %s\n", store.error().message.c_str());
    return 1;
  }
  const Vocab& vocab = rt.file->vocab();
  ChatTemplate tmpl = ChatTemplate::Fallback();
  if (!vocab.chat_template.empty()) {
    auto t = ChatTemplate::Create(vocab.chat_template, vocab.bos >= 0 ? rt.tokenizer->TokenText(vocab.bos) : "",
                                  vocab.eos >= 0 ? rt.tokenizer->TokenText(vocab.eos) : "");
    if (t.ok()) {
      tmpl = std::move(t.value());
    } else {
      spdlog::warn("the model's chat template cannot be used ({}); using the fallback", t.error().message);
    }
  }
  ServiceConfig sc;
  sc.model_name = f.model_name.empty() ? std::filesystem::path(f.model).stem().string() : f.model_name;
  sc.default_context = f.context;
  {
    const uint64_t parts[2] = {VocabFingerprint(vocab), XXH3_64bits(vocab.chat_template.data(), vocab.chat_template.size())};
    sc.token_identity = XXH3_64bits(parts, sizeof parts);
  }
  sc.render_windows = !f.render_whole;
  // A continuation waiting for another replica's turn on its session waits as long as a turn may
  // wait for admission (--max-queue-ms), or 10 s without that bound.
  sc.turn_lock_wait_s = f.engine.max_queue_ms > 0 ? f.engine.max_queue_ms / 1000.0 : 10.0;
  sc.system_fingerprint = SystemFingerprint(rt, f.runtime.precision);
  // Selective context embeds turns with the model's own token embeddings (no extra model pass).
  const TensorRef emb = rt.file->weights().tok_embd;
  sc.embed_dim = static_cast<int>(emb.cols);
  sc.embed = [emb](int32_t token, float* out) {
    const size_t row = DTypeBytes(emb.dtype, emb.cols);
    ToF32(emb.dtype, static_cast<const uint8_t*>(emb.data) + row * token, out, emb.cols);
  };
  auto service = Service::Create(*started->engine, *rt.tokenizer, std::move(tmpl), store->get(), sc);
  if (!service.ok()) {
    std::fprintf(stderr, "error: %s\n", service.error().message.c_str());
    return 1;
  }
  Metrics metrics;
  f.server.max_body_bytes = static_cast<size_t>(f.max_body_mb * 1048576);
  ApiServer server(f.server, **service, metrics);
  Status st = server.Start();
  if (!st.ok()) {
    std::fprintf(stderr, "error: %s\n", st.error().message.c_str());
    return 1;
  }
  spdlog::info("mnemo serving {} on {}://{}:{} (replica {}, db {}{})", sc.model_name,
               f.server.tls_cert_file.empty() ? "http" : "https", f.server.host, server.port(), server.replica_id(),
               (*store)->path(), temp_db ? ", temporary" : "");
  int sig = 0;
  sigwait(&sigs, &sig);
  if (f.drain_s > 0) {
    // Behind a front (deploy/haproxy.cfg): fail readiness first, so the health checks take this
    // replica out while it still answers what reaches it; a second signal ends the wait.
    server.BeginDrain();
    spdlog::info("signal {}: draining for {} s (/ready answers 503; a second signal stops now)", sig, f.drain_s);
    timespec ts{};
    ts.tv_sec = static_cast<time_t>(f.drain_s);
    ts.tv_nsec = static_cast<long>((f.drain_s - static_cast<double>(ts.tv_sec)) * 1e9);
    siginfo_t info{};
    while (sigtimedwait(&sigs, &info, &ts) < 0 && errno == EINTR) {
    }
  }
  spdlog::info("signal {}, shutting down", sig);
  server.Stop();
  service->reset();
  started->engine.reset();  // finishes running turns as cancelled and writes the KV to the disk tier
  store->reset();
  if (temp_db) {
    std::filesystem::remove(db);
    std::filesystem::remove(db + "-wal");
    std::filesystem::remove(db + "-shm");
  }
  return 0;
}

}  // namespace

void RegisterServe(CLI::App& app) {
  auto f = std::make_shared<ServeFlags>();
  f->runtime.log_level = "info";
  f->engine.t0_mb = f->engine.t1_mb = f->engine.t2_mb = -1;  // sized from the machine unless given
  // Load shedding is on by default: at most 32 turns wait (with the default 64 running), and none
  // waits past 5 s (a client gets a 429 and a Retry-After instead). Waiting turns hold no HTTP
  // thread (the server is event-driven), so the bound is the engine's, not the server's.
  f->engine.max_waiting = 32;
  f->engine.max_queue_ms = 5000;
  auto* cmd = app.add_subcommand("serve", "OpenAI-compatible stateful HTTP server");
  cmd->add_option("--model", f->model, "model file")->required()->check(CLI::ExistingFile);
  cmd->add_option("--tokenizer", f->tokenizer, "llama2.c tokenizer file for .bin models");
  cmd->add_option("--host", f->server.host, "bind address");
  cmd->add_option("--port", f->server.port, "port (0: any free port)")->check(CLI::Range(0, 65535));
  cmd->add_option("--db", f->db,
                  "store for sessions, responses and conversations: a SQLite file, or postgresql://user@host/db "
                  "(shared by replicas)");
  cmd->add_option("--api-key", f->server.api_keys, "accepted API key (repeatable); none = no auth");
  cmd->add_option("--model-name", f->model_name, "model id in the API (default: the file name)");
  cmd->add_option("--replica-id", f->server.replica_id,
                  "this replica's name: the X-Mnemo-Replica header of every response, /health, /metrics and the "
                  "status page (default: hostname:port)");
  cmd->add_option("--max-body-mb", f->max_body_mb, "largest request body (MB)");
  cmd->add_option("--drain-s", f->drain_s,
                  "on SIGTERM/SIGINT, answer /ready with 503 for this long (while still serving) before "
                  "stopping, so a front's health checks take the replica out first (deploy/haproxy.cfg: 1)")
      ->check(CLI::Range(0.0, 3600.0));
  cmd->add_option("--request-id-ttl-s", f->server.request_id_ttl_s,
                  "how long a turn answered for an X-Mnemo-Request-Id is replayed to retries of that id (seconds; "
                  "expired records are deleted in the background)")
      ->check(CLI::Range(1.0, 30.0 * 86400));
  cmd->add_flag("--render-whole", f->render_whole,
                "render every turn's whole conversation (no window fast path; for comparisons and tests)");
  cmd->add_option("--http-threads", f->server.http_threads,
                  "workers running request handlers (connections and streams hold none)")
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--max-connections", f->server.max_connections,
                  "open connections in total; more are answered 503 and closed")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--max-connections-per-address", f->server.max_connections_per_address,
                  "open connections from one client address; more are answered 503 and closed")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--header-timeout-s", f->server.header_timeout_s,
                  "total time for a request's line and headers, from its first byte")
      ->check(CLI::Range(0.1, 3600.0));
  cmd->add_option("--body-timeout-s", f->server.body_timeout_s, "total time for a request's body")
      ->check(CLI::Range(0.1, 3600.0));
  cmd->add_option("--idle-timeout-s", f->server.idle_timeout_s,
                  "a kept-alive connection's wait for its next request")
      ->check(CLI::Range(0.1, 86400.0));
  cmd->add_option("--tls-cert", f->server.tls_cert_file,
                  "serve HTTPS with this PEM certificate chain (with --tls-key)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--tls-key", f->server.tls_key_file, "the PEM private key of --tls-cert")->check(CLI::ExistingFile);
  cmd->add_flag("--private-metrics", f->server.private_metrics,
                "with --api-key: /metrics (and so the status page's figures) needs a key too");
  cmd->add_option("--cors-origin", f->server.cors_origins,
                  "allow browser apps from this origin (repeatable; '*' = any); off by default");
  cmd->add_option("--context-budget", f->context.budget,
                  "selective context for every request: history tokens (>= 1) or share (< 1); 0 = off");
  cmd->add_option("--context-mode", f->context.mode, "selective context: reuse or exact")
      ->check(CLI::IsMember({"reuse", "exact"}));
  cmd->add_option("--context-preset", f->context.preset, "turn scoring weights")
      ->check(CLI::IsMember({"default", "factual", "sequential", "analytical"}));
  AddRuntimeFlags(cmd, &f->runtime);
  AddEngineFlags(cmd, &f->engine);
  cmd->footer(
      "KV tiers by default: T0 (--kv-t0-mb) = the smaller of a quarter of the available memory and the KV of 64\n"
      "full-length contexts; T1 (--kv-t1-mb) = the smaller of a quarter of the available memory and 4x T0;\n"
      "with --db, a disk tier in <db>.kv/ (--kv-disk-dir) of the smaller of 4096 MB and a quarter of the free\n"
      "disk space (--kv-disk-mb), so a restart keeps the KV. Give a size of 0 to turn a tier off.");
  cmd->callback([f] {
    int rc = RunServe(*f);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace mnemo::app
