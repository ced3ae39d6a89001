// mnemo bench convkv: what selective context (ConvKV, DESIGN.md section 4) costs in quality and
// saves in prefill, measured against the full context on conversations the model itself writes.
//
// Each conversation is a plain transcript: a system prompt, then T exchanges ("User: ...\n\n
// Assistant: ...\n\n"; the blank line after a reply is tokenized with the next message, so turn
// i >= 2 starts with it). User messages are story prompts drawn from a fixed list of topics; the
// model writes each reply greedily from the full context so far; the final user message (the
// query) returns to the topic of an early exchange (the target turn). For each budget and
// selection method the selected context (kept turns, compacted, then the query) is run from
// scratch, which is what exact mode computes, and compared with the full context (all history,
// then the query) on the full context's greedy continuation:
//   greedy_agreement  share of the continuation's positions where the selected context's argmax
//                     is the full context's token (teacher-forced)
//   kl                mean over those positions of KL(P_full || P_selected), in nats
//   prefill_fraction  (n_selected - exact_prefix_tokens) / n_full: what exact mode with a cache
//                     recomputes, against a stateless server that recomputes history + query
//   selected_fraction n_selected / n_full
// Greedy picks skip control tokens (BOS/EOS) so that every reply and continuation has its planned
// length; KL is over the whole vocabulary. The "full" row is measured the same way (the batched,
// teacher-forced run against the token-by-token greedy run), not written in.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/block.h"
#include "base/cpu.h"
#include "base/dtype.h"
#include "base/rng.h"
#include "bench_convkv_eval.h"
#include "commands.h"
#include "context/embedding.h"
#include "context/layout.h"
#include "context/scoring.h"
#include "context/selection.h"
#include "context/turns.h"
#include "runtime.h"
#include "sampling/sampler.h"
#include "server/service.h"

namespace mnemo::app {
namespace {

using context::SelectionMethod;

struct ConvkvFlags {
  std::string model = "../shared/models/stories260K/stories260K.gguf";  // model file
  std::string tokenizer;                 // llama2.c tokenizer file for .bin models
  int conversations = 12;                // conversations averaged over
  int turns = 8;                         // exchanges per conversation (history turns after the system prompt)
  uint64_t seed = 1;                     // conversation plans and the random baseline
  int gen_tokens = 32;                   // continuation tokens compared
  int max_positions = 512;               // conversation + query + continuation fit here (stories260K was
                                         // trained on 512; its GGUF metadata says 2048)
  std::vector<double> budgets{0.3, 0.5, 0.7};  // fractions of the history tokens
  std::string weights = "default";       // 3-factor weight preset (context::WeightPreset)
  bool relevance_minmax = false;         // 3-factor: rescale relevance to [0, 1] over the history first
  bool verbose = false;                  // print each conversation and its selections on stderr
  bool json = false;
  RuntimeFlags runtime;
  // --eval: a labelled evaluation set served through the service instead (bench_convkv_eval.h).
  std::string eval;
  int limit = 0;
  std::vector<std::string> modes{"exact", "reuse"};
  std::vector<std::string> methods{"3-factor", "relevance", "recency", "recent-only", "random"};
  std::string relevance = "keyword";
  double relevance_temperature = context::ScoringOptions{}.relevance_temperature;
  int hidden_layer = -1;    // --eval: ServiceConfig::hidden_layer
  int attention_layers = 0; // --eval: ServiceConfig::attention_layers
  int answer_tokens = 12;
  int keep_last = context::SelectionOptions{}.keep_last;
  std::string dump_turns;   // --eval: JSONL of every conversation's turn sizes and scores
};

// ---- Conversation content -------------------------------------------------------------------

// One topic: openings are user messages that start a story about it; recalls are final questions
// that return to it. Topics differ in characters and objects so that relevance can find the turn.
struct Topic {
  std::array<const char*, 3> openings;
  std::array<const char*, 2> recalls;
};

constexpr Topic kTopics[] = {
    {{"A dog named Max finds a bone.", "Max the dog runs in the park.", "Max the dog digs a big hole."},
     {"What did Max the dog find?", "Tell me more about Max the dog."}},
    {{"Lily has a garden with red flowers.", "Lily plants a seed in her garden.",
      "Lily waters the flowers in her garden."},
     {"What grew in Lily's garden?", "Tell me more about Lily's garden."}},
    {{"Tom has a little blue boat.", "Tom sails his boat on the lake.", "Tom and dad go on a boat."},
     {"What did Tom do with his boat?", "Tell me more about Tom's boat."}},
    {{"A bird named Sue cannot fly.", "Sue the bird sings in a tree.", "Sue the bird builds a nest."},
     {"Did Sue the bird fly?", "Tell me more about Sue the bird."}},
    {{"Ben sees a big cake.", "Ben and mom bake a cake.", "Ben wants to eat the cake."},
     {"Did Ben eat the cake?", "Tell me more about Ben's cake."}},
    {{"A cat named Kitty likes milk.", "Kitty the cat sleeps in the sun.", "Kitty the cat chases a mouse."},
     {"What did Kitty the cat do?", "Tell me more about Kitty the cat."}},
    {{"Anna finds a shell at the beach.", "Anna plays in the sand.", "Anna swims in the sea."},
     {"What did Anna find at the beach?", "Tell me more about Anna at the beach."}},
    {{"Sam has a fast red car.", "Sam lost his toy car.", "Sam races his car."},
     {"Where was Sam's car?", "Tell me more about Sam's red car."}},
    {{"A big bear looks for honey.", "The bear is very hungry.", "The bear meets a rabbit."},
     {"Did the bear find honey?", "Tell me more about the big bear."}},
    {{"Mia sees the rain from her window.", "It is a rainy day for Mia.", "Mia sees a rainbow."},
     {"What did Mia see after the rain?", "Tell me more about Mia and the rain."}},
};
constexpr int kNumTopics = sizeof(kTopics) / sizeof(kTopics[0]);
constexpr const char* kSystemPrompt = "You tell short stories for kids.";
constexpr int kMinReply = 24, kMaxReply = 48, kFloorReply = 12;  // reply tokens

struct Conversation {
  std::vector<int32_t> log;              // [n_history] system prompt, then each exchange
  std::vector<context::TurnSpan> turns;  // tiles [0, log.size()); turn 0 = system prompt
  std::vector<int32_t> query;            // the final user message (not a history turn)
  int target_turn = 0;                   // the exchange whose topic the query returns to
  int reply_tokens = 0;                  // generated tokens over all replies
};

// ---- Forward pass over one sequence ---------------------------------------------------------

// One sequence over a private KV pool of the model's whole context, block table 0..n-1. Feed
// writes positions [from, from + n) and reads the KV of [0, from) written by earlier calls.
class Runner {
 public:
  Runner(Model& m, DType kv_dtype, int max_positions)
      : m_(m), n_ctx_max_(std::min(max_positions, m.config().context_length)),
        kv_(m.kv_shape(kv_dtype), (n_ctx_max_ + kBlockTokens - 1) / kBlockTokens),
        table_(kv_.n_blocks()) {
    std::iota(table_.begin(), table_.end(), 0);
  }
  int max_positions() const { return n_ctx_max_; }

  // Returns logits [n, vocab] when all_logits, else [1, vocab] for the last token; n >= 1 and
  // from + n <= max_positions() (the caller checks).
  const std::vector<float>& Feed(std::span<const int32_t> toks, int from, bool all_logits) {
    std::vector<int32_t> pos(toks.size());
    std::iota(pos.begin(), pos.end(), from);
    Batch b;
    int i = b.Add(toks.data(), pos.data(), static_cast<int>(toks.size()), all_logits);
    b.seqs[i].n_ctx = from + static_cast<int>(toks.size());
    b.seqs[i].block_table.assign(table_.begin(),
                                 table_.begin() + (b.seqs[i].n_ctx + kBlockTokens - 1) / kBlockTokens);
    m_.Forward(b, kv_, logits_);
    return logits_;
  }

 private:
  Model& m_;
  int n_ctx_max_;                // positions the pool holds
  KvStorage kv_;                 // [ceil(n_ctx_max / 32)] blocks
  std::vector<int32_t> table_;   // [n_blocks] identity block table
  std::vector<float> logits_;    // [rows, vocab] last Feed's output
};

// Argmax over the tokens that are not control tokens (mask[t] true = allowed).
int32_t GreedyPick(const float* logits, const std::vector<char>& mask) {
  int32_t best = -1;
  for (int32_t t = 0; t < static_cast<int32_t>(mask.size()); t++) {
    if (mask[t] && (best < 0 || logits[t] > logits[best])) best = t;
  }
  return best;
}

// ---- Building conversations -----------------------------------------------------------------

// Plans conversation `index` (topics, messages, reply lengths) and lets the model write the replies
// greedily from the full context so far.
Result<Conversation> BuildConversation(const ConvkvFlags& f, int index, Runtime& rt, Runner& run,
                                       const std::vector<char>& mask) {
  const Tokenizer& tok = *rt.tokenizer;
  const int T = f.turns;
  Rng rng(f.seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(index) + 1);
  // Topics: the target (the query's) appears once, at exchange 1 or 2; the others are a shuffle of
  // the remaining topics, cycled if T - 1 exceeds them.
  const int target_topic = static_cast<int>(rng.Next() % kNumTopics);
  const int target_turn = T >= 2 ? 1 + static_cast<int>(rng.Next() % 2) : 1;
  std::vector<int> others;
  for (int t = 0; t < kNumTopics; t++) {
    if (t != target_topic) others.push_back(t);
  }
  for (int i = static_cast<int>(others.size()) - 1; i > 0; i--) std::swap(others[i], others[rng.Next() % (i + 1)]);
  std::vector<int> topic(T + 1, -1);  // [T + 1] topic of exchange i (index 0 unused)
  for (int i = 1, k = 0; i <= T; i++) topic[i] = i == target_turn ? target_topic : others[k++ % others.size()];

  Conversation c;
  c.target_turn = target_turn;
  const std::vector<int32_t> system = tok.Encode(std::string(kSystemPrompt) + "\n\n", /*add_special=*/true);
  // The blank line that ends a reply opens the next message: encoding "\n\nUser: ..." in one piece
  // avoids a second dummy-prefix space token per turn. Turn 1 follows the system prompt's own.
  std::vector<std::vector<int32_t>> prompts(T + 1);  // [T + 1] rendered user messages (index 0 unused)
  int fixed = static_cast<int>(system.size());
  for (int i = 1; i <= T; i++) {
    const char* msg = kTopics[topic[i]].openings[rng.Next() % 3];
    prompts[i] = tok.Encode(std::string(i == 1 ? "" : "\n\n") + "User: " + msg + "\n\nAssistant:", false);
    fixed += static_cast<int>(prompts[i].size());
  }
  const char* question = kTopics[target_topic].recalls[rng.Next() % 2];
  c.query = tok.Encode(std::string("\n\nUser: ") + question + "\n\nAssistant:", false);
  fixed += static_cast<int>(c.query.size()) + f.gen_tokens;

  // Reply lengths in [24, 48], scaled down (not below 12) when the conversation, its query and the
  // compared continuation would not fit the model's trained context.
  std::vector<int> reply_len(T + 1, 0);
  int sum = 0;
  for (int i = 1; i <= T; i++) sum += reply_len[i] = kMinReply + static_cast<int>(rng.Next() % (kMaxReply - kMinReply + 1));
  const int room = run.max_positions() - fixed;
  if (sum > room) {
    const int drawn = sum;
    sum = 0;
    for (int i = 1; i <= T; i++) sum += reply_len[i] = std::max(kFloorReply, reply_len[i] * std::max(room, 0) / drawn);
  }
  if (sum > room) {
    return MakeError("bench convkv: conversation %d: %d turns (%d tokens without replies, %d with the shortest "
                     "replies) do not fit %d positions; use fewer --turns",
                     index, T, fixed, fixed + sum, run.max_positions());
  }

  // Generate: one growing sequence; `fed` positions of c.log are in the KV.
  c.log = system;
  c.turns.push_back({0, static_cast<int>(system.size())});
  int fed = 0;
  for (int i = 1; i <= T; i++) {
    const int begin = static_cast<int>(c.log.size());
    c.log.insert(c.log.end(), prompts[i].begin(), prompts[i].end());
    for (int k = 0; k < reply_len[i]; k++) {
      const auto& logits = run.Feed(std::span(c.log).subspan(fed), fed, false);
      fed = static_cast<int>(c.log.size());
      c.log.push_back(GreedyPick(logits.data(), mask));
    }
    c.reply_tokens += reply_len[i];
    c.turns.push_back({begin, static_cast<int>(c.log.size())});
  }
  return c;
}

// ---- Evaluation -----------------------------------------------------------------------------

// Log-probabilities [gen.size(), vocab] of the next token after context + gen[0, j) for each j:
// the context is run from scratch, then the continuation teacher-forced.
std::vector<float> ContinuationLogProbs(Runner& run, const std::vector<int32_t>& ctx,
                                        const std::vector<int32_t>& gen, int vocab) {
  std::vector<int32_t> seq(ctx);
  seq.insert(seq.end(), gen.begin(), gen.end() - 1);  // the last token's successor is not compared
  const int n = static_cast<int>(ctx.size());
  if (n > 1) run.Feed(std::span(seq).first(n - 1), 0, false);
  const auto& logits = run.Feed(std::span(seq).subspan(n - 1), n - 1, true);  // [gen.size(), vocab]
  std::vector<float> lp(logits.size());
  for (size_t j = 0; j < gen.size(); j++) {
    LogSoftmax(std::span(logits).subspan(j * vocab, vocab), std::span(lp).subspan(j * vocab, vocab));
  }
  return lp;
}

struct Quality {
  double agreement = 0;  // share of positions whose masked argmax is the full context's token
  double kl = 0;         // mean KL(P_full || P_selected), nats
};

Quality Compare(const std::vector<float>& full_lp, const std::vector<float>& sel_lp,
                const std::vector<int32_t>& gen, int vocab, const std::vector<char>& mask) {
  Quality q;
  for (size_t j = 0; j < gen.size(); j++) {
    const float* lf = &full_lp[j * vocab];
    const float* ls = &sel_lp[j * vocab];
    if (GreedyPick(ls, mask) == gen[j]) q.agreement += 1;
    double kl = 0;
    for (int v = 0; v < vocab; v++) {
      if (std::isinf(lf[v])) continue;  // p_full = 0 contributes nothing
      kl += std::exp(double(lf[v])) * (double(lf[v]) - double(ls[v]));
    }
    q.kl += std::max(0.0, kl);  // rounding can leave a tiny negative for identical rows
  }
  q.agreement /= static_cast<double>(gen.size());
  q.kl /= static_cast<double>(gen.size());
  return q;
}

struct MethodSpec {
  const char* name;         // name in the report
  SelectionMethod method;   // context library method
};
constexpr MethodSpec kMethods[] = {
    {"3-factor", SelectionMethod::kScore},      {"relevance", SelectionMethod::kRelevance},
    {"recency", SelectionMethod::kRecency},     {"recent-only", SelectionMethod::kRecentOnly},
    {"random", SelectionMethod::kRandom},
};

// Sums over conversations of one (method, budget) row.
struct RowSum {
  std::string method;
  double budget = 0;
  double prefill = 0, selected = 0, agreement = 0, kl = 0, kept_turns = 0, target_kept = 0, over_budget = 0;
};

std::string KeptList(const std::vector<int>& kept) {
  std::string s;
  for (int k : kept) s += (s.empty() ? "" : ",") + std::to_string(k);
  return s;
}

Status EvaluateConversation(const ConvkvFlags& f, int index, const Conversation& c, Runtime& rt,
                            Runner& run, const std::vector<char>& mask, const context::ScoringOptions& scoring,
                            std::vector<RowSum>& rows) {
  const int vocab = rt.model->config().vocab_size;
  const int n_hist = static_cast<int>(c.log.size());
  std::vector<int32_t> full(c.log);
  full.insert(full.end(), c.query.begin(), c.query.end());
  const int n_full = static_cast<int>(full.size());

  // The reference continuation: greedy from the full context, one token at a time.
  std::vector<int32_t> gen;
  {
    std::vector<int32_t> seq(full);
    int fed = 0;
    for (int k = 0; k < f.gen_tokens; k++) {
      const auto& logits = run.Feed(std::span(seq).subspan(fed), fed, false);
      fed = static_cast<int>(seq.size());
      gen.push_back(GreedyPick(logits.data(), mask));
      seq.push_back(gen.back());
    }
  }
  const std::vector<float> full_lp = ContinuationLogProbs(run, full, gen, vocab);
  const Quality self = Compare(full_lp, full_lp, gen, vocab, mask);  // sanity: batched == incremental
  rows[0].agreement += self.agreement;
  rows[0].kl += self.kl;
  rows[0].prefill += 1;
  rows[0].selected += 1;
  rows[0].kept_turns += static_cast<double>(c.turns.size());
  rows[0].target_kept += 1;

  // Relevance embeddings: IDF-weighted means of the model's own token embedding rows.
  const TensorRef& E = rt.file->weights().tok_embd;  // [vocab, dim]
  const size_t row_bytes = DTypeBytes(E.dtype, static_cast<size_t>(E.cols));
  context::IdfStats idf;
  for (const auto& t : c.turns) idf.AddDocument(std::span(c.log).subspan(t.begin, t.size()));
  idf.Publish();
  context::IdfEmbedder embedder(
      [&](int32_t token, float* out) {
        ToF32(E.dtype, static_cast<const char*>(E.data) + row_bytes * token, out, static_cast<size_t>(E.cols));
      },
      static_cast<int>(E.cols), &idf);
  auto scored = context::ScoreTurns(c.log, c.turns, c.query, embedder, scoring);
  if (!scored.ok()) return scored.error();
  std::vector<context::TurnScore>& scores = *scored;
  if (f.relevance_minmax) {  // experiment: spread the relevances of this history over [0, 1]
    double lo = 1, hi = 0;
    for (const auto& s : scores) lo = std::min(lo, s.relevance), hi = std::max(hi, s.relevance);
    for (auto& s : scores) {
      s.relevance = hi > lo ? (s.relevance - lo) / (hi - lo) : 0;
      s.total = scoring.weights.recency * s.recency + scoring.weights.relevance * s.relevance +
                scoring.weights.information * s.information;
    }
  }

  if (f.verbose) {
    std::fprintf(stderr, "conversation %d: %d history tokens, %d query tokens, target turn %d\n", index, n_hist,
                 static_cast<int>(c.query.size()), c.target_turn);
    for (size_t t = 0; t < c.turns.size(); t++) {
      const auto& s = scores[t];
      std::string text = rt.tokenizer->Decode(std::span(c.log).subspan(c.turns[t].begin, c.turns[t].size()));
      std::replace(text.begin(), text.end(), '\n', ' ');
      std::fprintf(stderr, "  turn %zu [%d tok] rec %.2f rel %.2f inf %.2f total %.2f | %s\n", t, c.turns[t].size(),
                   s.recency, s.relevance, s.information, s.total, text.c_str());
    }
    std::string q = rt.tokenizer->Decode(c.query);
    std::replace(q.begin(), q.end(), '\n', ' ');
    std::fprintf(stderr, "  query: %s\n  full continuation: %s\n", q.c_str(), rt.tokenizer->Decode(gen).c_str());
  }

  // Identical selections (e.g. the mandatory set alone) are run once.
  std::map<std::vector<int>, std::pair<Quality, int>> memo;  // kept turns -> (quality, prefix tokens)
  size_t r = 1;
  for (size_t bi = 0; bi < f.budgets.size(); bi++) {
    auto resolved = context::ResolveBudget(f.budgets[bi], n_hist);
    if (!resolved.ok()) return resolved.error();
    const int budget = *resolved;
    for (const auto& m : kMethods) {
      context::SelectionOptions opts;
      opts.method = m.method;
      opts.keep_last = f.keep_last;
      opts.seed = f.seed * 1000003ull + static_cast<uint64_t>(index) * 101 + bi;
      auto selected = context::SelectTurns(c.turns, scores, budget, opts);
      if (!selected.ok()) return selected.error();
      const context::Selection& sel = *selected;
      auto laid = context::ComputeLayout(c.turns, sel.kept);
      if (!laid.ok()) return laid.error();
      const context::Layout& layout = *laid;
      auto it = memo.find(sel.kept);
      if (it == memo.end()) {
        auto gathered = context::GatherTokens(c.log, layout);
        if (!gathered.ok()) return gathered.error();
        std::vector<int32_t>& ctx = *gathered;
        ctx.insert(ctx.end(), c.query.begin(), c.query.end());
        const auto lp = ContinuationLogProbs(run, ctx, gen, vocab);
        it = memo.emplace(sel.kept, std::pair(Compare(full_lp, lp, gen, vocab, mask), layout.exact_prefix_tokens)).first;
      }
      const Quality& q = it->second.first;
      const int n_sel = layout.n_tokens + static_cast<int>(c.query.size());
      RowSum& row = rows[r++];
      row.prefill += double(n_sel - layout.exact_prefix_tokens) / n_full;
      row.selected += double(n_sel) / n_full;
      row.agreement += q.agreement;
      row.kl += q.kl;
      row.kept_turns += static_cast<double>(sel.kept.size());
      row.target_kept += std::binary_search(sel.kept.begin(), sel.kept.end(), c.target_turn) ? 1 : 0;
      row.over_budget += sel.overflow_tokens > 0 ? 1 : 0;
      if (f.verbose) {
        std::fprintf(stderr, "  %-11s budget %.2f (%3d tok): kept {%s} agreement %.3f kl %.4f\n", m.name,
                     f.budgets[bi], budget, KeptList(sel.kept).c_str(), q.agreement, q.kl);
      }
    }
  }
  return {};
}

int RunConvkv(ConvkvFlags& f) {
  auto t0 = std::chrono::steady_clock::now();
  for (double b : f.budgets) {
    if (!(b > 0 && b < 1)) {
      std::fprintf(stderr, "error: --budgets takes fractions in (0, 1), got %g\n", b);
      return 1;
    }
  }
  auto rt = LoadRuntime(f.model, f.tokenizer, f.runtime);
  if (!rt.ok()) {
    std::fprintf(stderr, "error: %s\n", rt.error().message.c_str());
    return 1;
  }
  Runner run(*rt->model, rt->kv_dtype, f.max_positions);
  const int vocab = rt->model->config().vocab_size;
  std::vector<char> mask(vocab);  // [vocab] 1 = a greedy pick may choose this token
  for (int t = 0; t < vocab; t++) mask[t] = !rt->tokenizer->IsControl(t);

  context::ScoringOptions scoring;
  auto preset = context::WeightPreset(f.weights);
  if (!preset.ok()) {
    std::fprintf(stderr, "error: %s\n", preset.error().message.c_str());
    return 1;
  }
  scoring.weights = *preset;
  // Relevance as the service computes it (--relevance; the results in docs/benchmarks-convkv.md's
  // story section were measured with the seed's embedding relevance).
  scoring.relevance = *context::ParseRelevanceKind(f.relevance);  // checked by the flag
  scoring.relevance_temperature = f.relevance_temperature;
  std::vector<int32_t> fold;     // [vocab]
  std::vector<int8_t> word_kind;  // [vocab]
  KeywordTables(*rt->tokenizer, &fold, &word_kind);
  scoring.fold = fold;
  scoring.word_kind = word_kind;
  std::vector<RowSum> rows;
  rows.push_back({"full", 1.0});
  for (double b : f.budgets) {
    for (const auto& m : kMethods) rows.push_back({m.name, b});
  }
  double hist_tokens = 0, query_tokens = 0, reply_tokens = 0, cached_full = 0;
  for (int i = 0; i < f.conversations; i++) {
    auto c = BuildConversation(f, i, *rt, run, mask);
    Status st = c.ok() ? EvaluateConversation(f, i, *c, *rt, run, mask, scoring, rows) : Status(c.error());
    if (!st.ok()) {
      std::fprintf(stderr, "error: %s\n", st.error().message.c_str());
      return 1;
    }
    hist_tokens += static_cast<double>(c->log.size());
    query_tokens += static_cast<double>(c->query.size());
    reply_tokens += static_cast<double>(c->reply_tokens) / f.turns;
    cached_full += static_cast<double>(c->query.size()) / static_cast<double>(c->log.size() + c->query.size());
    Progress("conversation %d/%d\r", i + 1, f.conversations);
  }
  Progress("\n");
  const double n = f.conversations;
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  nlohmann::json jrows = nlohmann::json::array();
  for (const auto& r : rows) {
    jrows.push_back({{"method", r.method}, {"budget", r.budget}, {"prefill_fraction", r.prefill / n},
                     {"selected_fraction", r.selected / n}, {"greedy_agreement", r.agreement / n},
                     {"kl", r.kl / n}, {"kept_turns", r.kept_turns / n}, {"target_kept", r.target_kept / n},
                     {"over_budget", r.over_budget / n}});
  }
  if (f.json) {
    nlohmann::json j;
    j["rows"] = jrows;
    j["conversations"] = f.conversations;
    j["model"] = f.model;
    j["turns"] = f.turns;
    j["seed"] = f.seed;
    j["gen_tokens"] = f.gen_tokens;
    j["history_tokens_mean"] = hist_tokens / n;
    j["query_tokens_mean"] = query_tokens / n;
    j["reply_tokens_mean"] = reply_tokens / n;
    // Full context on a server that keeps the session's KV computes only the query.
    j["cached_full_prefill_fraction"] = cached_full / n;
    j["precision"] = f.runtime.precision;
    j["kv_dtype"] = DTypeName(rt->kv_dtype);
    j["threads"] = NumThreads();
    j["weights"] = f.weights;
    j["relevance_minmax"] = f.relevance_minmax;
    j["wall_seconds"] = wall;
    std::cout << j.dump() << std::endl;
    return 0;
  }
  std::printf("model %s, %d conversations of %d turns (mean %.0f history + %.0f query tokens, replies %.1f tokens), "
              "%d tokens compared, %.1f s\n",
              f.model.c_str(), f.conversations, f.turns, hist_tokens / n, query_tokens / n, reply_tokens / n,
              f.gen_tokens, wall);
  std::printf("%-11s %6s %8s %8s %9s %8s %6s %7s %6s\n", "method", "budget", "prefill", "selected", "agreement",
              "KL", "kept", "target", "over");
  for (const auto& r : jrows) {
    std::printf("%-11s %6.2f %8.3f %8.3f %9.3f %8.4f %6.2f %7.2f %6.2f\n", r["method"].get<std::string>().c_str(),
                r["budget"].get<double>(), r["prefill_fraction"].get<double>(), r["selected_fraction"].get<double>(),
                r["greedy_agreement"].get<double>(), r["kl"].get<double>(), r["kept_turns"].get<double>(),
                r["target_kept"].get<double>(), r["over_budget"].get<double>());
  }
  std::printf("full context with the session's KV cached computes only the query: prefill %.3f\n", cached_full / n);
  std::printf("prefill/selected: fractions of the full context's tokens; kept: turns kept (system prompt "
              "included); target: share of conversations that kept the turn the query returns to; over: share "
              "whose mandatory turns exceeded the budget\n");
  return 0;
}

}  // namespace

void RegisterBenchConvkv(CLI::App* bench) {
  auto f = std::make_shared<ConvkvFlags>();
  f->runtime.precision = "f32";  // exact path: differences come from the context, not rounding
  f->runtime.threads = 1;         // a tiny model: thread synchronisation costs more than it saves
  auto* cmd = bench->add_subcommand("convkv", "quality and prefill cost of selective context against full context");
  cmd->add_option("--model", f->model, "model file")->check(CLI::ExistingFile)->capture_default_str();
  cmd->add_option("--tokenizer", f->tokenizer, "llama2.c tokenizer file for .bin models");
  cmd->add_option("--conversations", f->conversations, "conversations averaged over")
      ->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--turns", f->turns, "exchanges per conversation")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--seed", f->seed, "conversation plans and the random baseline")->capture_default_str();
  cmd->add_option("--gen-tokens", f->gen_tokens, "continuation tokens compared")
      ->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--max-positions", f->max_positions, "positions a conversation, its query and the continuation fit in")
      ->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--budgets", f->budgets, "budgets as fractions of the history tokens")->capture_default_str();
  cmd->add_option("--weights", f->weights, "3-factor weight preset: default, factual, sequential, analytical")
      ->capture_default_str();
  cmd->add_flag("--relevance-minmax", f->relevance_minmax,
                "experiment: rescale relevance to [0, 1] over each history before the 3-factor mix");
  cmd->add_flag("--verbose", f->verbose, "print each conversation, its scores and selections on stderr");
  cmd->add_flag("--json", f->json, "print one JSON object");
  AddRuntimeFlags(cmd, &f->runtime);
  cmd->get_option("--threads")->capture_default_str();
  cmd->get_option("--precision")->capture_default_str();
  cmd->add_option("--eval", f->eval,
                  "JSONL evaluation set (turns, fact_turn, answer; e.g. ../shared/models/recall/eval.jsonl): "
                  "answer accuracy through the serving path instead of agreement on generated conversations")
      ->check(CLI::ExistingFile);
  cmd->add_option("--limit", f->limit, "--eval: first N conversations (0 = all)")->capture_default_str();
  cmd->add_option("--modes", f->modes, "--eval: context modes (exact, reuse)")->capture_default_str();
  cmd->add_option("--methods", f->methods, "--eval: 3-factor, relevance, recency, recent-only, random")
      ->check(CLI::IsMember({"3-factor", "relevance", "recency", "recent-only", "random"}))->capture_default_str();
  cmd->add_option("--relevance", f->relevance,
                  "relevance factor: keyword, embedding, centred, whitened; with --eval also hidden, attention")
      ->check(CLI::IsMember({"keyword", "embedding", "centred", "whitened", "hidden", "attention"}))->capture_default_str();
  cmd->add_option("--relevance-temperature", f->relevance_temperature,
                  "keyword relevance sharpening (context::ScoringOptions; 0: the linear share, as before 2026-12-03)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  cmd->add_option("--hidden-layer", f->hidden_layer, "--eval, --relevance hidden: block whose output is pooled (-1: n_layers / 2)")
      ->capture_default_str();
  cmd->add_option("--attention-layers", f->attention_layers,
                  "--eval, --relevance attention: average over blocks [0, N) (0: all; the probe stops there)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  cmd->add_option("--answer-tokens", f->answer_tokens, "--eval: tokens generated per answer")
      ->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--keep-last", f->keep_last, "newest turns always kept (context_keep_last)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  cmd->add_option("--dump-turns", f->dump_turns,
                  "--eval: write one JSON line per conversation (fact turn, tokens and scores of every "
                  "turn) to FILE, for studying rankings offline");
  cmd->callback([f] {
    if (!f->eval.empty()) {
      ConvkvEvalConfig c;
      c.model = f->model;
      c.eval = f->eval;
      c.limit = f->limit;
      c.budgets = f->budgets;
      c.modes = f->modes;
      c.methods = f->methods;
      c.preset = f->weights;
      c.relevance = f->relevance;
      c.relevance_temperature = f->relevance_temperature;
      c.seed = f->seed;
      c.max_tokens = f->answer_tokens;
      c.keep_last = f->keep_last;
      c.hidden_layer = f->hidden_layer;
      c.attention_layers = f->attention_layers;
      c.verbose = f->verbose;
      c.dump_turns = f->dump_turns;
      c.json = f->json;
      c.runtime = f->runtime;
      int rc = RunConvkvEval(c);
      if (rc != 0) throw CLI::RuntimeError(rc);
      return;
    }
    if (f->relevance == "hidden" || f->relevance == "attention") {
      throw CLI::ValidationError("--relevance", "hidden and attention need the engine: use them with --eval");
    }
    int rc = RunConvkv(*f);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace mnemo::app
