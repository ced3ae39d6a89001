// A dumb preallocated allocator of block ids [0, n_blocks): a free list threaded through one array
// of links (doubly linked), so any free block can also be taken out of the middle in O(1). A
// block's links sit in one 8-byte entry, so freeing or taking one touches one cache line (three
// separate arrays cost three misses per block at 131k blocks; docs/benchmarks.md §7f).
// Not thread-safe: owned by the one thread that owns cache metadata.
#pragma once

#include <cstdint>
#include <vector>

#include "base/huge_pages.h"

namespace mnemo {

class BlockAllocator {
 public:
  explicit BlockAllocator(int32_t n_blocks);

  int32_t capacity() const { return static_cast<int32_t>(links_.size()); }
  int32_t num_free() const { return n_free_; }
  bool IsFree(int32_t id) const;

  // Takes the block that has been free the longest; -1 when none is free.
  int32_t Allocate();
  // Takes a specific free block (e.g. to revive a cached one). Returns false if it is not free.
  bool Take(int32_t id);
  // Returns an allocated block to the back of the free list. CHECKs that it was allocated.
  void Free(int32_t id);

 private:
  void Unlink(int32_t id);
  static constexpr int32_t kNil = -1;
  static constexpr int32_t kTaken = -2;  // prev of an allocated block
  struct Link {
    int32_t next;  // next free block, kNil at the tail; unused when allocated
    int32_t prev;  // previous free block, kNil at the head; kTaken when allocated
  };
  HugeVector<Link> links_;  // [n_blocks]
  int32_t head_ = kNil;      // oldest free block
  int32_t tail_ = kNil;      // newest free block
  int32_t n_free_ = 0;
};

}  // namespace mnemo
