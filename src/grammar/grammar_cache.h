// Compiled grammars by text, shared across requests: requests with the same schema reuse one
// automaton, so its lazily built transitions and cached masks pay off across requests, not only
// within one. Bounded: least recently used entries go, and an automaton that has grown past
// kFreshAfterStates is replaced for new requests (running ones keep theirs: shared_ptr).
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

  GrammarCache(std::shared_ptr<const TokenIndex> index, size_t capacity = 64)
      : index_(std::move(index)), capacity_(capacity) {}

  // The automaton for grammar text (parsed and prepared on a miss, Automaton::Prepare:
  // kInvalidArgument with the parser's reason).
  Result<std::shared_ptr<Automaton>> Get(const std::string& text);
  const std::shared_ptr<const TokenIndex>& index() const { return index_; }

 private:
  std::shared_ptr<const TokenIndex> index_;
  size_t capacity_;
  std::mutex mu_;
  std::list<std::string> lru_;  // most recent first
  struct Entry {
    std::shared_ptr<Automaton> automaton;
    std::list<std::string>::iterator pos;
  };
  std::unordered_map<std::string, Entry> map_;
};

}  // namespace mnemo::grammar
