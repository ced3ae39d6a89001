// When fetching a chunk's KV from the remote tier beats recomputing it (Pensieve's cost model, in
// seconds): recomputing chunk c (positions [32c, 32c + 32)) costs
//     R(c) = Σ_p (a + b·(p + 1)) = 32·a + b·(32·32c + 528)
// with a, b the engine's calibrated step-cost model (cost_fit.h): it grows with the position. A
// fetch costs one round trip for the whole pipelined batch plus block_bytes / throughput per
// chunk, whatever its position. So the chunks worth fetching are those with R(c) above the
// per-chunk transfer time (a suffix of the candidates, the later ones), and the batch only when
// what they save exceeds the round trip. Model-free: tested on figures alone.
#pragma once

#include <cstddef>
#include <vector>

#include "engine/cost_fit.h"

namespace mnemo {

struct RemoteFetchCost {
  double rtt_s = 5e-4;         // one round trip to the remote tier (measured: RemoteStats::rtt_s)
  double bytes_per_s = 1e9;    // its fetch throughput (measured: RemoteStats::bytes_per_s)
  size_t chunk_bytes = 0;      // bytes of one chunk's value
};

// Seconds to recompute chunk c under p.
double RecomputeChunkSeconds(const StepCostParams& p, int chunk);

// The candidates (chunk indices, ascending) worth fetching; all of them when `always`.
std::vector<int> ChooseRemoteFetches(const std::vector<int>& candidates, const StepCostParams& p,
                                     const RemoteFetchCost& f, bool always);

}  // namespace mnemo
