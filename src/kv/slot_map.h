// Values under ids the map mints itself, found without hashing: an id is (sequence << kSlotBits) |
// slot, so it names its slot directly, stays unique over the map's life (a stale id is not found),
// and ids order by creation. Slots are reused through a free list; no allocation once the slot array
// has grown to the largest number held at once; ForEach visits the values held (a dense list of
// live slots), not every slot ever used. For the cache manager's transfers in flight, which
// were an unordered_map: a node allocation per transfer and a hash-bucket miss per lookup, on the
// engine thread's admission path (docs/benchmarks.md §7f).
//
// Not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "base/status.h"

namespace mnemo {

template <typename T>
class SlotMap {
 public:
  static constexpr int kSlotBits = 24;  // up to 16 M values at once

  // Stores a default T under a new id (never 0) and returns both.
  std::pair<uint64_t, T*> Emplace() {
    uint32_t slot;
    if (!free_.empty()) {
      slot = free_.back();
      free_.pop_back();
    } else {
      MNEMO_CHECK(slots_.size() < (size_t{1} << kSlotBits));
      slot = static_cast<uint32_t>(slots_.size());
      slots_.emplace_back();
    }
    Slot& s = slots_[slot];
    s.id = (next_seq_++ << kSlotBits) | slot;
    s.value = T{};
    s.live_pos = static_cast<uint32_t>(live_.size());
    live_.push_back(slot);
    return {s.id, &s.value};
  }
  T* Find(uint64_t id) {
    const size_t slot = id & kSlotMask;
    return id != 0 && slot < slots_.size() && slots_[slot].id == id ? &slots_[slot].value : nullptr;
  }
  const T* Find(uint64_t id) const { return const_cast<SlotMap*>(this)->Find(id); }
  // CHECKs that id is held.
  T& At(uint64_t id) {
    T* v = Find(id);
    MNEMO_CHECK(v != nullptr);
    return *v;
  }
  const T& At(uint64_t id) const { return const_cast<SlotMap*>(this)->At(id); }
  // CHECKs that id is held.
  void Erase(uint64_t id) {
    MNEMO_CHECK(Find(id) != nullptr);
    const uint32_t slot = static_cast<uint32_t>(id & kSlotMask);
    Slot& s = slots_[slot];
    s.id = 0;
    const uint32_t moved = live_.back();  // the last live slot takes this one's place in live_
    live_[s.live_pos] = moved;
    slots_[moved].live_pos = s.live_pos;
    live_.pop_back();
    free_.push_back(slot);
  }
  size_t size() const { return live_.size(); }
  bool empty() const { return live_.empty(); }
  // f(id, const T&) for every value held, in no particular order.
  template <typename F>
  void ForEach(F&& f) const {
    for (uint32_t slot : live_) f(slots_[slot].id, slots_[slot].value);
  }

 private:
  static constexpr uint64_t kSlotMask = (uint64_t{1} << kSlotBits) - 1;
  struct Slot {
    uint64_t id = 0;        // 0: free
    uint32_t live_pos = 0;  // its index in live_ while held
    T value{};
  };
  std::vector<Slot> slots_;
  std::vector<uint32_t> live_;  // the slots held
  std::vector<uint32_t> free_;  // the slots not held
  uint64_t next_seq_ = 1;
};

}  // namespace mnemo
