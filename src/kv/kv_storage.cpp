#include "kv/kv_storage.h"

#include <sys/mman.h>

#include <new>

#include "base/status.h"

namespace mnemo {

size_t KvShape::LayerBlockBytes() const {
  return DTypeBytes(dtype, size_t(2) * n_kv_heads * kBlockTokens * head_dim);
}

void KvStorage::Unmap::operator()(void* p) const { munmap(p, bytes); }

// Anonymous private mappings: the kernel hands out zero pages on first touch, so construction
// costs O(layers) whatever the pool size, and resident memory grows with the blocks written
// (plus blocks merely read, which map the shared zero page). Zeroing eagerly cost ~57 s before
// /health answered for two 3.3 GB tiers (docs/benchmarks.md §7c). Page-aligned, so 64-byte aligned.
KvStorage::KvStorage(const KvShape& shape, int32_t n_blocks) : shape_(shape), n_blocks_(n_blocks) {
  MNEMO_CHECK(shape.dtype != DType::Q8_0);
  size_t bytes = shape.LayerBlockBytes() * n_blocks;
  if (bytes == 0) bytes = 64;
  for (int l = 0; l < shape.n_layers; l++) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    layers_.emplace_back(p, Unmap{bytes});
  }
}

}  // namespace mnemo
