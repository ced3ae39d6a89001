// Internal to src/kernels/cpu: heap memory for weights that kernels stream.
#pragma once

#include <cstddef>
#include <memory>

namespace mnemo::kernels::detail {

// Zero-initialised memory; from 2 MiB on, 2 MiB aligned and advised for transparent huge pages. With 4 KiB pages a
// weight-streaming GEMV on this machine is TLB-bound: one core read 256 MB at ~11 GB/s with
// small pages and ~20 GB/s with huge ones. Move-only; no copies of big buffers.
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
    void operator()(void* p) const;
  };
  std::unique_ptr<void, Free> p_;
  size_t bytes_ = 0;
};

}  // namespace mnemo::kernels::detail
