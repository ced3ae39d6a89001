#include "kv/block_allocator.h"

#include "base/status.h"

namespace mnemo {

BlockAllocator::BlockAllocator(int32_t n_blocks) : links_(n_blocks), n_free_(n_blocks) {
  for (int32_t i = 0; i < n_blocks; i++) links_[i] = Link{i + 1 < n_blocks ? i + 1 : kNil, i - 1};
  head_ = n_blocks > 0 ? 0 : kNil;
  tail_ = n_blocks > 0 ? n_blocks - 1 : kNil;
}

bool BlockAllocator::IsFree(int32_t id) const {
  return id >= 0 && id < capacity() && links_[id].prev != kTaken;
}

void BlockAllocator::Unlink(int32_t id) {
  Link& l = links_[id];
  if (l.prev != kNil) links_[l.prev].next = l.next; else head_ = l.next;
  if (l.next != kNil) links_[l.next].prev = l.prev; else tail_ = l.prev;
  l.prev = kTaken;
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
  MNEMO_CHECK(id >= 0 && id < capacity() && links_[id].prev == kTaken);
  links_[id] = Link{kNil, tail_};
  if (tail_ != kNil) links_[tail_].next = id; else head_ = id;
  tail_ = id;
  n_free_++;
}

}  // namespace mnemo
