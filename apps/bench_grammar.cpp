// mnemo bench grammar: what constrained decoding costs. Decode throughput through the engine
// (masks, sampling, everything a served turn does) with and without a grammar, at each batch size,
// alternating per repeat, in two cases of the schema's automaton (the server keeps one per
// schema, grammar_cache.h): "fresh", a new automaton for every run (a schema's first request pays
// every state; the walks the server does when it compiles the schema, Automaton::Prepare, are
// timed apart: prepare_ms), and "warm", one automaton per schema that has served an
// earlier turn and is shared by every run after it (the server from a schema's second request on).
// Then the mask time per token alone, replaying each constrained output through a new automaton
// (cold: every state new, a first request) and again through the same one (warm: all cached); the
// automaton figures (states, walks, keys) are per replayed output.
#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "grammar/automaton.h"
#include "grammar/json_schema.h"
#include "runtime.h"

namespace mnemo::app {
namespace {

struct BenchGrammarFlags {
  std::string model, tokenizer;
  std::vector<int> batches{1, 8};
  int tokens = 64;        // max_tokens per turn
  int repeats = 3;        // runs of each case (unconstrained, fresh, warm) per figure (median)
  std::string schema_file;  // default: the built-in schemas below
  bool json = false;
  RuntimeFlags runtime;
  EngineFlags engine;
};

// Two shapes of output: a long free-text member (states recur: cached masks) and a record of
// bounded fields (states rarely recur: trie walks).
const char* kStorySchema = R"({"type": "object", "properties": {"title": {"type": "string"}, "story": {"type": "string"}},
  "required": ["title", "story"], "additionalProperties": false})";
const char* kRecordSchema = R"({"type": "object", "properties": {
  "name": {"type": "string", "maxLength": 24}, "age": {"type": "integer", "minimum": 0, "maximum": 150},
  "id": {"type": "integer", "minimum": -9007199254740991, "maximum": 9007199254740991},
  "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 4},
  "score": {"type": "number", "minimum": 0, "maximum": 1}, "kind": {"enum": ["a", "b", "c"]},
  "note": {"anyOf": [{"type": "string", "maxLength": 40}, {"type": "null"}]}},
  "required": ["name", "age", "id", "tags", "score", "kind", "note"], "additionalProperties": false})";

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct RunResult {
  double tokens_per_s = 0;             // decode throughput over the batch
  double grammar_seconds = 0;          // engine-thread time in the matcher, all turns
  double sampling_seconds = 0;         // engine-thread time in the sampler, all turns
  int64_t tokens = 0;                  // generated, all turns
  std::vector<std::vector<int32_t>> outputs;
};

// One batch of turns started together; decode throughput = tokens after the first / decode time.
Result<RunResult> RunBatch(Engine& e, const std::vector<int32_t>& prompt, int batch, int tokens, uint64_t seed,
                           std::shared_ptr<grammar::Automaton> g) {
  std::vector<std::shared_ptr<TurnHandle>> handles;
  std::vector<SessionId> sessions;
  for (int i = 0; i < batch; ++i) {
    TurnRequest req;
    req.session = e.CreateSession();
    sessions.push_back(req.session);
    req.append = prompt;
    req.max_tokens = tokens;
    req.ignore_eos = true;  // same length with and without a grammar (unless the grammar closes)
    req.sampling.temperature = 1.0f;
    req.sampling.seed = seed + static_cast<uint64_t>(i);
    req.grammar = g;
    auto h = e.Submit(std::move(req));
    if (!h.ok()) return h.error();
    handles.push_back(*h);
  }
  RunResult out;
  double first = 1e30, last = 0;
  int64_t n = 0;
  for (auto& h : handles) {
    TurnResult r = h->Wait();
    if (r.finish_reason == FinishReason::kError) return r.error;
    first = std::min(first, r.ttft_seconds);
    last = std::max(last, r.total_seconds);
    n += static_cast<int64_t>(r.tokens.size()) - 1;
    out.grammar_seconds += r.grammar_seconds;
    out.sampling_seconds += r.sampling_seconds;
    out.tokens += static_cast<int64_t>(r.tokens.size());
    out.outputs.push_back(r.tokens);
  }
  for (SessionId s : sessions) (void)e.DeleteSession(s);
  out.tokens_per_s = last > first ? static_cast<double>(n) / (last - first) : 0;
  return out;
}

int RunBenchGrammar(const BenchGrammarFlags& f) {
  auto er = StartEngine(f.model, f.tokenizer, f.runtime, f.engine);
  if (!er.ok()) {
    std::fprintf(stderr, "error: %s\n", er.error().message.c_str());
    return 1;
  }
  Engine& e = *er->engine;
  const Tokenizer& tok = *er->rt.tokenizer;
  auto index = grammar::TokenIndex::Build(tok);
  std::vector<std::pair<std::string, std::string>> schemas = {{"story", kStorySchema}, {"record", kRecordSchema}};
  if (!f.schema_file.empty()) {
    std::ifstream in(f.schema_file);
    std::stringstream ss;
    ss << in.rdbuf();
    schemas = {{"file", ss.str()}};
  }
  std::vector<std::pair<std::string, std::string>> grammars;  // name, text
  for (const auto& [name, s] : schemas) {
    auto text = grammar::SchemaToGrammar(grammar::OrderedJson::parse(s));
    if (!text.ok()) {
      std::fprintf(stderr, "error: schema %s: %s\n", name.c_str(), text.error().message.c_str());
      return 1;
    }
    grammars.push_back({name, *text});
  }
  // As the server compiles a grammar (GrammarCache::Get): parsed, then prepared on this thread.
  std::vector<double> prepare_s;  // per automaton made
  auto make = [&](const std::string& text) {
    auto g = grammar::Grammar::Parse(text);
    MNEMO_CHECK(g.ok());
    auto a = std::make_shared<grammar::Automaton>(std::make_shared<const grammar::Grammar>(std::move(*g)), index);
    const auto t0 = std::chrono::steady_clock::now();
    a->Prepare();
    prepare_s.push_back(Seconds(t0));
    return a;
  };
  const std::vector<int32_t> prompt = tok.Encode("Once upon a time, there was a", /*add_special=*/true);
  nlohmann::json j = {{"model", f.model}, {"n_vocab", tok.n_vocab()}, {"trie_nodes", index->nodes().size()},
                      {"max_tokens", f.tokens}, {"results", nlohmann::json::array()}};
  RunBatch(e, prompt, 1, 4, 1, nullptr).ok();  // warm-up
  for (const auto& [name, text] : grammars) {
    // One automaton for every "warm" run of this schema (as the server caches it), after one
    // earlier turn with another seed.
    prepare_s.clear();
    auto shared = make(text);
    if (auto w = RunBatch(e, prompt, 1, f.tokens, 1, shared); !w.ok()) {
      std::fprintf(stderr, "error: %s\n", w.error().message.c_str());
      return 1;
    }
    for (int batch : f.batches) {
      struct Case {
        const char* automaton;
        std::vector<double> tokens_per_s;
        double engine_grammar_s = 0, sampling_s = 0;
        int64_t engine_tokens = 0;
        std::vector<std::vector<int32_t>> outputs;
      };
      std::vector<double> off;
      Case cases[2] = {{"fresh", {}, 0, 0, 0, {}}, {"warm", {}, 0, 0, 0, {}}};
      double off_sampling_s = 0;
      int64_t off_tokens = 0;
      for (int r = 0; r < f.repeats; ++r) {
        Progress("%s batch %d: run %d/%d\r", name.c_str(), batch, r + 1, f.repeats);
        const uint64_t seed = 1000 * static_cast<uint64_t>(r + 1);
        auto a = RunBatch(e, prompt, batch, f.tokens, seed, nullptr);
        if (!a.ok()) {
          std::fprintf(stderr, "error: %s\n", a.error().message.c_str());
          return 1;
        }
        off.push_back(a->tokens_per_s);
        off_sampling_s += a->sampling_seconds;
        off_tokens += a->tokens;
        for (Case& c : cases) {
          auto b = RunBatch(e, prompt, batch, f.tokens, seed, c.automaton[0] == 'f' ? make(text) : shared);
          if (!b.ok()) {
            std::fprintf(stderr, "error: %s\n", b.error().message.c_str());
            return 1;
          }
          c.tokens_per_s.push_back(b->tokens_per_s);
          for (auto& o : b->outputs) c.outputs.push_back(o);
          c.engine_grammar_s += b->grammar_seconds;
          c.sampling_s += b->sampling_seconds;
          c.engine_tokens += b->tokens;
        }
      }
      for (const Case& c : cases) {
        // Mask time alone: replay each constrained output through a new automaton (cold: what a
        // schema's first request pays), then again through the same one (warm: all cached).
        std::vector<std::shared_ptr<grammar::Automaton>> colds;
        for (size_t o = 0; o < c.outputs.size(); ++o) colds.push_back(make(text));
        double cold_s = 0, warm_s = 0;
        int64_t masked = 0;
        grammar::TokenMask mask;
        for (int pass = 0; pass < 2; ++pass) {
          for (size_t o = 0; o < c.outputs.size(); ++o) {
            const auto& out = c.outputs[o];
            grammar::Matcher m(colds[o]);
            const auto t0 = std::chrono::steady_clock::now();
            for (size_t i = 0; i < out.size() && !m.done(); ++i) {
              if (!m.FillMask(f.tokens - static_cast<int>(i), &mask).ok() || !m.Accept(out[i]).ok()) break;
              if (pass == 0) ++masked;
            }
            (pass == 0 ? cold_s : warm_s) += Seconds(t0);
          }
        }
        // The automata's figures per replayed output (each built its own).
        grammar::Automaton::Stats st;
        for (const auto& a : colds) {
          const auto x = a->stats();
          st.states += x.states;
          st.masks_computed += x.masks_computed;
          st.masks_cached += x.masks_cached;
          st.greedy_walks += x.greedy_walks;
          st.budget_walks += x.budget_walks;
          st.masks_split += x.masks_split;
          st.keys += x.keys;
          st.key_bytes += x.key_bytes;
          st.nodes_visited += x.nodes_visited;
        }
        const int64_t n_out = std::max<int64_t>(1, static_cast<int64_t>(colds.size()));
        const double off_m = Median(off), on_m = Median(c.tokens_per_s);
        nlohmann::json row = {{"schema", name}, {"batch", batch}, {"automaton", c.automaton},
                              {"unconstrained_tokens_per_s", off_m}, {"constrained_tokens_per_s", on_m},
                              {"cost_share", off_m > 0 ? 1.0 - on_m / off_m : 0.0},
                              {"mask_us_per_token_cold", masked ? 1e6 * cold_s / masked : 0.0},
                              {"mask_us_per_token_warm", masked ? 1e6 * warm_s / masked : 0.0},
                              {"mask_us_per_token_engine", c.engine_tokens ? 1e6 * c.engine_grammar_s / c.engine_tokens : 0.0},
                              // The sampler's time per token, unconstrained and under the masks.
                              {"sample_us_per_token_off", off_tokens ? 1e6 * off_sampling_s / off_tokens : 0.0},
                              {"sample_us_per_token_on", c.engine_tokens ? 1e6 * c.sampling_s / c.engine_tokens : 0.0},
                              {"prepare_ms", 1e3 * Median(prepare_s)},
                              {"tokens_replayed", masked}, {"states", st.states / n_out},
                              {"trie_walks", st.masks_computed / n_out}, {"masks_from_cache", st.masks_cached / n_out},
                              {"greedy_walks", st.greedy_walks / n_out}, {"budget_walks", st.budget_walks / n_out},
                              {"split_masks", st.masks_split / n_out}, {"keys", st.keys / n_out}, {"key_bytes", st.key_bytes / n_out},
                              {"trie_nodes_per_walk", st.masks_computed + st.greedy_walks
                                                          ? static_cast<double>(st.nodes_visited) / (st.masks_computed + st.greedy_walks)
                                                          : 0.0},
                              {"runs_off", off}, {"runs_on", c.tokens_per_s}};
        j["results"].push_back(row);
      }
    }
  }
  if (f.json) {
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("vocab %d tokens, trie %zu nodes, max_tokens %d\n", tok.n_vocab(), index->nodes().size(), f.tokens);
  std::printf("%-7s %5s %-9s %12s %12s %7s %10s %10s %10s %10s %10s %8s %10s %9s\n", "schema", "batch", "automaton", "off tok/s",
              "on tok/s", "cost", "in engine", "sample off", "sample on", "mask cold", "mask warm", "states", "nodes/walk", "prepare");
  for (const auto& r : j["results"]) {
    std::printf("%-7s %5d %-9s %12.1f %12.1f %6.1f%% %8.1fus %8.1fus %8.1fus %8.1fus %8.1fus %8lld %10.0f %7.2fms\n", r["schema"].get<std::string>().c_str(),
                r["batch"].get<int>(), r["automaton"].get<std::string>().c_str(), r["unconstrained_tokens_per_s"].get<double>(), r["constrained_tokens_per_s"].get<double>(),
                100 * r["cost_share"].get<double>(), r["mask_us_per_token_engine"].get<double>(), r["sample_us_per_token_off"].get<double>(),
                r["sample_us_per_token_on"].get<double>(), r["mask_us_per_token_cold"].get<double>(),
                r["mask_us_per_token_warm"].get<double>(), static_cast<long long>(r["states"].get<int64_t>()),
                r["trie_nodes_per_walk"].get<double>(), r["prepare_ms"].get<double>());
  }
  return 0;
}

}  // namespace

void RegisterBenchGrammar(CLI::App* bench) {
  auto f = std::make_shared<BenchGrammarFlags>();
  auto* cmd = bench->add_subcommand("grammar", "constrained decoding: decode throughput with and without a grammar, mask time per token");
  cmd->add_option("--model", f->model, "model file")->required()->check(CLI::ExistingFile);
  cmd->add_option("--tokenizer", f->tokenizer, "llama2.c tokenizer file for .bin models");
  cmd->add_option("--batches", f->batches, "decode batch sizes");
  cmd->add_option("--tokens", f->tokens, "max_tokens per turn")->check(CLI::PositiveNumber);
  cmd->add_option("--repeats", f->repeats, "runs of each case (unconstrained, fresh automaton, warm automaton) per figure (median reported)")->check(CLI::PositiveNumber);
  cmd->add_option("--schema", f->schema_file, "a JSON Schema file instead of the built-in story and record schemas");
  cmd->add_flag("--json", f->json, "print one JSON object");
  AddRuntimeFlags(cmd, &f->runtime);
  AddEngineFlags(cmd, &f->engine);
  cmd->callback([f] {
    int rc = RunBenchGrammar(*f);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace mnemo::app
