// The lifecycle of a chunk record in the cache manager: one named state and a table of the moves
// between states that the cache manager may make. CacheManager::Transition is the only place a
// record changes state; it refuses (CHECK-fails on) any move the table lacks, and
// CacheManager::CheckInvariants checks that each record's fields are what its state requires.
//
// What stays outside the state, as counts or tags that any state may carry: the owners (refs), the
// acquired owners (pins), in-flight copies reading the record (readers), the latest activity, and
// where the data came from (a disk hit not yet counted). The tier the data is in is a field too:
// it is the same lifecycle whether a chunk rests in T0, T1 or T2.
//
// The edges (kChunkEdges lists them with the verb that takes each; docs/architecture.md draws them):
//
//   kFree       -> kEmpty       NewRec
//   kEmpty      -> kFilling     Acquire: KV gone below kv_tokens, a T0 block to recompute into
//               -> kResident    Acquire/Grow (new positions), RestoreChunk, a synchronous copy
//               -> kCopyTarget  a background copy-on-write copy, or a fill from the remote tier
//               -> kFree        recycled: no owner, transfer or reader left
//   kFilling    -> kResident    Release: recomputed, or the releaser's alone
//               -> kEmpty       Release: a shared chunk left part-recomputed
//   kResident   -> kDemoting    evict, suspend, spill T1 -> T2, flush to disk
//               -> kLoading     swap-in T1 -> T0, disk load T2 -> T0/T1
//               -> kEmpty       dropped (no room below), Invalidate
//   kDemoting   -> kResident    landed below, or failed (kept where it was)
//               -> kRevived     used again (Acquire, a copy reading it) while leaving T0
//               -> kEmpty       a failed disk write
//   kRevived    -> kResident    the demotion ended; its result is discarded
//   kLoading    -> kResident    landed above (a failed swap-in stays in T1)
//               -> kEmpty       a failed disk read
//   kCopyTarget -> kResident    the copy landed
//               -> kEmpty       the copy failed
#pragma once

#include <cstdint>

namespace mnemo {

enum class ChunkState : uint8_t {
  kFree,        // on the free list: no owner, no data, no transfer; tier none
  kEmpty,       // held, no KV (dropped, never computed, or invalidated): only the raw tokens remain
  kFilling,     // acquired with no KV: a T0 block an acquired owner is recomputing into. Not a hit
                // for anyone (half-written); never moved, copied or evicted while so
  kResident,    // valid KV at rest in its tier (T0, T1 or T2), no transfer moving or filling it
  kDemoting,    // being moved down (T0 -> T1/T2, T1 -> T2): the source block is valid and read
                // by the transfer, the destination block is reserved by it
  kRevived,     // a demotion out of T0 whose result will be discarded: the chunk is in use (or
                // read by a copy) again, so it keeps its T0 block and the destination is freed
  kLoading,     // being moved up (T1 -> T0 swap-in, T2 -> T0/T1 disk load)
  kCopyTarget,  // no KV yet: a copy-on-write transfer fills it from another record, or a fill
                // brings its KV from outside the tiers (the remote tier; CacheManager::PlanFills)
};
inline constexpr int kChunkStates = 8;

const char* ChunkStateName(ChunkState s);

// True when the table has the edge from -> to. Staying in a state is no transition and is not in
// the table (the cache manager does not call Transition for it).
bool ChunkTransitionAllowed(ChunkState from, ChunkState to);
// CHECK-fails (naming both states) unless the table has the edge from -> to: the cache manager's
// guard on every transition. An illegal move is a bug in the cache manager, never bad input.
void CheckChunkTransition(ChunkState from, ChunkState to);

// One legal edge and the verb that takes it, for docs and tests.
struct ChunkEdge {
  ChunkState from, to;
  const char* why;
};
// [kChunkEdgeCount] every legal edge.
extern const ChunkEdge kChunkEdges[];
extern const int kChunkEdgeCount;

}  // namespace mnemo
