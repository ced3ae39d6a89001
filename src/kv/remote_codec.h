// The remote KV tier's data format (Redis; remote_tier.h): how a full 32-token chunk is named and
// how its KV is stored, so that replicas of one model share a chunk, and a value that does not
// verify is never used.
//
// Content-addressed: a chunk's KV depends on every token up to and including the chunk (causal
// attention), on the model (weights, vocabulary, arithmetic), the KV element type and the block
// layout, and on nothing else. So the key names exactly those:
//     mnemo:kv:<layout>:<model, 16 hex>:<dtype>:<end>:<XXH3-128 of tokens [0, end), 32 hex>
// where end = (chunk + 1) * 32. Two conversations that begin with the same system prompt, on any
// replica, name its chunks alike. Only full chunks are stored (a partial chunk is still written).
//
// The value is a header and the block's KV as KvStorage lays it out, layer after layer
// ([n_layers][2][n_kv_heads][32][head_dim], `space.block_bytes` in all). The header repeats what
// the key names and carries an XXH3-64 of the payload and of itself, as the disk tier's slots do:
// a value that is truncated, corrupt, or names another chunk, model or type decodes as an error
// (kDataLoss), which the reader treats as a miss. Host byte order: replicas share one architecture.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/dtype.h"
#include "base/status.h"

namespace mnemo {

// Bump when the block layout (kv_storage.h) or this format changes: older values are then never
// named again (and age out of Redis).
inline constexpr uint32_t kRemoteLayoutVersion = 1;

// What a chunk's KV depends on besides its tokens.
struct RemoteKvSpace {
  uint64_t model = 0;             // the model's identity (weights, vocabulary, precision): EngineConfig::kv_identity
  DType dtype = DType::F32;       // KV element type
  size_t block_bytes = 0;         // payload bytes: KvShape::BlockBytes()
};

// A full chunk, by the tokens its KV depends on.
struct RemoteChunkId {
  int32_t end = 0;        // (chunk + 1) * kBlockTokens: the tokens [0, end) hashed
  uint64_t hash_lo = 0;   // XXH3-128 of those tokens (as int32 ids)
  uint64_t hash_hi = 0;
  bool operator==(const RemoteChunkId&) const = default;
};

// Chunk `chunk` of a token sequence; tokens must hold at least (chunk + 1) * kBlockTokens ids.
// Cost: hashing (chunk + 1) * 32 ids (~10 GB/s).
RemoteChunkId RemoteChunkOf(std::span<const int32_t> tokens, int chunk);

// Chunks [0, n_chunks) of a token sequence in one pass (each equals RemoteChunkOf's); tokens must
// hold at least n_chunks * kBlockTokens ids. Cost: hashing n_chunks * 32 ids once.
std::vector<RemoteChunkId> RemoteChunksOf(std::span<const int32_t> tokens, int n_chunks);

// The Redis key of a chunk in a space.
std::string RemoteKey(const RemoteKvSpace& space, const RemoteChunkId& id);

// Bytes before the payload in a value.
size_t RemoteHeaderBytes();
// Makes a value for `id` around a payload already written at value->data() + RemoteHeaderBytes()
// (value->size() must be RemoteHeaderBytes() + space.block_bytes): fills in the header and its
// checksums. Cost: one hash pass over the payload.
void SealRemoteValue(const RemoteKvSpace& space, const RemoteChunkId& id, std::string* value);
// Checks that `value` is a sealed value of chunk `id` in `space` whose payload verifies; returns
// the payload (a view into value). Errors (kDataLoss): too short or long, bad header, another
// chunk, model, type or layout, or a payload that fails its checksum.
Result<std::string_view> OpenRemoteValue(const RemoteKvSpace& space, const RemoteChunkId& id, std::string_view value);

}  // namespace mnemo
