// mnemo bench policy: the eviction policies compared on a virtual clock (workload/policy_sim.h):
// the real cache manager and scheduler, a forward pass that takes the time a measured step-cost
// model gives it. Model-free and deterministic: each seed is one workload, replayed once per
// policy; the summary gives each policy's medians over the seeds and the per-seed ratios.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "workload/policy_sim.h"

namespace mnemo::app {
namespace {

struct PolicyFlags {
  WorkloadConfig workload;
  int users = 8;
  double rate = 0;  // unused (closed loop only); AddWorkloadFlags registers it
  int seeds = 1;    // seeds workload.seed, +1, ...
  std::vector<std::string> policies = {"lru", "pensieve"};
  double t0_live = 0.5, t1_live = 0;  // tiers as shares of the live KV (users x mean context)
  double reserve = 0.1;
  double per_token_us = 57, per_pair_ns = 14, per_step_us = 300, per_row_us = 0;  // llama-25m bf16, 2 threads
  double copy_us = 20;                // one block T0 <-> T1
  int max_batch_tokens = 512, max_running = 64, overhead = 6;
  bool json = false, per_turn = false;
};

struct Sizing {
  double live_tokens = 0;  // users x mean context after a turn
  int longest = 0;         // the longest context (tokens)
  CacheConfig cache;
  bool t0_raised = false;
};

Sizing SizeTiers(const PolicyFlags& f, const std::vector<ConversationPlan>& convs) {
  Sizing s;
  double sum = 0;
  int n = 0;
  for (const auto& c : convs) {
    for (int t = 0; t < static_cast<int>(c.turns.size()); t++) {
      const int ctx = SimContextAfter(c, t, f.overhead);
      sum += ctx;
      n++;
      s.longest = std::max(s.longest, ctx);
    }
  }
  s.live_tokens = (n > 0 ? sum / n : 0) * std::max(f.users, 1);
  const int min_t0 = static_cast<int>(std::ceil((std::ceil(double(s.longest) / kBlockTokens) + 1) / (1 - f.reserve))) + 1;
  const int t0 = static_cast<int>(std::lround(f.t0_live * s.live_tokens / kBlockTokens));
  s.t0_raised = t0 < min_t0;
  s.cache.t0_blocks = std::max(t0, min_t0);
  s.cache.t1_blocks = static_cast<int>(std::lround(f.t1_live * s.live_tokens / kBlockTokens));
  s.cache.reserve_fraction = f.reserve;
  return s;
}

nlohmann::json Report(const PolicySimResult& r, bool per_turn) {
  std::vector<double> all, late;
  for (const SimTurn& t : r.turns) {
    if (t.ttft < 0) continue;
    all.push_back(t.ttft * 1000);
    if (t.turn >= 5) late.push_back(t.ttft * 1000);
  }
  nlohmann::json j;
  j["recomputed_positions"] = r.recomputed_positions;
  j["recomputed_pairs"] = r.recomputed_pairs;
  j["recompute_ms"] = r.recompute_s * 1000;
  j["ttft_ms"] = {{"p50", Percentile(all, 0.5)}, {"p90", Percentile(all, 0.9)}};
  j["ttft_ms_turns_5_plus"] = {{"p50", Percentile(late, 0.5)}, {"p90", Percentile(late, 0.9)}, {"n", late.size()}};
  j["suspensions"] = r.suspensions;
  j["refused"] = r.refused;
  j["steps"] = r.steps;
  j["copy_waits"] = r.copy_waits;
  j["copy_wait_ms"] = r.copy_wait_s * 1000;
  j["swapped_in_blocks"] = r.swapped_in_blocks;
  j["dropped_chunks"] = r.cache.drops;
  j["duration_s"] = r.duration_s;
  if (per_turn) {
    nlohmann::json turns = nlohmann::json::array();
    for (const SimTurn& t : r.turns) {
      turns.push_back({{"conv", t.conv}, {"turn", t.turn}, {"submitted_s", t.submitted}, {"ttft_ms", t.ttft * 1000},
                       {"prompt_tokens", t.prompt_tokens}, {"recomputed_positions", t.recomputed_positions},
                       {"recompute_ms", t.recompute_s * 1000}, {"suspensions", t.suspensions}, {"refused", t.refused}});
    }
    j["turn_log"] = turns;
  }
  return j;
}

double Median(std::vector<double> v) { return v.empty() ? 0 : Percentile(std::move(v), 0.5); }

int RunPolicy(const PolicyFlags& f) {
  PolicySimConfig cfg;
  cfg.users = f.users;
  cfg.step = StepCostParams{f.per_step_us * 1e-6, f.per_token_us * 1e-6, f.per_pair_ns * 1e-9, f.per_row_us * 1e-6};
  cfg.copy_block_s = f.copy_us * 1e-6;
  cfg.limits = ScheduleLimits{f.max_batch_tokens, f.max_running};
  cfg.turn_overhead_tokens = f.overhead;

  nlohmann::json runs = nlohmann::json::array();
  std::map<std::string, std::map<std::string, std::vector<double>>> values;  // [policy][metric] per seed
  const char* kMetrics[] = {"recompute_ms", "recomputed_positions", "recomputed_pairs", "ttft_p50_5plus",
                            "ttft_p90_5plus", "suspensions"};
  Sizing sizing;
  for (int k = 0; k < f.seeds; k++) {
    WorkloadConfig w = f.workload;
    w.seed = f.workload.seed + static_cast<uint64_t>(k);
    const auto convs = MakeWorkload(w);
    sizing = SizeTiers(f, convs);
    cfg.cache = sizing.cache;
    for (const std::string& p : f.policies) {
      cfg.policy = p;
      auto r = SimulatePolicy(cfg, convs);
      if (!r.ok()) {
        std::fprintf(stderr, "error: seed %llu, %s: %s\n", static_cast<unsigned long long>(w.seed), p.c_str(),
                     r.error().message.c_str());
        return 1;
      }
      nlohmann::json j = Report(*r, f.per_turn);
      j["policy"] = p;
      j["seed"] = w.seed;
      j["kv_blocks"] = {{"t0", sizing.cache.t0_blocks}, {"t1", sizing.cache.t1_blocks}};
      j["t0_live_fraction"] = sizing.cache.t0_blocks * kBlockTokens / sizing.live_tokens;
      j["longest_context"] = sizing.longest;
      auto& v = values[p];
      v["recompute_ms"].push_back(j["recompute_ms"]);
      v["recomputed_positions"].push_back(r->recomputed_positions);
      v["recomputed_pairs"].push_back(static_cast<double>(r->recomputed_pairs));
      v["ttft_p50_5plus"].push_back(j["ttft_ms_turns_5_plus"]["p50"]);
      v["ttft_p90_5plus"].push_back(j["ttft_ms_turns_5_plus"]["p90"]);
      v["suspensions"].push_back(static_cast<double>(r->suspensions));
      runs.push_back(std::move(j));
    }
  }
  nlohmann::json summary;
  for (const auto& [p, m] : values) {
    for (const char* k : kMetrics) summary[p][k] = Median(m.at(k));
  }
  // Per-seed ratios of the last policy to the first (pensieve / lru by default): median, min, max.
  if (f.policies.size() >= 2) {
    const auto& a = values[f.policies.front()];
    const auto& b = values[f.policies.back()];
    for (const char* k : kMetrics) {
      std::vector<double> r;
      for (size_t i = 0; i < a.at(k).size(); i++) {
        if (a.at(k)[i] > 0) r.push_back(b.at(k)[i] / a.at(k)[i]);
      }
      if (r.empty()) continue;
      summary["ratio"][k] = {{"median", Median(r)}, {"min", *std::min_element(r.begin(), r.end())},
                             {"max", *std::max_element(r.begin(), r.end())}, {"seeds", r.size()}};
    }
    summary["ratio"]["of"] = f.policies.back() + " / " + f.policies.front();
  }
  summary["t0_live_fraction"] = sizing.cache.t0_blocks * kBlockTokens / sizing.live_tokens;
  summary["t0_raised"] = sizing.t0_raised;
  if (f.json) {
    std::cout << nlohmann::json{{"summary", summary}, {"runs", runs}}.dump() << std::endl;
  } else {
    std::printf("T0 %d blocks (%.0f%% of the live KV%s), T1 %d blocks, %d seed(s)\n", sizing.cache.t0_blocks,
                100 * summary["t0_live_fraction"].get<double>(), sizing.t0_raised ? ", raised to admit the longest context" : "",
                sizing.cache.t1_blocks, f.seeds);
    for (const auto& [p, m] : summary.items()) {
      if (p == "ratio" || !m.is_object()) continue;
      std::printf("%-9s recompute %8.1f ms  positions %8.0f  TTFT t>=5 p50 %7.1f p90 %7.1f ms  suspensions %.0f\n",
                  p.c_str(), m["recompute_ms"].get<double>(), m["recomputed_positions"].get<double>(),
                  m["ttft_p50_5plus"].get<double>(), m["ttft_p90_5plus"].get<double>(), m["suspensions"].get<double>());
    }
    if (summary.contains("ratio")) std::printf("ratio %s: %s\n", summary["ratio"]["of"].get<std::string>().c_str(),
                                               summary["ratio"].dump().c_str());
  }
  return 0;
}

}  // namespace

void RegisterBenchPolicy(CLI::App* bench) {
  auto f = std::make_shared<PolicyFlags>();
  auto* cmd = bench->add_subcommand("policy", "compare eviction policies on a virtual clock (model-free, deterministic)");
  AddWorkloadFlags(cmd, &f->workload, &f->users, &f->rate);
  cmd->add_option("--seeds", f->seeds, "workloads to replay: --seed, --seed + 1, ...")->check(CLI::PositiveNumber);
  cmd->add_option("--policies", f->policies, "policies to compare (ratios: the last over the first)");
  cmd->add_option("--kv-t0-live", f->t0_live, "T0 as a share of the live KV (raised to admit the longest context)")
      ->check(CLI::Range(0.001, 10.0));
  cmd->add_option("--kv-t1-live", f->t1_live, "T1 as a share of the live KV (0 = none)")->check(CLI::Range(0.0, 10.0));
  cmd->add_option("--kv-reserve", f->reserve, "share of T0 reserved for generated tokens")->check(CLI::Range(0.0, 0.9));
  cmd->add_option("--per-token-us", f->per_token_us, "modelled forward time per query token (us)");
  cmd->add_option("--per-pair-ns", f->per_pair_ns, "modelled time per attention (query, key) pair (ns)");
  cmd->add_option("--per-step-us", f->per_step_us, "modelled time per forward step (us)");
  cmd->add_option("--per-row-us", f->per_row_us, "modelled time per logits row (us)");
  cmd->add_option("--copy-us", f->copy_us, "one block's copy between T0 and T1 (us)");
  cmd->add_option("--max-batch-tokens", f->max_batch_tokens, "tokens per forward step")->check(CLI::PositiveNumber);
  cmd->add_option("--max-running", f->max_running, "turns in the batch at once")->check(CLI::PositiveNumber);
  cmd->add_option("--turn-overhead", f->overhead, "template tokens around each user message");
  cmd->add_flag("--json", f->json, "print one JSON object");
  cmd->add_flag("--per-turn", f->per_turn, "with --json: every turn's record (turn_log)");
  cmd->callback([f] {
    int rc = RunPolicy(*f);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace mnemo::app
