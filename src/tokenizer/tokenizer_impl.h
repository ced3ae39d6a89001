// Internal: the two tokenizer strategies behind Tokenizer::Create. Not part of the public API.
#pragma once

#include <memory>

#include "base/status.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/vocab.h"

namespace mnemo::internal {

// SentencePiece-style BPE with byte fallback (vocab.model == "llama"). The vocab is already checked
// by Tokenizer::Create for what both strategies share.
Result<std::unique_ptr<Tokenizer>> CreateSpmTokenizer(const Vocab& vocab);

// Byte-level BPE (vocab.model == "gpt2").
Result<std::unique_ptr<Tokenizer>> CreateBpeTokenizer(const Vocab& vocab);

// Merges adjacent symbols of one piece of text by priority, the core that both strategies share.
// Symbols start as the UTF-8 characters of the text; a byte that does not start a well-formed
// sequence is a symbol of its own. (llama.cpp splits by the lead byte alone, so a stray lead byte
// swallows the next bytes, e.g. "\xFF▁" becomes one symbol and its "▁" is decoded as the three bytes
// of U+2581 instead of a space. Identical for valid UTF-8; for invalid input ours is lossless.) A pair (left, right) may merge when `priority(left_text, right_text, &p)` returns true;
// the pair with the highest p merges first, ties go to the leftmost pair, and new pairs with the
// neighbours are considered after each merge (a priority queue with lazy invalidation: O(n log n)).
// Calls emit(text) for each final symbol, left to right.
template <class PriorityFn, class EmitFn>
void MergeSymbols(std::string_view text, PriorityFn&& priority, EmitFn&& emit);

}  // namespace mnemo::internal

#include "tokenizer/merge_symbols.inl"
