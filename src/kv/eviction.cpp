#include "kv/eviction.h"

#include <algorithm>

namespace mnemo {

std::pair<double, double> PensievePolicy::Key(const EvictionCandidate& c) const {
  // A session touched this instant still gets a finite value; 1 ms is below any think time.
  double idle = std::max(c.idle_s, 1e-3);
  return {cost_.Cost(c.begin, c.length) / idle, double(c.chunk_index)};
}

std::pair<double, double> LruPolicy::Key(const EvictionCandidate& c) const {
  return {c.last_active, -double(c.chunk_index)};
}

Result<std::unique_ptr<EvictionPolicy>> MakeEvictionPolicy(const std::string& name, CostModel cost) {
  if (name == "pensieve") return std::unique_ptr<EvictionPolicy>(new PensievePolicy(cost));
  if (name == "lru") return std::unique_ptr<EvictionPolicy>(new LruPolicy());
  return MakeError("unknown eviction policy '%s' (expected pensieve or lru)", name.c_str());
}

}  // namespace mnemo
