#include "grammar/grammar_cache.h"

namespace mnemo::grammar {

Result<std::shared_ptr<Automaton>> GrammarCache::Get(const std::string& text) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(text);
    if (it != map_.end() && it->second.automaton->stats().states <= kFreshAfterStates) {
      lru_.splice(lru_.begin(), lru_, it->second.pos);
      return it->second.automaton;
    }
  }
  // Parse outside the lock: a large grammar must not hold up other requests.
  auto g = Grammar::Parse(text);
  if (!g.ok()) return g.error();
  auto a = std::make_shared<Automaton>(std::make_shared<const Grammar>(std::move(*g)), index_);
  a->Prepare();  // on this (the request's) thread, not the engine's
  std::lock_guard<std::mutex> lock(mu_);
  auto it = map_.find(text);
  if (it != map_.end()) {
    it->second.automaton = a;
    lru_.splice(lru_.begin(), lru_, it->second.pos);
    return a;
  }
  lru_.push_front(text);
  map_[text] = Entry{a, lru_.begin()};
  while (map_.size() > capacity_) {
    map_.erase(lru_.back());
    lru_.pop_back();
  }
  return a;
}

}  // namespace mnemo::grammar
