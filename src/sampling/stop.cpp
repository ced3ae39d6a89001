#include "sampling/stop.h"

#include <algorithm>

namespace mnemo {
namespace {

// Length of an incomplete UTF-8 sequence at the end of `s` (0 if the end is complete, or is not
// valid UTF-8 in a way that more bytes could fix).
size_t IncompleteUtf8Tail(std::string_view s) {
  const size_t n = s.size();
  for (size_t back = 1; back <= std::min<size_t>(n, 4); ++back) {
    const unsigned char c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    size_t need = 0;
    if ((c & 0xE0) == 0xC0) need = 2;
    else if ((c & 0xF0) == 0xE0) need = 3;
    else if ((c & 0xF8) == 0xF0) need = 4;
    return need > back ? back : 0;  // ASCII, a complete sequence, or an invalid lead byte
  }
  return 0;
}

}  // namespace

Status StopMatcher::Validate(const std::vector<std::string>& stops) {
  if (stops.size() > kMaxStops)
    return MakeError("at most %zu stop strings are allowed, got %zu", kMaxStops, stops.size());
  for (size_t i = 0; i < stops.size(); ++i)
    if (stops[i].empty()) return MakeError("stop string %zu is empty", i);
  return Status::Ok();
}

Result<StopMatcher> StopMatcher::Create(std::vector<std::string> stops) {
  MNEMO_TRY(Validate(stops));
  return StopMatcher(std::move(stops));
}

StopMatcher::StopMatcher(std::vector<std::string> stops, CallStart call_start)
    : stops_(std::move(stops)), call_start_(std::move(call_start)) {
  Status st = Validate(stops_);
  MNEMO_CHECK_MSG(st.ok(), st.error().message);
  for (const std::string& s : stops_) {
    // fail[i] = length of the longest proper prefix of s[0..i] that is also its suffix.
    std::vector<int32_t> fail(s.size(), 0);
    for (size_t i = 1, k = 0; i < s.size(); ++i) {
      while (k > 0 && s[i] != s[k]) k = fail[k - 1];
      if (s[i] == s[k]) ++k;
      fail[i] = static_cast<int32_t>(k);
    }
    fail_.push_back(std::move(fail));
  }
  state_.assign(stops_.size(), 0);
  start_done_ = call_start_.at_start.empty();
}

void StopMatcher::Lift() {
  lifted_ = true;
  std::fill(state_.begin(), state_.end(), 0);
}

bool StopMatcher::OpensCall(char c) {
  if (!call_start_.anywhere.empty()) {
    size_t longest = 0;
    for (const std::string& o : call_start_.anywhere) longest = std::max(longest, o.size());
    tail_ += c;
    if (tail_.size() > longest) tail_.erase(0, tail_.size() - longest);
    for (const std::string& o : call_start_.anywhere) {
      if (tail_.size() >= o.size() && tail_.compare(tail_.size() - o.size(), o.size(), o) == 0) return true;
    }
  }
  if (!start_done_ && !(start_.empty() && (c == ' ' || c == '\n' || c == '\t' || c == '\r'))) {
    start_ += c;
    start_done_ = true;
    for (const std::string& o : call_start_.at_start) {
      if (o == start_) return true;
      if (o.size() > start_.size() && o.compare(0, start_.size(), start_) == 0) start_done_ = false;
    }
  }
  return false;
}

StopMatcher::Output StopMatcher::Push(std::string_view piece) {
  if (stopped_) return {"", true};
  const size_t base = pending_.size();
  pending_.append(piece);
  // Advance every stop's automaton byte by byte; the first byte that completes a stop ends the
  // stream there (the smallest end offset). Several completing at once: the longest wins.
  for (size_t i = base; i < pending_.size() && !lifted_; ++i) {
    const char c = pending_[i];
    if (OpensCall(c)) {
      Lift();
      break;
    }
    size_t hit = stops_.size();
    for (size_t j = 0; j < stops_.size(); ++j) {
      const std::string& s = stops_[j];
      int32_t q = state_[j];
      while (q > 0 && s[q] != c) q = fail_[j][q - 1];
      if (s[q] == c) ++q;
      state_[j] = q;
      if (static_cast<size_t>(q) == s.size() && (hit == stops_.size() || s.size() > stops_[hit].size()))
        hit = j;
    }
    if (hit < stops_.size()) {
      // The matched prefix was held back, so the stop starts inside pending_.
      const size_t start = i + 1 - stops_[hit].size();
      Output out{pending_.substr(0, start), true};
      pending_.clear();
      stopped_ = true;
      return out;
    }
  }
  size_t hold = IncompleteUtf8Tail(pending_);
  for (int32_t q : state_) hold = std::max(hold, static_cast<size_t>(q));
  Output out{pending_.substr(0, pending_.size() - hold), false};
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StopMatcher::Flush() {
  std::string out;
  if (!stopped_) out.swap(pending_);
  pending_.clear();
  std::fill(state_.begin(), state_.end(), 0);
  return out;
}

}  // namespace mnemo
