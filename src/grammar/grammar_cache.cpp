#include "grammar/grammar_cache.h"

#include <unordered_map>
#include <vector>

namespace mnemo::grammar {

Result<std::shared_ptr<Automaton>> GrammarCache::Get(const std::string& text) {
  std::shared_ptr<Automaton> hit;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(text);
    if (it != map_.end()) hit = it->second.automaton;
  }
  // Checked outside the cache's lock (stats() takes the automaton's, which a mask walk may hold).
  if (hit && Fresh(*hit)) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(text);
    if (it != map_.end() && it->second.automaton == hit) lru_.splice(lru_.begin(), lru_, it->second.pos);
    return hit;
  }
  // Parse outside the lock: a large grammar must not hold up other requests.
  auto g = Grammar::Parse(text);
  if (!g.ok()) return g.error();
  auto a = std::make_shared<Automaton>(std::make_shared<const Grammar>(std::move(*g)), index_);
  a->Prepare();  // on this (the request's) thread, not the engine's
  std::vector<std::shared_ptr<Automaton>> all;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(text);
    if (it != map_.end()) {
      it->second.automaton = a;
      lru_.splice(lru_.begin(), lru_, it->second.pos);
    } else {
      lru_.push_front(text);
      map_[text] = Entry{a, lru_.begin()};
    }
    for (const auto& [k, e] : map_) all.push_back(e.automaton);
  }
  // Sizes read outside the cache's lock: an automaton's own lock may be held by a mask walk.
  std::unordered_map<const Automaton*, int64_t> bytes_of;
  for (const auto& x : all) bytes_of[x.get()] = x->stats().bytes;
  std::lock_guard<std::mutex> lock(mu_);
  int64_t bytes = 0;
  for (const auto& [k, e] : map_) {
    auto b = bytes_of.find(e.automaton.get());
    if (b != bytes_of.end()) bytes += b->second;
  }
  // The least recently used go first; the newest stays whatever its size.
  while (map_.size() > 1 && (map_.size() > capacity_ || bytes > max_bytes_)) {
    auto last = map_.find(lru_.back());
    auto b = bytes_of.find(last->second.automaton.get());
    if (b != bytes_of.end()) bytes -= b->second;
    map_.erase(last);
    lru_.pop_back();
  }
  return a;
}

bool GrammarCache::Fresh(Automaton& a) const {
  const Automaton::Stats st = a.stats();
  return st.states <= kFreshAfterStates && st.bytes <= max_bytes_ / 4;
}

}  // namespace mnemo::grammar
