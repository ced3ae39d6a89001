#include "workload/policy_sim.h"

#include <algorithm>
#include <deque>
#include <limits>
#include <memory>
#include <queue>

namespace mnemo {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Copies between tiers on one FIFO channel, each taking a fixed time: what the transfer engine's
// background thread does, on the virtual clock.
class SimCopies final : public CopyWaiter {
 public:
  SimCopies(CacheManager& cm, double* now, double per_block, PolicySimResult* out)
      : cm_(cm), now_(now), per_block_(per_block), out_(out) {}

  // Queues the copies the cache manager planned, behind those in flight.
  void Submit() {
    for (const TransferOp& op : cm_.TakeTransfers()) {
      free_at_ = std::max(free_at_, *now_) + per_block_;
      queue_.push_back({op.id, free_at_});
    }
  }
  void Poll() override {
    while (!queue_.empty() && queue_.front().done <= *now_) {
      cm_.OnTransferDone(queue_.front().id, true);
      queue_.pop_front();
    }
  }
  // The step stalls until the last of `ops` has landed (and, FIFO, everything before it).
  void WaitFor(std::span<const uint64_t> ops) override {
    Submit();
    double until = *now_;
    for (const Pending& p : queue_) {
      if (std::find(ops.begin(), ops.end(), p.id) != ops.end()) until = std::max(until, p.done);
    }
    out_->copy_waits++;
    out_->copy_wait_s += until - *now_;
    *now_ = until;
    Poll();
  }
  double next_done() const { return queue_.empty() ? kInf : queue_.front().done; }

 private:
  struct Pending {
    uint64_t id;
    double done;
  };
  CacheManager& cm_;
  double* now_;
  double per_block_;
  PolicySimResult* out_;
  std::deque<Pending> queue_;
  double free_at_ = 0;
};

// A turn from its submission to its end.
struct SimRunning {
  int conv = 0, turn = 0;
  SessionId session = -1;
  int n_tokens = 0;                // sequence length: prompt + generated (the last one unfed)
  int output_target = 0;
  int generated = 0;
  bool admitted = false;
  uint64_t order = 0;
  std::vector<int32_t> table, queries;
  size_t next_query = 0, n_recompute = 0;
  SimTurn record;
  bool decoding() const { return admitted && next_query == queries.size(); }
};

// A user: its conversations, the one it is in, the time of its next message.
struct SimUser {
  std::vector<int> convs;
  size_t conv = 0;
  int turn = 0;
  double next_at = kInf;
};

// BOS and the system prompt (about a token a word).
int SystemTokens(const ConversationPlan& c) {
  return 1 + static_cast<int>(std::count(c.system_text.begin(), c.system_text.end(), ' ')) + !c.system_text.empty();
}

}  // namespace

int SimContextAfter(const ConversationPlan& c, int t, int turn_overhead_tokens) {
  int n = SystemTokens(c);
  for (int i = 0; i <= t && i < static_cast<int>(c.turns.size()); i++) {
    n += turn_overhead_tokens + c.turns[i].user_tokens + c.turns[i].output_tokens;
  }
  return n;
}

Result<PolicySimResult> SimulatePolicy(const PolicySimConfig& cfg, const std::vector<ConversationPlan>& convs) {
  const CostModel prices = cfg.policy_cost.per_token > 0 ? cfg.policy_cost : cfg.step.cost();
  auto policy = MakeEvictionPolicy(cfg.policy, prices);
  if (!policy.ok()) return policy.error();
  CacheManager cache(cfg.cache, std::move(*policy));
  PolicySimResult out;
  double now = 0;
  SimCopies copies(cache, &now, cfg.copy_block_s, &out);

  const int n_users = std::max(1, cfg.users);
  std::vector<SimUser> users(n_users);
  for (int c = 0; c < static_cast<int>(convs.size()); c++) users[c % n_users].convs.push_back(c);
  for (SimUser& u : users) {
    if (!u.convs.empty()) u.next_at = convs[u.convs[0]].turns.empty() ? kInf : convs[u.convs[0]].turns[0].think_s;
  }
  std::vector<int> context(convs.size(), 0);      // [conv] tokens in the session after its last turn
  std::vector<SessionId> session(convs.size(), -1);
  SessionId next_session = 1;

  std::deque<std::unique_ptr<SimRunning>> waiting;
  std::vector<std::unique_ptr<SimRunning>> running;
  uint64_t next_order = 0;
  double last_touch = -1;

  // The user's next message, after `think_s`, or its next conversation.
  auto advance_user = [&](SimUser& u, bool conversation_over) {
    const ConversationPlan* c = &convs[u.convs[u.conv]];
    u.turn++;
    if (conversation_over || u.turn >= static_cast<int>(c->turns.size())) {
      u.conv++;
      u.turn = 0;
      if (u.conv >= u.convs.size()) {
        u.next_at = kInf;
        return;
      }
      c = &convs[u.convs[u.conv]];
    }
    u.next_at = now + c->turns[u.turn].think_s;
  };
  auto user_of = [&](int conv) -> SimUser& { return users[conv % n_users]; };

  auto finish = [&](SimRunning& r, bool over) {
    out.turns.push_back(r.record);
    advance_user(user_of(r.conv), over);
  };

  int stalled = 0;
  while (true) {
    // Arrivals due now.
    double next_arrival = kInf;
    for (SimUser& u : users) {
      if (u.next_at <= now) {
        const int ci = u.convs[u.conv];
        const ConversationPlan& c = convs[ci];
        const TurnPlan& tp = c.turns[u.turn];
        if (session[ci] < 0) {
          session[ci] = next_session++;
          cache.AddSession(session[ci], now);
          context[ci] = SystemTokens(c);
        }
        auto r = std::make_unique<SimRunning>();
        r->conv = ci;
        r->turn = u.turn;
        r->session = session[ci];
        r->n_tokens = context[ci] + cfg.turn_overhead_tokens + tp.user_tokens;
        r->output_target = std::max(1, tp.output_tokens);
        r->record.conv = ci;
        r->record.turn = u.turn;
        r->record.submitted = now;
        r->record.prompt_tokens = r->n_tokens;
        u.next_at = kInf;  // until this turn ends
        if (r->n_tokens + r->output_target > cfg.max_context) {
          r->record.refused = true;
          out.refused++;
          finish(*r, true);
          continue;
        }
        waiting.push_back(std::move(r));
      }
      next_arrival = std::min(next_arrival, u.next_at);
    }

    if (running.empty() && waiting.empty()) {
      const double t = std::min(next_arrival, copies.next_done());
      if (t == kInf) break;
      now = std::max(now, t);
      copies.Poll();
      continue;
    }

    // One engine step: copies that landed, the plan, the forward pass, upkeep.
    copies.Poll();
    if (now - last_touch >= 0.05) {  // queued sessions are about to be read (as engine/step.cpp)
      std::vector<SessionId> queue;
      for (const auto& w : waiting) queue.push_back(w->session);
      MarkQueued(cache, queue, now);
      last_touch = now;
    }
    std::vector<RunningTurn> rv;
    for (const auto& r : running) {
      RunningTurn t;
      t.session = r->session;
      t.order = r->order;
      t.n_tokens = r->n_tokens;
      t.decoding = r->decoding();
      t.pending = std::span<const int32_t>(r->queries).subspan(r->next_query);
      t.table = r->table;
      rv.push_back(t);
    }
    std::vector<WaitingTurn> wv;
    for (const auto& w : waiting) wv.push_back(WaitingTurn{w->session, w->n_tokens, false});
    const double plan_at = now;
    StepPlan plan = ScheduleStep(cache, rv, wv, cfg.limits, now, copies);

    // Apply the plan as the engine does: admissions run, refusals end, suspensions queue first.
    std::vector<SimRunning*> turns;  // the plan's turn index -> turn
    for (const auto& r : running) turns.push_back(r.get());
    for (const PlannedAdmission& pa : plan.admitted) {
      SimRunning& r = *waiting[pa.waiting];
      r.admitted = true;
      r.order = next_order++;
      r.table = pa.table;
      r.queries = pa.queries;
      r.next_query = 0;
      r.n_recompute = pa.n_recompute;
      r.record.recomputed_positions += pa.n_recompute;
      out.recomputed_positions += pa.n_recompute;
      out.recomputed_pairs += pa.recompute_pairs;
      turns.push_back(&r);
    }
    std::vector<bool> leaves(waiting.size(), false);
    for (const PlannedAdmission& pa : plan.admitted) leaves[pa.waiting] = true;
    for (int w : plan.refused) {
      leaves[w] = true;
      waiting[w]->record.refused = true;
      out.refused++;
      finish(*waiting[w], true);
    }
    std::deque<std::unique_ptr<SimRunning>> still;
    for (size_t i = 0; i < waiting.size(); i++) {
      if (!leaves[i]) still.push_back(std::move(waiting[i]));
    }
    for (const PlannedAdmission& pa : plan.admitted) running.push_back(std::move(waiting[pa.waiting]));
    for (int v : plan.suspended) {
      SimRunning& r = *running[v];
      r.admitted = false;
      r.table.clear();
      r.queries.clear();
      r.next_query = 0;
      r.record.suspensions++;
      out.suspensions++;
      still.push_front(std::move(running[v]));
    }
    waiting = std::move(still);
    running.erase(std::remove(running.begin(), running.end(), nullptr), running.end());

    // The forward pass: modelled time; the swap-ins overlap it.
    StepSample shape;
    std::vector<SimRunning*> sampled;
    for (const StepSeq& ps : plan.seqs) {
      SimRunning& r = *turns[ps.turn];
      r.table = ps.table;
      const bool decode = r.decoding();
      for (int32_t p : ps.positions) {
        shape.pairs += p + 1;
        if (!decode) {
          if (r.next_query < r.n_recompute) {
            const double c = cfg.step.per_token + cfg.step.per_pair * (p + 1);
            r.record.recompute_s += c;
            out.recompute_s += c;
          }
          r.next_query++;
        }
      }
      shape.tokens += static_cast<int>(ps.positions.size());
      if (ps.sample) {
        shape.sampled++;
        sampled.push_back(&r);
      }
    }
    const bool progressed = !plan.seqs.empty() || !plan.admitted.empty() || !plan.suspended.empty() ||
                            !plan.refused.empty() || now > plan_at;
    if (!plan.seqs.empty()) {
      const double swap = static_cast<double>(plan.swap_ins.size()) * cfg.copy_block_s;
      now += std::max(cfg.step.Predict(shape), swap);
      out.steps++;
      out.swapped_in_blocks += static_cast<int64_t>(plan.swap_ins.size());
    }
    for (const TransferOp& op : plan.swap_ins) cache.OnTransferDone(op.id, true);
    for (SimRunning* r : sampled) {
      r->generated++;
      r->n_tokens++;  // the sampled token joins the sequence, unfed
      if (r->generated == 1 && r->record.ttft < 0) r->record.ttft = now - r->record.submitted;
      if (r->generated < r->output_target) continue;
      cache.Release(r->session, r->n_tokens - 1, now);
      context[r->conv] = r->n_tokens;
      r->admitted = false;
      finish(*r, false);
      r->session = -1;  // marks it done
    }
    running.erase(std::remove_if(running.begin(), running.end(), [](const auto& r) { return r->session < 0; }),
                  running.end());

    cache.Maintain(cache.capacity(Tier::kT0) - cache.admission_blocks(), now);
    copies.Submit();
    out.duration_s = now;

    if (plan.seqs.empty()) {
      // Nothing ran: wait for the next copy or arrival; with neither, the queue cannot move.
      const double t = std::min(next_arrival, copies.next_done());
      if (!progressed && t == kInf && ++stalled > 3) {
        return MakeError(StatusCode::kFailedPrecondition,
                         "policy simulation stalled: %zu turns waiting, %zu running, nothing in flight",
                         waiting.size(), running.size());
      }
      if (t != kInf) now = std::max(now, t);
    } else {
      stalled = 0;
    }
  }
  out.cache = cache.stats();
  if (!cache.CheckInvariants()) return MakeError(StatusCode::kInternal, "cache invariants broken after the run");
  return out;
}

}  // namespace mnemo
