#include "kv/block_allocator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "base/rng.h"
#include "kv/kv_storage.h"

namespace mnemo {
namespace {

TEST(BlockAllocator, AllocatesEveryBlockOnceThenFails) {
  BlockAllocator a(5);
  std::set<int32_t> got;
  for (int i = 0; i < 5; i++) got.insert(a.Allocate());
  EXPECT_EQ(got.size(), 5u);
  EXPECT_EQ(a.Allocate(), -1);
  EXPECT_EQ(a.num_free(), 0);
}

TEST(BlockAllocator, FreeReturnsBlocksInLruOrder) {
  BlockAllocator a(4);
  for (int i = 0; i < 4; i++) a.Allocate();
  a.Free(2);
  a.Free(0);
  a.Free(3);
  EXPECT_EQ(a.Allocate(), 2);
  EXPECT_EQ(a.Allocate(), 0);
  EXPECT_EQ(a.Allocate(), 3);
}

TEST(BlockAllocator, TakeRemovesFromTheMiddle) {
  BlockAllocator a(4);
  EXPECT_TRUE(a.Take(2));
  EXPECT_FALSE(a.Take(2));
  EXPECT_FALSE(a.IsFree(2));
  EXPECT_EQ(a.Allocate(), 0);
  EXPECT_EQ(a.Allocate(), 1);
  EXPECT_EQ(a.Allocate(), 3);
  EXPECT_EQ(a.Allocate(), -1);
}

TEST(BlockAllocator, RandomOperationsKeepCountsConsistent) {
  BlockAllocator a(64);
  std::vector<int32_t> held;
  Rng rng(3);
  for (int step = 0; step < 10000; step++) {
    uint64_t r = rng.Next() % 3;
    if (r == 0 && !held.empty()) {
      size_t i = rng.Next() % held.size();
      a.Free(held[i]);
      held.erase(held.begin() + i);
    } else if (r == 1) {
      int32_t id = int32_t(rng.Next() % 64);
      if (a.Take(id)) held.push_back(id);
    } else {
      int32_t id = a.Allocate();
      if (id >= 0) held.push_back(id);
    }
    ASSERT_EQ(a.num_free() + int(held.size()), 64);
  }
  std::sort(held.begin(), held.end());
  EXPECT_TRUE(std::adjacent_find(held.begin(), held.end()) == held.end());
}

TEST(KvStorage, LayersAreSeparateContiguousArrays) {
  KvShape s{3, 2, 8, DType::BF16};
  EXPECT_EQ(s.LayerBlockBytes(), size_t(2 * 2 * 32 * 8 * 2));
  KvStorage kv(s, 10);
  EXPECT_EQ(kv.bytes(), s.BlockBytes() * 10);
  EXPECT_EQ(static_cast<char*>(kv.block(1, 3)) - static_cast<char*>(kv.layer(1)),
            ptrdiff_t(3 * s.LayerBlockBytes()));
  EXPECT_NE(kv.layer(0), kv.layer(1));
}

}  // namespace
}  // namespace mnemo
