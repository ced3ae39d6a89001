// The remote KV tier's names and values (model-free, no server): a key names everything a chunk's
// KV depends on, and a value decodes only as the chunk, model and type it was sealed for.
#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

#include "base/block.h"
#include "kv/redis_client.h"
#include "kv/remote_codec.h"

namespace mnemo {
namespace {

std::vector<int32_t> Tokens(int n, int32_t first = 1) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

RemoteKvSpace Space() { return RemoteKvSpace{0x1234abcdull, DType::BF16, 4096}; }

std::string Sealed(const RemoteKvSpace& space, const RemoteChunkId& id, char fill) {
  std::string v(RemoteHeaderBytes() + space.block_bytes, fill);
  SealRemoteValue(space, id, &v);
  return v;
}

TEST(RemoteCodec, KeyDependsOnEveryTokenUpToTheChunkAndNothingAfter) {
  const RemoteKvSpace space = Space();
  std::vector<int32_t> a = Tokens(100), b = Tokens(100);
  b[80] = 7;  // differs after chunk 1's end (64)
  EXPECT_EQ(RemoteKey(space, RemoteChunkOf(a, 1)), RemoteKey(space, RemoteChunkOf(b, 1)));
  EXPECT_NE(RemoteKey(space, RemoteChunkOf(a, 2)), RemoteKey(space, RemoteChunkOf(b, 2)));
  b[3] = 9;  // a token of chunk 0 changes every later chunk's key
  for (int c = 0; c < 3; c++) EXPECT_NE(RemoteKey(space, RemoteChunkOf(a, c)), RemoteKey(space, RemoteChunkOf(b, c))) << c;
  EXPECT_EQ(RemoteChunkOf(a, 2).end, 3 * kBlockTokens);
}

TEST(RemoteCodec, OnePassIdsEqualOneChunkIds) {
  const std::vector<int32_t> t = Tokens(32 * 5 + 7);
  const auto ids = RemoteChunksOf(t, 5);
  ASSERT_EQ(ids.size(), 5u);
  for (int c = 0; c < 5; c++) EXPECT_TRUE(ids[c] == RemoteChunkOf(t, c)) << c;
  EXPECT_TRUE(RemoteChunksOf(t, 0).empty());
}

TEST(RemoteCodec, KeyNamesModelTypeAndLayout) {
  const RemoteChunkId id = RemoteChunkOf(Tokens(32), 0);
  RemoteKvSpace s = Space();
  const std::string k = RemoteKey(s, id);
  EXPECT_EQ(k.rfind("mnemo:kv:" + std::to_string(kRemoteLayoutVersion) + ":", 0), 0u) << k;
  EXPECT_NE(k.find(":bf16:32:"), std::string::npos) << k;
  RemoteKvSpace other_model = s, other_type = s;
  other_model.model++;
  other_type.dtype = DType::F32;
  EXPECT_NE(RemoteKey(other_model, id), k);
  EXPECT_NE(RemoteKey(other_type, id), k);
}

TEST(RemoteCodec, SealedValueOpensToItsPayload) {
  const RemoteKvSpace space = Space();
  const RemoteChunkId id = RemoteChunkOf(Tokens(64), 1);
  std::string v(RemoteHeaderBytes() + space.block_bytes, '\0');
  for (size_t i = 0; i < space.block_bytes; i++) v[RemoteHeaderBytes() + i] = static_cast<char>(i * 31 + 7);
  SealRemoteValue(space, id, &v);
  auto p = OpenRemoteValue(space, id, v);
  ASSERT_TRUE(p.ok()) << p.error().message;
  ASSERT_EQ(p->size(), space.block_bytes);
  for (size_t i = 0; i < space.block_bytes; i++) ASSERT_EQ((*p)[i], static_cast<char>(i * 31 + 7)) << i;
}

TEST(RemoteCodec, BadValuesAreRefusedAsDataLoss) {
  const RemoteKvSpace space = Space();
  const RemoteChunkId id = RemoteChunkOf(Tokens(64), 1);
  const std::string good = Sealed(space, id, 'x');
  auto refused = [&](const RemoteKvSpace& sp, const RemoteChunkId& i, const std::string& v) {
    auto r = OpenRemoteValue(sp, i, v);
    return !r.ok() && r.error().code == StatusCode::kDataLoss;
  };
  EXPECT_TRUE(refused(space, id, good.substr(0, good.size() - 1)));  // truncated payload
  EXPECT_TRUE(refused(space, id, good.substr(0, 10)));               // truncated header
  EXPECT_TRUE(refused(space, id, ""));
  EXPECT_TRUE(refused(space, id, good + "y"));                       // trailing bytes
  std::string flipped = good;
  flipped[RemoteHeaderBytes() + 100] ^= 1;                           // a payload bit
  EXPECT_TRUE(refused(space, id, flipped));
  std::string header = good;
  header[12] ^= 1;                                                   // a header bit
  EXPECT_TRUE(refused(space, id, header));
  EXPECT_TRUE(refused(space, RemoteChunkOf(Tokens(64), 0), good));   // sealed for another chunk
  RemoteKvSpace other = space;
  other.model ^= 1;
  EXPECT_TRUE(refused(other, id, good));                             // another model
  other = space;
  other.dtype = DType::F16;
  EXPECT_TRUE(refused(other, id, good));                             // another KV type
  EXPECT_TRUE(OpenRemoteValue(space, id, good).ok());
}

TEST(RemoteCodec, ParsesRedisUrls) {
  auto u = ParseRedisUrl("redis://10.0.0.5:6380/3");
  ASSERT_TRUE(u.ok()) << u.error().message;
  EXPECT_EQ(u->host, "10.0.0.5");
  EXPECT_EQ(u->port, 6380);
  EXPECT_EQ(u->db, 3);
  u = ParseRedisUrl("redis://cache");
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->host, "cache");
  EXPECT_EQ(u->port, 6379);
  EXPECT_EQ(u->db, 0);
  for (const char* bad : {"http://h:1", "redis://", "redis://:6379", "redis://h:0", "redis://h:70000", "redis://h:x",
                          "redis://h:1/db", "redis://user:pw@h:1"}) {
    auto r = ParseRedisUrl(bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_EQ(r.error().code, StatusCode::kInvalidArgument) << bad;
    }
  }
}

}  // namespace
}  // namespace mnemo
