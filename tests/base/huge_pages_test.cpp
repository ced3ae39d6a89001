#include "base/huge_pages.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>

namespace mnemo {
namespace {

TEST(HugePages, LargeAllocationsAreAlignedWritableAndFreed) {
  for (size_t bytes : {kHugeMin, kHugePage + 1, 3 * kHugePage + 17}) {
    void* p = AllocHuge(bytes);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % kHugePage, 0u) << bytes;
    EXPECT_EQ(static_cast<unsigned char*>(p)[bytes / 2], 0) << bytes;  // zeroed
    std::memset(p, 0xab, bytes);
    EXPECT_EQ(static_cast<unsigned char*>(p)[bytes - 1], 0xab);
    FreeHuge(p, bytes);
  }
  void* small = AllocHuge(100);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(small) % kSmallAlign, 0u);
  FreeHuge(small, 100);
}

TEST(HugePages, VectorGrowsAcrossTheThreshold) {
  HugeVector<int64_t> v;
  for (int64_t i = 0; i < 600000; i++) v.push_back(i);  // 4.8 MB, reallocated from small to huge
  for (int64_t i = 0; i < 600000; i += 9973) ASSERT_EQ(v[i], i);
}

}  // namespace
}  // namespace mnemo
