// The memory of one KV tier: per layer one contiguous array indexed by block id, so that one
// layer of a set of blocks can be moved on its own (layer-wise pipelined swap-in).
// Knows no model: only layer count, KV head count, head size and element type.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "base/block.h"
#include "base/dtype.h"

namespace mnemo {

struct KvShape {
  int n_layers = 0;    // transformer layers
  int n_kv_heads = 0;  // KV heads per layer
  int head_dim = 0;    // elements per head
  DType dtype = DType::F32;  // F32, F16 or BF16

  // Bytes of one block of one layer: 2 (K, V) * n_kv_heads * kBlockTokens * head_dim elements.
  size_t LayerBlockBytes() const;
  // Bytes of one block over all layers.
  size_t BlockBytes() const { return LayerBlockBytes() * n_layers; }
};

// Contents start zero. Memory is committed lazily: a block's pages become resident when first
// touched, so a large pool costs nothing until used.
class KvStorage {
 public:
  KvStorage(const KvShape& shape, int32_t n_blocks);
  KvStorage(const KvStorage&) = delete;
  KvStorage& operator=(const KvStorage&) = delete;

  const KvShape& shape() const { return shape_; }
  int32_t n_blocks() const { return n_blocks_; }
  size_t bytes() const { return shape_.BlockBytes() * n_blocks_; }

  // Base of layer l: [n_blocks, 2, n_kv_heads, kBlockTokens, head_dim] of shape().dtype.
  void* layer(int l) { return layers_[l].get(); }
  const void* layer(int l) const { return layers_[l].get(); }
  // Block b of layer l: [2, n_kv_heads, kBlockTokens, head_dim].
  void* block(int l, int32_t b) {
    return static_cast<char*>(layers_[l].get()) + shape_.LayerBlockBytes() * b;
  }

 private:
  struct Unmap {
    size_t bytes = 0;
    void operator()(void* p) const;
  };
  KvShape shape_;
  int32_t n_blocks_;
  // [n_layers] page-aligned anonymous mappings, zero until written; pages become resident on
  // first touch (construction is O(n_layers), not O(bytes))
  std::vector<std::unique_ptr<void, Unmap>> layers_;
};

}  // namespace mnemo
