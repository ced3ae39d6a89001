#include "kv/transfer.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <string>

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

// A file written for another model (identity) is never read back: a restart on another model of the
// same shape must not serve the old model's KV.
TEST(DiskTier, AnotherIdentityDiscardsTheFile) {
  std::string dir = TempDir("identity");
  std::vector<char> buf(1000, 'x'), back(1000);
  const DiskSlotId id{1, 0, 32, 0x1};
  bool discarded = true;
  {
    auto t = DiskTier::Open(dir, 2, 1000, /*identity=*/111, &discarded);
    ASSERT_TRUE(t.ok());
    EXPECT_FALSE(discarded);  // a new file
    ASSERT_TRUE((*t)->Write(0, id, buf.data()).ok());
  }
  {
    auto same = DiskTier::Open(dir, 2, 1000, 111, &discarded);
    ASSERT_TRUE(same.ok());
    EXPECT_FALSE(discarded);
    EXPECT_EQ((*same)->Scan().size(), 1u);
  }
  auto other = DiskTier::Open(dir, 2, 1000, 222, &discarded);
  ASSERT_TRUE(other.ok());
  EXPECT_TRUE(discarded);
  EXPECT_TRUE((*other)->Scan().empty());
  EXPECT_FALSE((*other)->Read(0, id, back.data()).ok());
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


// A latch the transfer thread's copy hook waits on. A wait times out once (and says so, and opens
// the latch) so that a broken property fails the test instead of hanging it.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  bool timed_out = false;
  std::vector<std::string> log;  // copies in the order the transfer thread started them

  void Open() {
    {
      std::lock_guard<std::mutex> lock(mu);
      open = true;
    }
    cv.notify_all();
  }
  // Called with mu held.
  void WaitOpen(std::unique_lock<std::mutex>& lock) {
    if (!cv.wait_for(lock, std::chrono::seconds(10), [&] { return open; })) timed_out = open = true;
  }
  void Record(std::string what) {
    {
      std::lock_guard<std::mutex> lock(mu);
      log.push_back(std::move(what));
    }
    cv.notify_all();
  }
  bool WaitLogged(const std::string& what) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, std::chrono::seconds(10),
                       [&] { return std::find(log.begin(), log.end(), what) != log.end(); });
  }
  std::vector<std::string> Log() {
    std::lock_guard<std::mutex> lock(mu);
    return log;
  }
};

std::string Name(const CopyPoint& p) {
  if (p.kind == CopyPoint::Kind::kSwapInLayer) return "swap-in layer " + std::to_string(p.layer);
  if (p.kind == CopyPoint::Kind::kTask) return "task";
  return "op " + std::to_string((*p.ops)[0].id);
}

// Pipelining: layer 0 of a swap-in is usable while layer 1 has not even started copying (its copy
// is held in the hook until the reader has seen layer 0). A group that published its layers only
// at the end would return from WaitLayer(0) after the hook timed out, with layer 1 already copied.
TEST(Transfer, SwapInLayerZeroIsUsableWhileLaterLayersCopy) {
  KvStorage t0(kShape, 4), t1(kShape, 4);
  for (int b = 0; b < 4; b++) Fill(t1, b, 20 + b);
  Gate gate;
  TransferEngine te(&t0, &t1, nullptr);
  te.SetCopyHook([&](const CopyPoint& p) {
    gate.Record(Name(p));
    if (p.kind != CopyPoint::Kind::kSwapInLayer || p.layer == 0) return;
    std::unique_lock<std::mutex> lock(gate.mu);
    gate.WaitOpen(lock);
  });
  std::vector<TransferOp> ops;
  for (int b = 0; b < 3; b++) ops.push_back(TransferOp{uint64_t(b + 1), Tier::kT1, b, Tier::kT0, b, 1, b});
  auto g = te.SubmitSwapIns(ops);
  g->WaitLayer(0);
  const size_t lb = kShape.LayerBlockBytes();
  for (int b = 0; b < 3; b++) {
    EXPECT_EQ(std::memcmp(t0.block(0, b), t1.block(0, b), lb), 0) << "block " << b;
    EXPECT_NE(std::memcmp(t0.block(1, b), t1.block(1, b), lb), 0) << "layer 1 of block " << b << " landed with layer 0";
  }
  EXPECT_FALSE(g->done());
  EXPECT_TRUE(gate.WaitLogged("swap-in layer 1"));  // the copy of layer 1 is under way, held in the hook
  gate.Open();
  g->WaitLayer(kShape.n_layers - 1);
  EXPECT_TRUE(g->done());
  for (int b = 0; b < 3; b++) EXPECT_TRUE(Same(t0, b, t1, b));
  te.WaitIdle();
  EXPECT_FALSE(gate.timed_out);
  const std::vector<std::string> want{"swap-in layer 0", "swap-in layer 1", "swap-in layer 2", "swap-in layer 3"};
  EXPECT_EQ(gate.Log(), want);
}

// Priority: swap-outs queued before a swap-in do not delay it. The first swap-out is held in the
// hook until the swap-in is submitted (a copy in progress is not interrupted); every layer of the
// swap-in then lands before any of the other queued swap-outs starts, and completes first.
TEST(Transfer, QueuedSwapOutsDoNotDelayASwapIn) {
  KvStorage t0(kShape, 8), t1(kShape, 8);
  for (int b = 0; b < 4; b++) Fill(t0, b, 40 + b);
  for (int b = 4; b < 6; b++) Fill(t1, b, 40 + b);
  Gate gate;
  TransferEngine te(&t0, &t1, nullptr);
  te.SetCopyHook([&](const CopyPoint& p) {
    gate.Record(Name(p));
    if (Name(p) != "op 1") return;
    std::unique_lock<std::mutex> lock(gate.mu);
    gate.WaitOpen(lock);
  });
  std::vector<TransferOp> outs;  // T0 blocks 0..3 -> T1 blocks 0..3
  for (int b = 0; b < 4; b++) outs.push_back(TransferOp{uint64_t(b + 1), Tier::kT0, b, Tier::kT1, b, 1, b});
  te.Submit(outs, {});
  ASSERT_TRUE(gate.WaitLogged("op 1"));
  // T1 blocks 4, 5 -> T0 blocks 4, 5.
  auto g = te.SubmitSwapIns({TransferOp{10, Tier::kT1, 4, Tier::kT0, 4, 2, 0}, TransferOp{11, Tier::kT1, 5, Tier::kT0, 5, 2, 1}});
  gate.Open();
  g->WaitLayer(kShape.n_layers - 1);
  te.WaitIdle();
  EXPECT_FALSE(gate.timed_out);
  const std::vector<std::string> want{"op 1", "swap-in layer 0", "swap-in layer 1", "swap-in layer 2",
                                      "swap-in layer 3", "op 2", "op 3", "op 4"};
  EXPECT_EQ(gate.Log(), want);
  std::vector<uint64_t> order;
  for (const auto& [id, ok] : te.TakeCompleted()) order.push_back(id);
  EXPECT_EQ(order, (std::vector<uint64_t>{1, 10, 11, 2, 3, 4}));
  for (int b = 0; b < 4; b++) EXPECT_TRUE(Same(t1, b, t0, b));
  EXPECT_TRUE(Same(t0, 4, t1, 4));
  EXPECT_TRUE(Same(t0, 5, t1, 5));
}

// A task runs in submission order behind queued ops, after a swap-in group submitted before it
// (it reads what the group brought in), and is not reported as an op.
TEST(Transfer, TaskRunsAfterEarlierSwapIns) {
  KvStorage t0(kShape, 4), t1(kShape, 4);
  Fill(t1, 0, 77);
  Gate gate;
  TransferEngine te(&t0, &t1, nullptr);
  te.SetCopyHook([&](const CopyPoint& p) { gate.Record(Name(p)); });
  te.Submit({TransferOp{1, Tier::kT0, 3, Tier::kT1, 3, 1, 0}}, {});
  auto g = te.SubmitSwapIns({TransferOp{2, Tier::kT1, 0, Tier::kT0, 0, 1, 1}});
  bool saw_swap_in = false;
  auto task = te.SubmitTask([&] {
    saw_swap_in = Same(t0, 0, t1, 0);
    for (int l = 0; l < kShape.n_layers; l++) std::memcpy(t0.block(l, 1), t0.block(l, 0), kShape.LayerBlockBytes());
    return true;
  });
  te.WaitIdle();
  EXPECT_TRUE(task->done());
  EXPECT_TRUE(task->ok());
  EXPECT_TRUE(saw_swap_in);
  EXPECT_TRUE(Same(t0, 1, t1, 0));
  const std::vector<std::string> log = gate.Log();
  ASSERT_FALSE(log.empty());
  EXPECT_EQ(log.back(), "task");
  EXPECT_EQ(te.TakeCompleted().size(), 2u);  // ops 1 and 2
  auto failed = te.SubmitTask([] { return false; });
  te.WaitIdle();
  EXPECT_TRUE(failed->done());
  EXPECT_FALSE(failed->ok());
}

}  // namespace
}  // namespace mnemo
