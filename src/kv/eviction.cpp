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

Result<std::unique_ptr<EvictionPolicy>> MakeEvictionPolicy(const std::string& name, CostModel cost) {
  if (name == "pensieve") return std::unique_ptr<EvictionPolicy>(new PensievePolicy(cost));
  if (name == "lru") return std::unique_ptr<EvictionPolicy>(new LruPolicy());
  return MakeError("unknown eviction policy '%s' (expected pensieve or lru)", name.c_str());
}

}  // namespace mnemo
