// mnemo bench convkv --eval: does selective context keep the turn a question needs?
//
// Protocol, per conversation of the evaluation set (rows: turns = chat messages ending with the
// question, fact_turn = the message index of the user message that states the answer, answer):
//   1. full: the whole conversation is served as one chat request on an empty engine (no session
//      shares its prefix), greedy, max_tokens tokens; the turn is committed, so its session holds
//      the KV of the history, the question and the answer, as a served conversation would.
//   2. for each budget, method and mode: the same request with context_budget = budget (a share of
//      the history tokens), through Service::Start exactly as chat completions does: turns are
//      segmented, scored and selected; exact mode re-renders the kept turns (the prefix up to the
//      first dropped turn is reused from the full session by prefix matching, the rest computed);
//      reuse mode composes a session from the full session's KV of the kept turns, keys re-rotated
//      to their new positions (Engine::ComposeSession), and computes only the question. Every
//      session but the full one is deleted after each run, so runs do not feed each other.
//   3. the answer is the first line of the generated text, trimmed, its final period stripped
//      (as make_recall.py / verify_recall.py), compared with `answer`.
// Context turn k >= 1 holds messages 2(k-1) and 2(k-1)+1 (turn 0 is the empty system prompt), so
// the fact's turn is fact_turn / 2 + 1.
//
// Figures per (method, budget, mode): accuracy; fact_kept (share of conversations whose fact turn
// was kept); prefill_fraction = positions the engine computed (fresh + recomputed) / the full
// run's prompt tokens; selected_fraction = prompt tokens / the full run's; TTFT (median, ms); the
// scoring cost (Service's segmentation and scoring, ms per history turn, median).
#include "bench_convkv_eval.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/dtype.h"
#include "base/log.h"
#include "runtime.h"
#include "server/service.h"

namespace mnemo::app {
namespace {

using Json = nlohmann::json;

struct EvalConversation {
  std::vector<ChatMessage> messages;  // ends with the question (a user message)
  int fact_turn = 0;                  // message index of the fact
  std::string answer;
};

Result<std::vector<EvalConversation>> LoadEval(const std::string& path, int limit) {
  std::ifstream in(path);
  if (!in) return MakeError("cannot open %s", path.c_str());
  std::vector<EvalConversation> out;
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.empty()) continue;
    Json j = Json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("turns") || !j["turns"].is_array() ||
        !j.contains("fact_turn") || !j["fact_turn"].is_number_integer() || !j.contains("answer") ||
        !j["answer"].is_string()) {
      return MakeError("%s:%d: expected an object with turns, fact_turn and answer", path.c_str(), n);
    }
    EvalConversation c;
    for (const Json& m : j["turns"]) {
      if (!m.is_object() || !m.value("role", Json()).is_string() || !m.value("content", Json()).is_string()) {
        return MakeError("%s:%d: a turn without string role and content", path.c_str(), n);
      }
      c.messages.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
    }
    c.fact_turn = j["fact_turn"].get<int>();
    c.answer = j["answer"].get<std::string>();
    if (c.messages.size() < 2 || c.messages.back().role != "user" || c.fact_turn < 0 ||
        c.fact_turn + 1 >= static_cast<int>(c.messages.size()) || c.messages[c.fact_turn].role != "user") {
      return MakeError("%s:%d: turns must end with a user question and fact_turn name an earlier user message",
                       path.c_str(), n);
    }
    out.push_back(std::move(c));
    if (limit > 0 && static_cast<int>(out.size()) >= limit) break;
  }
  if (out.empty()) return MakeError("%s holds no conversations", path.c_str());
  return out;
}

// The first line of the generated text, trimmed, without its final period.
std::string AnswerOf(const std::string& text) {
  auto trim = [](std::string s) {
    const char* ws = " \t\r\n";
    const size_t b = s.find_first_not_of(ws);
    if (b == std::string::npos) return std::string();
    return s.substr(b, s.find_last_not_of(ws) - b + 1);
  };
  std::string s = trim(text);
  s = trim(s.substr(0, s.find('\n')));
  while (!s.empty() && s.back() == '.') s.pop_back();
  return trim(s);
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct Row {
  Row(std::string m, std::string md, double b) : method(std::move(m)), mode(std::move(md)), budget(b) {}
  std::string method, mode;
  double budget = 0;
  int n = 0, correct = 0, fact_kept = 0, correct_fact_kept = 0;
  double prefill = 0, selected = 0, probe = 0;  // sums of fractions
  std::vector<double> ttft_ms, scoring_ms_per_turn;
  // Per conversation, in eval-set order: '1' answered right / fact turn kept, else '0'. [n] chars
  // each; what paired statistics (scripts/convkv_stats.py) compare method against method.
  std::string correct_bits, kept_bits;
};

struct RunOutcome {
  bool correct = false;
  int prompt_tokens = 0;
  int64_t computed = 0;  // fresh + recomputed positions
  double ttft_ms = 0;
  ContextReport context;
};

const char* ServiceMethod(const std::string& m) { return m == "3-factor" ? "score" : m.c_str(); }

class Evaluator {
 public:
  Evaluator(const ConvkvEvalConfig& c, Service& s) : c_(c), service_(s) {}

  Result<RunOutcome> Serve(const EvalConversation& conv, const ContextRequest* ctx) {
    TurnSpec spec;
    spec.messages = conv.messages;
    spec.request.max_tokens = c_.max_tokens;
    spec.request.sampling.temperature = 0;
    if (ctx) spec.context = *ctx;
    auto st = service_.Start(spec);
    if (auto* e = std::get_if<ApiError>(&st)) return MakeError("serving failed: %s", e->message.c_str());
    StartedTurn& t = std::get<StartedTurn>(st);
    TurnResult r = t.handle->Wait();
    auto committed = service_.Commit(t, r, std::nullopt, std::nullopt, "");
    if (auto* e = std::get_if<ApiError>(&committed)) return MakeError("commit failed: %s", e->message.c_str());
    if (!Completed(r.finish_reason)) return MakeError("the turn did not complete: %s", r.error.message.c_str());
    RunOutcome o;
    o.correct = AnswerOf(r.text) == conv.answer;
    o.prompt_tokens = r.prompt_tokens;
    o.computed = r.sources.fresh + r.sources.recomputed;
    o.ttft_ms = r.ttft_seconds * 1e3;
    o.context = std::move(t.context);
    if (c_.verbose) std::fprintf(stderr, "    -> '%s' (%s)\n", AnswerOf(r.text).c_str(), o.correct ? "ok" : "wrong");
    return o;
  }

  // Deletes every session except `keep` (-1: all).
  void DeleteSessionsExcept(int64_t keep) {
    for (const auto& s : service_.Sessions("")) {
      if (s.id != keep) (void)service_.DeleteSession(s.id, "");
    }
  }

 private:
  const ConvkvEvalConfig& c_;
  Service& service_;
};

Json ScoresJson(const ContextReport& r) {
  Json a = Json::array();
  for (const auto& s : r.scores) {
    a.push_back({{"recency", s.recency}, {"relevance", s.relevance}, {"information", s.information},
                 {"total", s.total}});
  }
  return a;
}

}  // namespace

int RunConvkvEval(const ConvkvEvalConfig& c) {
  auto t0 = std::chrono::steady_clock::now();
  for (double b : c.budgets) {
    if (!(b > 0 && b < 1)) {
      std::fprintf(stderr, "error: --budgets takes fractions in (0, 1), got %g\n", b);
      return 1;
    }
  }
  for (const auto& m : c.modes) {
    if (m != "exact" && m != "reuse") {
      std::fprintf(stderr, "error: --modes takes exact and reuse, got %s\n", m.c_str());
      return 1;
    }
  }
  auto convs = LoadEval(c.eval, c.limit);
  if (!convs.ok()) {
    std::fprintf(stderr, "error: %s\n", convs.error().message.c_str());
    return 1;
  }
  EngineFlags ef;  // 256 MB of T0: far more than one conversation's sessions need
  auto started = StartEngine(c.model, "", c.runtime, ef);
  if (!started.ok()) {
    std::fprintf(stderr, "error: %s\n", started.error().message.c_str());
    return 1;
  }
  Runtime& rt = started->rt;
  const Vocab& vocab = rt.file->vocab();
  ChatTemplate tmpl = ChatTemplate::Fallback();  // as mnemo serve: the model's template when usable
  if (!vocab.chat_template.empty()) {
    auto t = ChatTemplate::Create(vocab.chat_template, vocab.bos >= 0 ? rt.tokenizer->TokenText(vocab.bos) : "",
                                  vocab.eos >= 0 ? rt.tokenizer->TokenText(vocab.eos) : "");
    if (t.ok()) tmpl = std::move(t.value());
  }
  ServiceConfig sc;
  sc.model_name = "bench";
  sc.hidden_layer = c.hidden_layer;
  sc.attention_layers = c.attention_layers;
  const TensorRef emb = rt.file->weights().tok_embd;
  sc.embed_dim = static_cast<int>(emb.cols);
  sc.embed = [emb](int32_t token, float* out) {
    const size_t row = DTypeBytes(emb.dtype, emb.cols);
    ToF32(emb.dtype, static_cast<const uint8_t*>(emb.data) + row * token, out, emb.cols);
  };
  auto service = Service::Create(*started->engine, *rt.tokenizer, std::move(tmpl), nullptr, sc);
  if (!service.ok()) {
    std::fprintf(stderr, "error: %s\n", service.error().message.c_str());
    return 1;
  }
  Evaluator ev(c, **service);

  std::vector<Row> rows;
  rows.emplace_back("full", "exact", 1.0);
  for (double b : c.budgets) {
    for (const auto& m : c.methods) {
      for (const auto& md : c.modes) rows.emplace_back(m, md, b);
    }
  }
  Json dropped = Json::array();  // 3-factor at the middle budget, exact: conversations that lost the fact
  const double report_budget = c.budgets[c.budgets.size() / 2];
  const int n_conv = static_cast<int>(convs->size());
  std::ofstream dump;
  if (!c.dump_turns.empty()) {
    dump.open(c.dump_turns);
    if (!dump) {
      std::fprintf(stderr, "error: cannot write %s\n", c.dump_turns.c_str());
      return 1;
    }
  }
  for (int i = 0; i < n_conv; i++) {
    const EvalConversation& conv = (*convs)[i];
    const int fact_ctx_turn = conv.fact_turn / 2 + 1;
    ev.DeleteSessionsExcept(-1);
    if (c.verbose) std::fprintf(stderr, "conversation %d: fact turn %d, answer %s\n", i, fact_ctx_turn, conv.answer.c_str());
    auto full = ev.Serve(conv, nullptr);
    if (!full.ok()) {
      std::fprintf(stderr, "error: conversation %d: %s\n", i, full.error().message.c_str());
      return 1;
    }
    const auto sessions = (*service)->Sessions("");
    const int64_t full_session = sessions.empty() ? -1 : sessions.front().id;
    const double n_full = std::max(1, full->prompt_tokens);
    Row& fr = rows[0];
    fr.n++, fr.correct += full->correct, fr.fact_kept++, fr.correct_fact_kept += full->correct;
    fr.correct_bits += full->correct ? '1' : '0';
    fr.kept_bits += '1';
    fr.prefill += full->computed / n_full;
    fr.selected += 1;
    fr.ttft_ms.push_back(full->ttft_ms);
    for (size_t r = 1; r < rows.size(); r++) {
      Row& row = rows[r];
      ContextRequest ctx;
      ctx.budget = row.budget;
      ctx.mode = row.mode;
      ctx.method = ServiceMethod(row.method);
      ctx.relevance = c.relevance;
      ctx.relevance_temperature = c.relevance_temperature;
      ctx.preset = c.preset;
      ctx.keep_last = c.keep_last;
      ctx.seed = c.seed * 1000003ull + static_cast<uint64_t>(i) * 101 + static_cast<uint64_t>(row.budget * 100);
      ctx.scores = true;
      if (c.verbose) std::fprintf(stderr, "  %-11s %.2f %-5s", row.method.c_str(), row.budget, row.mode.c_str());
      auto o = ev.Serve(conv, &ctx);
      ev.DeleteSessionsExcept(full_session);
      if (!o.ok()) {
        std::fprintf(stderr, "error: conversation %d: %s\n", i, o.error().message.c_str());
        return 1;
      }
      if (dump.is_open() && r == 1) {  // the scores do not depend on budget, method or mode
        dump << Json{{"conversation", i}, {"fact_turn", fact_ctx_turn}, {"turn_tokens", o->context.turn_tokens},
                     {"scores", ScoresJson(o->context)}}.dump() << "\n";
      }
      const auto& kept = o->context.kept_turns;
      const bool fact_kept = !o->context.applied || std::find(kept.begin(), kept.end(), fact_ctx_turn) != kept.end();
      if (c.verbose) std::fprintf(stderr, "      fact %s\n", fact_kept ? "kept" : "dropped");
      row.n++, row.correct += o->correct, row.fact_kept += fact_kept, row.correct_fact_kept += o->correct && fact_kept;
      row.correct_bits += o->correct ? '1' : '0';
      row.kept_bits += fact_kept ? '1' : '0';
      row.prefill += o->computed / n_full;
      row.selected += o->prompt_tokens / n_full;
      row.probe += o->context.probe_tokens / n_full;
      row.ttft_ms.push_back(o->ttft_ms);
      if (o->context.n_turns > 0) row.scoring_ms_per_turn.push_back(o->context.scoring_ms / o->context.n_turns);
      if (!fact_kept && row.method == "3-factor" && row.mode == "exact" && row.budget == report_budget) {
        dropped.push_back({{"conversation", i}, {"fact_turn", fact_ctx_turn}, {"kept_turns", kept},
                           {"question", conv.messages.back().content},
                           {"fact", conv.messages[conv.fact_turn].content}, {"scores", ScoresJson(o->context)}});
      }
    }
    Progress("conversation %d/%d\r", i + 1, n_conv);
  }
  Progress("\n");
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  Json jrows = Json::array();
  for (const Row& r : rows) {
    const double n = std::max(1, r.n);
    jrows.push_back({{"method", r.method}, {"budget", r.budget}, {"mode", r.mode}, {"n", r.n},
                     {"accuracy", r.correct / n}, {"fact_kept", r.fact_kept / n},
                     {"accuracy_when_fact_kept", r.fact_kept ? double(r.correct_fact_kept) / r.fact_kept : 0.0},
                     {"prefill_fraction", r.prefill / n}, {"selected_fraction", r.selected / n},
                     {"probe_fraction", r.probe / n},
                     {"ttft_ms_median", Median(r.ttft_ms)},
                     {"scoring_ms_per_turn_median", Median(r.scoring_ms_per_turn)},
                     {"correct_per_conversation", r.correct_bits}, {"fact_kept_per_conversation", r.kept_bits}});
  }
  if (c.json) {
    Json j;
    j["rows"] = jrows;
    j["model"] = c.model;
    j["eval"] = c.eval;
    j["conversations"] = n_conv;
    j["relevance"] = c.relevance;
    j["relevance_temperature"] = c.relevance_temperature;
    j["preset"] = c.preset;
    j["keep_last"] = c.keep_last;
    j["hidden_layer"] = c.hidden_layer;
    j["attention_layers"] = c.attention_layers;
    j["seed"] = c.seed;
    j["precision"] = c.runtime.precision;
    j["kv_dtype"] = DTypeName(rt.kv_dtype);
    j["dropped_fact_budget"] = report_budget;
    j["dropped_fact"] = dropped;
    j["wall_seconds"] = wall;
    std::cout << j.dump() << std::endl;
    return 0;
  }
  std::printf("model %s, eval %s: %d conversations, relevance %s, preset %s, %.1f s\n", c.model.c_str(),
              c.eval.c_str(), n_conv, c.relevance.c_str(), c.preset.c_str(), wall);
  std::printf("%-11s %6s %-5s %8s %9s %8s %8s %8s %8s %9s\n", "method", "budget", "mode", "accuracy", "fact_kept",
              "prefill", "probe", "selected", "ttft_ms", "score_ms");
  for (const auto& r : jrows) {
    std::printf("%-11s %6.2f %-5s %8.3f %9.3f %8.3f %8.3f %8.3f %8.2f %9.4f\n", r["method"].get<std::string>().c_str(),
                r["budget"].get<double>(), r["mode"].get<std::string>().c_str(), r["accuracy"].get<double>(),
                r["fact_kept"].get<double>(), r["prefill_fraction"].get<double>(), r["probe_fraction"].get<double>(),
                r["selected_fraction"].get<double>(), r["ttft_ms_median"].get<double>(),
                r["scoring_ms_per_turn_median"].get<double>());
  }
  std::printf("%zu conversations lost the fact's turn with 3-factor at budget %.2f (exact); --json lists their scores\n",
              dropped.size(), report_budget);
  return 0;
}

}  // namespace mnemo::app
