// mnemo bench cache: model-free latency of the cache manager's admission path at scale.
//
// N chunk records in sessions of 64 chunks, the older half in T1 (full), the newer half in T0
// (full), no disk tier; each session idle since its own time. Each iteration admits a new
// session of 64 chunks: Acquire (kLater, it records the room it wants), Maintain (demotes 64
// T0 chunks into T1, dropping 64 T1 chunks to make room there), the copies are reported done
// (not timed: the transfer thread's work), and Acquire again (kOk). The timed part is what the
// engine thread spends: both Acquires and the Maintain. The session is then released, so T0 is
// full again for the next iteration.
//
// Reported twice: wall time (acquire_us_*), and the calling thread's CPU time (acquire_cpu_us_*),
// which a busy machine does not inflate by preempting the thread (on the shared 2-core machine,
// wall p99 is set by the scheduler's time slices, a few ms, at any N). load_avg_1m says how busy.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "commands.h"
#include "base/block.h"
#include "kv/cache_manager.h"

namespace mnemo::app {
namespace {

struct BenchCacheFlags {
  int records = 262144;
  int iterations = 200;
  std::string policy = "pensieve";
  bool json = false;
};

constexpr int kChunksPerSession = 64;

double Seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double ThreadCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

int RunBenchCache(const BenchCacheFlags& f) {
  if (f.records < 2 * kChunksPerSession || f.iterations < 1) {
    std::fprintf(stderr, "bench cache: --records must be >= %d and --iterations >= 1\n", 2 * kChunksPerSession);
    return 2;
  }
  const int sessions = f.records / kChunksPerSession;
  const int half = sessions / 2;
  CacheConfig cc;
  cc.t1_blocks = half * kChunksPerSession;
  cc.t0_blocks = (sessions - half) * kChunksPerSession;
  cc.t2_blocks = 0;
  cc.reserve_fraction = 0;
  // A llama-25m-like cost: FLOPs per token through the linear layers, per (query, key) pair.
  CostModel cost{5.0e7, 2.0e4};
  auto policy = MakeEvictionPolicy(f.policy, cost);
  if (!policy.ok()) {
    std::fprintf(stderr, "bench cache: %s\n", policy.error().message.c_str());
    return 2;
  }
  CacheManager cm(cc, std::move(policy.value()));
  const int n_tokens = kChunksPerSession * kBlockTokens;
  int32_t next_block[2] = {0, 0};
  for (int s = 0; s < sessions; s++) {
    const Tier t = s < half ? Tier::kT1 : Tier::kT0;
    cm.AddSession(s, double(s));  // idle since its own time
    for (int c = 0; c < kChunksPerSession; c++) {
      cm.RestoreChunk(s, c, t, next_block[static_cast<int>(t)]++, n_tokens);
    }
  }
  std::vector<double> us, cpu_us;
  double now = sessions;
  for (int it = 0; it < f.iterations + 10; it++) {
    const SessionId s = sessions + it;
    now += 1.0;
    cm.AddSession(s, now);
    CacheManager::Acquired a;
    double timed = 0, timed_cpu = 0;
    double t0 = Seconds(), c0 = ThreadCpuSeconds();
    Admission ad = cm.Acquire(s, n_tokens, now, &a);
    cm.Maintain(0, now);
    timed += Seconds() - t0;
    timed_cpu += ThreadCpuSeconds() - c0;
    for (int round = 0; round < 4 && ad != Admission::kOk; round++) {
      for (const TransferOp& op : cm.TakeTransfers()) cm.OnTransferDone(op.id, true);
      t0 = Seconds();
      c0 = ThreadCpuSeconds();
      ad = cm.Acquire(s, n_tokens, now, &a);
      if (ad != Admission::kOk) cm.Maintain(0, now);
      timed += Seconds() - t0;
      timed_cpu += ThreadCpuSeconds() - c0;
    }
    if (ad != Admission::kOk) {
      std::fprintf(stderr, "bench cache: iteration %d was not admitted\n", it);
      return 1;
    }
    for (const TransferOp& op : a.swap_ins) cm.OnTransferDone(op.id, true);
    cm.Release(s, n_tokens, now);
    if (it >= 10) {  // the first ones warm the allocator up
      us.push_back(timed * 1e6);
      cpu_us.push_back(timed_cpu * 1e6);
    }
  }
  const double p50 = Percentile(us, 0.5), p99 = Percentile(us, 0.99);
  const double cpu50 = Percentile(cpu_us, 0.5), cpu99 = Percentile(cpu_us, 0.99);
  double load[1] = {-1};
  getloadavg(load, 1);
  if (f.json) {
    nlohmann::json j;
    j["records"] = f.records;
    j["sessions"] = sessions;
    j["chunks_per_session"] = kChunksPerSession;
    j["policy"] = f.policy;
    j["t0_blocks"] = cc.t0_blocks;
    j["t1_blocks"] = cc.t1_blocks;
    j["evicted_per_admission"] = kChunksPerSession;
    j["iterations"] = f.iterations;
    j["acquire_us_p50"] = p50;
    j["acquire_us_p99"] = p99;
    j["acquire_cpu_us_p50"] = cpu50;
    j["acquire_cpu_us_p99"] = cpu99;
    j["load_avg_1m"] = load[0];
    const VictimIndex& vx = cm.victim_index();
    j["victim_picks"] = vx.picks();
    j["fronts_visited_per_pick"] = vx.picks() ? double(vx.visits()) / double(vx.picks()) : 0.0;
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("records %d (%s): admission evicting %d blocks with T1 full: p50 %.1f us, p99 %.1f us "
                "(thread CPU: p50 %.1f us, p99 %.1f us; load %.1f)\n",
                f.records, f.policy.c_str(), kChunksPerSession, p50, p99, cpu50, cpu99, load[0]);
  }
  return 0;
}

}  // namespace

void RegisterBenchCache(CLI::App* bench) {
  auto f = std::make_shared<BenchCacheFlags>();
  auto* cmd = bench->add_subcommand("cache", "model-free latency of an admission that evicts 64 blocks with T1 full");
  cmd->add_option("--records", f->records, "chunk records in the cache")->capture_default_str();
  cmd->add_option("--iterations", f->iterations, "timed admissions")->capture_default_str();
  cmd->add_option("--policy", f->policy, "eviction policy: pensieve or lru")->capture_default_str();
  cmd->add_flag("--json", f->json, "print one JSON object");
  cmd->callback([f] {
    int rc = RunBenchCache(*f);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace mnemo::app
