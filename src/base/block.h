#pragma once

namespace mnemo {
// Token positions per KV block (one chunk): the unit of allocation, transfer and eviction.
constexpr int kBlockTokens = 32;
// Blocks that hold n positions.
constexpr int BlocksFor(int n) { return (n + kBlockTokens - 1) / kBlockTokens; }
}  // namespace mnemo
