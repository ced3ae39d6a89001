// The service's fast paths (turn_window.h): a turn that continues a session's latest reply is
// rendered from a window of the conversation and appended, in O(the new turn). Found by
// previous_response_id (StartAfterResponse) or, for a client resending the whole history, by the
// hash of the messages before the last reply (Start, below the context check in context_select.cpp).
// Anything they do not cover returns nullopt before changing anything, and the caller takes the
// whole-history path, which gives the same turn.
#include "base/log.h"
#include "server/service.h"
#include "server/turn_append.h"

namespace mnemo {

std::optional<ApiResult<StartedTurn>> Service::StartAfterResponse(TurnSpec spec, const std::string& response_id) {
  if (!windows_ || spec.prompt || spec.template_extra || spec.context.budget > 0 || config_.default_context.budget > 0) return std::nullopt;
  int64_t source = -1;
  MessageHash hash;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto r = responses_.find(spec.owner + '\n' + response_id);
    if (r == responses_.end()) return std::nullopt;
    auto it = sessions_.find(r->second);
    if (it == sessions_.end() || !it->second.window) return std::nullopt;
    // The chain's history is [instructions] + the messages up to the response: the request's
    // instructions must be those the session's prompt rendered with.
    if (it->second.instructions != spec.instructions) return std::nullopt;
    source = r->second;
    hash = it->second.window->prompt_hash;
  }
  const std::vector<ChatMessage> more = spec.messages;
  return StartWindowed(spec, source, hash, nullptr, more);
}

std::optional<ApiResult<StartedTurn>> Service::StartResent(TurnSpec& spec) {
  // The reply the request continues after: the last assistant message (as PlanAppend finds it).
  const std::vector<ChatMessage>& msgs = spec.messages;
  size_t r = 0;
  for (size_t i = msgs.size(); i-- > 0;) {
    if (msgs[i].role == "assistant") {
      r = i;
      break;
    }
  }
  if (r == 0) return std::nullopt;  // none, or nothing before it
  const MessageHash hash = HashMessages(std::span<const ChatMessage>(msgs).first(r));  // one pass over the bytes
  int64_t source = -1;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = prompts_.find(spec.owner + '\n' + hash.Hex());
    if (it == prompts_.end()) return std::nullopt;
    source = it->second;
  }
  const ChatMessage reply = msgs[r];
  const std::vector<ChatMessage> more(msgs.begin() + static_cast<std::ptrdiff_t>(r) + 1, msgs.end());
  return StartWindowed(spec, source, hash, &reply, more);
}

std::optional<ApiResult<StartedTurn>> Service::StartWindowed(TurnSpec& spec, int64_t source,
                                                             const MessageHash& prompt_hash,
                                                             const ChatMessage* client_reply,
                                                             std::span<const ChatMessage> more) {
  // Snapshot the session's latest turn: the window of its prompt, its reply, the text the prompt
  // tokenization restarts from.
  std::shared_ptr<const TurnWindow> window;
  uint64_t version = 0;
  size_t prompt_end = 0, end = 0;
  std::vector<int32_t> reply_tokens;
  int32_t prev = kNoToken;
  std::string reply_text, prompt_tail;
  {
    std::lock_guard<std::mutex> lock(mu_);
    DropExpiredLocked();
    auto it = sessions_.find(source);
    if (it == sessions_.end()) return std::nullopt;
    const Entry& e = it->second;
    if (e.owner != spec.owner || e.busy || !e.window || !(e.window->prompt_hash == prompt_hash) || e.marks.empty()) {
      return std::nullopt;
    }
    const TurnMark& m = e.marks.back();
    // The latest turn, whole in the log, its prompt the session's text.
    if (m.end != e.tokens.size() || m.text_end != e.text.size() || m.prompt_end == 0) return std::nullopt;
    window = e.window;
    version = e.version;
    prompt_end = m.prompt_end;
    end = m.end;
    reply_tokens.assign(e.tokens.begin() + static_cast<std::ptrdiff_t>(prompt_end), e.tokens.end());
    prev = e.tokens[prompt_end - 1];
    reply_text = m.reply;
    prompt_tail = e.text.substr(tok_.RestartPoint(e.text));
  }
  // The reply as the history holds it: the client's copy (stateless chat), or ours (a stored response).
  const ChatMessage reply = client_reply ? *client_reply : ChatMessage{"assistant", reply_text};
  size_t n_old = 0;
  const std::vector<ChatMessage> msgs = WindowMessages(*window, reply, more, &n_old);
  auto a = template_.RenderAppend(msgs, n_old, /*add_generation_prompt=*/true);
  if (!a.ok()) return std::nullopt;
  // Surely too long (the new text alone makes too many tokens, service.cpp): not tokenized here.
  if (static_cast<int64_t>(prompt_end + a->tail.size() / tok_.max_token_bytes()) >= engine_.max_context())
    return std::nullopt;
  auto turn = AppendAfterReply(tok_, prompt_tail, prev, reply_tokens, reply_text, *a);
  // An edited reply forks the session: the whole-history path does that.
  if (!turn || turn->match.kind == ReplyMatch::Kind::kEdited) return std::nullopt;
  const size_t cut = prompt_end + turn->keep;
  const size_t context = cut + turn->tokens.size();
  // Too long: the whole-history path reports it, or selects turns (truncation "auto").
  if (static_cast<int64_t>(context) >= engine_.max_context()) return std::nullopt;

  const bool truncate = cut != end;
  bool stored = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sessions_.find(source);
    if (it == sessions_.end() || it->second.version != version || it->second.busy) return std::nullopt;
    it->second.busy = true;
    index_.SetUse(source, UseOf(it->second));
    stored = it->second.stored;
  }
  // On a shared store another replica may be running a turn on the session: wait for its commit
  // (the turn lock, as the whole-history path takes it).
  std::shared_ptr<TurnLock> turn_lock;
  if (stored && Probes()) {
    bool waited = false;
    auto l = LockTurn(source, &waited);
    if (!l.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      ReleaseLocked(source);
      return ApiResult<StartedTurn>(ToApiError(l.error()));
    }
    turn_lock = std::move(*l);
  }
  // On a shared store the session may have moved on another replica (one probe): brought in step,
  // the whole-history path plans the turn on what the store holds (and takes the lock again).
  if (!FreshInStore(source)) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ReleaseLocked(source);
    }
    SyncSession(source, spec.owner, /*load=*/false);
    return std::nullopt;
  }
  StartedTurn st;
  st.session = source;
  st.prompt_tokens = static_cast<int>(context);
  st.window = std::make_shared<const TurnWindow>(ExtendWindow(*window, reply, more));
  st.chain = spec.chain;
  st.instructions = spec.instructions;
  st.windowed = true;
  // The engine may have expired the session meanwhile: forget it, and the whole-history path
  // starts a new one (as it does when it finds the session gone).
  auto fall_back = [&]() -> std::optional<ApiResult<StartedTurn>> {
    std::lock_guard<std::mutex> lock(mu_);
    ForgetLocked(source);
    return std::nullopt;
  };
  if (truncate) {
    Status t = engine_.TruncateSession(source, static_cast<int>(cut));
    if (!t.ok()) {
      if (!engine_.HasSession(source)) return fall_back();
      std::lock_guard<std::mutex> lock(mu_);
      ReleaseLocked(source);
      return ApiResult<StartedTurn>(ToApiError(t.error()));
    }
    st.truncated_to = static_cast<int64_t>(cut);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    Entry& e = sessions_.at(source);
    UnlinkLocked(source, e);  // its latest turn changes
    e.version++;
    if (truncate) {
      e.cuts++;
      e.tokens.resize(cut);
      e.store_truncate = std::min<int64_t>(e.store_truncate.value_or(cut), static_cast<int64_t>(cut));
    }
    IndexLocked(source, e.tokens.size());
    // The earlier turns stay valid within the kept log; the text grows by the rendering after the
    // prompt (the whole-history path gets the same text by rendering everything).
    while (!e.marks.empty() && e.marks.back().end > cut) e.marks.pop_back();
    e.text += a->text();
  }
  spec.request.session = source;
  spec.request.append = std::move(turn->tokens);
  spec.request.keep_stop_token = true;  // templates close an assistant turn with the model's EOG token
  auto h = engine_.Enqueue(spec.request, /*new_session=*/false);  // refusals arrive as its kDone
  if (h.ok()) {
    st.handle = *h;
    st.lock = std::move(turn_lock);  // held until the commit
    return ApiResult<StartedTurn>(std::move(st));
  }
  if (h.error().code == StatusCode::kNotFound) return fall_back();
  std::lock_guard<std::mutex> lock(mu_);
  ReleaseLocked(source);
  const Error& err = h.error();
  return ApiResult<StartedTurn>(ToApiError(err, err.code == StatusCode::kResourceExhausted ? "the server is busy: " : ""));
}

}  // namespace mnemo
