// mnemo bench multiturn: replays a synthetic ShareGPT-like workload in process against the engine,
// once per mode (cache off, lru, pensieve, ...) at the same T0 capacity, and reports throughput,
// TTFT by turn index, where context tokens came from, swaps and evictions.
#include <sys/resource.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "runtime.h"
#include "workload/workload.h"

namespace mnemo::app {
namespace {

struct MultiturnFlags {
  std::string model, tokenizer;
  WorkloadConfig workload;
  int users = 8;                 // closed loop: concurrent users
  double rate = 0;               // > 0: Poisson arrivals of conversations per second instead
  float temperature = 0;
  std::vector<std::string> modes;  // e.g. off lru pensieve; empty = the one --cache/--policy give
  bool json = false;
  bool per_turn = false;         // add every turn's record to the JSON (turn_log)
  double t0_live = 0;            // > 0: T0 sized to this share of the workload's live KV (--kv-t0-live)
  double t1_live = -1;           // >= 0: T1 likewise (--kv-t1-live; 0 = no host tier)
  RuntimeFlags runtime;
  EngineFlags engine;
};

struct TurnRecord {
  int conv = 0, turn = 0;
  double submitted_s = 0;  // since the run started
  TurnResult result;
};

long PeakRssMb() {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss / 1024;
}

// The tokens a turn appends: the system prompt once, then each user message in a plain template.
std::vector<int32_t> TurnTokens(const Tokenizer& tok, const ConversationPlan& c, int t) {
  std::string text = "\nUser: " + c.turns[t].user_text + "\nAssistant:";
  if (t == 0) text = c.system_text + "\n" + text;
  return tok.Encode(text, /*add_special=*/t == 0);
}

nlohmann::json RunMode(const std::string& mode, Runtime& rt, const MultiturnFlags& f,
                       const std::vector<ConversationPlan>& convs) {
  EngineFlags ef = f.engine;
  if (mode == "off") {
    ef.cache = "off";
  } else if (mode == "lru" || mode == "pensieve") {
    ef.policy = mode;
  }
  auto engine = Engine::Create(*rt.model, *rt.tokenizer, MakeEngineConfig(ef, rt.kv_dtype));
  if (!engine.ok()) throw std::runtime_error(engine.error().message);
  Engine& e = **engine;
  std::mutex mu;
  std::vector<TurnRecord> records;
  std::atomic<int> done_turns{0}, errors{0};
  int total_turns = 0;
  for (const auto& c : convs) total_turns += static_cast<int>(c.turns.size());

  const auto start = std::chrono::steady_clock::now();
  auto run_conversation = [&](const ConversationPlan& c) {
    SessionId s = e.CreateSession();
    for (int t = 0; t < static_cast<int>(c.turns.size()); t++) {
      std::this_thread::sleep_for(std::chrono::duration<double>(c.turns[t].think_s));
      TurnRequest req;
      req.session = s;
      req.append = TurnTokens(*rt.tokenizer, c, t);
      req.max_tokens = c.turns[t].output_tokens;
      req.ignore_eos = true;  // forced output lengths, as serving benchmarks do
      req.sampling.temperature = f.temperature;
      req.sampling.seed = c.index * 1000 + t;
      const double submitted = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      auto h = e.Submit(req);
      if (!h.ok()) {  // e.g. the conversation outgrew the context: end it
        errors++;
        break;
      }
      TurnRecord rec{c.index, t, submitted, (*h)->Wait()};
      const bool ok = Completed(rec.result.finish_reason);
      {
        std::lock_guard<std::mutex> lock(mu);
        records.push_back(std::move(rec));
      }
      int d = ++done_turns;
      Progress("%s: %d/%d turns\r", mode.c_str(), d, total_turns);
      if (!ok) {
        errors++;
        break;
      }
    }
  };

  const auto t0 = start;
  std::vector<std::thread> threads;
  if (f.rate > 0) {  // open loop: conversations arrive as a Poisson process
    Rng rng(f.workload.seed ^ 0x5bd1e995);
    for (const auto& c : convs) {
      std::this_thread::sleep_for(std::chrono::duration<double>(-std::log(1 - rng.UniformDouble()) / f.rate));
      threads.emplace_back(run_conversation, std::cref(c));
    }
  } else {  // closed loop: each user runs conversations back to back
    // User u runs conversations u, u + users, ...: a fixed schedule. (Handing the next
    // conversation to whichever user finished first made the pairing of conversations, and so
    // which sessions compete for T0 at a time, depend on thread timing; it was one of the
    // run-to-run differences between runs of one configuration, docs/benchmarks.md.)
    for (int u = 0; u < f.users; u++) {
      threads.emplace_back([&, u] {
        for (size_t i = u; i < convs.size(); i += f.users) run_conversation(convs[i]);
      });
    }
  }
  for (auto& t : threads) t.join();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  Progress("\n");
  EngineStats st = e.Stats();

  // Aggregate.
  std::sort(records.begin(), records.end(),
            [](const auto& a, const auto& b) { return std::tie(a.conv, a.turn) < std::tie(b.conv, b.turn); });
  XXH3_state_t* digest = XXH3_createState();
  XXH3_64bits_reset(digest);
  int64_t out_tokens = 0;
  TokenSources src;
  double recompute_ms = 0, recomputed_pairs = 0;
  int64_t recomputed_positions = 0;
  std::vector<double> ttft_all, ttft_late;  // ttft_late: turns with index >= 5 (long histories)
  std::map<int, std::vector<double>> ttft_by_turn, new_by_turn;
  std::map<int, int64_t> recomputed_by_turn;
  std::map<int, double> recompute_ms_by_turn;
  nlohmann::json turn_log = nlohmann::json::array();
  for (const auto& r : records) {
    const auto& res = r.result;
    XXH3_64bits_update(digest, res.tokens.data(), res.tokens.size() * sizeof(int32_t));
    out_tokens += static_cast<int64_t>(res.tokens.size());
    src.t0 += res.sources.t0;
    src.t1 += res.sources.t1;
    src.t2 += res.sources.t2;
    src.recomputed += res.sources.recomputed;
    src.fresh += res.sources.fresh;
    ttft_all.push_back(res.ttft_seconds * 1000);
    ttft_by_turn[r.turn].push_back(res.ttft_seconds * 1000);
    new_by_turn[r.turn].push_back(static_cast<double>(res.sources.fresh));
    if (r.turn >= 5) ttft_late.push_back(res.ttft_seconds * 1000);
    recompute_ms += res.recompute_seconds * 1000;
    recomputed_pairs += res.recomputed_pairs;
    recomputed_positions += res.recomputed_positions;
    recomputed_by_turn[r.turn] += res.sources.recomputed;
    recompute_ms_by_turn[r.turn] += res.recompute_seconds * 1000;
    if (f.per_turn) {
      turn_log.push_back({{"conv", r.conv}, {"turn", r.turn}, {"submitted_s", r.submitted_s},
                          {"context", res.prompt_tokens}, {"t0", res.sources.t0}, {"t1", res.sources.t1},
                          {"t2", res.sources.t2}, {"recomputed", res.sources.recomputed},
                          {"recompute_ms", res.recompute_seconds * 1000}, {"queue_ms", res.queue_seconds * 1000},
                          {"ttft_ms", res.ttft_seconds * 1000}, {"suspensions", res.suspensions}});
    }
  }
  char digest_hex[17];
  std::snprintf(digest_hex, sizeof digest_hex, "%016llx", static_cast<unsigned long long>(XXH3_64bits_digest(digest)));
  XXH3_freeState(digest);
  nlohmann::json j;
  j["mode"] = mode;
  j["policy"] = ef.policy;
  j["cache"] = ef.cache;
  j["wall_seconds"] = wall;
  j["turns"] = records.size();
  j["errors"] = errors.load();
  j["throughput_output_tokens_per_s"] = out_tokens / wall;
  j["throughput_requests_per_s"] = records.size() / wall;
  j["output_tokens"] = out_tokens;
  j["ttft_ms"] = {{"p50", Percentile(ttft_all, 0.5)}, {"p90", Percentile(ttft_all, 0.9)}, {"p99", Percentile(ttft_all, 0.99)}};
  nlohmann::json by_turn = nlohmann::json::array(), p90_by_turn = nlohmann::json::array(),
                 n_by_turn = nlohmann::json::array(), new_tokens_by_turn = nlohmann::json::array();
  for (auto& [t, v] : ttft_by_turn) {
    by_turn.push_back(Percentile(v, 0.5));
    p90_by_turn.push_back(Percentile(v, 0.9));
    n_by_turn.push_back(v.size());
    new_tokens_by_turn.push_back(Percentile(new_by_turn[t], 0.5));
  }
  j["ttft_ms_turns_5_plus"] = {{"p50", Percentile(ttft_late, 0.5)}, {"p90", Percentile(ttft_late, 0.9)},
                               {"n", ttft_late.size()}};
  j["ttft_ms_p50_by_turn"] = by_turn;
  j["ttft_ms_p90_by_turn"] = p90_by_turn;
  j["turns_by_turn_index"] = n_by_turn;
  j["new_tokens_p50_by_turn"] = new_tokens_by_turn;
  j["tokens_by_source"] = {{"t0", src.t0}, {"t1", src.t1}, {"t2", src.t2}, {"recomputed", src.recomputed}, {"new", src.fresh}};
  j["recomputed_tokens"] = src.recomputed;
  // Forward time spent recomputing lost KV (per turn, summed; includes KV lost to suspensions,
  // which recomputed_tokens, counted at a turn's first admission, does not).
  j["recompute_ms"] = recompute_ms;
  // Deterministic counters behind it (every admission, suspensions included): positions and
  // attention pairs Σ (p + 1); a·positions + b·pairs is their cost under any model.
  j["recomputed_positions"] = recomputed_positions;
  j["recomputed_attention_pairs"] = recomputed_pairs;
  nlohmann::json rec_tokens_by_turn = nlohmann::json::array(), rec_ms_by_turn = nlohmann::json::array();
  for (auto& [t, v] : recomputed_by_turn) rec_tokens_by_turn.push_back(v);
  for (auto& [t, v] : recompute_ms_by_turn) rec_ms_by_turn.push_back(v);
  j["recomputed_tokens_by_turn"] = rec_tokens_by_turn;
  j["recompute_ms_by_turn"] = rec_ms_by_turn;
  // The step-time model the engine fitted (cost_fit.h) and the one the policy priced chunks with
  // at the end (a FLOP count until calibrated, then seconds).
  const StepCostParams& sc = st.step_cost;
  j["cost_model"] = {{"per_token_us", sc.per_token * 1e6}, {"per_pair_ns", sc.per_pair * 1e9},
                     {"per_step_us", sc.step * 1e6}, {"per_logits_row_us", sc.per_row * 1e6},
                     {"attention_equals_linear_at", sc.per_pair > 0 ? sc.per_token / sc.per_pair : 0.0},
                     {"steps_fitted", st.step_cost_samples}, {"rel_rms", st.step_cost_rel_rms},
                     {"policy_pair_to_token_ratio", st.policy_cost.per_token_ctx / st.policy_cost.per_token}};
  j["suspensions"] = st.suspensions;
  j["evictions"] = {{"t0", st.cache.evictions[0]}, {"t1", st.cache.evictions[1]}, {"t2", st.cache.evictions[2]}, {"dropped", st.cache.drops}};
  j["bytes_swapped"] = {{"in", st.transfer.bytes_in}, {"out", st.transfer.bytes_out},
                        {"disk_write", st.transfer.bytes_disk_w}, {"disk_read", st.transfer.bytes_disk_r}};
  j["swap_in"] = {{"copy_seconds", st.swap_in_copy_seconds}, {"wait_seconds", st.swap_in_wait_seconds}};
  j["kv_blocks"] = {{"t0", st.capacity[0]}, {"t1", st.capacity[1]}, {"t2", st.capacity[2]}, {"block_bytes", st.block_bytes}};
  j["peak_rss_mb"] = PeakRssMb();
  j["generated_digest"] = digest_hex;
  if (f.per_turn) j["turn_log"] = turn_log;
  return j;
}

void PrintHuman(const nlohmann::json& j) {
  std::printf("mode %-9s %6.1f out tok/s  %5.2f req/s  TTFT p50 %7.1f ms p90 %7.1f ms  recomputed %lld (%.1f ms)  digest %s\n",
              j["mode"].get<std::string>().c_str(), j["throughput_output_tokens_per_s"].get<double>(),
              j["throughput_requests_per_s"].get<double>(), j["ttft_ms"]["p50"].get<double>(),
              j["ttft_ms"]["p90"].get<double>(), static_cast<long long>(j["recomputed_tokens"].get<int64_t>()),
              j["recompute_ms"].get<double>(), j["generated_digest"].get<std::string>().c_str());
  std::printf("  cost model: %s\n", j["cost_model"].dump().c_str());
  std::printf("  TTFT p50 by turn (ms):");
  for (const auto& v : j["ttft_ms_p50_by_turn"]) std::printf(" %.1f", v.get<double>());
  std::printf("\n  tokens by source: %s\n", j["tokens_by_source"].dump().c_str());
  std::printf("  evictions %s, swapped %s, swap-in %s\n", j["evictions"].dump().c_str(),
              j["bytes_swapped"].dump().c_str(), j["swap_in"].dump().c_str());
}

// The KV the workload keeps live: `users` conversations at once, each holding on average the KV
// of its context after a turn (mean over its turns), and the least T0 that admits the longest
// context (plus a block, beyond the reserve).
struct LiveKv {
  double mb = 0;
  double min_t0_mb = 0;
};
LiveKv EstimateLiveKv(const Runtime& rt, const MultiturnFlags& f, const std::vector<ConversationPlan>& convs) {
  double sum = 0, longest = 0;
  int n = 0;
  for (const auto& c : convs) {
    double ctx = 0;
    for (int t = 0; t < static_cast<int>(c.turns.size()); t++) {
      ctx += static_cast<double>(TurnTokens(*rt.tokenizer, c, t).size()) + c.turns[t].output_tokens;
      sum += ctx;
      n++;
      longest = std::max(longest, ctx);
    }
  }
  const double mb_per_token = rt.model->kv_shape(rt.kv_dtype).BlockBytes() / double(kBlockTokens) / 1048576.0;
  LiveKv out;
  out.mb = (n > 0 ? sum / n : 0) * std::max(f.users, 1) * mb_per_token;
  const double reserve = f.engine.reserve;
  out.min_t0_mb = (std::ceil(longest / kBlockTokens) + 1) * kBlockTokens * mb_per_token / (1 - reserve) + mb_per_token * kBlockTokens;
  return out;
}

int RunMultiturn(MultiturnFlags& f) {
  auto rt = LoadRuntime(f.model, f.tokenizer, f.runtime);
  if (!rt.ok()) {
    std::fprintf(stderr, "error: %s\n", rt.error().message.c_str());
    return 1;
  }
  auto convs = MakeWorkload(f.workload);
  const LiveKv live = EstimateLiveKv(*rt, f, convs);
  if (f.t0_live > 0) {
    f.engine.t0_mb = std::max(f.t0_live * live.mb, live.min_t0_mb);
    if (f.t0_live * live.mb < live.min_t0_mb) {
      std::fprintf(stderr, "note: T0 raised from %.1f MB (%.0f%% of the live KV) to %.1f MB, the least that admits "
                   "the longest context\n", f.t0_live * live.mb, 100 * f.t0_live, live.min_t0_mb);
    }
  }
  if (f.t1_live >= 0) f.engine.t1_mb = f.t1_live * live.mb;
  if (f.modes.empty()) f.modes.push_back(f.engine.cache == "off" ? "off" : f.engine.policy);
  nlohmann::json runs = nlohmann::json::array();
  try {
    for (const auto& m : f.modes) {
      runs.push_back(RunMode(m, *rt, f, convs));
      runs.back()["live_kv_mb"] = live.mb;
      runs.back()["kv_t0_mb"] = f.engine.t0_mb;
      runs.back()["kv_t1_mb"] = f.engine.t1_mb;
      runs.back()["t0_live_fraction"] = f.engine.t0_mb / live.mb;
      if (!f.json) PrintHuman(runs.back());
    }
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "error: %s\n", ex.what());
    return 1;
  }
  if (f.json) {
    if (runs.size() == 1) {
      std::cout << runs[0].dump() << std::endl;
    } else {
      nlohmann::json j;
      j["runs"] = runs;
      std::cout << j.dump() << std::endl;
    }
  }
  return 0;
}

}  // namespace

void RegisterBenchMultiturn(CLI::App* bench) {
  auto f = std::make_shared<MultiturnFlags>();
  auto* cmd = bench->add_subcommand("multiturn", "replay a synthetic multi-turn chat workload in process");
  cmd->add_option("--model", f->model, "model file")->required()->check(CLI::ExistingFile);
  cmd->add_option("--tokenizer", f->tokenizer, "llama2.c tokenizer file for .bin models");
  AddWorkloadFlags(cmd, &f->workload, &f->users, &f->rate);
  cmd->add_option("--temperature", f->temperature, "sampling temperature (0 = greedy)");
  cmd->add_option("--modes", f->modes, "modes to run in turn: off, lru, pensieve");
  cmd->add_flag("--json", f->json, "print one JSON object");
  cmd->add_flag("--per-turn", f->per_turn, "with --json: every turn's record (turn_log)");
  cmd->add_option("--kv-t0-live", f->t0_live,
                  "size T0 to this share of the workload's live KV (users x mean context), instead of --kv-t0-mb")
      ->check(CLI::Range(0.0, 10.0));
  cmd->add_option("--kv-t1-live", f->t1_live, "size T1 to this share of the live KV (0 = none), instead of --kv-t1-mb")
      ->check(CLI::Range(0.0, 10.0));
  AddRuntimeFlags(cmd, &f->runtime);
  AddEngineFlags(cmd, &f->engine);
  cmd->callback([f] {
    int rc = RunMultiturn(*f);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace mnemo::app
