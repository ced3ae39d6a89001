#include "kv/eviction.h"

#include <algorithm>

#include "base/block.h"

namespace mnemo {

double PensievePolicy::Weight(int, int begin) const {
  // Priced as a whole chunk: a session's partial tail (the chunk its next turn extends) would
  // otherwise look cheapest of all and go first, leaving a hole at the end; Pensieve evicts a
  // session from its front, the partial tail last. For full chunks this is Cost(s, l).
  return cost_.Cost(begin, kBlockTokens);
}

double PensievePolicy::Value(double weight, double idle_s, double) const {
  // A session touched this instant still gets a finite value. The floor is far below the gaps
  // between engine events (a 1 ms floor made every session released within the last millisecond
  // tie, and the tie went to whichever record came first, e.g. a chunk just shared by a fork).
  return weight / std::max(idle_s, 1e-6);
}

Result<std::unique_ptr<EvictionPolicy>> MakeEvictionPolicy(const std::string& name, CostModel cost) {
  if (name == "pensieve") return std::unique_ptr<EvictionPolicy>(new PensievePolicy(cost));
  if (name == "lru") return std::unique_ptr<EvictionPolicy>(new LruPolicy());
  return MakeError("unknown eviction policy '%s' (expected pensieve or lru)", name.c_str());
}

}  // namespace mnemo
