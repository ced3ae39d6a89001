#include "kv/kv_storage.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include "base/status.h"

namespace mnemo {

size_t KvShape::LayerBlockBytes() const {
  return DTypeBytes(dtype, size_t(2) * n_kv_heads * kBlockTokens * head_dim);
}

void KvStorage::FreeDeleter::operator()(void* p) const { std::free(p); }

KvStorage::KvStorage(const KvShape& shape, int32_t n_blocks) : shape_(shape), n_blocks_(n_blocks) {
  MNEMO_CHECK(shape.dtype != DType::Q8_0);
  size_t bytes = shape.LayerBlockBytes() * n_blocks;
  bytes = (bytes + 63) / 64 * 64;
  for (int l = 0; l < shape.n_layers; l++) {
    void* p = std::aligned_alloc(64, bytes ? bytes : 64);
    if (!p) throw std::bad_alloc();
    std::memset(p, 0, bytes);
    layers_.emplace_back(p);
  }
}

}  // namespace mnemo
