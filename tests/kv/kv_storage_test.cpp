// The KV pool's memory: zero until written, and committed lazily, so a pool sized for the
// machine costs nothing at start-up (mnemo serve's default tiers are gigabytes).
#include "kv/kv_storage.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>

namespace mnemo {
namespace {

// Resident set size of this process in bytes (/proc/self/statm, second field in pages).
size_t ResidentBytes() {
  std::ifstream in("/proc/self/statm");
  size_t total = 0, resident = 0;
  in >> total >> resident;
  return resident * static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

TEST(KvStorage, BlocksStartZeroAndHoldWhatIsWritten) {
  KvShape shape{2, 2, 16, DType::F32};
  KvStorage kv(shape, 8);
  ASSERT_EQ(kv.bytes(), shape.BlockBytes() * 8);
  for (int l = 0; l < shape.n_layers; l++) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(kv.layer(l)) % 64, 0u);
    const float* f = static_cast<const float*>(kv.layer(l));
    for (size_t i = 0; i < shape.LayerBlockBytes() * 8 / sizeof(float); i++) ASSERT_EQ(f[i], 0.0f);
  }
  std::memset(kv.block(1, 5), 0x3f, shape.LayerBlockBytes());
  EXPECT_EQ(static_cast<const unsigned char*>(kv.block(1, 5))[shape.LayerBlockBytes() - 1], 0x3f);
  EXPECT_EQ(static_cast<const unsigned char*>(kv.block(1, 4))[shape.LayerBlockBytes() - 1], 0);
  EXPECT_EQ(static_cast<const unsigned char*>(kv.block(0, 5))[0], 0);
}

// 16 GiB of pool (more than this machine's free memory, on purpose): constructing it is
// immediate and commits nothing; writing one block commits about that block.
TEST(KvStorage, MemoryIsCommittedOnFirstTouch) {
  KvShape shape{16, 8, 64, DType::BF16};  // 64 KiB per layer-block, 1 MiB per block
  const int32_t n_blocks = 16 * 1024;
  const size_t before = ResidentBytes();
  const auto t0 = std::chrono::steady_clock::now();
  KvStorage kv(shape, n_blocks);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(seconds, 0.5);  // eager zeroing of 16 GiB takes several seconds at best
  EXPECT_EQ(kv.bytes(), size_t(16) << 30);
  EXPECT_LT(ResidentBytes(), before + (size_t(64) << 20));
  for (int l = 0; l < shape.n_layers; l++) std::memset(kv.block(l, n_blocks - 1), 1, shape.LayerBlockBytes());
  const size_t after = ResidentBytes();
  EXPECT_GE(after + (size_t(64) << 20), before + shape.BlockBytes());
  EXPECT_LT(after, before + (size_t(64) << 20) + shape.BlockBytes());
  EXPECT_EQ(static_cast<const unsigned char*>(kv.block(7, n_blocks - 1))[100], 1);
}

}  // namespace
}  // namespace mnemo
