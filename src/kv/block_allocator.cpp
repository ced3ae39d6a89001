#include "kv/block_allocator.h"

#include "base/status.h"

namespace mnemo {

BlockAllocator::BlockAllocator(int32_t n_blocks)
    : next_(n_blocks), prev_(n_blocks), free_(n_blocks, 1), n_free_(n_blocks) {
  for (int32_t i = 0; i < n_blocks; i++) {
    next_[i] = i + 1 < n_blocks ? i + 1 : kNil;
    prev_[i] = i - 1;
  }
  head_ = n_blocks > 0 ? 0 : kNil;
  tail_ = n_blocks > 0 ? n_blocks - 1 : kNil;
}

bool BlockAllocator::IsFree(int32_t id) const {
  return id >= 0 && id < capacity() && free_[id];
}

void BlockAllocator::Unlink(int32_t id) {
  if (prev_[id] != kNil) next_[prev_[id]] = next_[id]; else head_ = next_[id];
  if (next_[id] != kNil) prev_[next_[id]] = prev_[id]; else tail_ = prev_[id];
  free_[id] = 0;
  n_free_--;
}

int32_t BlockAllocator::Allocate() {
  if (head_ == kNil) return -1;
  int32_t id = head_;
  Unlink(id);
  return id;
}

bool BlockAllocator::Take(int32_t id) {
  if (!IsFree(id)) return false;
  Unlink(id);
  return true;
}

void BlockAllocator::Free(int32_t id) {
  MNEMO_CHECK(id >= 0 && id < capacity() && !free_[id]);
  prev_[id] = tail_;
  next_[id] = kNil;
  if (tail_ != kNil) next_[tail_] = id; else head_ = id;
  tail_ = id;
  free_[id] = 1;
  n_free_++;
}

}  // namespace mnemo
