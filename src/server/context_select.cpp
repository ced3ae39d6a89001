// Selective context (ConvKV) in the service: segment a conversation into turns, score and select
// them under a token budget, and either re-render the kept turns (exact mode: the shared prefix up
// to the first gap is reused, the rest recomputed) or compose a session from the cached KV of the
// kept turns, re-rotated to their new positions (reuse mode).
#include <algorithm>
#include <chrono>
#include <mutex>
#include <unordered_set>

#include "base/log.h"
#include "context/embedding.h"
#include "context/scoring.h"
#include "context/selection.h"
#include "server/service.h"

namespace mnemo {

struct Service::ContextState {
  std::mutex mu;                          // one request of a conversation scores at a time
  context::IdfStats stats;                // document frequencies over the conversation's turns
  context::TurnCache cache;               // turn features (embeddings), reused across requests
  std::unordered_set<uint64_t> counted;   // hashes of the turns already in stats
};

namespace {
ApiError Invalid(std::string msg, std::string param) {
  return ApiError{400, "invalid_request_error", std::move(msg), std::move(param), "invalid_value"};
}
}  // namespace

ApiResult<StartedTurn> Service::Start(TurnSpec spec) {
  // A session the request names (previous_response_id's chain, a conversation): loaded when this
  // replica does not hold it, brought in step with a shared store when it does.
  int64_t synced = -1;
  if (spec.hint.session >= 0 && Probes()) {
    SyncSession(spec.hint.session, spec.owner, /*load=*/true);
    synced = spec.hint.session;
  }
  if (spec.context.budget <= 0 && config_.default_context.budget > 0) spec.context = config_.default_context;
  ContextReport report;
  if (spec.context.budget > 0 && !spec.prompt) {
    auto r = SelectContext(spec, spec.context.budget);
    if (auto* e = std::get_if<ApiError>(&r)) return *e;
    report = std::get<ContextReport>(r);
    if (report.applied) spec.chain = false;  // the session no longer holds the chain's whole history
  } else if (windows_ && !spec.prompt && !spec.template_extra && spec.hint.session < 0 && spec.hint.key.empty()) {
    if (auto fast = StartResent(spec)) return std::move(*fast);
  }
  std::shared_ptr<TurnLock> lock = spec.lock;  // kept to the commit when the turn continues its session
  auto st = StartRendered(std::move(spec), synced, 0, std::move(lock));
  if (auto* t = std::get_if<StartedTurn>(&st)) t->context = std::move(report);
  return st;
}

ApiResult<ContextReport> Service::SelectContext(TurnSpec& spec, double budget) {
  ContextReport report;
  report.mode = spec.context.mode;
  if (spec.context.mode != "reuse" && spec.context.mode != "exact") {
    return Invalid("'context_mode' must be 'reuse' or 'exact'", "context_mode");
  }
  const std::vector<ChatMessage>& msgs = spec.messages;
  if (msgs.size() < 2 || msgs.back().role != "user") return report;  // nothing to choose from
  const size_t n_hist = msgs.size() - 1;
  const auto t_start = std::chrono::steady_clock::now();

  // Turns: 0 = the leading system messages (maybe none), then a user message with what follows it.
  std::vector<size_t> starts{0};  // first message of each turn
  size_t first = 0;
  while (first < n_hist && msgs[first].role == "system") first++;
  for (size_t j = first; j < n_hist; j++) {
    if (j == first || msgs[j].role == "user") starts.push_back(j);
  }
  starts.push_back(n_hist);
  // Token span of each turn: lengths of the renderings of growing prefixes.
  auto encode_prefix = [&](const std::vector<ChatMessage>& m, size_t k) -> ApiResult<std::vector<int32_t>> {
    if (k == 0) return std::vector<int32_t>{};
    TurnSpec s;
    s.messages.assign(m.begin(), m.begin() + k);
    auto r = template_.Render(s.messages, false, spec.template_extra.get());
    if (!r.ok()) return Invalid("cannot render the conversation: " + r.error().message, "messages");
    const bool has_bos_text = tok_.bos() >= 0 && r->rfind(tok_.TokenText(tok_.bos()), 0) == 0;
    return tok_.Encode(*r, !has_bos_text, true);
  };
  std::vector<int> lens;
  for (size_t s : starts) {
    auto t = encode_prefix(msgs, s);
    if (auto* e = std::get_if<ApiError>(&t)) return *e;
    lens.push_back(std::max(lens.empty() ? 0 : lens.back(), static_cast<int>(std::get<0>(t).size())));
  }
  auto hist_r = encode_prefix(msgs, n_hist);
  if (auto* e = std::get_if<ApiError>(&hist_r)) return *e;
  const std::vector<int32_t> hist = std::get<0>(hist_r);
  lens.back() = static_cast<int>(hist.size());
  std::vector<context::TurnSpan> turns;
  for (size_t t = 0; t + 1 < starts.size(); t++) {
    context::TurnSpan span{std::min(lens[t], lens.back()), std::min(lens[t + 1], lens.back()), false};
    for (size_t m = starts[t]; m < starts[t + 1]; m++) span.pinned = span.pinned || (m < spec.pinned.size() && spec.pinned[m]);
    turns.push_back(span);
  }

  // Score (3 factors) and select under the budget.
  auto weights = context::WeightPreset(spec.context.preset);
  if (!weights.ok()) return Invalid(weights.error().message, "context_preset");
  auto relevance = context::ParseRelevanceKind(spec.context.relevance);
  if (!relevance.ok()) return Invalid(relevance.error().message, "context_relevance");
  auto method = context::ParseSelectionMethod(spec.context.method);
  if (!method.ok()) return Invalid(method.error().message, "context_method");
  context::ScoringOptions opts;
  opts.weights = *weights;
  opts.relevance = *relevance;
  opts.relevance_temperature = spec.context.relevance_temperature;
  opts.fold = fold_;
  opts.word_kind = word_kind_;
  // The conversation's scoring state: found again by its first user turn.
  const context::TurnSpan& anchor = turns.size() > 1 ? turns[1] : turns[0];
  const std::string key = spec.owner + '\n' +
      std::to_string(context::HashTokens(std::span<const int32_t>(hist.data() + anchor.begin, anchor.size())));
  std::shared_ptr<ContextState> state;
  {
    std::lock_guard<std::mutex> lock(ctx_mu_);
    auto& slot = context_[key];
    if (!slot) {
      if (context_.size() > 4096) context_.clear();  // bounded: states are only a cache
      slot = std::make_shared<ContextState>();
    }
    state = context_[key];
  }
  std::lock_guard<std::mutex> state_lock(state->mu);
  for (const auto& t : turns) {
    std::span<const int32_t> toks(hist.data() + t.begin, t.size());
    if (state->counted.insert(context::HashTokens(toks)).second) state->stats.AddDocument(toks);
  }
  state->stats.MaybePublish();
  context::IdfEmbedder idf_embedder(config_.embed, config_.embed_dim, &state->stats);
  std::vector<int32_t> query = tok_.Encode(msgs.back().content, false);
  // Model-internal relevance runs passes on the engine thread (Engine::Probe).
  const ModelConfig& mc = engine_.model_config();
  const int hidden_layer = config_.hidden_layer >= 0 ? std::min(config_.hidden_layer, mc.n_layers - 1) : mc.n_layers / 2;
  int64_t probe_tokens = 0;
  std::string probe_error;
  context::FunctionEmbedder hidden_embedder(
      [&](std::span<const int32_t> toks) -> Result<std::vector<float>> {
        ProbeRequest pr;
        pr.tokens.assign(toks.begin(), toks.end());
        pr.hidden_layer = hidden_layer;
        pr.pool_spans = {{0, static_cast<int>(toks.size())}};
        probe_tokens += static_cast<int64_t>(toks.size());
        auto r = engine_.Probe(pr);
        if (!r.ok()) return r.error();
        return std::move(r->pooled[0]);
      },
      mc.dim, (uint64_t{1} << 63) | static_cast<uint64_t>(hidden_layer));
  std::vector<float> attention_mass;  // [hist.size()] (attention relevance)
  if (*relevance == context::RelevanceKind::kAttention && !query.empty() && !hist.empty()) {
    // The history and the new message as the model will see them; the message's rows attend.
    auto full = Render(spec);
    if (auto* e = std::get_if<ApiError>(&full)) return *e;
    std::vector<int32_t> probe_toks = std::get<0>(full);
    if (probe_toks.size() <= hist.size() || !std::equal(hist.begin(), hist.end(), probe_toks.begin())) {
      probe_toks = hist;  // the rendering is not prefix-stable here: the message's raw tokens follow
      probe_toks.insert(probe_toks.end(), query.begin(), query.end());
    }
    ProbeRequest pr;
    pr.tokens = std::move(probe_toks);
    pr.attn_from = static_cast<int>(hist.size());
    pr.attn_layer_end = config_.attention_layers > 0 ? std::min(config_.attention_layers, mc.n_layers) : -1;
    probe_tokens += static_cast<int64_t>(pr.tokens.size());
    auto r = engine_.Probe(pr);
    if (!r.ok()) return ToApiError(r.error(), "attention relevance: ");
    attention_mass.assign(r->attn_mass.begin(), r->attn_mass.begin() + hist.size());
    opts.attention_mass = attention_mass;
  }
  context::Embedder& embedder = *relevance == context::RelevanceKind::kHidden
                                    ? static_cast<context::Embedder&>(hidden_embedder)
                                    : static_cast<context::Embedder&>(idf_embedder);
  auto scores = context::ScoreTurns(hist, turns, query, embedder, opts, &state->cache);
  if (!scores.ok()) {
    if (!hidden_embedder.last_error().empty()) {
      return ToApiError(MakeError(StatusCode::kInternal, "%s", hidden_embedder.last_error().c_str()), "hidden relevance: ");
    }
    return ToApiError(scores.error(), "scoring the turns: ");
  }
  report.probe_tokens = probe_tokens;
  report.scoring_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_start).count();
  report.method = spec.context.method;
  report.relevance = spec.context.relevance;
  report.n_turns = static_cast<int>(turns.size());
  if (spec.context.scores) {
    report.has_scores = true;
    report.scores = *scores;
    for (const auto& t : turns) report.turn_tokens.push_back(t.size());
  }
  auto budget_tokens = context::ResolveBudget(budget, static_cast<int>(hist.size()));
  if (!budget_tokens.ok()) return Invalid(budget_tokens.error().message, "context_budget");
  context::SelectionOptions so;
  so.keep_last = spec.context.keep_last;
  so.method = *method;
  so.seed = spec.context.seed;
  auto sel = context::SelectTurns(turns, *scores, *budget_tokens, so);
  if (!sel.ok()) return Invalid(sel.error().message, "context_budget");
  report.applied = true;
  report.kept_turns = sel->kept;
  report.dropped_turns = sel->dropped;
  report.kept_tokens = sel->kept_tokens;
  report.dropped_tokens = sel->dropped_tokens;
  if (sel->dropped.empty()) return report;  // nothing dropped: normal stateful serving

  std::vector<ChatMessage> kept;
  for (int t : sel->kept) kept.insert(kept.end(), msgs.begin() + starts[t], msgs.begin() + starts[t + 1]);
  const size_t n_kept_hist = kept.size();
  kept.push_back(msgs.back());
  if (spec.context.mode == "exact") {  // the prefix up to the first gap is reused by prefix matching
    spec.messages = std::move(kept);
    spec.hint = SessionHint{};
    return report;
  }

  // Reuse: the session holding this conversation's KV, and where each kept turn moves.
  auto full = Render(spec);
  if (auto* e = std::get_if<ApiError>(&full)) return *e;
  auto [src, lcp] = BestSession(spec.owner, std::get<0>(full));
  std::vector<int32_t> old_log;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (src >= 0) old_log = sessions_.at(src).tokens;
  }
  std::vector<int> kept_lens;
  std::vector<size_t> kept_starts{0};
  for (int t : sel->kept) kept_starts.push_back(kept_starts.back() + (starts[t + 1] - starts[t]));
  for (size_t k : kept_starts) {
    auto e = encode_prefix(kept, k);
    if (auto* err = std::get_if<ApiError>(&e)) return *err;
    kept_lens.push_back(static_cast<int>(std::get<0>(e).size()));
  }
  auto new_hist_r = encode_prefix(kept, n_kept_hist);
  if (auto* e = std::get_if<ApiError>(&new_hist_r)) return *e;
  std::vector<int32_t> new_hist = std::get<0>(new_hist_r);
  spec.messages = std::move(kept);
  if (src < 0 || lcp < size_t(config_.min_reuse_tokens) || new_hist.empty()) {
    spec.hint = SessionHint{};
    return report;  // no cached KV to reuse: the kept turns are computed afresh
  }
  std::vector<KvRun> runs;
  for (size_t j = 0; j < sel->kept.size(); j++) {
    const int t = sel->kept[j];
    const int o0 = turns[t].begin, n0 = std::min(kept_lens[j], static_cast<int>(new_hist.size()));
    const int len = std::min(turns[t].size(), std::min(kept_lens[j + 1], static_cast<int>(new_hist.size())) - n0);
    for (int k = 0; k < len;) {  // runs of positions whose tokens agree in both logs
      while (k < len && (o0 + k >= static_cast<int>(old_log.size()) || old_log[o0 + k] != new_hist[n0 + k])) k++;
      int start = k;
      while (k < len && o0 + k < static_cast<int>(old_log.size()) && old_log[o0 + k] == new_hist[n0 + k]) k++;
      if (k > start) runs.push_back(KvRun{o0 + start, n0 + start, k - start});
    }
  }
  auto dst = engine_.ComposeSession(src, new_hist, runs);
  if (!dst.ok()) {  // the turn still runs, on the kept turns' text (recomputed): say why it is slower
    spdlog::warn("selective context: cannot compose a session from session {}'s KV ({}); recomputing the kept turns",
                 src, dst.error().message);
    spec.hint = SessionHint{};
    return report;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    Entry& e = sessions_[*dst];
    e.owner = spec.owner;
    e.tokens = new_hist;
    e.unstored_prefix = new_hist;
    IndexLocked(*dst, 0);
  }
  spec.hint = SessionHint{"", *dst, static_cast<int64_t>(new_hist.size())};
  return report;
}

}  // namespace mnemo
