// Memory for large, long-lived, randomly read data (weights the kernels stream, the cache manager's
// chunk records, the victim index's entries and heaps, the block allocators' free lists), on
// transparent huge pages where the kernel gives them to regions that ask (`madvise` mode, the common
// default).
//
// Why: a weight-streaming GEMV read 256 MB at ~11 GB/s with 4 KB pages and ~20 GB/s with huge ones
// (one core; TLB-bound). At 262k chunk records that metadata is ~45 MB, and an admission that evicts 64 blocks
// touches a few hundred scattered lines of it. On 4 KB pages each of those is also a TLB miss,
// and in a virtual machine a page walk is two-dimensional; glibc's malloc on huge pages (its
// `glibc.malloc.hugetlb=1` tunable) measured ~15% off bench cache's p50 (docs/benchmarks.md §7f).
//
// An allocation of kHugeMin bytes or more is an anonymous mapping rounded up to and aligned on
// 2 MB and madvised MADV_HUGEPAGE: its first touch of each 2 MB faults in one huge page (zeroed,
// ~0.3 ms; a few ms when the kernel must compact memory first), instead of 512 small faults.
// Smaller allocations use operator new, 64-byte aligned (a cache line; what SIMD loads want): a
// huge page for a 100 KB vector would waste most of it.
// Where huge pages are off (`never`) or none can be had, the memory is ordinary pages.
#pragma once

#include <cstddef>
#include <new>
#include <vector>

namespace mnemo {

constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kHugeMin = kHugePage;
constexpr size_t kSmallAlign = 64;

// bytes of memory, aligned on kSmallAlign at least; on huge pages, and zeroed, when bytes >=
// kHugeMin. Throws std::bad_alloc when out of memory.
void* AllocHuge(size_t bytes);
// Frees what AllocHuge(bytes) returned (the same bytes).
void FreeHuge(void* p, size_t bytes) noexcept;

// A std allocator over AllocHuge, for vectors that grow large: HugeVector<T>.
template <typename T>
struct HugePageAllocator {
  using value_type = T;
  HugePageAllocator() = default;
  template <typename U>
  HugePageAllocator(const HugePageAllocator<U>&) noexcept {}
  T* allocate(size_t n) {
    static_assert(alignof(T) <= kSmallAlign);
    if (n > static_cast<size_t>(-1) / sizeof(T)) throw std::bad_alloc();
    return static_cast<T*>(AllocHuge(n * sizeof(T)));
  }
  void deallocate(T* p, size_t n) noexcept { FreeHuge(p, n * sizeof(T)); }
  template <typename U>
  bool operator==(const HugePageAllocator<U>&) const noexcept { return true; }
};

template <typename T>
using HugeVector = std::vector<T, HugePageAllocator<T>>;

}  // namespace mnemo
