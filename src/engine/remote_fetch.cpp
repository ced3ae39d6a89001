#include "engine/remote_fetch.h"

#include <algorithm>

#include "base/block.h"

namespace mnemo {

double RecomputeChunkSeconds(const StepCostParams& p, int chunk) {
  const double first = static_cast<double>(chunk) * kBlockTokens + 1;  // (p + 1) of its first position
  const double pairs = kBlockTokens * first + kBlockTokens * (kBlockTokens - 1) / 2.0;
  return kBlockTokens * p.per_token + p.per_pair * pairs;
}

std::vector<int> ChooseRemoteFetches(const std::vector<int>& candidates, const StepCostParams& p,
                                     const RemoteFetchCost& f, bool always) {
  if (always) return candidates;
  const double per_chunk = static_cast<double>(f.chunk_bytes) / std::max(f.bytes_per_s, 1.0);
  std::vector<int> out;
  double saved = 0;
  for (int c : candidates) {
    const double gain = RecomputeChunkSeconds(p, c) - per_chunk;
    if (gain <= 0) continue;
    out.push_back(c);
    saved += gain;
  }
  if (saved <= f.rtt_s) out.clear();
  return out;
}

}  // namespace mnemo
