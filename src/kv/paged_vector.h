// A growable array whose elements never move: pages of 256 elements, found with one shift and a
// mask. Small pages spread the cost of growth (a 4,096-record page, 420 KB zeroed and faulted in at
// once, was every 64th admission of bench cache and doubled its p99); at 262k records the page
// table is 8 KB and stays in cache. For the cache manager's chunk records, which were a std::deque (stable, but 4 records of
// ~100 bytes per 512-byte deque block: at 262k records a 512 KB block map whose lookups were a
// second cache miss on every record touched by an eviction; docs/benchmarks.md §7f).
//
// Not thread-safe.
#pragma once

#include <cstddef>
#include <new>
#include <vector>

#include "base/huge_pages.h"

namespace mnemo {

template <typename T>
class PagedVector {
 public:
  static constexpr int kPageBits = 8;

  PagedVector() = default;
  PagedVector(const PagedVector&) = delete;
  PagedVector& operator=(const PagedVector&) = delete;
  ~PagedVector() {
    for (T* page : pages_)
      for (size_t i = 0; i < kPage; ++i) page[i].~T();
    for (char* r : regions_) FreeHuge(r, kRegionBytes);
  }

  size_t size() const { return size_; }
  T& operator[](size_t i) { return pages_[i >> kPageBits][i & kMask]; }
  const T& operator[](size_t i) const { return pages_[i >> kPageBits][i & kMask]; }
  // Appends a default T and returns it.
  T& emplace_back() {
    if ((size_ >> kPageBits) == pages_.size()) AddPage();
    T& t = (*this)[size_++];
    t = T{};
    return t;
  }

 private:
  static constexpr size_t kPage = size_t{1} << kPageBits;
  static constexpr size_t kMask = kPage - 1;
  static constexpr size_t kPageBytes = (kPage * sizeof(T) + alignof(std::max_align_t) - 1) &
                                       ~(alignof(std::max_align_t) - 1);
  static constexpr size_t kPagesPerRegion = kHugePage >= kPageBytes ? kHugePage / kPageBytes : 1;
  // Whole huge pages (AllocHuge maps nothing smaller than kHugeMin on huge pages).
  static constexpr size_t kRegionBytes = (kPagesPerRegion * kPageBytes + kHugePage - 1) / kHugePage * kHugePage;

  void AddPage() {
    if (pages_.size() % kPagesPerRegion == 0) {
      regions_.push_back(nullptr);  // room first: the push below cannot throw after the mapping
      regions_.back() = static_cast<char*>(AllocHuge(kRegionBytes));
    }
    char* at = regions_.back() + (pages_.size() % kPagesPerRegion) * kPageBytes;
    pages_.reserve(pages_.size() + 1);
    T* page = reinterpret_cast<T*>(at);
    for (size_t i = 0; i < kPage; ++i) new (page + i) T();
    pages_.push_back(page);
  }

  std::vector<char*> regions_;  // kRegionBytes each, from AllocHuge
  std::vector<T*> pages_;       // kPage elements each, constructed, inside regions_
  size_t size_ = 0;
};

}  // namespace mnemo
