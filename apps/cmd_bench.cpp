// mnemo bench engine: prefill and decode throughput of the forward pass, median of repeated runs.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <numeric>

#include <nlohmann/json.hpp>

#include "base/cpu.h"
#include "base/rng.h"
#include "commands.h"
#include "runtime.h"

namespace mnemo::app {
namespace {

struct BenchEngineFlags {
  std::string model, tokenizer;
  std::vector<int> prompts{128, 512, 2048};  // prefill sizes
  std::vector<int> batches{1, 8, 32};        // decode batch sizes
  int decode_context = 512;                  // context of each decoding sequence
  int decode_steps = 16;                     // timed decode steps per repeat
  int repeats = 5;                           // runs per figure; the median is reported
  bool json = false;
  RuntimeFlags runtime;
};

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Block tables for `n_seqs` sequences of up to `len` positions each, in disjoint block ranges.
std::vector<std::vector<int32_t>> Tables(int n_seqs, int len) {
  int per = (len + kBlockTokens - 1) / kBlockTokens;
  std::vector<std::vector<int32_t>> t(n_seqs, std::vector<int32_t>(per));
  for (int s = 0; s < n_seqs; s++) std::iota(t[s].begin(), t[s].end(), s * per);
  return t;
}

int RunBenchEngine(const BenchEngineFlags& f) {
  auto rt = LoadRuntime(f.model, f.tokenizer, f.runtime);
  if (!rt.ok()) {
    std::fprintf(stderr, "error: %s\n", rt.error().message.c_str());
    return 1;
  }
  Model& m = *rt->model;
  const ModelConfig& c = m.config();
  Rng rng(1);
  auto random_tokens = [&](int n) {
    std::vector<int32_t> t(n);
    for (auto& x : t) x = int32_t(3 + rng.Next() % (c.vocab_size - 3));
    return t;
  };
  std::vector<float> logits;
  nlohmann::json prefill = nlohmann::json::object(), decode = nlohmann::json::object();

  for (int p : f.prompts) {
    if (p > c.context_length) continue;
    KvStorage kv(m.kv_shape(rt->kv_dtype), (p + kBlockTokens - 1) / kBlockTokens);
    auto tables = Tables(1, p);
    auto toks = random_tokens(p);
    std::vector<int32_t> pos(p);
    std::iota(pos.begin(), pos.end(), 0);
    std::vector<double> rates;
    for (int r = 0; r < f.repeats + 1; r++) {  // the first run warms up caches and primitives
      Batch b;
      int i = b.Add(toks.data(), pos.data(), p, false);
      b.seqs[i].block_table = tables[0];
      b.seqs[i].n_ctx = p;
      auto t0 = std::chrono::steady_clock::now();
      m.Forward(b, kv, logits);
      if (r > 0) rates.push_back(p / Seconds(t0));
      Progress("prefill %d: run %d/%d\r", p, r, f.repeats);
    }
    prefill[std::to_string(p)] = Median(rates);
    Progress("\n");
  }

  const int ctx = std::min(f.decode_context, c.context_length - f.decode_steps);
  for (int bsz : f.batches) {
    const int len = ctx + f.decode_steps;
    KvStorage kv(m.kv_shape(rt->kv_dtype), bsz * ((len + kBlockTokens - 1) / kBlockTokens));
    auto tables = Tables(bsz, len);
    // Prefill every sequence to `ctx` positions (one forward per sequence).
    std::vector<std::vector<int32_t>> toks(bsz);
    for (int s = 0; s < bsz; s++) {
      toks[s] = random_tokens(len);
      std::vector<int32_t> pos(ctx);
      std::iota(pos.begin(), pos.end(), 0);
      Batch b;
      int i = b.Add(toks[s].data(), pos.data(), ctx, false);
      b.seqs[i].block_table = tables[s];
      b.seqs[i].n_ctx = ctx;
      m.Forward(b, kv, logits);
      Progress("decode batch %d: prefill %d/%d\r", bsz, s + 1, bsz);
    }
    std::vector<double> rates;
    for (int r = 0; r < f.repeats + 1; r++) {
      auto t0 = std::chrono::steady_clock::now();
      for (int step = 0; step < f.decode_steps; step++) {
        Batch b;
        for (int s = 0; s < bsz; s++) {
          int32_t p = ctx + step;
          int i = b.Add(&toks[s][p], &p, 1, false);
          b.seqs[i].block_table = tables[s];
          b.seqs[i].n_ctx = p + 1;
        }
        m.Forward(b, kv, logits);
      }
      if (r > 0) rates.push_back(double(bsz) * f.decode_steps / Seconds(t0));
      Progress("decode batch %d: run %d/%d\r", bsz, r, f.repeats);
    }
    decode[std::to_string(bsz)] = Median(rates);
    Progress("\n");
  }

  if (f.json) {
    nlohmann::json j;
    j["model"] = f.model;
    j["threads"] = NumThreads();
    j["precision"] = f.runtime.precision;
    j["kv_dtype"] = DTypeName(rt->kv_dtype);
    j["prefill_tokens_per_s"] = prefill;
    j["decode_tokens_per_s"] = decode;
    j["decode_context"] = ctx;
    j["repeats"] = f.repeats;
    std::cout << j.dump() << std::endl;
  } else {
    std::printf("model %s, %d threads, precision %s, kv %s, median of %d runs\n", f.model.c_str(),
                NumThreads(), f.runtime.precision.c_str(), DTypeName(rt->kv_dtype), f.repeats);
    for (auto& [k, v] : prefill.items()) std::printf("prefill %5s tokens: %10.1f tokens/s\n", k.c_str(), v.get<double>());
    for (auto& [k, v] : decode.items()) {
      std::printf("decode batch %3s (ctx %d): %10.1f tokens/s\n", k.c_str(), ctx, v.get<double>());
    }
  }
  return 0;
}

}  // namespace

void RegisterBench(CLI::App& app) {
  auto* bench = app.add_subcommand("bench", "benchmarks");
  bench->require_subcommand(1);
  auto f = std::make_shared<BenchEngineFlags>();
  auto* cmd = bench->add_subcommand("engine", "prefill and decode throughput of the forward pass");
  cmd->add_option("--model", f->model, "model file")->required()->check(CLI::ExistingFile);
  cmd->add_option("--tokenizer", f->tokenizer, "llama2.c tokenizer file for .bin models");
  cmd->add_option("--prompts", f->prompts, "prefill sizes");
  cmd->add_option("--batches", f->batches, "decode batch sizes");
  cmd->add_option("--decode-context", f->decode_context, "context of each decoding sequence");
  cmd->add_option("--decode-steps", f->decode_steps, "timed decode steps per run");
  cmd->add_option("--repeats", f->repeats, "runs per figure (median reported)")->check(CLI::PositiveNumber);
  cmd->add_flag("--json", f->json, "print one JSON object");
  AddRuntimeFlags(cmd, &f->runtime);
  cmd->callback([f] {
    int rc = RunBenchEngine(*f);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
  RegisterBenchMultiturn(bench);
  RegisterBenchConvkv(bench);
  RegisterBenchServe(bench);
  RegisterBenchCache(bench);
  RegisterBenchPolicy(bench);
  RegisterBenchTurns(bench);
  RegisterBenchGrammar(bench);
}

}  // namespace mnemo::app
