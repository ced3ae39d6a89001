#include "engine/engine.h"

#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <future>

#include "base/log.h"
#include "engine/running.h"

namespace mnemo {

uint64_t TokenPrefixHash(const std::vector<int32_t>& tokens, int n) {
  return XXH3_64bits(tokens.data(), sizeof(int32_t) * size_t(n));
}

void TurnHandle::Push(TurnEvent ev) {
  std::shared_ptr<std::function<void()>> notify;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (ev.kind == TurnEvent::kDone) ended_ = true;
    events_.push_back(std::move(ev));
    notify = notify_;
  }
  cv_.notify_all();
  if (notify) (*notify)();
}

bool TurnHandle::TryNext(TurnEvent* ev) {
  std::lock_guard<std::mutex> lock(mu_);
  if (done_ || events_.empty()) return false;
  *ev = std::move(events_.front());
  events_.pop_front();
  if (ev->kind == TurnEvent::kDone) done_ = true;
  return true;
}

TurnHandle::Admission TurnHandle::AdmissionState() const {
  std::lock_guard<std::mutex> lock(mu_);
  return admitted_ ? Admission::kAdmitted : ended_ ? Admission::kEndedBefore : Admission::kWaiting;
}

void TurnHandle::SetNotify(std::function<void()> fn) {
  std::shared_ptr<std::function<void()>> now;
  {
    std::lock_guard<std::mutex> lock(mu_);
    notify_ = fn ? std::make_shared<std::function<void()>>(std::move(fn)) : nullptr;
    if (notify_ && (admitted_ || ended_ || !events_.empty())) now = notify_;
  }
  if (now) (*now)();
}

bool TurnHandle::Next(TurnEvent* ev) {
  std::unique_lock<std::mutex> lock(mu_);
  if (done_) return false;
  cv_.wait(lock, [&] { return !events_.empty(); });
  *ev = std::move(events_.front());
  events_.pop_front();
  if (ev->kind == TurnEvent::kDone) done_ = true;
  return true;
}

void TurnHandle::MarkAdmitted() {
  std::shared_ptr<std::function<void()>> notify;
  {
    std::lock_guard<std::mutex> lock(mu_);
    admitted_ = true;
    notify = notify_;
  }
  cv_.notify_all();
  if (notify) (*notify)();
}

bool TurnHandle::WaitAdmitted() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return admitted_ || ended_; });
  return admitted_;
}

void TurnHandle::Cancel() {
  std::lock_guard<std::mutex> lock(mu_);
  cancelled_ = true;
}

bool TurnHandle::cancelled() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cancelled_;
}

TurnResult TurnHandle::Wait() {
  TurnEvent ev;
  while (Next(&ev)) {
    if (ev.kind == TurnEvent::kDone) return ev.result;
  }
  return {};
}

Engine::Engine(Model& model, const Tokenizer& tokenizer, const EngineConfig& config)
    : model_(model), tok_(tokenizer), config_(config) {
  start_ = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double Engine::Now() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count() - start_;
}

Result<std::unique_ptr<Engine>> Engine::Create(Model& model, const Tokenizer& tokenizer,
                                               const EngineConfig& config) {
  std::unique_ptr<Engine> e(new Engine(model, tokenizer, config));
  const ModelConfig& mc = model.config();
  e->max_context_ = config.max_context > 0 ? std::min(config.max_context, mc.context_length) : mc.context_length;
  if (config.kv_dtype == DType::Q8_0) return MakeError("KV dtype q8_0 is not supported");
  const KvShape shape = model.kv_shape(config.kv_dtype);
  const double block_mb = shape.BlockBytes() / 1048576.0;
  auto blocks = [&](double mb) { return static_cast<int32_t>(mb / block_mb); };
  CacheConfig cc{blocks(config.t0_mb), blocks(config.t1_mb), 0, config.reserve_fraction};
  if (cc.t0_blocks < 2) return MakeError("--kv-t0-mb %.1f holds fewer than 2 blocks of %.3f MB", config.t0_mb, block_mb);
  if (config.reserve_fraction < 0 || config.reserve_fraction >= 1) return MakeError("the reserve must be in [0, 1)");
  CostModel cost;
  cost.per_token = 2.0 * (double(mc.dim) * (mc.n_heads + 2 * mc.n_kv_heads) * mc.head_dim +
                          double(mc.dim) * mc.n_heads * mc.head_dim + 3.0 * mc.dim * mc.ffn_dim) * mc.n_layers;
  cost.per_token_ctx = 4.0 * mc.n_heads * mc.head_dim * mc.n_layers;
  auto policy = MakeEvictionPolicy(config.policy, cost);
  if (!policy.ok()) return policy.error();
  // The calibration's prior: the FLOP counts above at an assumed 10 GFLOP/s, the classifier row
  // likewise, no fixed step cost. Only b/a orders chunks, and the first few dozen prefill steps
  // replace this guess by the machine's own figures (attention on a CPU runs well below the GEMMs'
  // FLOP rate, so the measured b/a is larger).
  constexpr double kAssumedFlops = 1e10;
  e->cost_fit_ = std::make_unique<StepCostFit>(StepCostParams{
      0, cost.per_token / kAssumedFlops, cost.per_token_ctx / kAssumedFlops,
      2.0 * mc.dim * double(mc.vocab_size) / kAssumedFlops});
  e->stats_.step_cost = e->cost_fit_->params();
  e->stats_.policy_cost = cost;
  if (config.t2_mb > 0) {
    if (config.disk_dir.empty()) return MakeError("a disk tier needs a directory (--kv-disk-dir)");
    cc.t2_blocks = blocks(config.t2_mb);
    bool discarded = false;
    auto disk = DiskTier::Open(config.disk_dir, std::max(cc.t2_blocks, 1), shape.BlockBytes(), config.kv_identity,
                               &discarded);
    if (!disk.ok()) return disk.error();
    if (discarded) {
      spdlog::warn("disk tier {}: made for another model, KV type or size; starting it empty", config.disk_dir);
    }
    e->t2_ = std::move(disk.value());
  }
  e->t0_ = std::make_unique<KvStorage>(shape, cc.t0_blocks);
  if (cc.t1_blocks > 0) e->t1_ = std::make_unique<KvStorage>(shape, cc.t1_blocks);
  e->cache_ = std::make_unique<CacheManager>(cc, std::move(policy.value()));
  if (!config.kv_remote.empty()) {
    RemoteTierConfig rc;
    rc.url = config.kv_remote;
    rc.ttl_s = config.kv_remote_ttl_s;
    auto remote = RemoteTier::Create(rc, RemoteKvSpace{config.kv_identity, config.kv_dtype, shape.BlockBytes()});
    if (!remote.ok()) return remote.error();
    e->remote_ = std::move(remote.value());
    e->remote_->SetListener([p = e.get()] {  // fills landed: wake the engine as finished copies do
      {
        std::lock_guard<std::mutex> lock(p->mu_);
        p->transfers_done_ = true;
      }
      p->cv_.notify_all();
    });
  }
  e->transfer_ = std::make_unique<TransferEngine>(e->t0_.get(), e->t1_.get(), e->t2_.get(), e->remote_.get());
  e->transfer_->SetListener([p = e.get()] {
    {
      std::lock_guard<std::mutex> lock(p->mu_);
      p->transfers_done_ = true;
    }
    p->cv_.notify_all();
  });
  if (config.transfer_hook) e->transfer_->SetCopyHook(config.transfer_hook);
  for (int32_t id = 0; id < tokenizer.n_vocab(); id++) {
    if (tokenizer.IsEog(id)) e->eog_tokens_.push_back(id);
  }
  e->stats_.block_bytes = shape.BlockBytes();
  for (int t = 0; t < 3; t++) e->stats_.capacity[t] = e->cache_->capacity(static_cast<Tier>(t));
  e->thread_ = std::thread([p = e.get()] { p->Loop(); });
  return e;
}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  transfer_.reset();  // its listener locks mu_: stop its thread while mu_ still exists
  remote_.reset();    // likewise; and its fills write into t0_/t1_, which outlive it
}

bool Engine::Call(const std::function<void()>& fn) {
  std::promise<void> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return false;  // the engine thread has exited: nobody would run fn
    commands_.push_back([&] {
      fn();
      done.set_value();
    });
    // Notified under the lock: the engine may run fn, answer and be destroyed (a caller racing the
    // destructor, as at shutdown) before a notify made after unlocking would touch cv_ (TSan saw it).
    cv_.notify_all();
  }
  done.get_future().wait();
  return true;
}

Error Engine::Stopped() { return MakeError(StatusCode::kUnavailable, "the engine is shutting down"); }

void Engine::Loop() {
  // Sleeps until there is something to do: a command (a new turn, a session verb), a finished tier
  // copy, or a runnable turn. A waiting turn (or composition) that a step could not admit while
  // copies are in flight sleeps until one lands: it never spins on Step() (each Acquire it would
  // make only records the room it wants; upkeep starts each copy once). Without copies in flight
  // upkeep frees blocks at once (drops), so the next step admits it. A composition copying its
  // rows sleeps until the transfer thread signals its task done. Housekeeping (session expiry)
  // wakes the loop once a second when configured.
  const bool housekeeping = config_.session_ttl_s > 0 || config_.max_sessions > 0;
  bool stuck = false;  // the last step ran nothing while turns waited
  for (;;) {
    std::deque<std::function<void()>> cmds;
    {
      std::unique_lock<std::mutex> lock(mu_);
      const bool blocked = stuck && cache_->transfers_in_flight();
      auto ready = [&] {
        return stop_ || !commands_.empty() || transfers_done_ || !running_.empty() ||
               ((!waiting_.empty() || CompositionWaitsForRoom()) && !blocked);
      };
      if (housekeeping) {
        cv_.wait_for(lock, std::chrono::seconds(1), ready);
      } else {
        cv_.wait(lock, ready);
      }
      transfers_done_ = false;
      if (stop_) break;
      cmds.swap(commands_);
    }
    for (auto& c : cmds) c();
    Step();
    stuck = running_.empty() && (!waiting_.empty() || CompositionWaitsForRoom());
  }
  // Shutdown. Verbs queued before closing still run (so every Call gets its answer), and before
  // the cancellations: a turn they submit, or a composition they queue, is then ended too instead
  // of being left waiting forever. Then the KV goes to disk for a restart.
  std::deque<std::function<void()>> last;
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;  // later Calls fail instead of queueing
    last.swap(commands_);
  }
  for (auto& c : last) c();
  double now = Now();
  for (auto& r : running_) Finish(*r, FinishReason::kCancelled, now);
  running_.clear();
  while (!waiting_.empty()) {
    Finish(*waiting_.front(), FinishReason::kCancelled, now);
    waiting_.pop_front();
  }
  AbortCompositions();
  FlushToDisk();
  FlushToRemote();
}

Result<std::optional<SessionId>> Engine::MintSessionId() {
  if (!id_source_) return std::optional<SessionId>();
  auto id = id_source_();
  if (!id.ok()) return id.error();
  return std::optional<SessionId>(*id);
}

SessionId Engine::CreateSession() {
  auto minted = MintSessionId();
  if (!minted.ok()) {
    spdlog::error("no id for a new session: {}", minted.error().message);
    return -1;
  }
  SessionId id = -1;
  Call([&] {
    id = minted->value_or(next_session_++);
    Session& s = sessions_[id];
    s.id = id;
    s.created = s.last_active = Now();
    cache_->AddSession(id, s.last_active);
    MarkLive(id, true);
  });
  return id;
}

Result<SessionId> Engine::NewSessionId() {
  auto minted = MintSessionId();
  if (!minted.ok()) return minted.error();
  if (minted->has_value()) return **minted;
  return next_session_++;
}

void Engine::RaiseNextSessionId(SessionId n) {
  SessionId cur = next_session_.load();
  while (cur < n && !next_session_.compare_exchange_weak(cur, n)) {
  }
}

void Engine::MarkLive(SessionId id, bool live) {
  std::lock_guard<std::mutex> lock(mu_);
  if (live) {
    live_.insert(id);
  } else {
    live_.erase(id);
  }
}

Status Engine::RestoreSession(SessionId id, std::vector<int32_t> tokens, std::vector<Turn> turns) {
  Status st = Stopped();
  Call([&] {
    st = Status::Ok();
    if (id <= 0) {
      st = MakeError(StatusCode::kInvalidArgument, "session ids must be positive, not %lld", static_cast<long long>(id));
      return;
    }
    if (sessions_.count(id)) {
      st = MakeError(StatusCode::kAlreadyExists, "session %lld already exists", static_cast<long long>(id));
      return;
    }
    Session& s = sessions_[id];
    s.id = id;
    s.tokens = std::move(tokens);
    s.turns = std::move(turns);
    s.created = s.last_active = Now();
    RaiseNextSessionId(id + 1);
    cache_->AddSession(id, s.last_active);
    MarkLive(id, true);
    // KV from a disk tier may be a composition's (approximate): such a session's KV is not shared.
    if (RestoreFromDisk(s) > 0) s.shares_kv = false;
    // Positions no disk chunk covers are rebuilt from the raw tokens (counted as recomputed).
    cache_->RestoreLength(id, std::max(0, static_cast<int>(s.tokens.size()) - 1));
  });
  return st;
}

Result<Session*> Engine::IdleSession(SessionId id) {
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return MakeError(StatusCode::kNotFound, "unknown session %lld", static_cast<long long>(id));
  if (it->second.busy || it->second.composing) {
    return MakeError(StatusCode::kFailedPrecondition, "session %lld has a turn in progress", static_cast<long long>(id));
  }
  return &it->second;
}

Status Engine::ExtendSession(SessionId id, std::span<const int32_t> tokens, std::vector<Turn> turns) {
  Status st = Stopped();
  Call([&] {
    auto idle = IdleSession(id);
    if (!idle.ok()) {
      st = idle.error();
      return;
    }
    st = Status::Ok();
    Session& s = **idle;
    int at = static_cast<int>(s.tokens.size());
    for (const Turn& t : turns) {
      if (t.begin != at || t.prompt_end < t.begin || t.end < t.prompt_end) break;
      at = t.end;
    }
    if (at != static_cast<int>(s.tokens.size() + tokens.size())) {
      st = MakeError(StatusCode::kInvalidArgument, "session %lld: the turns do not tile the %zu appended tokens",
                     static_cast<long long>(id), tokens.size());
      return;
    }
    // The cache manager's KV length stays: positions past it are computed by the next turn.
    s.tokens.insert(s.tokens.end(), tokens.begin(), tokens.end());
    s.turns.insert(s.turns.end(), turns.begin(), turns.end());
  });
  return st;
}

void Engine::SetNextSessionId(SessionId n) {
  RaiseNextSessionId(n);
}

Status Engine::DeleteSession(SessionId id) {
  Status st = Stopped();
  Call([&] {
    auto idle = IdleSession(id);
    st = idle.ok() ? Status::Ok() : Status(idle.error());
    if (idle.ok()) {
      cache_->RemoveSession(id);
      sessions_.erase(id);
      MarkLive(id, false);
    }
  });
  return st;
}

void Engine::DiscardSession(SessionId id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return;
  commands_.push_back([this, id] {
    auto it = sessions_.find(id);
    if (it == sessions_.end() || it->second.busy || it->second.composing) {
      spdlog::debug("session {}: not discarded ({})", id, it == sessions_.end() ? "unknown" : "busy");
      return;
    }
    cache_->RemoveSession(id);
    sessions_.erase(it);
    MarkLive(id, false);
  });
  cv_.notify_all();
}

Result<SessionId> Engine::ForkSession(SessionId id, int n_tokens, std::span<const int32_t> expect) {
  if (!expect.empty() && expect.size() != static_cast<size_t>(n_tokens)) {
    return MakeError(StatusCode::kInvalidArgument, "fork at %d expects %zu tokens", n_tokens, expect.size());
  }
  auto minted = MintSessionId();
  if (!minted.ok()) return minted.error();
  Result<SessionId> out = Stopped();
  Call([&] {
    auto it = sessions_.find(id);
    if (it == sessions_.end()) {
      out = MakeError(StatusCode::kNotFound, "unknown session %lld", static_cast<long long>(id));
      return;
    }
    // A turn queued or running on src is fine (src.busy): src.tokens is its committed log until
    // the turn ends, and the cache manager shares only the KV src had before the turn. A
    // composition reads src's KV on the transfer thread: nothing may take its blocks then.
    Session& src = it->second;
    if (src.composing) {
      out = MakeError(StatusCode::kFailedPrecondition, "session %lld has a turn in progress", static_cast<long long>(id));
      return;
    }
    if (n_tokens < 0 || n_tokens > static_cast<int>(src.tokens.size())) {
      out = MakeError(StatusCode::kInvalidArgument, "fork point %d is outside the session's %zu tokens", n_tokens, src.tokens.size());
      return;
    }
    if (!expect.empty() && !std::equal(expect.begin(), expect.end(), src.tokens.begin())) {
      out = MakeError(StatusCode::kFailedPrecondition, "session %lld's log changed before the fork point %d",
                      static_cast<long long>(id), n_tokens);
      return;
    }
    SessionId nid = minted->has_value() ? **minted : next_session_++;
    Session& dst = sessions_[nid];
    dst.id = nid;
    dst.shares_kv = src.shares_kv;
    MarkLive(nid, true);
    dst.tokens.assign(src.tokens.begin(), src.tokens.begin() + n_tokens);
    for (const Turn& t : src.turns) {
      if (t.end <= n_tokens) dst.turns.push_back(t);
    }
    dst.created = dst.last_active = Now();
    auto copy = cache_->Fork(id, nid, std::min(n_tokens, cache_->kv_tokens(id)), dst.last_active);
    if (copy) {  // the partial chunk's KV, copied layer by layer (nothing else touches these blocks)
      KvStorage* from = copy->src == Tier::kT0 ? t0_.get() : t1_.get();
      for (int l = 0; l < t0_->shape().n_layers; l++) {
        std::memcpy(t0_->block(l, copy->dst_block), from->block(l, copy->src_block), t0_->shape().LayerBlockBytes());
      }
    }
    out = nid;
  });
  return out;
}

Status Engine::TruncateSession(SessionId id, int n_tokens) {
  Status st = Stopped();
  Call([&] {
    auto idle = IdleSession(id);
    if (!idle.ok()) {
      st = idle.error();
      return;
    }
    st = Status::Ok();
    Session& s = **idle;
    if (n_tokens < 0 || n_tokens > static_cast<int>(s.tokens.size())) {
      st = MakeError(StatusCode::kInvalidArgument, "cannot truncate session %lld (%zu tokens) to %d tokens",
                     static_cast<long long>(id), s.tokens.size(), n_tokens);
      return;
    }
    s.tokens.resize(n_tokens);
    while (!s.turns.empty() && s.turns.back().begin >= n_tokens) s.turns.pop_back();
    if (!s.turns.empty() && s.turns.back().end > n_tokens) {
      s.turns.back().end = n_tokens;
      s.turns.back().prompt_end = std::min(s.turns.back().prompt_end, n_tokens);
    }
    cache_->Truncate(id, n_tokens);
  });
  return st;
}

namespace {
// with_log: copy the token log and turns (else only their counts).
SessionInfo Info(const Session& s, const CacheManager& cache, double now, bool with_log) {
  SessionInfo info;
  info.id = s.id;
  if (with_log) {
    info.tokens = s.tokens;
    info.turns = s.turns;
  }
  info.n_tokens = static_cast<int>(s.tokens.size());
  info.n_turns = static_cast<int>(s.turns.size());
  info.kv_tokens = cache.kv_tokens(s.id);
  for (Tier t : cache.Residency(s.id)) info.chunks_by_tier[static_cast<int>(t)]++;
  info.idle_seconds = now - s.last_active;
  info.busy = s.busy || s.composing > 0;  // a composition reading it holds it as a turn would
  return info;
}
}  // namespace

Result<SessionInfo> Engine::GetSession(SessionId id) {
  Result<SessionInfo> out = Stopped();
  Call([&] {
    auto it = sessions_.find(id);
    if (it == sessions_.end()) {
      out = MakeError(StatusCode::kNotFound, "unknown session %lld", static_cast<long long>(id));
    } else {
      out = Info(it->second, *cache_, Now(), /*with_log=*/true);
    }
  });
  return out;
}

bool Engine::HasSession(SessionId id) {
  std::lock_guard<std::mutex> lock(mu_);
  return live_.count(id) > 0;
}

std::vector<SessionId> Engine::TakeExpired() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<SessionId> out;
  out.swap(expired_);
  return out;
}

std::vector<SessionInfo> Engine::ListSessions(const std::vector<SessionId>& ids) {
  std::vector<SessionInfo> out;
  Call([&] {
    const double now = Now();
    for (SessionId id : ids) {
      auto it = sessions_.find(id);
      if (it != sessions_.end()) out.push_back(Info(it->second, *cache_, now, /*with_log=*/false));
    }
  });
  return out;
}

EngineStats Engine::Stats() {
  EngineStats st;
  Call([&] {
    st = stats_;
    st.waiting = static_cast<int>(waiting_.size());
    st.running = static_cast<int>(running_.size());
    st.sessions = static_cast<int>(sessions_.size());
    for (int t = 0; t < 3; t++) st.used_blocks[t] = cache_->used_blocks(static_cast<Tier>(t));
    st.cache = cache_->stats();
    st.transfer = transfer_->stats();
    st.remote_on = remote_ != nullptr;
    if (remote_) st.remote = remote_->stats();
  });
  return st;
}

Status Engine::CheckAdmission() const {
  return LoadAllows(static_cast<size_t>(std::max(wait_.waiting(), 0)), arriving_.load(std::memory_order_acquire));
}

Result<AdmissionTicket> Engine::ReserveAdmission() {
  const int others = arriving_.fetch_add(1, std::memory_order_acq_rel);
  AdmissionTicket ticket(&arriving_);  // releases the place on a refusal too
  MNEMO_TRY(LoadAllows(static_cast<size_t>(std::max(wait_.waiting(), 0)), others));
  return ticket;
}

QueueState Engine::Queue() const {
  QueueState q;
  q.waiting = wait_.waiting();
  q.estimated_wait_s = wait_.Estimate(Now(), arriving_.load(std::memory_order_acquire));
  q.drain_rate = wait_.drain_rate();
  q.max_queue_s = config_.max_queue_s;
  q.max_waiting = config_.max_waiting;
  return q;
}

void Engine::PublishQueue() {
  double oldest = -1;
  for (const auto& w : waiting_) oldest = oldest < 0 ? w->queued_at : std::min(oldest, w->queued_at);
  wait_.Publish(static_cast<int>(waiting_.size()), config_.max_running - static_cast<int>(running_.size()), oldest);
}

namespace {
// What Submit checks on the caller's thread.
Status CheckRequest(const TurnRequest& req, int n_vocab) {
  for (Status st : {req.sampling.Validate(), StopMatcher::Validate(req.stop)}) {
    if (!st.ok()) return Error{st.error().message, StatusCode::kInvalidArgument};
  }
  if (req.max_tokens < 0 || req.min_tokens < 0) {
    return MakeError(StatusCode::kInvalidArgument, "max_tokens and min_tokens must be >= 0");
  }
  if (req.logprobs < -1 || req.logprobs > kMaxTopLogprobs) {
    return MakeError(StatusCode::kInvalidArgument, "logprobs must be -1 (off) or in [0, %d]", kMaxTopLogprobs);
  }
  for (int32_t id : req.append) {
    if (id < 0 || id >= n_vocab) return MakeError(StatusCode::kInvalidArgument, "token id %d is outside the vocabulary", id);
  }
  return Status::Ok();
}
}  // namespace

Result<std::shared_ptr<TurnHandle>> Engine::Submit(TurnRequest req) {
  MNEMO_TRY(CheckRequest(req, tok_.n_vocab()));
  auto handle = std::make_shared<TurnHandle>();
  Status st = Stopped();
  const double submitted = Now();
  Call([&] { st = Admit(std::move(req), handle, submitted); });
  if (!st.ok()) return st.error();
  return handle;
}

Result<std::shared_ptr<TurnHandle>> Engine::Enqueue(TurnRequest req, bool new_session) {
  MNEMO_TRY(CheckRequest(req, tok_.n_vocab()));
  auto handle = std::make_shared<TurnHandle>();
  const double submitted = Now();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return Stopped();
    const SessionId id = req.session;
    if (!new_session) {
      if (!live_.count(id)) return MakeError(StatusCode::kNotFound, "unknown session %lld", static_cast<long long>(id));
      queued_[id]++;  // ExpireSessions leaves it alone until the command below ran
    }
    arriving_.fetch_add(1, std::memory_order_acq_rel);  // until the command queued it (or refused it)
    commands_.push_back([this, req = std::move(req), handle, new_session, submitted]() mutable {
      const SessionId id = req.session;
      if (!new_session) {
        std::lock_guard<std::mutex> lock(mu_);
        if (--queued_[id] == 0) queued_.erase(id);
      }
      Status st = Status::Ok();
      if (new_session) {
        // The load checks first: a refused turn leaves no session behind.
        st = LoadAllows(waiting_.size());
        if (st.ok() && sessions_.count(id)) {
          st = MakeError(StatusCode::kAlreadyExists, "session %lld already exists", static_cast<long long>(id));
        }
        if (st.ok()) {
          Session& s = sessions_[id];
          s.id = id;
          s.created = s.last_active = Now();
          cache_->AddSession(id, s.last_active);
          MarkLive(id, true);
        }
      }
      if (st.ok()) st = Admit(std::move(req), handle, submitted);  // publishes the queue with it
      arriving_.fetch_sub(1, std::memory_order_acq_rel);
      if (!st.ok()) {
        if (new_session && sessions_.count(id) && !sessions_.at(id).busy) {
          cache_->RemoveSession(id);
          sessions_.erase(id);
          MarkLive(id, false);
        }
        TurnEvent ev;
        ev.kind = TurnEvent::kDone;
        ev.result.finish_reason = FinishReason::kError;
        ev.result.error = st.error();
        ev.result.queue_seconds = Now() - submitted;
        ev.result.total_seconds = ev.result.queue_seconds;
        handle->Push(std::move(ev));
      }
    });
    cv_.notify_all();
  }
  return handle;
}

Status Engine::LoadAllows(size_t waiting, int arriving) const {
  // Arrivals the batch's free places take do not queue (wait_estimate.h).
  const size_t ahead = waiting + static_cast<size_t>(std::max(0, arriving - wait_.free_slots()));
  if (ahead >= static_cast<size_t>(std::max(config_.max_waiting, 0))) {
    return MakeError(StatusCode::kResourceExhausted, "the queue is full: %zu turns wait", ahead);
  }
  if (config_.max_queue_s > 0) {
    const double wait = wait_.Estimate(Now(), arriving);
    if (wait > config_.max_queue_s) {
      return MakeError(StatusCode::kResourceExhausted, "a turn would wait about %.1f s for admission (the bound is %.1f s)",
                       wait, config_.max_queue_s);
    }
  }
  return Status::Ok();
}

Status Engine::Admit(TurnRequest req, const std::shared_ptr<TurnHandle>& handle, double submitted) {
  // Load first: a refused turn costs nothing more. The queue here is exact (engine thread).
  MNEMO_TRY(LoadAllows(waiting_.size()));
  auto it = sessions_.find(req.session);
  if (it == sessions_.end()) {
    return MakeError(StatusCode::kNotFound, "unknown session %lld", static_cast<long long>(req.session));
  }
  Session& s = it->second;
  if (s.busy) {
    return MakeError(StatusCode::kFailedPrecondition, "session %lld already has a turn in progress", static_cast<long long>(s.id));
  }
  const size_t total = s.tokens.size() + req.append.size();
  if (total == 0) return MakeError(StatusCode::kInvalidArgument, "the turn has no tokens");
  if (total >= static_cast<size_t>(max_context_)) {
    return MakeError(StatusCode::kOutOfRange, "the context would hold %zu tokens; the maximum is %d", total, max_context_ - 1);
  }
  if (req.grammar && req.grammar->index().n_vocab() != tok_.n_vocab()) {
    return MakeError(StatusCode::kInvalidArgument, "the grammar was built for another vocabulary (%d tokens, not %d)",
                     req.grammar->index().n_vocab(), tok_.n_vocab());
  }
  auto r = std::make_unique<Running>();
  if (req.grammar) r->matcher.emplace(req.grammar);
  r->session = &s;
  r->seq = s.tokens;
  r->seq.insert(r->seq.end(), req.append.begin(), req.append.end());
  r->prompt_len = static_cast<int>(r->seq.size());
  r->sampler.emplace(req.sampling, model_.config().vocab_size);
  r->decoder.emplace(tok_, r->seq.back());
  r->stop.emplace(req.stop, req.call_start);
  r->req = std::move(req);
  r->handle = handle;
  r->submitted = r->queued_at = submitted;
  s.busy = true;
  waiting_.push_back(std::move(r));
  PublishQueue();
  return Status::Ok();
}

}  // namespace mnemo
