#include "kv/transfer.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "base/rng.h"

namespace mnemo {
namespace {

std::string TempDir(const char* name) {
  auto p = std::filesystem::temp_directory_path() / (std::string("mnemo-") + name + "-" + std::to_string(getpid()));
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p.string();
}

void Fill(KvStorage& kv, int32_t block, uint64_t seed) {
  Rng rng(seed);
  for (int l = 0; l < kv.shape().n_layers; l++) {
    auto* p = static_cast<uint8_t*>(kv.block(l, block));
    for (size_t i = 0; i < kv.shape().LayerBlockBytes(); i++) p[i] = uint8_t(rng.Next());
  }
}

bool Same(KvStorage& a, int32_t ba, KvStorage& b, int32_t bb) {
  for (int l = 0; l < a.shape().n_layers; l++) {
    if (std::memcmp(a.block(l, ba), b.block(l, bb), a.shape().LayerBlockBytes()) != 0) return false;
  }
  return true;
}

const KvShape kShape{4, 2, 16, DType::F16};

TEST(DiskTier, RoundTripAndSurvivesReopen) {
  std::string dir = TempDir("disk");
  KvStorage kv(kShape, 2);
  Fill(kv, 0, 1);
  std::vector<char> buf(kShape.BlockBytes()), back(kShape.BlockBytes());
  for (int l = 0; l < 4; l++) std::memcpy(buf.data() + l * kShape.LayerBlockBytes(), kv.block(l, 0), kShape.LayerBlockBytes());
  DiskSlotId id{7, 3, 96, 0xabc};
  {
    auto t = DiskTier::Open(dir, 8, kShape.BlockBytes());
    ASSERT_TRUE(t.ok());
    ASSERT_TRUE((*t)->Write(5, id, buf.data()).ok());
    ASSERT_TRUE((*t)->Read(5, id, back.data()).ok());
    EXPECT_EQ(buf, back);
    EXPECT_FALSE((*t)->Read(5, DiskSlotId{7, 4, 96, 0xabc}, back.data()).ok());  // another chunk
    EXPECT_FALSE((*t)->Read(4, id, back.data()).ok());                       // empty slot
  }
  auto t = DiskTier::Open(dir, 8, kShape.BlockBytes());
  ASSERT_TRUE(t.ok());
  auto entries = (*t)->Scan();
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0].slot, 5);
  EXPECT_EQ(entries[0].id.session, 7);
  EXPECT_EQ(entries[0].id.chunk, 3);
  ASSERT_TRUE((*t)->Read(5, id, back.data()).ok());
  EXPECT_EQ(buf, back);
  // Another geometry discards the file.
  auto other = DiskTier::Open(dir, 9, kShape.BlockBytes());
  ASSERT_TRUE(other.ok());
  EXPECT_TRUE((*other)->Scan().empty());
  std::filesystem::remove_all(dir);
}

TEST(DiskTier, CorruptPayloadIsDetected) {
  std::string dir = TempDir("corrupt");
  auto t = DiskTier::Open(dir, 2, 1000);
  ASSERT_TRUE(t.ok());
  std::vector<char> buf(1000, 'x');
  DiskSlotId id{1, 0, 32, 42};
  ASSERT_TRUE((*t)->Write(1, id, buf.data()).ok());
  int fd = open((dir + "/kv-t2.bin").c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  char c = 'y';
  // Slot 1 starts after the file header page and slot 0 (4 KiB each); flip a payload byte.
  ASSERT_EQ(pwrite(fd, &c, 1, 4096 + 4096 + 64 + 500), 1);
  close(fd);
  EXPECT_FALSE((*t)->Read(1, id, buf.data()).ok());
  std::filesystem::remove_all(dir);
}

TEST(Transfer, SwapInGroupLandsLayerByLayer) {
  KvStorage t0(kShape, 4), t1(kShape, 4);
  for (int b = 0; b < 4; b++) Fill(t1, b, 10 + b);
  TransferEngine te(&t0, &t1, nullptr);
  std::vector<TransferOp> ops;
  for (int b = 0; b < 3; b++) ops.push_back(TransferOp{uint64_t(b + 1), Tier::kT1, b, Tier::kT0, 3 - b, 1, b});
  auto g = te.SubmitSwapIns(ops);
  for (int l = 0; l < kShape.n_layers; l++) {
    g->WaitLayer(l);
    for (int b = 0; b < 3; b++) {
      EXPECT_EQ(std::memcmp(t0.block(l, 3 - b), t1.block(l, b), kShape.LayerBlockBytes()), 0);
    }
  }
  te.WaitIdle();
  EXPECT_EQ(te.TakeCompleted().size(), 3u);
  EXPECT_EQ(te.stats().bytes_in, int64_t(3 * kShape.BlockBytes()));
}

TEST(Transfer, BackgroundCopiesThroughDisk) {
  std::string dir = TempDir("transfer");
  auto disk = DiskTier::Open(dir, 4, kShape.BlockBytes());
  ASSERT_TRUE(disk.ok());
  KvStorage t0(kShape, 2), t1(kShape, 2);
  Fill(t0, 0, 99);
  TransferEngine te(&t0, &t1, disk->get());
  DiskSlotId id{1, 0, 32, 5};
  te.Submit({TransferOp{1, Tier::kT0, 0, Tier::kT1, 1, 1, 0}, TransferOp{2, Tier::kT1, 1, Tier::kT2, 2, 1, 0}},
            {id, id});
  te.WaitIdle();
  te.Submit({TransferOp{3, Tier::kT2, 2, Tier::kT0, 1, 1, 0}, TransferOp{4, Tier::kT2, 3, Tier::kT0, 0, 1, 1}},
            {id, DiskSlotId{1, 1, 64, 5}});
  te.WaitIdle();
  auto done = te.TakeCompleted();
  ASSERT_EQ(done.size(), 4u);
  EXPECT_TRUE(done[0].second && done[1].second && done[2].second);
  EXPECT_FALSE(done[3].second);  // slot 3 was never written
  EXPECT_TRUE(Same(t0, 0, t0, 1));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace mnemo
