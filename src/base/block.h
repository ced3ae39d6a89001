#pragma once

namespace mnemo {
// Token positions per KV block (one chunk): the unit of allocation, transfer and eviction.
constexpr int kBlockTokens = 32;
}  // namespace mnemo
