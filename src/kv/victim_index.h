// Eviction candidates filed for the policy, per tier, so that the cache manager finds the next
// victim without scanning its chunk records.
//
// A policy orders chunks by the key (Value(weight, idle), weight) (kv/eviction.h): the weight is
// fixed while a chunk sits idle, and Value is nondecreasing in the weight and in the time of last
// activity. Records of one tier with equal weight form a class; within a class, the record idle
// longest has the smallest key. So each tier keeps
//   - its classes, each holding its records in a 4-ary min-heap by (last activity, record id) in
//     one array (only the front is ever read; no allocation per record; a record filed at the
//     newest time, the common case, stays at the bottom in O(1); four children share one or two
//     cache lines, so removing a front touches half the levels of a binary heap), and
//   - two flat arrays of the classes' fronts (weight, front's last activity, class): one sorted by
//     weight, one by (last activity, weight),
// and Pick walks both orders at once (Fagin's threshold algorithm): after visiting class a in
// weight order and front b in time order, every class not visited yet has weight >= a's next and
// a front no older than b's next, so its key is >= (Value(a's weight, b's idle), a's weight); the
// walk stops when the best key seen is no greater. The answer is exact (the minimum key over every
// filed record; ties between equal keys go to either). Its cost is O(classes visited), at most the
// number of distinct weights in the tier: for Pensieve one per chunk position (context / 16), and
// often 1-3, since the lightest class's oldest record usually wins (bench cache, 4,096 sessions
// idle since distinct times, visits ~40 of 64); for LRU, whose Value is the time alone, the
// oldest front is the answer (one or two steps, more only on equal times). Both walks read
// consecutive array elements, not tree nodes.
// File and Unfile cost O(log n) for the heap sift within the class; when the class's front
// changes, O(log classes) to find it in both arrays plus O(fronts it passes) to move it to its new
// place in time order (a new front is usually near its old place). A class that appears or
// empties costs O(classes) (array insert or erase; rare: weights are few and classes large). No
// allocation once the arrays have grown.
//
// Not thread-safe: owned by the cache manager (the engine thread).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "base/huge_pages.h"

#include "kv/eviction.h"

namespace mnemo {

class VictimIndex {
 public:
  static constexpr int kTiers = 3;

  // Files record rec (not filed) as a candidate of tier `tier` in [0, kTiers) under `weight` and
  // `last_active` (engine clock, seconds).
  void File(int32_t rec, int tier, double weight, double last_active);
  // Takes rec out; no-op when it is not filed.
  void Unfile(int32_t rec);
  // True when rec is filed in `tier` under exactly this weight and time.
  bool FiledAs(int32_t rec, int tier, double weight, double last_active) const;
  bool Filed(int32_t rec) const { return rec < static_cast<int32_t>(entries_.size()) && entries_[rec].cls >= 0; }
  size_t size(int tier) const { return tiers_[tier].size; }
  // The filed record of `tier` with the smallest policy key at `now`; -1 when none.
  int32_t Pick(int tier, double now, const EvictionPolicy& policy) const;
  // Internal consistency (both orders of the fronts, heap order, counts, back-references). For
  // CheckInvariants and tests.
  bool Check() const;
  // Searches made by Pick and the class fronts they looked at (both walks): the walk's length,
  // for benchmarks.
  uint64_t picks() const { return picks_; }
  uint64_t visits() const { return visits_; }

 private:
  struct Entry {
    double last_active = 0;
    int32_t cls = -1;  // its class (an index into classes_); -1: not filed
    int32_t pos = -1;  // its place in its class's heap
  };
  struct Slot {
    double last_active;
    int32_t rec;
    bool operator<(const Slot& o) const { return last_active < o.last_active || (last_active == o.last_active && rec < o.rec); }
  };
  // The records of one tier with one weight: heap is a 4-ary min-heap by (last_active, rec)
  // ([0] is the oldest; the children of i are 4i+1 .. 4i+4). Each record's Entry::pos follows it.
  // A class that empties goes to free_classes_ and keeps its array's capacity for the next one.
  struct Class {
    int tier = -1;  // -1: unused
    double weight = 0;
    HugeVector<Slot> heap;
  };
  // A class as the walks see it: its weight and its front's (oldest record's) time.
  struct Front {
    double weight;
    double last_active;
    int32_t cls;
  };
  struct TierIndex {
    std::vector<Front> by_weight;  // [classes of the tier] ascending weight (unique within a tier)
    std::vector<Front> by_time;    // [classes of the tier] ascending (last_active, weight)
    size_t size = 0;               // records filed
  };

  void SiftUp(Class& c, size_t i);
  void SiftDown(Class& c, size_t i);
  void Place(Class& c, size_t i, const Slot& s) {
    c.heap[i] = s;
    entries_[s.rec].pos = static_cast<int32_t>(i);
  }
  // The class of `weight` in tier x, created (empty, in both orders at time `last_active`) when
  // there is none.
  int32_t ClassFor(TierIndex& x, int tier, double weight, double last_active);
  // Class c's front went from old_time to c.heap[0]'s time: updates both orders.
  void MoveFront(TierIndex& x, const Class& c, double old_time);
  // Takes empty class c, whose front was at old_time, out of both orders.
  void DropClass(TierIndex& x, int32_t cls, double old_time);

  HugeVector<Entry> entries_;  // [records] by record id, grown on demand
  std::vector<Class> classes_;  // [classes ever needed at once], by id
  std::vector<int32_t> free_classes_;
  TierIndex tiers_[kTiers];
  mutable uint64_t picks_ = 0, visits_ = 0;
};

}  // namespace mnemo
