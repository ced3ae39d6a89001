// Internal to src/kernels/cpu: heap memory for weights that kernels stream.
#pragma once

#include <cstddef>
#include <memory>

namespace mnemo::kernels::detail {

// Zero-initialised memory from base/huge_pages.h: from 2 MiB on, on transparent huge pages (a
// weight-streaming GEMV is TLB-bound on 4 KiB pages); 64-byte aligned below. Move-only; no copies
// of big buffers.
class HugeBuffer {
 public:
  HugeBuffer() = default;
  explicit HugeBuffer(size_t bytes);
  template <class T>
  T* as() const {
    return static_cast<T*>(p_.get());
  }
  size_t size() const { return bytes_; }  // bytes requested

 private:
  struct Free {
    size_t bytes;  // (no initialiser: GCC cannot use one of a nested class inside its enclosing class)
    void operator()(void* p) const;
  };
  std::unique_ptr<void, Free> p_;
  size_t bytes_ = 0;
};

}  // namespace mnemo::kernels::detail
