// Internal to src/kernels/cpu: the row split shared by the row-wise kernels.
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/cpu.h"
#include "base/thread_pool.h"

namespace mnemo::kernels::detail {

// Runs fn(i0, i1) over rows [0, n), one contiguous range per thread, in parallel once the rows
// hold enough elements (~64 K) to pay for handing them out; otherwise fn(0, n) on the caller.
template <class Fn>
void ForRowRanges(int n, size_t row_elems, Fn fn) {
  const int threads = NumThreads();
  if (threads == 1 || n < 2 || size_t(n) * row_elems < (size_t(1) << 16)) return fn(0, n);
  ThreadPool::Get().For(threads, [&](int t) {
    const int i0 = int(int64_t(n) * t / threads), i1 = int(int64_t(n) * (t + 1) / threads);
    if (i1 > i0) fn(i0, i1);
  });
}

}  // namespace mnemo::kernels::detail
