// Implementation of internal::MergeSymbols (included by tokenizer_impl.h).
#pragma once

#include <algorithm>
#include <cstdint>
#include <queue>
#include <string_view>
#include <vector>

#include "tokenizer/unicode.h"

namespace mnemo::internal {

template <class PriorityFn, class EmitFn>
void MergeSymbols(std::string_view text, PriorityFn&& priority, EmitFn&& emit) {
  // A symbol is a byte range of text; merged-away symbols keep len 0. Symbols stay contiguous: a
  // merge grows the left symbol over its right neighbour.
  struct Symbol {
    int32_t prev;    // index of the previous live symbol, -1 if none
    int32_t next;    // index of the next live symbol, -1 if none
    uint32_t start;  // byte offset in text
    uint32_t len;    // bytes; 0 once merged into its left neighbour
  };
  struct Pair {
    double priority;  // higher merges first
    int32_t left;     // symbol index; lower wins ties (leftmost)
    int32_t right;    // symbol index
    uint32_t len;     // bytes of left + right when queued; a mismatch later means the pair is stale
  };
  struct Lower {
    bool operator()(const Pair& a, const Pair& b) const {
      return a.priority < b.priority || (a.priority == b.priority && a.left > b.left);
    }
  };

  std::vector<Symbol> symbols;  // [n_chars]
  symbols.reserve(text.size());
  for (size_t off = 0; off < text.size();) {
    size_t end = off;
    uint32_t cp;
    const size_t len = DecodeUtf8(text, &end, &cp) ? end - off : 1;  // a stray byte is its own symbol
    const int32_t index = static_cast<int32_t>(symbols.size());
    symbols.push_back({index - 1, -1, static_cast<uint32_t>(off), static_cast<uint32_t>(len)});
    if (index > 0) symbols[index - 1].next = index;
    off += len;
  }
  const auto piece = [&](int32_t i) { return text.substr(symbols[i].start, symbols[i].len); };

  std::vector<Pair> storage;
  storage.reserve(symbols.size());
  std::priority_queue<Pair, std::vector<Pair>, Lower> queue(Lower{}, std::move(storage));
  const auto try_add = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    double p;
    if (!priority(piece(left), piece(right), &p)) return;
    queue.push({p, left, right, symbols[left].len + symbols[right].len});
  };
  for (int32_t i = 1; i < static_cast<int32_t>(symbols.size()); ++i) try_add(i - 1, i);

  while (!queue.empty()) {
    const Pair pair = queue.top();
    queue.pop();
    Symbol& left = symbols[pair.left];
    Symbol& right = symbols[pair.right];
    // Lengths only grow, so an unchanged sum means neither side has merged since the pair was queued.
    if (left.len == 0 || right.len == 0 || left.len + right.len != pair.len) continue;
    left.len += right.len;
    right.len = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = pair.left;
    try_add(left.prev, pair.left);
    try_add(pair.left, left.next);
  }

  for (int32_t i = symbols.empty() ? -1 : 0; i != -1; i = symbols[i].next) emit(piece(i));
}

}  // namespace mnemo::internal
