// A conversation as the engine keeps it: its raw token log and turns. The KV residency of its
// chunks is the cache manager's business.
#pragma once

#include <cstdint>
#include <vector>

#include "kv/cache_manager.h"

namespace mnemo {

struct Turn {
  int begin = 0;       // first position of the turn's prompt tokens
  int prompt_end = 0;  // first generated position
  int end = 0;         // one past the last position
};

struct Session {
  SessionId id = -1;
  std::vector<int32_t> tokens;  // raw token log: every prompt and generated token, in order
  std::vector<Turn> turns;      // in order; they tile [0, tokens.size())
  double created = 0;           // engine clock, seconds
  double last_active = 0;       // engine clock, seconds
  bool busy = false;            // a turn is queued or running on it
  bool shares_kv = true;        // its KV is exactly what its tokens give (not composed by selective
                                // context, not restored from a disk tier): chunks may be put to and
                                // fetched from the remote tier, which names KV by tokens alone
  int composing = 0;            // compositions queued or running that read its KV: its turns wait,
                                // and verbs that change its KV refuse
};

// Hash of tokens [0, n): what the KV of a chunk ending at n depends on (for disk slot headers).
uint64_t TokenPrefixHash(const std::vector<int32_t>& tokens, int n);

}  // namespace mnemo
