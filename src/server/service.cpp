#include "server/service.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <tuple>

#include "base/log.h"
#include "server/turn_append.h"

namespace mnemo {
namespace {

size_t CommonPrefix(const std::vector<int32_t>& a, size_t a_len, const std::vector<int32_t>& b) {
  size_t n = std::min({a_len, a.size(), b.size()});
  size_t i = 0;
  while (i < n && a[i] == b[i]) i++;
  return i;
}

}  // namespace

void KeywordTables(const Tokenizer& tokenizer, std::vector<int32_t>* fold, std::vector<int8_t>* word_kind) {
  // Keyword relevance counts "My" and "my" as one word: each token maps to its lower-case twin.
  (*fold).resize(tokenizer.n_vocab());
  for (int32_t id = 0; id < tokenizer.n_vocab(); id++) {
    std::string lower = tokenizer.TokenText(id);
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    const int32_t twin = lower == tokenizer.TokenText(id) ? -1 : tokenizer.TokenId(lower);
    (*fold)[id] = twin >= 0 ? twin : id;
  }
  // Words for keyword relevance: a token whose text begins with a space marker (SPM U+2581, GPT-2
  // U+0120, or a space) starts one; punctuation and control tokens belong to none.
  (*word_kind).resize(tokenizer.n_vocab());
  for (int32_t id = 0; id < tokenizer.n_vocab(); id++) {
    const std::string& text = tokenizer.TokenText(id);
    std::string_view rest = text;
    bool starts = false;
    for (std::string_view marker : {std::string_view("\xe2\x96\x81"), std::string_view("\xc4\xa0"), std::string_view(" ")}) {
      if (rest.substr(0, marker.size()) == marker) {
        rest.remove_prefix(marker.size());
        starts = true;
        break;
      }
    }
    bool wordy = rest.empty();  // a bare marker starts the word the next tokens spell
    for (char c : rest) wordy = wordy || std::isalnum(static_cast<unsigned char>(c)) || (c & 0x80);
    if (tokenizer.IsByte(id) && text.size() == 6) {  // <0xXX>: ASCII punctuation and space separate
      const int byte = static_cast<int>(std::strtol(text.substr(3, 2).c_str(), nullptr, 16));
      wordy = byte >= 0x80 || std::isalnum(byte);
    }
    if (tokenizer.IsControl(id) || !wordy) {
      (*word_kind)[id] = -1;
    } else {
      (*word_kind)[id] = starts ? 1 : 0;
    }
  }
}

Result<std::unique_ptr<Service>> Service::Create(Engine& engine, const Tokenizer& tokenizer, ChatTemplate chat_template,
                                                 Store* store, const ServiceConfig& config) {
  std::unique_ptr<Service> s(new Service(engine, tokenizer, std::move(chat_template), store, config));
  KeywordTables(tokenizer, &s->fold_, &s->word_kind_);
  s->windows_ = config.render_windows && TemplateRendersWindows(s->template_);
  spdlog::info("chat template ({}): {}", s->template_.family(),
               s->windows_ ? "turns after a session's latest reply render from a window of the conversation"
                           : "every turn renders the whole conversation (the template is position-dependent)");
  if (store) {
    auto max_id = store->MaxSessionId();
    if (!max_id.ok()) return max_id.error();
    engine.SetNextSessionId(*max_id + 1);
    // Replicas sharing the store draw ids from it (a sequence), so theirs never collide.
    if (store->shared()) engine.SetSessionIdSource([store]() -> Result<SessionId> { return store->NewSessionId(); });
    if (config.token_identity != 0) {
      const auto identity = static_cast<int64_t>(config.token_identity);
      auto claim = store->ClaimTokenIdentity(identity);
      if (!claim.ok()) return claim.error();
      if (*claim == Store::IdentityClaim::kHeldByOther && store->shared()) {
        // Other replicas may be serving those sessions right now: never delete or rewrite them.
        return MakeError(StatusCode::kFailedPrecondition,
                         "the shared store %s holds sessions made with another vocabulary or chat template "
                         "(another model): a replica must serve the model of its store's sessions; give this "
                         "model its own database",
                         store->path().c_str());
      }
      if (*claim == Store::IdentityClaim::kHeldByOther) {  // one process restarted on another model
        auto n = store->DeleteAllSessions();
        if (!n.ok()) return n.error();
        spdlog::warn("the store's {} sessions were made with another vocabulary or chat template (another model): "
                     "deleted, not restored; their responses and conversations continue from their text",
                     *n);
        MNEMO_TRY(store->SetTokenIdentity(identity));
      }
    }
    if (store->shared()) {
      // Other replicas hold most of a shared store's sessions: each is loaded when a request names
      // it (SyncSession). Loading them all cost every replica the whole store at every start.
      spdlog::info("shared store: sessions load when a request names them");
      // And their commits are told: a copy held here goes stale or is dropped at once.
      Service* svc = s.get();
      store->Watch([svc](const SessionChange& c) { svc->OnStoreChange(c); });
      return s;
    }
    std::vector<int64_t> invalid;  // sessions holding ids outside the vocabulary (a damaged store)
    Status st = store->ForEachSession([&](StoredSession&& ss) -> Status {
      const int64_t id = ss.id;
      Status r = s->Adopt(std::move(ss));
      if (r.code() == StatusCode::kDataLoss) {
        invalid.push_back(id);
        return Status::Ok();
      }
      return r;
    });
    if (!st.ok()) return st.error();
    for (int64_t id : invalid) {
      spdlog::warn("stored session {} holds token ids outside the vocabulary: deleted", id);
      MNEMO_TRY(store->DeleteSession(id));
    }
    spdlog::info("restored {} sessions from the store", s->sessions_.size());
  }
  return s;
}

Service::~Service() {
  if (store_ && store_->shared()) store_->Watch(nullptr);  // no notice reaches this object once it returns
}

std::vector<Service::TurnMark> Service::MarksWithin(const Entry& e, size_t n, const std::string& text) {
  // One pass over the texts, then O(1) per mark (comparing each mark's prefix cost O(turns x text)).
  const size_t n_cmp = std::min(text.size(), e.text.size());
  const size_t same = static_cast<size_t>(
      std::mismatch(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(n_cmp), e.text.begin()).first - text.begin());
  std::vector<TurnMark> out;
  for (const TurnMark& m : e.marks) {  // nested prefixes: the first that fails ends the list
    if (m.end > n || m.text_end > same) break;
    out.push_back(m);
  }
  return out;
}

std::optional<Service::AppendPlan> Service::PlanAppend(const TurnSpec& spec, const std::string& text) {
  // The reply the request continues after, and the text before it (the prompt that produced it).
  const auto& msgs = spec.messages;
  int n_old = spec.hint.reply_message;
  if (n_old < 0) {
    for (int i = static_cast<int>(msgs.size()) - 1; i >= 0 && n_old < 0; --i) {
      if (msgs[i].role == "assistant") n_old = i;
    }
  }
  if (n_old <= 0 || n_old >= static_cast<int>(msgs.size()) || msgs[n_old].role != "assistant") return std::nullopt;
  auto a = template_.RenderAppend(msgs, static_cast<size_t>(n_old), /*add_generation_prompt=*/true,
                                  spec.template_extra.get());
  if (!a.ok()) return std::nullopt;  // not prefix-stable here: render whole
  const std::string after = a->text();
  if (after.size() > text.size() || text.compare(text.size() - after.size(), after.size(), after) != 0) return std::nullopt;
  const size_t prompt_size = text.size() - after.size();

  // The session and turn whose prompt rendered exactly as that text, and a snapshot of its reply.
  AppendPlan plan;
  bool can_continue = false;  // the turn is the session's latest: it may continue in place
  bool explicit_session = false;
  size_t prompt_end = 0;
  std::vector<int32_t> reply_tokens;
  int32_t prev = kNoToken;
  std::string reply_text;
  {
    std::lock_guard<std::mutex> lock(mu_);
    DropExpiredLocked();
    auto turn_of = [&](const Entry& e, int64_t end_token) -> const TurnMark* {
      for (size_t j = 0; j < e.marks.size(); ++j) {
        const TurnMark& m = e.marks[j];
        if ((end_token >= 0 && m.end != static_cast<size_t>(end_token)) || m.text_end != prompt_size) continue;
        if (m.end > e.tokens.size() || text.compare(0, prompt_size, e.text, 0, prompt_size) != 0) continue;
        return &m;
      }
      return nullptr;
    };
    int64_t best = -1;
    const TurnMark* mark = nullptr;
    auto hinted = sessions_.find(spec.hint.session);
    auto keyed = spec.hint.key.empty() ? keys_.end() : keys_.find(spec.owner + '\n' + spec.hint.key);
    if (spec.hint.session >= 0 && hinted != sessions_.end()) {
      const Entry& e = hinted->second;
      if (e.owner == spec.owner && UseOf(e) != PrefixIndex::Use::kNone && (mark = turn_of(e, spec.hint.end_token))) {
        best = hinted->first;
      }
    } else if (keyed != keys_.end()) {
      auto it = sessions_.find(keyed->second);
      if (it != sessions_.end() && !it->second.busy && (mark = turn_of(it->second, -1))) best = it->first;
      explicit_session = true;
    } else {
      // Sessions branching from one prompt (n > 1 choices, regenerated replies) differ in their
      // reply: the one whose reply is the client's, as its latest turn, is continued in place. A
      // session with a turn running can only be forked: an idle one is preferred.
      int best_rank = -1;
      for (const auto& [id, e] : sessions_) {
        if (e.owner != spec.owner || e.marks.empty() || UseOf(e) == PrefixIndex::Use::kNone) continue;
        const TurnMark* m = turn_of(e, -1);
        if (!m) continue;
        const bool latest = m == &e.marks.back() && e.tokens.size() == m->end;
        const int rank = (m->reply == msgs[n_old].content ? 4 : 0) + (latest && !e.busy ? 2 : 0) + (e.busy ? 0 : 1);
        if (rank > best_rank) {
          best = id;
          mark = m;
          best_rank = rank;
        }
        if (rank == 7) break;
      }
    }
    if (best < 0) return std::nullopt;
    const Entry& e = sessions_.at(best);
    plan.source = best;
    plan.version = e.version;
    plan.cuts = e.cuts;
    can_continue = !e.busy && mark == &e.marks.back() && e.tokens.size() == mark->end;
    prompt_end = mark->prompt_end;
    if (prompt_end == 0) return std::nullopt;
    reply_tokens.assign(e.tokens.begin() + static_cast<std::ptrdiff_t>(prompt_end),
                        e.tokens.begin() + static_cast<std::ptrdiff_t>(mark->end));
    prev = e.tokens[prompt_end - 1];
    reply_text = mark->reply;
  }

  // Keep the reply's tokens as far as they stand for the client's reply; tokenize the rest.
  auto turn = AppendAfterReply(tok_, std::string_view(text).substr(0, prompt_size), prev,
                               reply_tokens, reply_text, *a);
  if (!turn) return std::nullopt;
  plan.cut = prompt_end + turn->keep;
  // A reply the client edited keeps the original branch (fork), unless the client named the session.
  plan.in_place = explicit_session || (can_continue && turn->match.kind != ReplyMatch::Kind::kEdited);
  plan.append = std::move(turn->tokens);
  return plan;
}

ApiResult<StartedTurn> Service::StartRendered(TurnSpec spec, int64_t synced, int depth,
                                              std::shared_ptr<TurnLock> lock) {
  auto rendered = RenderText(spec);
  if (auto* err = std::get_if<ApiError>(&rendered)) return *err;
  const std::string text = std::move(std::get<std::string>(rendered));
  auto too_long = [&](size_t tokens, const char* at_least) {
    return ApiError{400, "invalid_request_error",
                    "the context has " + std::string(at_least) + std::to_string(tokens) +
                        " tokens; this model's maximum context is " + std::to_string(engine_.max_context() - 1) +
                        " tokens",
                    spec.prompt ? "prompt" : "messages", "context_length_exceeded"};
  };
  // Refused before tokenizing when even the fewest tokens this text can make do not fit: a 7 MB
  // prompt took a worker 5 s to tokenize only to be refused, and each left ~26 MB in that worker's
  // malloc arena (RSS 30 -> 264 MB over 12 of them; issue 13). Any tokens that render to the text
  // (its fresh encoding, or the session's tokens plus the appended ones) number at least this many.
  if (const size_t at_least = text.size() / tok_.max_token_bytes();
      static_cast<int64_t>(at_least) >= engine_.max_context())
    return too_long(at_least, "at least ");
  std::optional<AppendPlan> ap;
  if (!spec.prompt) ap = PlanAppend(spec, text);

  // Choose the session under the lock, and mark it busy so no other turn picks it.
  enum class Plan { kNew, kContinue, kFork, kTruncate } plan = Plan::kNew;
  int64_t target = -1;
  size_t lcp = 0;
  std::vector<int32_t> tokens;  // the turn's whole context
  for (;;) {
    if (!ap && tokens.empty()) tokens = Encode(spec, text);  // the whole rendering, outside the lock
    const size_t context = ap ? ap->cut + ap->append.size() : tokens.size();
    if (static_cast<int64_t>(context) >= engine_.max_context()) return too_long(context, "");
    std::lock_guard<std::mutex> lock(mu_);
    DropExpiredLocked();
    if (ap) {  // append to the session holding the history, if it is still as planned
      auto it = sessions_.find(ap->source);
      // Idle, the source must be as planned. With a turn running on it (started since the plan,
      // perhaps), it can only be forked, which needs only its log up to the cut as planned (no
      // cut since; its turn appends only when it ends), and not when the client named it (a
      // named session is rewritten in place).
      const bool usable =
          it != sessions_.end() &&
          (!it->second.busy ? it->second.version == ap->version
                            : spec.hint.key.empty() && UseOf(it->second) == PrefixIndex::Use::kFork &&
                                  it->second.cuts == ap->cuts && ap->cut <= it->second.tokens.size());
      if (!usable) {
        ap.reset();
        continue;
      }
      const Entry& e = it->second;
      target = ap->source;
      lcp = ap->cut;
      plan = !ap->in_place || e.busy ? Plan::kFork : lcp == e.tokens.size() ? Plan::kContinue : Plan::kTruncate;
      tokens.assign(e.tokens.begin(), e.tokens.begin() + static_cast<std::ptrdiff_t>(lcp));
      tokens.insert(tokens.end(), ap->append.begin(), ap->append.end());
    } else {  // the session sharing the longest token prefix
      auto consider = [&](int64_t id, size_t limit) {
        Entry& e = sessions_.at(id);
        size_t n = CommonPrefix(e.tokens, limit, tokens);
        return n;
      };
      const std::string key = spec.owner + '\n' + spec.hint.key;
      auto kit = spec.hint.key.empty() ? keys_.end() : keys_.find(key);
      if (spec.hint.session >= 0 && sessions_.count(spec.hint.session) &&
          sessions_.at(spec.hint.session).owner == spec.owner && !sessions_.at(spec.hint.session).busy) {
        target = spec.hint.session;
        Entry& e = sessions_.at(target);
        size_t limit = spec.hint.end_token >= 0 ? static_cast<size_t>(spec.hint.end_token) : e.tokens.size();
        lcp = consider(target, limit);
        plan = lcp == e.tokens.size()                                       ? Plan::kContinue
               : lcp >= size_t(config_.min_reuse_tokens) && Forkable(e) ? Plan::kFork
                                                                            : Plan::kNew;
      } else if (kit != keys_.end() && sessions_.count(kit->second)) {
        target = kit->second;
        Entry& e = sessions_.at(target);
        if (e.busy) {
          return ApiError{409, "invalid_request_error", "session '" + spec.hint.key + "' has a turn in progress", "",
                          "session_busy"};
        }
        lcp = consider(target, e.tokens.size());
        plan = lcp == e.tokens.size() ? Plan::kContinue : Plan::kTruncate;  // an explicit session is rewritten
      } else {
        std::tie(target, lcp) = BestSessionLocked(spec.owner, tokens);
        // A session with a turn running may share more (the same conversation continued by
        // concurrent requests): what it committed is forked.
        if (auto [busy, n] = index_.BestFork(spec.owner, tokens); n > lcp) std::tie(target, lcp) = std::tie(busy, n);
        if (target >= 0) {
          const Entry& e = sessions_.at(target);
          plan = !e.busy && lcp == e.tokens.size() && lcp > 0                 ? Plan::kContinue
                 : lcp >= size_t(config_.min_reuse_tokens) && Forkable(e) ? Plan::kFork
                                                                            : Plan::kNew;
        }
      }
    }
    if (plan == Plan::kNew) lcp = 0;
    if (plan == Plan::kContinue || plan == Plan::kTruncate) {
      Entry& e = sessions_.at(target);
      e.busy = true;
      index_.SetUse(target, UseOf(e));
    }
    break;
  }
  // On a shared store, a history that no session held here continues (a failover, a replica that
  // never saw the conversation) may continue one another replica stored: the store's prefix index
  // names it, it is loaded, and the plan is made again with it (once).
  if (Probes() && !ap && plan != Plan::kContinue && depth == 0 && synced < 0 && spec.hint.session < 0 &&
      spec.hint.key.empty()) {
    if (const int64_t found = FindStored(spec.owner, tokens, lcp); found > 0) {
      const Sync s = SyncSession(found, spec.owner, /*load=*/true);
      if (s == Sync::kLoaded || s == Sync::kDelta || s == Sync::kRebuilt) {
        return StartRendered(std::move(spec), found, depth + 1, std::move(lock));
      }
    }
  }
  // On a shared store, another replica may be running a turn on the session this turn continues:
  // its turn lock is taken before the probe, waiting for that turn to commit (the probe then finds
  // the session moved, and the plan is made again on what the store holds). A fork needs none:
  // it stores a new session.
  bool waited = false;
  if ((plan == Plan::kContinue || plan == Plan::kTruncate) && Probes() && (!lock || lock->id() != target)) {
    bool stored = false;
    {
      std::lock_guard<std::mutex> guard(mu_);
      auto it = sessions_.find(target);
      stored = it != sessions_.end() && it->second.stored;
    }
    if (stored) {
      auto l = LockTurn(target, &waited);
      if (!l.ok()) {
        std::lock_guard<std::mutex> guard(mu_);
        ReleaseLocked(target);
        return ToApiError(l.error());
      }
      lock = std::move(*l);
    }
  }
  // On a shared store, the session found here may have moved on another replica: one probe, and a
  // stale copy is brought in step and the plan made again (at most twice: then the turn goes on,
  // and a commit on a copy that moved again loses the compare-and-set).
  if (plan != Plan::kNew && (target != synced || waited) && depth < 2 && !FreshInStore(target)) {
    bool busy_elsewhere = false;  // a fork's source may have a turn running here
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = sessions_.find(target);
      if (it != sessions_.end() && plan != Plan::kFork) {
        it->second.busy = false;
        IndexLocked(target, it->second.tokens.size());
      } else if (it != sessions_.end()) {
        busy_elsewhere = it->second.busy;
      }
    }
    if (!busy_elsewhere) {
      SyncSession(target, spec.owner, /*load=*/false);
      return StartRendered(std::move(spec), target, depth + 1, std::move(lock));
    }
    // Its running turn's commit will find the store moved: start afresh rather than fork a prefix
    // the store may no longer hold.
    plan = Plan::kNew;
    target = -1;
    lcp = 0;
  }

  StartedTurn st;
  st.prompt_tokens = static_cast<int>(tokens.size());
  if (!spec.prompt && !spec.template_extra) st.window = std::make_shared<const TurnWindow>(WindowOfPrompt(spec.messages));
  st.chain = spec.chain;
  st.instructions = spec.instructions;
  // The engine may expire the chosen session (session TTL, max sessions) before the calls below
  // reach it: the turn then starts a new session with its whole context.
  auto gone = [&](int64_t s) { return !engine_.HasSession(s); };
  auto start_afresh = [&](int64_t s) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ForgetLocked(s);
    }
    plan = Plan::kNew;
    target = -1;
    lcp = 0;
    st.fork_of.reset();
    st.fork_at = 0;
    st.truncated_to.reset();
  };
  int64_t id = -1;
  if (plan == Plan::kFork) {
    // tokens[0, lcp) is the source's log as planned: the engine refuses the fork if it changed
    // since (cut, then regrown by a turn that ended meanwhile).
    auto f = engine_.ForkSession(target, static_cast<int>(lcp), std::span<const int32_t>(tokens).first(lcp));
    if (f.ok()) {
      id = *f;
      st.fork_of = target;
      st.fork_at = static_cast<int64_t>(lcp);
    } else if (gone(target)) {
      start_afresh(target);
    } else {
      spdlog::info("session {}: not forked at {} ({}); the turn starts a new session", target, lcp, f.error().message);
      plan = Plan::kNew;  // its log changed, or a composition reads it: start afresh
      lcp = 0;
    }
  }
  if (plan == Plan::kTruncate) {
    Status t = engine_.TruncateSession(target, static_cast<int>(lcp));
    if (t.ok()) {
      st.truncated_to = static_cast<int64_t>(lcp);
    } else if (gone(target)) {
      start_afresh(target);
    } else {
      std::lock_guard<std::mutex> lock(mu_);
      ReleaseLocked(target);
      return ToApiError(t.error());
    }
  }
  for (int attempt = 0;; attempt++) {
    if (plan == Plan::kNew) {
      // Made by the turn's own engine command (Enqueue): no wait for the engine here.
      auto nid = engine_.NewSessionId();
      if (!nid.ok()) {
        spdlog::error("no id for a new session: {}", nid.error().message);
        return ToApiError(MakeError(StatusCode::kUnavailable, "no session can be created now"));
      }
      id = *nid;
      st.new_session = true;
    }
    if (plan == Plan::kContinue || plan == Plan::kTruncate) id = target;
    {
      std::lock_guard<std::mutex> lock(mu_);
      // The turn's rendering (unknown for a raw prompt), and the earlier turns whose text stays
      // valid: the source's (fork) or its own, within the kept log.
      std::string new_text = spec.prompt ? std::string() : text;
      std::vector<TurnMark> marks;
      if (target >= 0 && plan != Plan::kNew && sessions_.count(target)) marks = MarksWithin(sessions_.at(target), lcp, new_text);
      Entry& e = sessions_[id];
      UnlinkLocked(id, e);  // its latest turn changes
      e.owner = spec.owner;
      e.busy = true;
      e.version++;
      const size_t kept = plan == Plan::kContinue ? e.tokens.size() : std::min(lcp, e.tokens.size());
      if (plan == Plan::kTruncate) e.cuts++;
      if (plan != Plan::kContinue) e.tokens.assign(tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(lcp));
      IndexLocked(id, kept);
      if (plan == Plan::kTruncate) e.store_truncate = std::min<int64_t>(e.store_truncate.value_or(lcp), lcp);
      e.marks = std::move(marks);
      e.text = std::move(new_text);
      if (!spec.hint.key.empty()) {
        keys_[spec.owner + '\n' + spec.hint.key] = id;
        e.key = spec.hint.key;
      }
    }
    st.session = id;
    spec.request.session = id;
    spec.request.append.assign(tokens.begin() + static_cast<std::ptrdiff_t>(lcp), tokens.end());
    spec.request.keep_stop_token = true;  // templates close an assistant turn with the model's EOG token
    // Queued without waiting for the engine: a refusal for load (or anything else the engine
    // thread decides) arrives as the turn's kDone before admission, and Commit discards it.
    auto h = engine_.Enqueue(spec.request, plan == Plan::kNew);
    if (h.ok()) {
      st.handle = *h;
      // Held until the commit; a lock for a session the turn no longer continues goes with `lock`.
      if (lock && lock->id() == id && (plan == Plan::kContinue || plan == Plan::kTruncate)) st.lock = lock;
      return st;
    }
    if (attempt == 0 && plan != Plan::kNew && h.error().code == StatusCode::kNotFound) {  // expired meanwhile
      start_afresh(id);
      continue;
    }
    const Error& err = h.error();
    if (st.new_session) {  // never reached the engine
      std::lock_guard<std::mutex> lock(mu_);
      ForgetLocked(id);
    } else if (st.fork_of) {
      // The session was made for this turn and the store has never seen it: forget it, here and
      // in the engine. Left idle in the mirror, a later request sharing its prefix continued it as
      // a stored session and its commit failed ("unknown session", issue 13: refused turns under
      // overload left such forks behind).
      {
        std::lock_guard<std::mutex> lock(mu_);
        ForgetLocked(id);
      }
      engine_.DiscardSession(id);
    } else {
      std::lock_guard<std::mutex> lock(mu_);
      ReleaseLocked(id);
    }
    return ToApiError(err, err.code == StatusCode::kResourceExhausted ? "the server is busy: " : "");
  }
}

ApiResult<std::vector<std::string>> Service::Commit(const StartedTurn& t, const TurnResult& r,
                                                    std::optional<StoredResponse> response,
                                                    std::optional<ConversationUpdate> conversation,
                                                    const std::string& owner, std::optional<StoredRequest> request) {
  // The session's turn lock goes once this commit is stored or refused (every return below), but
  // a prompt stored for n > 1 choices hands it on to them (StartChoices): choice 0 appends to
  // the session, and another replica's turn between the two commits would make it lose the
  // compare-and-set after all its work.
  struct Unlock {
    const std::shared_ptr<TurnLock>& lock;
    bool hand_on = false;
    ~Unlock() {
      if (lock && !hand_on) lock->Release();
    }
  } unlock{t.lock};
  const bool keep = Completed(r.finish_reason);
  std::vector<std::string> item_ids;
  std::vector<int32_t> unstored;  // a composed session's tokens that the store has not seen
  std::optional<int64_t> store_truncate;  // an earlier cut of the log that the store has not seen
  std::optional<SessionVersion> expected;  // the stored log this copy continues (shared stores)
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sessions_.find(t.session);
    if (it != sessions_.end()) {
      unstored = it->second.unstored_prefix;
      store_truncate = it->second.store_truncate;
      if (it->second.stored && !t.new_session && !t.fork_of) {
        expected = SessionVersion{it->second.store_length, it->second.store_cuts};
      }
    }
  }
  const bool nothing_new = t.prefill && r.log_append.empty() && unstored.empty();
  const std::string response_id = response ? response->id : std::string();
  std::vector<int32_t> commit_tokens;
  if (keep && store_) {
    if (t.fork_of) {
      Status f = store_->ForkSession(*t.fork_of, t.session, t.fork_at, owner);
      if (!f.ok()) {
        spdlog::error("session {}: storing the fork of session {} failed: {}", t.session, *t.fork_of, f.error().message);
        return StoreError(f.error(), "could not store the turn: ");
      }
    }
    // A prompt that was all in the log already (n > 1 choices after a fork at its end) has no
    // tokens to store: the fork above is all; an earlier cut of the log waits for the next commit.
    if (!nothing_new) {
      TurnCommit c;
      c.session_id = t.session;
      c.create_session = t.new_session || !unstored.empty();
      c.owner = owner;
      if (!c.create_session && !t.fork_of) c.truncate_to = store_truncate;
      c.begin = r.log_begin;
      c.prompt_end = t.prompt_tokens;
      c.tokens = r.log_append;
      if (!unstored.empty()) {  // the composed context becomes part of the session's first stored turn
        commit_tokens = unstored;
        commit_tokens.insert(commit_tokens.end(), r.log_append.begin(), r.log_append.end());
        c.begin = 0;
        c.tokens = commit_tokens;
      }
      c.complete = true;
      // On a shared store another replica may have moved the session since this copy was read:
      // the commit then fails (kAborted) instead of appending to, or cutting, a log it never saw.
      if (!c.create_session && !t.fork_of && expected && store_->shared()) {
        c.expected_length = expected->n_tokens;
        c.expected_cuts = expected->cuts;
      }
      c.response = std::move(response);
      c.conversation = std::move(conversation);
      const bool recorded = request.has_value();
      c.request = std::move(request);
      auto ids = store_->CommitTurn(c);
      if (!ids.ok()) {
        // The engine's log now holds a turn the store does not (and after a lost compare-and-set,
        // the store holds turns this copy lacks): forget the local copy, so the next turn of the
        // conversation rebuilds it from the stored text instead of appending to a diverged log.
        if (recorded && ids.error().code == StatusCode::kAlreadyExists) {
          spdlog::info("session {}: not storing a turn: {}; dropping the local copy", t.session, ids.error().message);
        } else {
          spdlog::error("session {}: storing a turn failed ({}): {}; dropping the local copy", t.session,
                        StatusCodeName(ids.error().code), ids.error().message);
        }
        {
          std::lock_guard<std::mutex> lock(mu_);
          ForgetLocked(t.session);
        }
        Status d = engine_.DeleteSession(t.session);
        if (!d.ok()) spdlog::warn("session {}: dropping the local copy failed: {}", t.session, d.error().message);
        return StoreError(ids.error(), "could not store the turn: ");
      }
      item_ids = std::move(ids.value());
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  Entry& e = sessions_[t.session];
  e.busy = keep && t.prefill;  // a prompt computed for n choices stays reserved for them (StartChoices)
  unlock.hand_on = keep && t.prefill;
  if (keep) e.unstored_prefix.clear();
  if (keep && store_) e.stored = true;  // the commit above stored it (or its fork)
  if (keep && store_ && !nothing_new) e.stale = false;
  if (keep && store_ && !nothing_new) {  // the stored log is now this copy's
    const bool created = t.new_session || t.fork_of || !unstored.empty();
    const int64_t before = expected ? expected->n_tokens : 0;
    const bool cut = !created && store_truncate && *store_truncate < before;
    e.store_cuts = created ? 0 : (expected ? expected->cuts : 0) + (cut ? 1 : 0);
    e.store_length = static_cast<int64_t>(r.log_begin + r.log_append.size());
    if (!unstored.empty()) e.store_length = static_cast<int64_t>(unstored.size() + r.log_append.size());
  } else if (keep && store_ && t.fork_of) {  // the fork alone was stored
    e.store_cuts = 0;
    e.store_length = t.fork_at;
  }
  const size_t kept = keep ? std::min(e.tokens.size(), static_cast<size_t>(r.log_begin)) : e.tokens.size();
  if (keep) {
    if (!nothing_new) e.store_truncate.reset();
    e.version++;
    if (static_cast<size_t>(r.log_begin) < e.tokens.size()) e.cuts++;
    e.tokens.resize(r.log_begin);
    e.tokens.insert(e.tokens.end(), r.log_append.begin(), r.log_append.end());
    UnlinkLocked(t.session, e);
    // A templated turn: remember where its reply is (also when the whole prompt was already in the
    // log, e.g. a fork at the end of an identical prompt: log_begin == prompt_tokens).
    if (!t.prefill && !e.text.empty() && t.prompt_tokens >= r.log_begin && t.prompt_tokens > 0) {
      e.marks.push_back(TurnMark{static_cast<size_t>(t.prompt_tokens), e.tokens.size(), e.text.size(), r.text});
      if (t.window && windows_) {  // the fast paths may continue it
        e.window = t.window;
        e.prompt_key = owner + '\n' + t.window->prompt_hash.Hex();
        prompts_[e.prompt_key] = t.session;
        if (t.chain && !response_id.empty()) {
          e.response_key = owner + '\n' + response_id;
          e.instructions = t.instructions;
          responses_[e.response_key] = t.session;
        }
      }
    }
  } else if (t.new_session || t.fork_of || !unstored.empty()) {  // nothing of it reached the store: forget it
    UnlinkLocked(t.session, e);
    if (!e.key.empty()) keys_.erase(e.owner + '\n' + e.key);
    sessions_.erase(t.session);
    index_.Remove(t.session);
    // Without waiting (this runs on the events lane, and under overload for every refused turn);
    // a new session whose turn the engine refused was never made, and this does nothing.
    engine_.DiscardSession(t.session);
    return item_ids;
  }
  IndexLocked(t.session, kept);
  return item_ids;
}

std::pair<int64_t, size_t> Service::BestSessionLocked(const std::string& owner, const std::vector<int32_t>& tokens) {
  // The owner's idle session sharing the most, preferring one whose whole log is shared: O(tokens),
  // whatever the number of sessions (prefix_index.h).
  return index_.Best(owner, tokens);
}

void Service::IndexLocked(int64_t id, size_t kept) {
  const Entry& e = sessions_.at(id);
  if (!index_.Contains(id)) {
    index_.Insert(id, e.owner, e.tokens, UseOf(e));
    return;
  }
  if (kept < index_.Length(id)) index_.Truncate(id, kept);
  if (e.tokens.size() > kept) index_.Append(id, std::span<const int32_t>(e.tokens).subspan(kept));
  index_.SetUse(id, UseOf(e));
  MNEMO_CHECK_MSG(index_.Length(id) == e.tokens.size(), "the prefix index lost step with a session's log");
}

void Service::ReleaseLocked(int64_t id) {
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return;
  it->second.busy = false;
  IndexLocked(id, it->second.tokens.size());
}

std::pair<int64_t, size_t> Service::BestSession(const std::string& owner, const std::vector<int32_t>& tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  return BestSessionLocked(owner, tokens);
}

void Service::UnlinkLocked(int64_t id, Entry& e) {
  auto drop = [id](std::unordered_map<std::string, int64_t>& m, std::string& key) {
    if (key.empty()) return;
    auto it = m.find(key);
    if (it != m.end() && it->second == id) m.erase(it);
    key.clear();
  };
  drop(prompts_, e.prompt_key);
  drop(responses_, e.response_key);
  e.window.reset();
  e.instructions.reset();
}

void Service::ForgetResponses(const std::string& owner) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, e] : sessions_) {
    if (e.owner != owner || e.response_key.empty()) continue;
    responses_.erase(e.response_key);
    e.response_key.clear();
  }
}

void Service::ForgetLocked(int64_t id) {
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return;
  UnlinkLocked(id, it->second);
  if (!it->second.key.empty()) {
    auto k = keys_.find(it->second.owner + '\n' + it->second.key);
    if (k != keys_.end() && k->second == id) keys_.erase(k);
  }
  sessions_.erase(it);
  index_.Remove(id);
}

void Service::DropExpiredLocked() {
  for (int64_t id : engine_.TakeExpired()) ForgetLocked(id);
}

std::vector<Service::SessionView> Service::Sessions(const std::string& owner) {
  std::lock_guard<std::mutex> lock(mu_);
  DropExpiredLocked();
  std::vector<SessionView> out;
  for (const auto& [id, e] : sessions_) {
    if (e.owner == owner) out.push_back({id, e.owner, e.key});
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
  return out;
}

Status Service::DeleteSession(int64_t id, const std::string& owner) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sessions_.find(id);
    if (it == sessions_.end() || it->second.owner != owner) return MakeError(StatusCode::kNotFound, "unknown session");
    if (it->second.busy) return MakeError(StatusCode::kFailedPrecondition, "the session has a turn in progress");
    UnlinkLocked(id, it->second);
    if (!it->second.key.empty()) keys_.erase(owner + '\n' + it->second.key);
    sessions_.erase(it);
    index_.Remove(id);
  }
  MNEMO_TRY(engine_.DeleteSession(id));
  if (store_) MNEMO_TRY(store_->DeleteSession(id));
  return Status::Ok();
}

}  // namespace mnemo
