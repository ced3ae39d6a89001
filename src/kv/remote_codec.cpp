#include "kv/remote_codec.h"

#include <xxhash.h>

#include <cstddef>
#include <cstdio>
#include <cstring>

#include "base/block.h"

namespace mnemo {
namespace {

constexpr uint64_t kValueMagic = 0x3152564f4d454e4dull;  // "MNEMOVR1"

struct ValueHeader {
  uint64_t magic;
  uint32_t layout;
  uint32_t dtype;
  uint64_t model;
  uint64_t hash_lo;
  uint64_t hash_hi;
  int64_t end;
  uint64_t payload_bytes;
  uint64_t payload_hash;  // XXH3-64 of the payload
  uint64_t header_hash;   // XXH3-64 of the fields above
};

uint64_t HeaderHash(const ValueHeader& h) { return XXH3_64bits(&h, offsetof(ValueHeader, header_hash)); }

Error Corrupt(const char* why) { return MakeError(StatusCode::kDataLoss, "remote KV value: %s", why); }

}  // namespace

RemoteChunkId RemoteChunkOf(std::span<const int32_t> tokens, int chunk) {
  RemoteChunkId id;
  id.end = (chunk + 1) * kBlockTokens;
  MNEMO_CHECK(chunk >= 0 && static_cast<size_t>(id.end) <= tokens.size());
  const XXH128_hash_t h = XXH3_128bits(tokens.data(), sizeof(int32_t) * static_cast<size_t>(id.end));
  id.hash_lo = h.low64;
  id.hash_hi = h.high64;
  return id;
}

std::vector<RemoteChunkId> RemoteChunksOf(std::span<const int32_t> tokens, int n_chunks) {
  MNEMO_CHECK(n_chunks >= 0 && static_cast<size_t>(n_chunks) * kBlockTokens <= tokens.size());
  std::vector<RemoteChunkId> out(n_chunks);
  if (n_chunks == 0) return out;
  XXH3_state_t* st = XXH3_createState();
  XXH3_128bits_reset(st);
  for (int c = 0; c < n_chunks; c++) {
    XXH3_128bits_update(st, tokens.data() + static_cast<size_t>(c) * kBlockTokens, sizeof(int32_t) * kBlockTokens);
    const XXH128_hash_t h = XXH3_128bits_digest(st);  // of everything so far; the state goes on
    out[c] = RemoteChunkId{(c + 1) * kBlockTokens, h.low64, h.high64};
  }
  XXH3_freeState(st);
  return out;
}

std::string RemoteKey(const RemoteKvSpace& space, const RemoteChunkId& id) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "mnemo:kv:%u:%016llx:%s:%d:%016llx%016llx", kRemoteLayoutVersion,
                static_cast<unsigned long long>(space.model), DTypeName(space.dtype), id.end,
                static_cast<unsigned long long>(id.hash_hi), static_cast<unsigned long long>(id.hash_lo));
  return buf;
}

size_t RemoteHeaderBytes() { return sizeof(ValueHeader); }

void SealRemoteValue(const RemoteKvSpace& space, const RemoteChunkId& id, std::string* value) {
  MNEMO_CHECK(value->size() == sizeof(ValueHeader) + space.block_bytes);
  ValueHeader h{};
  h.magic = kValueMagic;
  h.layout = kRemoteLayoutVersion;
  h.dtype = static_cast<uint32_t>(space.dtype);
  h.model = space.model;
  h.hash_lo = id.hash_lo;
  h.hash_hi = id.hash_hi;
  h.end = id.end;
  h.payload_bytes = space.block_bytes;
  h.payload_hash = XXH3_64bits(value->data() + sizeof h, space.block_bytes);
  h.header_hash = HeaderHash(h);
  std::memcpy(value->data(), &h, sizeof h);
}

Result<std::string_view> OpenRemoteValue(const RemoteKvSpace& space, const RemoteChunkId& id, std::string_view value) {
  ValueHeader h;
  if (value.size() < sizeof h) return Corrupt("shorter than its header");
  std::memcpy(&h, value.data(), sizeof h);
  if (h.magic != kValueMagic || h.header_hash != HeaderHash(h)) return Corrupt("bad header");
  if (h.layout != kRemoteLayoutVersion || h.dtype != static_cast<uint32_t>(space.dtype) || h.model != space.model ||
      h.payload_bytes != space.block_bytes) {
    return Corrupt("made for another model, KV type or layout");
  }
  if (h.end != id.end || h.hash_lo != id.hash_lo || h.hash_hi != id.hash_hi) return Corrupt("names another chunk");
  if (value.size() != sizeof h + space.block_bytes) return Corrupt("truncated");
  std::string_view payload = value.substr(sizeof h);
  if (XXH3_64bits(payload.data(), payload.size()) != h.payload_hash) return Corrupt("payload fails its checksum");
  return payload;
}

}  // namespace mnemo
