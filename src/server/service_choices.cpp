// n > 1 choices: the prompt's session, computed once, forked copy-on-write once per further choice.
#include <algorithm>
#include <cmath>
#include <limits>

#include "base/log.h"
#include "server/service.h"

namespace mnemo {

uint64_t ChoiceSeed(uint64_t seed, int i) {
  if (i == 0) return seed;
  uint64_t z = seed + 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(i);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

std::vector<int> RankCandidates(const std::vector<double>& logprob) {
  std::vector<int> rank(logprob.size());
  for (size_t i = 0; i < rank.size(); i++) rank[i] = static_cast<int>(i);
  auto key = [&](int i) { return std::isnan(logprob[i]) ? -std::numeric_limits<double>::infinity() : logprob[i]; };
  std::stable_sort(rank.begin(), rank.end(), [&](int a, int b) { return key(a) > key(b); });
  return rank;
}

void AsPrefill(TurnRequest* req) {
  req->max_tokens = 0;
  req->min_tokens = 0;
  req->logprobs = -1;
  req->grammar = nullptr;
  req->capture_logits = false;
}

ApiResult<std::vector<StartedTurn>> Service::StartChoices(const StartedTurn& prefill, const TurnRequest& request,
                                                          int n, const std::string& owner) {
  const int64_t source = prefill.session;
  size_t len = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sessions_.find(source);
    if (it == sessions_.end() || !it->second.busy) {  // the engine expired it after the prefill
      if (prefill.lock) prefill.lock->Release();
      return ToApiError(MakeError(StatusCode::kUnavailable, "the prompt's session is gone; retry"));
    }
    len = it->second.tokens.size();
  }
  std::vector<int64_t> forks;
  // Undoes what is made so far: the forks are forgotten, the source freed (and its turn lock,
  // which the prompt's Commit handed on to the choices).
  auto release = [&] {
    if (prefill.lock) prefill.lock->Release();
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (int64_t f : forks) ForgetLocked(f);
      ReleaseLocked(source);
    }
    for (int64_t f : forks) engine_.DiscardSession(f);
  };
  for (int i = 1; i < n; i++) {
    auto f = engine_.ForkSession(source, static_cast<int>(len));
    if (!f.ok()) {
      release();
      return ToApiError(f.error());
    }
    forks.push_back(*f);
    std::lock_guard<std::mutex> lock(mu_);
    auto src = sessions_.find(source);
    Entry& e = sessions_[*f];
    if (src != sessions_.end()) {  // the log, its rendering and its turns (the fork's Commit marks the reply)
      e.tokens = src->second.tokens;
      e.text = src->second.text;
      e.marks = src->second.marks;
    }
    e.owner = owner;
    e.busy = true;
    e.version++;
    IndexLocked(*f, 0);
  }
  std::vector<StartedTurn> out;
  for (int i = 0; i < n; i++) {
    StartedTurn st;
    st.choice = true;
    st.session = i == 0 ? source : forks[i - 1];
    if (i > 0) {
      st.fork_of = source;
      st.fork_at = static_cast<int64_t>(len);
    }
    st.prompt_tokens = static_cast<int>(len);
    st.context = prefill.context;
    st.window = prefill.window;
    st.chain = prefill.chain;
    st.instructions = prefill.instructions;
    TurnRequest req = request;
    req.session = st.session;
    req.append.clear();  // the whole prompt is in the log: the engine feeds its last position again
    req.sampling.seed = ChoiceSeed(request.sampling.seed, i);
    req.keep_stop_token = true;  // templates close an assistant turn with the model's EOG token
    st.lock = prefill.lock;  // each choice holds the session's turn lock until its commit
    if (st.lock) st.lock->Hold();
    auto h = engine_.Enqueue(std::move(req), /*new_session=*/false);
    if (!h.ok()) {
      if (st.lock) st.lock->Release();
      // The choices started end cancelled and are discarded (their forks dropped, the source
      // freed); the forks not started yet are dropped here.
      for (StartedTurn& s : out) {
        s.handle->Cancel();
        Commit(s, s.handle->Wait(), std::nullopt, std::nullopt, owner);
      }
      forks.erase(forks.begin(), forks.begin() + std::max(0, i - 1));
      if (i == 0) {
        release();
      } else {
        {
          std::lock_guard<std::mutex> lock(mu_);
          for (int64_t f : forks) ForgetLocked(f);
        }
        for (int64_t f : forks) engine_.DiscardSession(f);
        if (prefill.lock) prefill.lock->Release();
      }
      spdlog::warn("session {}: choice {} of {} could not start: {}", source, i, n, h.error().message);
      return ToApiError(h.error(), h.error().code == StatusCode::kResourceExhausted ? "the server is busy: " : "");
    }
    st.handle = *h;
    out.push_back(std::move(st));
  }
  if (prefill.lock) prefill.lock->Release();  // the prompt's hold: the choices hold it now
  return out;
}

}  // namespace mnemo
