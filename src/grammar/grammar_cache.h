// Compiled grammars by text, shared across requests: requests with the same schema reuse one
// automaton, so its lazily built transitions and cached masks pay off across requests, not only
// within one. Bounded: least recently used entries go while there are more than `capacity` or
// they hold more than `max_bytes` together (Automaton::Stats::bytes), and an automaton that has
// grown past kFreshAfterStates or a quarter of max_bytes is replaced for new requests (running
// ones keep theirs: shared_ptr). Without the byte bound, 64 hostile schemas each grown to an
// automaton's own limits (~300 MB) would hold the host's memory.
//
// Thread safety: Get may be called from any thread.
#pragma once

#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "grammar/automaton.h"

namespace mnemo::grammar {

class GrammarCache {
 public:
  static constexpr int64_t kFreshAfterStates = 20000;

  GrammarCache(std::shared_ptr<const TokenIndex> index, size_t capacity = 64, int64_t max_bytes = int64_t{1} << 30)
      : index_(std::move(index)), capacity_(capacity), max_bytes_(max_bytes) {}

  // The automaton for grammar text (parsed and prepared on a miss, Automaton::Prepare:
  // kInvalidArgument with the parser's reason).
  Result<std::shared_ptr<Automaton>> Get(const std::string& text);
  const std::shared_ptr<const TokenIndex>& index() const { return index_; }

 private:
  std::shared_ptr<const TokenIndex> index_;
  size_t capacity_;
  int64_t max_bytes_;
  // Whether a cached automaton should still serve new requests.
  bool Fresh(Automaton& a) const;
  std::mutex mu_;
  std::list<std::string> lru_;  // most recent first
  struct Entry {
    std::shared_ptr<Automaton> automaton;
    std::list<std::string>::iterator pos;
  };
  std::unordered_map<std::string, Entry> map_;
};

}  // namespace mnemo::grammar
