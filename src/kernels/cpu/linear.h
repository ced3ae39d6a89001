// Linear layers y = x W^T on the CPU, for every weight dtype, prefill and decode alike.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "base/dtype.h"

namespace mnemo::kernels {

// The arithmetic a Linear uses.
enum class Precision {
  kF32,   // exact path: weights expanded to f32 values, f32 products and sums (golden tests)
  kBF16,  // fast path: activations rounded to bf16, bf16 weights, f32 accumulation.
          // With block-type weights (Q8_0, Q4_K, ...) the activations are instead quantised to
          // int8 per 32-block (d = max|x| / 127, as llama.cpp's q8_0 dot) and multiplied with
          // VNNI against the weights kept at their file size (gemv.h, gemv_quant.h).
};

// A weight matrix W, row-major [out, in], prepared once for repeated y = x W^T.
// Thread-safety: Forward is const and may be called from one thread at a time per call site;
// it uses NumThreads() OpenMP threads itself.
class Linear {
 public:
  // src: row-major [out, in] of dtype t, any DType; `in` is a multiple of DTypeBlockElems(t)
  // (32 or 256 for the block types; the model loader checks this for user files). Create copies
  // the weights into the Linear's own layout (f32, blocked bf16 or int8 panels, on huge pages),
  // so src may be freed as soon as it returns.
  static Linear Create(DType t, const void* src, int out, int in, Precision p);

  Linear();
  ~Linear();
  Linear(Linear&&) noexcept;
  Linear& operator=(Linear&&) noexcept;
  Linear(const Linear&) = delete;
  Linear& operator=(const Linear&) = delete;

  // x: [n, in] f32 row-major -> y: [n, out] f32 row-major. n >= 1. Small n (decode) takes a
  // memory-bound GEMV-style kernel; large n a compute-bound GEMM (oneDNN; q8_0: VNNI kernel).
  void Forward(const float* x, int n, float* y) const;

  int out() const;
  int in() const;
  // Bytes of weight data read per Forward (for bandwidth accounting).
  size_t weight_bytes() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace mnemo::kernels
