// The engine's step: admission, the token budget, the forward pass, sampling and finishing turns.
#include <algorithm>
#include <limits>
#include <unordered_map>

#include "base/log.h"
#include "engine/batch_plan.h"
#include "engine/engine.h"
#include "engine/remote_fetch.h"
#include "engine/running.h"
#include "engine/scheduler.h"

namespace mnemo {

void Engine::Step() {
  const double now = Now();
  PollTransfers();
  if (now - last_expiry_ > 1.0) ExpireSessions(now);
  const StepPlan plan = Schedule(now);
  AdvanceCompositions(now);  // after admission: its kLater is the want the upkeep below serves
  RunBatch(plan);
  PublishQueue();
  // Keep some T0 free ahead of need (demotions run in the background), then start the copies.
  cache_->Maintain(cache_->capacity(Tier::kT0) - cache_->admission_blocks(), Now());
  SubmitTransfers();
}

// The scheduler's view of the engine's copies in flight (scheduler.h).
class Engine::Copies final : public CopyWaiter {
 public:
  explicit Copies(Engine& e) : e_(e) {}
  void Poll() override { e_.PollTransfers(); }
  void WaitFor(std::span<const uint64_t> ops) override {
    e_.SubmitTransfers();
    e_.transfer_->WaitFor(ops);
    e_.PollTransfers();
  }

 private:
  Engine& e_;
};

void Engine::PollTransfers() {
  for (const auto& [id, ok] : transfer_->TakeCompleted()) {
    // The cache manager falls back (a failed demotion keeps or drops the chunk, a failed swap-in
    // recomputes it): no client sees this, so say it here. A copy out that was not taken is a put
    // dropped by a full queue (counted in the remote tier's metrics; retried after a later turn).
    if (!ok && cache_->IsCopyOut(id)) {
      spdlog::debug("KV copy out {} not taken (the remote tier's put queue is full)", id);
    } else if (!ok) {
      spdlog::warn("KV transfer {} failed; the chunk falls back to its other copy or to recomputation", id);
    }
    cache_->OnTransferDone(id, ok);
  }
  if (remote_) {
    // A fill that brought nothing (a miss, or the tier down: logged there) leaves its chunk to be
    // recomputed, as without a remote tier.
    for (const auto& [id, ok] : remote_->TakeCompleted()) cache_->OnTransferDone(id, ok);
  }
}

const std::vector<int32_t>* Engine::KvTokens(SessionId s) const {
  const std::vector<int32_t>* tokens = nullptr;
  for (const auto& r : running_) {
    if (r->session->id == s) tokens = &r->seq;
  }
  for (const auto& r : waiting_) {
    if (r->session->id == s) tokens = &r->seq;
  }
  auto it = sessions_.find(s);
  if (!tokens && it != sessions_.end()) tokens = &it->second.tokens;
  return tokens;
}

DiskSlotId Engine::SlotId(SessionId s, int chunk) const {
  // The tokens the chunk's KV was computed from: a running turn's sequence, else the log.
  const std::vector<int32_t>* tokens = KvTokens(s);
  DiskSlotId id;
  id.session = s;
  id.chunk = chunk;
  int kv = cache_->HasSession(s) ? cache_->kv_tokens(s) : 0;
  id.valid_end = std::min({(chunk + 1) * kBlockTokens, kv, tokens ? static_cast<int>(tokens->size()) : 0});
  id.token_hash = tokens ? TokenPrefixHash(*tokens, id.valid_end) : 0;
  return id;
}

void Engine::SubmitTransfers() {
  std::vector<TransferOp> ops = cache_->TakeTransfers();
  if (ops.empty()) return;
  if (spdlog::should_log(spdlog::level::debug)) {
    int moves[4][4] = {};  // [src][dst] op counts
    for (const TransferOp& op : ops) moves[static_cast<int>(op.src)][static_cast<int>(op.dst)]++;
    for (int s = 0; s < 4; s++) {
      for (int d = 0; d < 4; d++) {
        if (moves[s][d] == 0) continue;
        spdlog::debug("{} {} chunk(s) {} -> {}", d > s ? "demoting" : d < s ? "swapping in" : "copying", moves[s][d],
                      TierName(static_cast<Tier>(s)), TierName(static_cast<Tier>(d)));
      }
    }
  }
  std::vector<DiskSlotId> ids;
  for (const TransferOp& op : ops) {
    ids.push_back(op.dst == Tier::kT2 || op.src == Tier::kT2 ? SlotId(op.session, op.chunk) : DiskSlotId{});
  }
  transfer_->Submit(ops, ids, RemotePuts(ops));
}

std::vector<std::optional<RemoteChunkId>> Engine::RemotePuts(const std::vector<TransferOp>& ops) const {
  std::vector<std::optional<RemoteChunkId>> puts;
  if (!remote_ || !config_.cache) return puts;
  puts.resize(ops.size());
  std::unordered_map<SessionId, std::vector<RemoteChunkId>> ids;  // per session, computed in one pass
  for (size_t i = 0; i < ops.size(); i++) {
    const TransferOp& op = ops[i];
    // A chunk leaving T0 (to T1 or disk), or T1 for disk: its block is read by the op anyway.
    const bool leaves = (op.src == Tier::kT0 && (op.dst == Tier::kT1 || op.dst == Tier::kT2)) ||
                        (op.src == Tier::kT1 && op.dst == Tier::kT2);
    if (!leaves || op.session < 0) continue;
    auto s = sessions_.find(op.session);
    if (s == sessions_.end() || !s->second.shares_kv) continue;
    const std::vector<int32_t>* tokens = KvTokens(op.session);
    const int end = (op.chunk + 1) * kBlockTokens;
    if (!tokens || end > std::min(cache_->kv_tokens(op.session), static_cast<int>(tokens->size()))) continue;  // partial
    std::vector<RemoteChunkId>& v = ids[op.session];
    if (static_cast<int>(v.size()) <= op.chunk) {
      v = RemoteChunksOf(*tokens, std::min(static_cast<int>(tokens->size()), cache_->kv_tokens(op.session)) / kBlockTokens);
    }
    puts[i] = v[op.chunk];
  }
  return puts;
}

void Engine::PlanRemoteFetches(double now) {
  if (!remote_ || !config_.cache || !remote_->available()) return;
  // The turns at the head of the queue, each once: a fetch started for a turn far behind would
  // hold blocks long before it is admitted.
  constexpr int kLookahead = 4;
  int looked = 0;
  for (auto& w : waiting_) {
    Running& r = *w;
    if (r.remote_checked) continue;
    if (looked++ >= kLookahead) break;
    r.remote_checked = true;
    Session& s = *r.session;
    if (s.composing || !s.shares_kv) continue;
    // Full chunks with no KV here, the last position excluded (it is fed for its logits): those
    // below the session's KV that were dropped, and those past it when it ends on a boundary.
    const int kv = cache_->kv_tokens(s.id);
    const std::vector<Tier> where = cache_->Residency(s.id);
    const int full = (static_cast<int>(r.seq.size()) - 1) / kBlockTokens;
    std::vector<int> candidates;
    for (int c = 0; c < full; c++) {
      if (c < static_cast<int>(where.size()) ? where[c] == Tier::kNone : kv % kBlockTokens == 0) candidates.push_back(c);
    }
    if (candidates.empty()) continue;
    const RemoteStats rs = remote_->stats();
    const std::vector<int> chosen =
        ChooseRemoteFetches(candidates, cost_fit_->params(),
                            RemoteFetchCost{rs.rtt_s, rs.bytes_per_s, RemoteHeaderBytes() + stats_.block_bytes},
                            config_.kv_remote_always);
    if (chosen.empty()) continue;
    const std::vector<RemoteChunkId> ids = RemoteChunksOf(r.seq, chosen.back() + 1);
    std::vector<RemoteFill> fills;
    for (const TransferOp& op : cache_->PlanFills(s.id, chosen, now)) {
      fills.push_back(RemoteFill{op.id, ids[op.chunk], op.dst == Tier::kT0 ? t0_.get() : t1_.get(), op.dst_block});
    }
    spdlog::debug("session {}: fetching {} of {} missing chunks from the remote tier", s.id, fills.size(),
                  candidates.size());
    remote_->Fetch(std::move(fills));
  }
}

void Engine::PutFinishedChunks(const Session& s) {
  if (!remote_ || !config_.cache || !s.shares_kv || !remote_->available() || !cache_->HasSession(s.id) ||
      cache_->acquired(s.id)) {
    return;
  }
  // The turn's KV is final: its full chunks go out now, not when they leave T0 (which a replica
  // killed with kill -9 never gets to). The engine thread only plans (O(chunks)) and hashes the
  // tokens; the transfer thread copies each block into the put queue, the remote tier's worker
  // sends it. Chunks already copied out are skipped, so a turn costs only its new chunks.
  const int end = std::min(cache_->kv_tokens(s.id), static_cast<int>(s.tokens.size())) / kBlockTokens * kBlockTokens;
  const std::vector<TransferOp> ops = cache_->PlanCopiesOut(s.id, end);
  if (ops.empty()) return;
  const std::vector<RemoteChunkId> ids = RemoteChunksOf(s.tokens, end / kBlockTokens);
  std::vector<std::optional<RemoteChunkId>> puts;
  for (const TransferOp& op : ops) puts.push_back(ids[op.chunk]);
  transfer_->Submit(ops, {}, puts);
}

void Engine::FlushToRemote() {
  if (!remote_ || !config_.cache) return;
  // Shutdown: nothing else runs, so T0 and T1 blocks can be read here. What a restart or another
  // replica would otherwise recompute goes out, within a bound (the queue waits at most ~2 s).
  const double deadline = Now() + 2.0;
  int offered = 0;
  for (const auto& [id, s] : sessions_) {
    if (!s.shares_kv || !cache_->HasSession(id)) continue;
    const int end = std::min(cache_->kv_tokens(id), static_cast<int>(s.tokens.size()));
    std::vector<CacheManager::RestingChunk> chunks = cache_->RestingFullChunks(id);
    if (chunks.empty()) continue;
    const std::vector<RemoteChunkId> ids = RemoteChunksOf(s.tokens, end / kBlockTokens);
    for (const auto& c : chunks) {
      if (c.chunk >= static_cast<int>(ids.size())) continue;
      KvStorage& from = c.tier == Tier::kT0 ? *t0_ : *t1_;
      offered += remote_->Offer(ids[c.chunk], from, c.block, std::max(0.0, deadline - Now())) == RemoteOffer::kQueued;
    }
  }
  remote_->Drain(std::max(0.1, deadline - Now()));
  if (offered > 0) spdlog::info("shutdown: {} KV chunks offered to the remote tier", offered);
}

void Engine::ExpireQueued(double now) {
  if (config_.max_queue_s <= 0) return;
  for (size_t i = 0; i < waiting_.size();) {
    Running& r = *waiting_[i];
    if (r.counted || now - r.submitted <= config_.max_queue_s) {  // resumed turns are not refused
      i++;
      continue;
    }
    r.result.error = MakeError(StatusCode::kResourceExhausted,
                               "the turn waited %.1f s for admission, past the bound of %.1f s", now - r.submitted,
                               config_.max_queue_s);
    r.result.queue_seconds = now - r.submitted;
    spdlog::info("session {}: {}", r.session->id, r.result.error.message);
    Finish(r, FinishReason::kError, now);
    waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(i));
  }
}

StepPlan Engine::Schedule(double now) {
  ExpireQueued(now);
  // Cancelled turns leave the queue before anything is planned for them.
  for (size_t i = 0; i < waiting_.size();) {
    if (waiting_[i]->handle->cancelled()) {
      Finish(*waiting_[i], FinishReason::kCancelled, now);
      waiting_.erase(waiting_.begin() + i);
    } else {
      i++;
    }
  }
  PlanRemoteFetches(now);  // their admission waits (kLater) until the fills are reported
  std::vector<RunningTurn> running;
  for (const auto& r : running_) {
    RunningTurn t;
    t.session = r->session->id;
    t.order = r->order;
    t.n_tokens = static_cast<int>(r->seq.size());
    t.decoding = r->decoding();
    t.pending = std::span<const int32_t>(r->queries).subspan(r->next_query);
    t.table = r->table;
    running.push_back(t);
  }
  std::vector<WaitingTurn> waiting;
  for (const auto& w : waiting_) {
    const Running& r = *w;
    waiting.push_back(WaitingTurn{r.session->id, static_cast<int>(r.seq.size()), r.session->composing > 0});
  }
  Copies copies(*this);
  StepPlan plan = ScheduleStep(*cache_, running, waiting,
                               ScheduleLimits{config_.max_batch_tokens, config_.max_running}, now, copies);

  // Apply: the plan's turns are running_ [0, R) and then its admissions; plan_turns_ maps them.
  plan_turns_.clear();
  for (const auto& r : running_) plan_turns_.push_back(r.get());
  uint64_t next_order = stats_.steps * 1000000 + running_.size();
  for (const PlannedAdmission& pa : plan.admitted) {
    Running& r = *waiting_[pa.waiting];
    r.admitted = true;
    r.order = next_order++;
    r.table = pa.table;
    r.queries = pa.queries;
    r.next_query = 0;
    r.n_recompute = pa.n_recompute;
    r.tail_unfed = false;
    r.result.recomputed_positions += pa.n_recompute;
    r.result.recomputed_pairs += pa.recompute_pairs;
    if (!r.counted) {
      r.counted = true;
      r.result.sources = pa.sources;
      r.result.prompt_tokens = r.prompt_len;
      r.result.queue_seconds = now - r.submitted;
      r.result.admitted = true;
      r.handle->MarkAdmitted();
    }
    stats_.sources.t0 += pa.sources.t0;
    stats_.sources.t1 += pa.sources.t1;
    stats_.sources.t2 += pa.sources.t2;
    stats_.sources.recomputed += pa.sources.recomputed;
    stats_.sources.fresh += pa.sources.fresh;
    stats_.sources.remote += pa.sources.remote;
    plan_turns_.push_back(&r);
  }
  transfer_group_ops_.insert(transfer_group_ops_.end(), plan.swap_ins.begin(), plan.swap_ins.end());
  for (int w : plan.refused) {
    Running& r = *waiting_[w];
    r.result.error = MakeError(StatusCode::kOutOfRange,
                               "the context of %zu tokens does not fit in the KV cache (%d tokens can be admitted)",
                               r.seq.size(), cache_->admission_blocks() * kBlockTokens);
    spdlog::info("session {}: turn refused: {}", r.session->id, r.result.error.message);
    Finish(r, r.result.tokens.empty() ? FinishReason::kError : FinishReason::kLength, now);
  }
  // The lists: admissions join the running ones, refusals leave, suspensions queue at the head.
  std::vector<bool> leaves(waiting_.size(), false);
  for (const PlannedAdmission& pa : plan.admitted) leaves[pa.waiting] = true;
  for (int w : plan.refused) leaves[w] = true;
  std::deque<std::unique_ptr<Running>> still_waiting;
  for (size_t i = 0; i < waiting_.size(); i++) {
    if (!leaves[i]) still_waiting.push_back(std::move(waiting_[i]));
  }
  for (const PlannedAdmission& pa : plan.admitted) running_.push_back(std::move(waiting_[pa.waiting]));
  for (int v : plan.suspended) {
    Suspend(*running_[v]);
    running_[v]->queued_at = now;
    still_waiting.push_front(std::move(running_[v]));
  }
  waiting_ = std::move(still_waiting);
  wait_.Pass(now, static_cast<int>(plan.admitted.size()), !waiting_.empty());
  running_.erase(std::remove(running_.begin(), running_.end(), nullptr), running_.end());

  // Queued sessions are about to be read (MarkQueued), every 50 ms at most.
  if (now - last_waiting_touch_ >= 0.05) {
    std::vector<SessionId> queue;
    for (const auto& w : waiting_) queue.push_back(w->session->id);
    MarkQueued(*cache_, queue, now);
    last_waiting_touch_ = now;
  }
  return plan;
}

void Engine::Calibrate(const StepSample& s) {
  cost_fit_->Add(s);
  const StepCostParams& p = cost_fit_->params();
  stats_.step_cost = p;
  stats_.step_cost_samples = cost_fit_->samples();
  stats_.step_cost_rel_rms = cost_fit_->rel_rms();
  // The policy gets the fit once it rests on a few dozen steps, and again whenever b/a (what
  // orders chunks) has moved by 25%: re-pricing every chunk at each step would make an index of
  // victims re-file everything per step for differences below the timing noise.
  // Nor does it get a fit that does not explain the steps: on a machine shared with other work a
  // step's wall time is mostly scheduling, and the fitted b/a then swung from 0 to 40,000 between
  // runs of one workload (relative RMS 0.4-1.3; docs/benchmarks.md §3c); the policy keeps the
  // model it has (the FLOP prior at first).
  constexpr int kMinSamples = 32;
  constexpr double kMove = 1.25, kMaxRelRms = 0.35;
  if (cost_fit_->samples() < kMinSamples || cost_fit_->rel_rms() > kMaxRelRms) return;
  const CostModel now = p.cost(), was = stats_.policy_cost;
  const double r_now = now.per_token_ctx / now.per_token, r_was = was.per_token_ctx / was.per_token;
  if (policy_calibrated_ && r_now <= r_was * kMove && r_now * kMove >= r_was) return;
  policy_calibrated_ = true;
  cache_->SetCostModel(now);
  stats_.policy_cost = now;
  spdlog::info("cost model calibrated from {} prefill steps: {:.2f} us per token, {:.3f} ns per attention pair "
               "(attention equals the linear layers at position {:.0f}), {:.0f} us per step, {:.1f} us per "
               "logits row; relative RMS {:.2f}",
               cost_fit_->samples(), p.per_token * 1e6, p.per_pair * 1e9,
               p.per_pair > 0 ? p.per_token / p.per_pair : 0.0, p.step * 1e6, p.per_row * 1e6, cost_fit_->rel_rms());
}

// The cache manager has demoted its KV (ScheduleStep); the turn goes back to the queue.
void Engine::Suspend(Running& r) {
  spdlog::info("session {}: turn suspended for memory after {} generated tokens ({} turns running, {} waiting)",
               r.session->id, r.result.tokens.size(), running_.size(), waiting_.size());
  r.admitted = false;
  r.table.clear();
  r.queries.clear();
  r.next_query = 0;
  r.result.suspensions++;
  stats_.suspensions++;
}

void Engine::RunBatch(const StepPlan& plan) {
  if (plan.seqs.empty()) return;
  Batch batch;
  std::vector<Running*> sampled;  // entries whose logits row is sampled, in row order
  std::vector<int32_t> toks;
  // The step's shape for the cost fit, and each entry's modelled cost (all of its tokens, and
  // those that recompute lost KV) to share the measured time by: a token at position p costs
  // a + b·(p + 1), a sampled row d more (cost_fit.h).
  const StepCostParams& cp = cost_fit_->params();
  StepSample shape;
  int prefill_tokens = 0;
  struct Share {
    Running* r;
    double recompute_cost;
  };
  std::vector<Share> shares;
  double step_cost = 0;
  for (const StepSeq& ps : plan.seqs) {
    Running& r = *plan_turns_[ps.turn];
    const int count = static_cast<int>(ps.positions.size());
    double recompute_cost = 0;
    r.table = ps.table;  // a decode's grows by a block at each chunk boundary
    toks.resize(count);
    const bool decode = r.decoding();
    for (int j = 0; j < count; j++) {
      const int32_t p = ps.positions[j];
      toks[j] = r.seq[p];
      const double c = cp.per_token + cp.per_pair * (p + 1);
      step_cost += c;
      shape.pairs += p + 1;
      if (!decode) {  // the plan feeds the turn's pending positions in order
        MNEMO_CHECK(r.next_query < r.queries.size() && r.queries[r.next_query] == p);
        if (r.next_query < r.n_recompute) recompute_cost += c;
        r.next_query++;
      }
    }
    int i = batch.Add(toks.data(), ps.positions.data(), count, false);
    batch.seqs[i].block_table = ps.table;
    batch.seqs[i].n_ctx = ps.positions.back() + 1;
    batch.seqs[i].logits = ps.sample;
    if (!decode) prefill_tokens += count;
    shape.tokens += count;
    if (ps.sample) {
      sampled.push_back(&r);
      shape.sampled++;
      step_cost += cp.per_row;
    }
    if (recompute_cost > 0) shares.push_back({&r, recompute_cost});
  }
  if (batch.seqs.empty()) return;

  for (const auto& r : running_) {  // eviction never touches what this batch reads
    if (r->admitted) MNEMO_CHECK(cache_->HoldsT0(r->session->id, r->table));
  }
  auto group = transfer_->SubmitSwapIns(transfer_group_ops_);
  transfer_group_ops_.clear();
  const double forward_start = Now();
  model_.Forward(batch, *t0_, logits_, [&](int l) { group->WaitLayer(l); });
  stats_.steps++;
  double forward_seconds = Now() - forward_start;
  if (group->n_ops() > 0) {
    group->WaitLayer(model_.config().n_layers - 1);
    stats_.swap_in_wait_seconds += group->waited_seconds();
    stats_.swap_in_copy_seconds += group->copy_seconds();
    forward_seconds = std::max(0.0, forward_seconds - group->waited_seconds());  // compute only
  }
  // Recompute time: the step's measured time shared by modelled cost (before this step updates
  // the fit). Added before sampling, since a turn that finishes below reports its result then.
  for (const Share& s : shares) {
    const double t = forward_seconds * s.recompute_cost / step_cost;
    s.r->result.recompute_seconds += t;
    stats_.recompute_seconds += t;
  }
  // Only steps that prefill at least a chunk's worth calibrate: smaller ones are bound by reading
  // the weights once (GEMV), a regime a recomputation never runs in.
  if (prefill_tokens >= kBlockTokens) {
    shape.seconds = forward_seconds;
    Calibrate(shape);
  }

  // Sample, stream, finish.
  const int vocab = model_.config().vocab_size;
  const double t = Now();
  for (size_t row = 0; row < sampled.size(); row++) {
    Running& r = *sampled[row];
    if (r.req.max_tokens == 0) {  // prefill only: the context's KV is computed and kept
      Finish(r, FinishReason::kLength, t);
      continue;
    }
    float* l = logits_.data() + row * vocab;
    const int generated = static_cast<int>(r.result.tokens.size());
    // Logprobs are of the row as the model gave it (over the tokenizer's ids, not padded rows):
    // scanned before the masks below edit it.
    if (r.req.logprobs >= 0) {
      ScanLogprobs(std::span<const float>(l, std::min(vocab, tok_.n_vocab())), r.req.logprobs, &r.logprob_scan);
    }
    if (r.req.ignore_eos || generated < r.req.min_tokens) {
      for (int32_t id : eog_tokens_) l[id] = -std::numeric_limits<float>::infinity();
    }
    if (generated < r.req.min_tokens) {
      for (int32_t id : r.req.stop_tokens) {
        if (id >= 0 && id < vocab) l[id] = -std::numeric_limits<float>::infinity();
      }
    }
    if (generated == 0 && r.req.capture_logits) r.result.first_logits.assign(l, l + vocab);
    std::span<const uint64_t> allowed;
    if (r.matcher) {
      // Tokens the turn may still generate, this one included: the grammar closes within them.
      const int budget = std::max(1, std::min(r.req.max_tokens - generated, max_context_ - static_cast<int>(r.seq.size())));
      const double g0 = Now();
      Status st = r.matcher->FillMask(budget, &r.mask);
      r.result.grammar_seconds += Now() - g0;
      if (!st.ok()) {
        r.result.error = st.error();
        spdlog::warn("session {}: grammar: {}", r.session->id, r.result.error.message);
        Finish(r, FinishReason::kError, t);
        continue;
      }
      if (r.matcher->final()) {  // the output is complete: only the end of generation can follow
        Finish(r, FinishReason::kStop, t);
        continue;
      }
      r.mask.resize((static_cast<size_t>(vocab) + 63) / 64, 0);  // padded vocab rows: refused
      allowed = r.mask;
    }
    const double s0 = Now();
    int32_t id = r.sampler->Sample(std::span<const float>(l, vocab), r.seq, allowed);
    r.result.sampling_seconds += Now() - s0;
    // A token masked above is drawn only when every token was (its logprob is then -inf).
    if (r.req.logprobs >= 0) r.logprobs = r.logprob_scan.For(id, l[id]);
    if (generated == 0) r.result.ttft_seconds = t - r.submitted;
    if (r.matcher) {
      // Sample draws only allowed tokens, so this cannot fail but for a state limit.
      const double g0 = Now();
      Status st = r.matcher->Accept(id);
      r.result.grammar_seconds += Now() - g0;
      if (!st.ok()) {
        r.result.error = st.error();
        spdlog::warn("session {}: grammar: {}", r.session->id, r.result.error.message);
        Finish(r, FinishReason::kError, t);
        continue;
      }
      if (r.matcher->done() && r.req.ignore_eos) {  // an end of generation closed the grammar
        r.result.tokens.push_back(id);
        if (r.logprobs) r.result.end_logprob = r.logprobs->chosen.logprob;
        r.logprobs.reset();
        Finish(r, FinishReason::kStop, t);
        continue;
      }
    }
    if (!EmitToken(r, id, t)) r.tail_unfed = true;
  }
  // Retire finished and cancelled turns.
  for (size_t i = 0; i < running_.size();) {
    Running& r = *running_[i];
    if (r.handle->cancelled() && r.result.finish_reason == FinishReason::kNone) Finish(r, FinishReason::kCancelled, t);
    if (r.result.finish_reason != FinishReason::kNone) {
      running_.erase(running_.begin() + i);
    } else {
      i++;
    }
  }
}

// Returns false when the turn goes on (the token is appended to seq, unfed).
bool Engine::EmitToken(Running& r, int32_t id, double now) {
  r.result.tokens.push_back(id);
  stats_.generated_tokens++;
  const bool stop_token = std::find(r.req.stop_tokens.begin(), r.req.stop_tokens.end(), id) != r.req.stop_tokens.end();
  if (stop_token || (!r.req.ignore_eos && tok_.IsEog(id))) {
    if (r.logprobs) r.result.end_logprob = r.logprobs->chosen.logprob;  // no kText reports it
    r.logprobs.reset();
    if (r.req.keep_stop_token) {
      r.seq.push_back(id);
      r.tail_unfed = true;
    }
    Finish(r, FinishReason::kStop, now);
    return true;
  }
  r.seq.push_back(id);
  r.tail_unfed = true;
  TurnEvent ev;
  ev.token = id;
  ev.logprobs = std::move(r.logprobs);
  r.logprobs.reset();
  // A call's control token (<|python_tag|>, [TOOL_CALLS]) shows no text: the stop matcher learns
  // of it here.
  if (r.req.call_start.control_token && tok_.IsControl(id)) r.stop->Lift();
  auto out = r.stop->Push(r.decoder->Push(id));
  ev.text = out.text;
  r.result.text += out.text;
  r.handle->Push(std::move(ev));
  if (out.stopped) {
    Finish(r, FinishReason::kStop, now);
  } else if (static_cast<int>(r.result.tokens.size()) >= r.req.max_tokens ||
             static_cast<int>(r.seq.size()) >= max_context_) {
    // A grammar that admits nothing more was closed by this very token: complete, not cut.
    Finish(r, r.matcher && r.matcher->final() ? FinishReason::kStop : FinishReason::kLength, now);
  }
  return false;
}

void Engine::Finish(Running& r, FinishReason reason, double now) {
  Session& s = *r.session;
  const bool keep = Completed(reason);
  if (keep && !r.stop->stopped()) {  // flush held-back text
    auto out = r.stop->Push(r.decoder->Flush());
    std::string tail = out.text + (out.stopped ? "" : r.stop->Flush());
    if (!tail.empty()) {
      r.result.text += tail;
      TurnEvent ev;
      ev.text = tail;
      r.handle->Push(std::move(ev));
    }
  }
  if (r.admitted) {
    int kv = r.kv_valid();
    if (!keep) kv = std::min(kv, static_cast<int>(s.tokens.size()));  // the turn is discarded
    if (!config_.cache) kv = 0;  // stateless mode: the next turn recomputes everything
    cache_->Release(s.id, kv, now);
    r.admitted = false;
  }
  r.result.log_begin = static_cast<int>(s.tokens.size());
  if (keep) {  // commit the turn to the raw token log
    Turn t{static_cast<int>(s.tokens.size()), r.prompt_len, static_cast<int>(r.seq.size())};
    r.result.log_append.assign(r.seq.begin() + t.begin, r.seq.end());
    s.tokens = r.seq;
    s.turns.push_back(t);
  }
  // A turn ended while not admitted may leave KV past the log: remote fills planned for its new
  // tokens (PlanFills), or the discarded tokens of a suspended turn. The log is what stays.
  if (!r.admitted && cache_->HasSession(s.id) && !cache_->acquired(s.id) &&
      cache_->kv_tokens(s.id) > static_cast<int>(s.tokens.size())) {
    cache_->Truncate(s.id, static_cast<int>(s.tokens.size()), now);
  }
  if (keep) PutFinishedChunks(s);
  s.busy = false;
  s.last_active = now;
  r.result.finish_reason = reason;
  r.result.total_seconds = now - r.submitted;
  if (r.result.prompt_tokens == 0) r.result.prompt_tokens = r.prompt_len;
  stats_.turns_done++;
  TurnEvent ev;
  ev.kind = TurnEvent::kDone;
  ev.result = r.result;
  r.handle->Push(std::move(ev));
}

void Engine::ExpireSessions(double now) {
  last_expiry_ = now;
  std::vector<std::pair<double, SessionId>> idle;
  for (const auto& [id, s] : sessions_) {
    if (!s.busy && !s.composing) idle.push_back({s.last_active, id});
  }
  std::sort(idle.begin(), idle.end());
  size_t over = config_.max_sessions > 0 && static_cast<int>(sessions_.size()) > config_.max_sessions
                    ? sessions_.size() - config_.max_sessions : 0;
  for (const auto& [last, id] : idle) {
    bool expired = config_.session_ttl_s > 0 && now - last > config_.session_ttl_s;
    if (!expired && over == 0) break;
    {
      // A turn Enqueue'd on it is on its way (its caller saw it live): it stays.
      std::lock_guard<std::mutex> lock(mu_);
      if (queued_.count(id)) continue;
      expired_.push_back(id);
      live_.erase(id);
    }
    spdlog::debug("session {} expired ({})", id, expired ? "idle past --session-ttl" : "over --max-sessions");
    cache_->RemoveSession(id);
    sessions_.erase(id);
    if (over > 0) over--;
  }
}

void Engine::FlushToDisk() {
  if (!t2_) return;
  PollTransfers();
  cache_->PlanFlushToDisk();
  SubmitTransfers();
  transfer_->WaitIdle();
  PollTransfers();
}

int Engine::RestoreFromDisk(Session& s) {
  if (!t2_) return 0;
  if (!disk_scanned_) {
    for (const auto& e : t2_->Scan()) disk_index_[e.id.session].push_back(e);
    disk_scanned_ = true;
  }
  auto it = disk_index_.find(s.id);
  if (it == disk_index_.end()) return 0;
  // Chunks whose KV matches the log's tokens; the session's KV then extends to the furthest one.
  std::vector<DiskTier::Entry> good;
  int kv = 0;
  for (const auto& e : it->second) {
    const int begin = e.id.chunk * kBlockTokens;
    if (e.id.valid_end <= begin || e.id.valid_end > std::min(begin + kBlockTokens, static_cast<int>(s.tokens.size()))) continue;
    if (TokenPrefixHash(s.tokens, e.id.valid_end) != e.id.token_hash) continue;
    good.push_back(e);
    kv = std::max(kv, e.id.valid_end);
  }
  std::sort(good.begin(), good.end(), [](const auto& a, const auto& b) { return a.id.chunk < b.id.chunk; });
  int last_chunk = -1, restored = 0;
  for (const auto& e : good) {
    const bool covers = e.id.valid_end == std::min((e.id.chunk + 1) * kBlockTokens, kv);
    if (!covers || e.id.chunk == last_chunk || !cache_->SlotFree(e.slot)) continue;
    cache_->RestoreChunk(s.id, e.id.chunk, Tier::kT2, e.slot, kv);
    last_chunk = e.id.chunk;
    restored++;
  }
  if (restored < static_cast<int>(it->second.size())) {  // stale or corrupt slots: those chunks are recomputed
    spdlog::debug("session {}: {} of {} disk-tier chunks restored; the others do not match the log", s.id, restored,
                  it->second.size());
  }
  disk_index_.erase(it);
  return restored;
}

}  // namespace mnemo
