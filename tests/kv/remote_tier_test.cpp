// The remote KV tier against a real Redis 7 server (tests/kv/redis_server.h): a put chunk comes
// back bit for bit into another storage; absent, corrupt and truncated values are misses; a dead
// or unreachable server fails fetches quickly and drops puts, and nothing waits past the timeouts;
// copies out of T0 (write-behind) go through the transfer thread into puts.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "kv/remote_tier.h"
#include "kv/transfer.h"
#include "redis_server.h"

namespace mnemo {
namespace {

using testing_util::RedisServer;

KvShape Shape() { return KvShape{2, 1, 4, DType::F32}; }  // 1 KB per layer block

// A model identity no other test of the run uses (keys name it).
uint64_t FreshModel() {
  static std::mt19937_64 rng(std::random_device{}());
  return rng();
}

RemoteTierConfig Config(const std::string& url) {
  RemoteTierConfig c;
  c.url = url;
  c.retry_s = 0.2;
  return c;
}

std::vector<int32_t> Tokens(int n, int32_t first) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

void FillBlock(KvStorage& s, int32_t b, uint8_t seed) {
  const size_t lb = s.shape().LayerBlockBytes();
  for (int l = 0; l < s.shape().n_layers; l++) {
    auto* p = static_cast<uint8_t*>(s.block(l, b));
    for (size_t i = 0; i < lb; i++) p[i] = static_cast<uint8_t>(seed + i * 13 + l);
  }
}

bool SameBlock(KvStorage& a, int32_t ba, KvStorage& b, int32_t bb) {
  const size_t lb = a.shape().LayerBlockBytes();
  for (int l = 0; l < a.shape().n_layers; l++) {
    if (std::memcmp(a.block(l, ba), b.block(l, bb), lb) != 0) return false;
  }
  return true;
}

// Fetches fills and waits (bounded) for all of them; (op, ok) by op order.
std::vector<bool> FetchAll(RemoteTier& tier, std::vector<RemoteFill> fills, double* seconds = nullptr) {
  const auto t0 = std::chrono::steady_clock::now();
  const size_t n = fills.size();
  uint64_t first = fills.empty() ? 0 : fills[0].op;
  tier.Fetch(std::move(fills));
  std::vector<bool> ok(n, false);
  size_t done = 0;
  while (done < n && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10)) {
    for (auto [op, good] : tier.TakeCompleted()) {
      ok[op - first] = good;
      done++;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(done, n);
  if (seconds) *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return ok;
}

// Waits (bounded) until the tier has stored `n` puts.
bool WaitPuts(RemoteTier& tier, int64_t n) {
  tier.Drain(5);
  return tier.stats().puts >= n;
}

class RemoteTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    redis_ = RedisServer::Shared(&why);
    if (!redis_) GTEST_SKIP() << why;
    space_ = RemoteKvSpace{FreshModel(), DType::F32, Shape().BlockBytes()};
  }
  RedisServer* redis_ = nullptr;
  RemoteKvSpace space_;
};

// Copies out of the tiers (CacheManager::PlanCopiesOut, dst kNone) on the transfer thread: each is
// an Offer of its T0 block, reported ok when queued or already put, not ok when dropped (so the
// cache manager plans it again) or when it names no chunk.
TEST_F(RemoteTierTest, CopiesOutOnTheTransferThreadBecomePuts) {
  KvStorage t0(Shape(), 4), back(Shape(), 4);
  FillBlock(t0, 0, 3);
  FillBlock(t0, 1, 7);
  const auto toks = Tokens(64, 500);
  auto collect = [](TransferEngine& te) {
    te.WaitIdle();
    std::map<uint64_t, bool> done;
    for (auto [id, ok] : te.TakeCompleted()) done[id] = ok;
    return done;
  };
  {
    auto tier = RemoteTier::Create(Config(redis_->url()), space_);
    ASSERT_TRUE(tier.ok());
    TransferEngine te(&t0, nullptr, nullptr, tier->get());
    const std::vector<TransferOp> ops = {{1, Tier::kT0, 0, Tier::kNone, -1, 7, 0}, {2, Tier::kT0, 1, Tier::kNone, -1, 7, 1},
                                         {3, Tier::kT0, 1, Tier::kNone, -1, 7, 1}, {4, Tier::kT0, 1, Tier::kNone, -1, 7, 1}};
    te.Submit(ops, {}, {RemoteChunkOf(toks, 0), RemoteChunkOf(toks, 1), RemoteChunkOf(toks, 1), std::nullopt});
    const auto done = collect(te);
    EXPECT_EQ(done, (std::map<uint64_t, bool>{{1, true}, {2, true}, {3, true}, {4, false}}))
        << "queued, queued, put already, no chunk named";
    ASSERT_TRUE(WaitPuts(**tier, 2));
    EXPECT_EQ((*tier)->stats().puts, 2);
    EXPECT_EQ(te.stats().bytes_out, 0) << "a copy out moves nothing between tiers";
  }
  auto ok = FetchAll(**RemoteTier::Create(Config(redis_->url()), space_),
                     {{1, RemoteChunkOf(toks, 0), &back, 2}, {2, RemoteChunkOf(toks, 1), &back, 3}});
  EXPECT_TRUE(ok[0] && ok[1]);
  EXPECT_TRUE(SameBlock(t0, 0, back, 2));
  EXPECT_TRUE(SameBlock(t0, 1, back, 3));

  // A queue too small for one value drops every put: reported not taken.
  RemoteTierConfig tiny = Config(redis_->url());
  tiny.max_queued_bytes = 16;
  auto dropping = RemoteTier::Create(tiny, RemoteKvSpace{FreshModel(), DType::F32, Shape().BlockBytes()});
  ASSERT_TRUE(dropping.ok());
  TransferEngine te(&t0, nullptr, nullptr, dropping->get());
  te.Submit({{9, Tier::kT0, 0, Tier::kNone, -1, 7, 0}}, {}, {RemoteChunkOf(toks, 0)});
  EXPECT_EQ(collect(te), (std::map<uint64_t, bool>{{9, false}}));
  EXPECT_EQ((*dropping)->stats().puts_dropped, 1);
}

TEST_F(RemoteTierTest, PutChunkComesBackBitForBitElsewhere) {
  KvStorage a(Shape(), 4), b(Shape(), 4);
  FillBlock(a, 1, 5);
  FillBlock(a, 2, 9);
  auto tier = RemoteTier::Create(Config(redis_->url()), space_);
  ASSERT_TRUE(tier.ok()) << tier.error().message;
  const auto toks = Tokens(96, 100);
  ASSERT_EQ((*tier)->Offer(RemoteChunkOf(toks, 0), a, 1), RemoteOffer::kQueued);
  ASSERT_EQ((*tier)->Offer(RemoteChunkOf(toks, 1), a, 2), RemoteOffer::kQueued);
  EXPECT_EQ((*tier)->Offer(RemoteChunkOf(toks, 1), a, 2), RemoteOffer::kKnown) << "a chunk put already is not put again";
  ASSERT_TRUE(WaitPuts(**tier, 2));

  // Another tier (another replica) of the same space reads them; chunk 2 was never put.
  auto other = RemoteTier::Create(Config(redis_->url()), space_);
  ASSERT_TRUE(other.ok());
  auto ok = FetchAll(**other, {{10, RemoteChunkOf(toks, 0), &b, 3}, {11, RemoteChunkOf(toks, 1), &b, 0},
                               {12, RemoteChunkOf(toks, 2), &b, 1}});
  EXPECT_TRUE(ok[0]);
  EXPECT_TRUE(ok[1]);
  EXPECT_FALSE(ok[2]);
  EXPECT_TRUE(SameBlock(a, 1, b, 3));
  EXPECT_TRUE(SameBlock(a, 2, b, 0));
  const RemoteStats s = (*other)->stats();
  EXPECT_EQ(s.gets, 3);
  EXPECT_EQ(s.hits, 2);
  EXPECT_EQ(s.misses, 1);
  EXPECT_EQ(s.bytes_read, 2 * static_cast<int64_t>(RemoteHeaderBytes() + space_.block_bytes));
  EXPECT_TRUE(s.available);
  EXPECT_EQ((*tier)->stats().puts, 2);

  // The same tokens in another model's space (or KV type) are another chunk.
  RemoteKvSpace f16 = space_;
  f16.model++;
  auto third = RemoteTier::Create(Config(redis_->url()), f16);
  ASSERT_TRUE(third.ok());
  EXPECT_FALSE(FetchAll(**third, {{1, RemoteChunkOf(toks, 0), &b, 2}})[0]);
}

TEST_F(RemoteTierTest, CorruptAndTruncatedValuesAreMisses) {
  KvStorage a(Shape(), 2), b(Shape(), 2);
  FillBlock(a, 0, 1);
  FillBlock(b, 1, 77);
  KvStorage before(Shape(), 2);
  FillBlock(before, 1, 77);
  auto tier = RemoteTier::Create(Config(redis_->url()), space_);
  ASSERT_TRUE(tier.ok());
  const auto toks = Tokens(64, 3);
  const RemoteChunkId c0 = RemoteChunkOf(toks, 0), c1 = RemoteChunkOf(toks, 1);
  ASSERT_EQ((*tier)->Offer(c0, a, 0), RemoteOffer::kQueued);
  ASSERT_EQ((*tier)->Offer(c1, a, 0), RemoteOffer::kQueued);
  ASSERT_TRUE(WaitPuts(**tier, 2));
  // Damage both values in place: cut one short, flip a byte of the other's payload.
  const std::string k0 = RemoteKey(space_, c0), k1 = RemoteKey(space_, c1);
  const std::string v1 = redis_->Run({"GET", k1});
  ASSERT_EQ(v1.size(), RemoteHeaderBytes() + space_.block_bytes);
  EXPECT_EQ(redis_->Run({"SETRANGE", k1, std::to_string(v1.size() - 5), std::string(1, static_cast<char>(v1[v1.size() - 5] ^ 0x40))}),
            std::to_string(v1.size()));
  const std::string v0 = redis_->Run({"GET", k0});
  EXPECT_EQ(redis_->Run({"SET", k0, v0.substr(0, v0.size() / 2)}), "OK");
  auto ok = FetchAll(**tier, {{1, c0, &b, 1}, {2, c1, &b, 1}});
  EXPECT_FALSE(ok[0]);
  EXPECT_FALSE(ok[1]);
  EXPECT_EQ((*tier)->stats().rejected, 2);
  EXPECT_TRUE(SameBlock(b, 1, before, 1)) << "a refused value never reaches the block";
}

TEST(RemoteTierDown, DeadServerFailsFastAndDropsPuts) {
  std::string why;
  auto redis = RedisServer::Private(&why);
  if (!redis) GTEST_SKIP() << why;
  const RemoteKvSpace space{FreshModel(), DType::F32, Shape().BlockBytes()};
  KvStorage a(Shape(), 2);
  FillBlock(a, 0, 3);
  auto tier = RemoteTier::Create(Config(redis->url()), space);
  ASSERT_TRUE(tier.ok());
  const auto toks = Tokens(64, 1);
  ASSERT_EQ((*tier)->Offer(RemoteChunkOf(toks, 0), a, 0), RemoteOffer::kQueued);
  ASSERT_TRUE(WaitPuts(**tier, 1));
  redis->Kill();
  double seconds = 0;
  auto ok = FetchAll(**tier, {{1, RemoteChunkOf(toks, 0), &a, 1}}, &seconds);
  EXPECT_FALSE(ok[0]);
  EXPECT_LT(seconds, 1.0) << "bounded by the command and connect timeouts";
  EXPECT_FALSE((*tier)->available());
  EXPECT_EQ((*tier)->Offer(RemoteChunkOf(toks, 1), a, 0), RemoteOffer::kDropped) << "puts are dropped while down";
  ok = FetchAll(**tier, {{2, RemoteChunkOf(toks, 0), &a, 1}}, &seconds);
  EXPECT_FALSE(ok[0]);
  EXPECT_LT(seconds, 0.1) << "while down, fetches fail without waiting";
  const RemoteStats s = (*tier)->stats();
  EXPECT_EQ(s.failed, 2);
  EXPECT_GE(s.puts_dropped, 1);
}

// A put that never reached Redis (the server was gone when the worker sent it) is not "put
// recently": once Redis is back, the same chunk offered again is taken and stored. (It stayed in
// the recent-key set, so that process never offered it again.)
TEST(RemoteTierDown, PutsLostWhileDownAreTakenAgainWhenBack) {
  std::string why;
  auto redis = RedisServer::Private(&why);
  if (!redis) GTEST_SKIP() << why;
  const RemoteKvSpace space{FreshModel(), DType::F32, Shape().BlockBytes()};
  KvStorage a(Shape(), 2);
  FillBlock(a, 0, 5);
  redis->Kill();
  auto tier = RemoteTier::Create(Config(redis->url()), space);
  ASSERT_TRUE(tier.ok());
  const auto toks = Tokens(64, 1);
  const RemoteChunkId id = RemoteChunkOf(toks, 0);
  EXPECT_EQ((*tier)->Offer(id, a, 0), RemoteOffer::kQueued) << "not known to be down yet";
  for (int i = 0; i < 100 && (*tier)->available(); i++) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_FALSE((*tier)->available()) << "the put found no server";
  ASSERT_TRUE(redis->Restart());
  RemoteOffer r = RemoteOffer::kDropped;
  for (int i = 0; i < 150 && r == RemoteOffer::kDropped; i++) {  // up to 3 s; reconnection every 0.2 s
    r = (*tier)->Offer(id, a, 0);
    if (r == RemoteOffer::kDropped) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(r, RemoteOffer::kQueued) << "the lost put is offered again, not skipped as known";
  ASSERT_TRUE(WaitPuts(**tier, 1));
  auto ok = FetchAll(**tier, {{1, id, &a, 1}});
  EXPECT_TRUE(ok[0]);
  EXPECT_TRUE(SameBlock(a, 1, a, 0));
}

TEST(RemoteTierDown, UnreachableServerIsBoundedByTheConnectTimeout) {
  const RemoteKvSpace space{FreshModel(), DType::F32, Shape().BlockBytes()};
  // 192.0.2.0/24 is TEST-NET-1: never routed, so a connection attempt hangs until its timeout
  // (or fails at once where the network refuses it).
  auto tier = RemoteTier::Create(Config("redis://192.0.2.1:6379"), space);
  ASSERT_TRUE(tier.ok());
  KvStorage a(Shape(), 1);
  double seconds = 0;
  auto ok = FetchAll(**tier, {{1, RemoteChunkOf(Tokens(32, 1), 0), &a, 0}}, &seconds);
  EXPECT_FALSE(ok[0]);
  EXPECT_LT(seconds, 1.0);
  EXPECT_FALSE((*tier)->available());
}

TEST(RemoteTierDown, BadUrlIsInvalidArgument) {
  auto tier = RemoteTier::Create(Config("http://localhost:6379"), RemoteKvSpace{1, DType::F32, 1024});
  ASSERT_FALSE(tier.ok());
  EXPECT_EQ(tier.error().code, StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace mnemo
