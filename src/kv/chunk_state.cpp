#include "kv/chunk_state.h"

#include <string>

#include "base/status.h"

namespace mnemo {

const char* ChunkStateName(ChunkState s) {
  switch (s) {
    case ChunkState::kFree: return "free";
    case ChunkState::kEmpty: return "empty";
    case ChunkState::kFilling: return "filling";
    case ChunkState::kResident: return "resident";
    case ChunkState::kDemoting: return "demoting";
    case ChunkState::kRevived: return "revived";
    case ChunkState::kLoading: return "loading";
    case ChunkState::kCopyTarget: return "copy-target";
  }
  return "?";
}

using S = ChunkState;
const ChunkEdge kChunkEdges[] = {
    {S::kFree, S::kEmpty, "NewRec: a chunk with no KV yet"},
    {S::kEmpty, S::kFree, "recycle: no owner, no transfer, no reader left"},
    {S::kEmpty, S::kFilling, "Acquire: positions below kv_tokens whose KV is gone get a T0 block to recompute into"},
    {S::kEmpty, S::kResident,
     "Acquire/Grow: a chunk past kv_tokens gets a T0 block; RestoreChunk; a synchronous copy-on-write copy; "
     "Release: a suspended recompute's block passes to the releaser's own record"},
    {S::kEmpty, S::kCopyTarget, "Fork/Truncate/Release: a background copy-on-write copy will fill it; PlanFills: a remote fill"},
    {S::kFilling, S::kResident, "Release: the recompute finished, or the chunk is the releaser's alone"},
    {S::kFilling, S::kEmpty,
     "Release: a shared chunk left part-recomputed (its block goes to the releaser's own record, or nothing was "
     "computed): the other owners recompute it"},
    {S::kResident, S::kEmpty, "drop: evicted with no room below, suspended with no room below, Invalidate"},
    {S::kResident, S::kDemoting, "evict or suspend out of T0, spill T1 -> T2, flush to disk"},
    {S::kResident, S::kLoading, "Acquire: swap-in T1 -> T0; Maintain: disk load T2 -> T0/T1"},
    {S::kDemoting, S::kResident, "landed (the data is in the lower tier), or failed (it stays where it was)"},
    {S::kDemoting, S::kEmpty, "a disk write failed for an unpinned chunk: dropped"},
    {S::kDemoting, S::kRevived, "Acquire of a T0 chunk being demoted, or a background copy reading it"},
    {S::kRevived, S::kResident, "the demotion ended: its destination block is freed, the T0 block kept"},
    {S::kLoading, S::kResident, "landed in the upper tier (a failed swap-in leaves it in T1)"},
    {S::kLoading, S::kEmpty, "a disk read failed (checksum or identity): recomputed"},
    {S::kCopyTarget, S::kResident, "the copy (or fill) landed"},
    {S::kCopyTarget, S::kEmpty, "the copy failed, or the fill found nothing: recomputed"},
};
const int kChunkEdgeCount = static_cast<int>(sizeof(kChunkEdges) / sizeof(kChunkEdges[0]));

bool ChunkTransitionAllowed(ChunkState from, ChunkState to) {
  for (int i = 0; i < kChunkEdgeCount; i++) {
    if (kChunkEdges[i].from == from && kChunkEdges[i].to == to) return true;
  }
  return false;
}

void CheckChunkTransition(ChunkState from, ChunkState to) {
  MNEMO_CHECK_MSG(ChunkTransitionAllowed(from, to), std::string("chunk state ") + ChunkStateName(from) + " -> " +
                                                        ChunkStateName(to) + " is not in the transition table");
}

}  // namespace mnemo
