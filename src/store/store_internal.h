// Helpers shared by the store's .cpp files. Not part of the store's API.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "store/store.h"

namespace mnemo::store_internal {

// Token logs are stored as BLOBs of little-endian int32, one BLOB per turn.
std::vector<uint8_t> EncodeTokens(std::span<const int32_t> tokens);  // [4 * n] bytes
// Appends the tokens of blob to out; false when the blob's size is not a multiple of 4.
bool DecodeTokens(std::span<const uint8_t> blob, std::vector<int32_t>& out);

// The id a NewItem gets: its own, or a fresh "msg_"/"item_" id by its JSON "type". Error when
// item_json is not a JSON object.
Result<std::string> ItemIdFor(const NewItem& item);

// One page of items (already in ascending position order) per options; Error when options.after
// names no item or options.limit is out of range.
Result<ItemPage> PageOf(std::vector<StoredItem> items, const ListOptions& options);

Status CheckLimit(const ListOptions& options);

// Whether a log of n tokens, marked up to its last full mark at m (0: none), has prefix marks to
// add (store.h): a chunk completed since m, or a short log (marked at its length). With m = a
// turn's begin and n its end: whether the turn's append must mark anything.
inline bool HasMarksToAdd(int64_t m, int64_t n) {
  return n / kPrefixChunk != m / kPrefixChunk || (n > 0 && n < kPrefixChunk);
}

}  // namespace mnemo::store_internal
