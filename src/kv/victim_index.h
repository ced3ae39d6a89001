// Eviction candidates filed for the policy, per tier, so that the cache manager finds the next
// victim without scanning its chunk records.
//
// A policy orders chunks by the key (Value(weight, idle), weight) (kv/eviction.h): the weight is
// fixed while a chunk sits idle, and Value is nondecreasing in the weight and in the time of last
// activity. Records of one tier with equal weight form a class; within a class, the record idle
// longest has the smallest key. So each tier keeps
//   - its classes in weight order, each holding its records in a min-heap by (last activity,
//     record id) (only the front is ever read; a heap in one array costs no allocation per record
//     and touches few cache lines: a record filed at the newest time, the common case, stays
//     at the bottom in O(1)), and
//   - the classes' fronts (their oldest record) by (last activity, weight),
// and Pick walks both orders at once (Fagin's threshold algorithm): after visiting class a in
// weight order and front b in time order, every class not visited yet has weight >= a's next and
// a front no older than b's next, so its key is >= (Value(a's weight, b's idle), a's weight); the
// walk stops when the best key seen is no greater. The answer is exact (the minimum key over every
// filed record; ties between equal keys go to either). Its cost is O(classes visited), at most the
// number of distinct weights in the tier: for Pensieve one per chunk position (context / 16), and
// often 1-3, since the lightest class's oldest record usually wins (bench cache, 4,096 sessions
// idle since distinct times, visits ~40 of 64); for LRU, whose Value is the time alone, the
// oldest front is the answer (one or two steps, more only on equal times).
// File and Unfile cost O(log n): a heap sift within the class and, when its front changes, an
// ordered-set update of the fronts.
//
// Not thread-safe: owned by the cache manager (the engine thread).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

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
  bool Filed(int32_t rec) const { return rec < static_cast<int32_t>(entries_.size()) && entries_[rec].tier >= 0; }
  size_t size(int tier) const { return tiers_[tier].size; }
  // The filed record of `tier` with the smallest policy key at `now`; -1 when none.
  int32_t Pick(int tier, double now, const EvictionPolicy& policy) const;
  // Internal consistency (class fronts, counts, back-references). For CheckInvariants.
  bool Check() const;
  // Searches made by Pick and the class fronts they looked at (both walks): the walk's length,
  // for benchmarks.
  uint64_t picks() const { return picks_; }
  uint64_t visits() const { return visits_; }

 private:
  struct Entry {
    int8_t tier = -1;  // -1: not filed
    int32_t pos = -1;  // its place in its class's heap
    double weight = 0;
    double last_active = 0;
  };
  struct Slot {
    double last_active;
    int32_t rec;
    bool operator<(const Slot& o) const { return last_active < o.last_active || (last_active == o.last_active && rec < o.rec); }
  };
  // One class's records, a binary min-heap by (last_active, rec): [0] is the oldest. Each record's
  // Entry::pos follows it.
  struct ByTime {
    std::vector<Slot> heap;
    bool empty() const { return heap.empty(); }
    size_t size() const { return heap.size(); }
    const Slot& front() const { return heap[0]; }
  };
  struct TierIndex {
    std::map<double, ByTime> classes;          // weight -> its records; never empty
    // {(front's last_active, weight, the class)}, one per class. The class pointer saves Pick a
    // lookup per step (map nodes do not move); weights are unique, so it never decides the order.
    std::set<std::tuple<double, double, const ByTime*>> fronts;
    size_t size = 0;                             // records filed
  };

  void SiftUp(ByTime& c, size_t i);
  void SiftDown(ByTime& c, size_t i);
  void Place(ByTime& c, size_t i, const Slot& s) {
    c.heap[i] = s;
    entries_[s.rec].pos = static_cast<int32_t>(i);
  }

  std::vector<Entry> entries_;  // [records] by record id, grown on demand
  TierIndex tiers_[kTiers];
  mutable uint64_t picks_ = 0, visits_ = 0;
};

}  // namespace mnemo
