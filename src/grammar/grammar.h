// Context-free grammars over bytes: the form every output constraint is compiled to (JSON Schema,
// json_object, a raw grammar from a request, later tool calls).
//
// Text form (GBNF-like; also the `grammar` request extension, docs/api.md):
//   root   ::= "{" ws pair ( "," ws pair )* "}"      # a rule: name ::= alternatives
//   pair   ::= name ws ":" ws [0-9]+ ws
//   name   ::= "\"" [a-z_]{1,16} "\""
//   ws     ::= | " " | "\n" [ \t]{0,20}               # an empty alternative
// Literals "..." (escapes \n \r \t \\ \" \xHH \uHHHH), character classes [a-z] / [^"\\] over Unicode
// code points (matched as their UTF-8 bytes), `.` (any code point), rule names [A-Za-z0-9_-]+,
// groups ( ), postfix * + ? {m} {m,} {m,n}, comments from # to the end of a line. A rule's body
// runs until the next `name ::=`. The start rule is `root`.
//
// Compiled form: every character class becomes byte sets (a class with non-ASCII code points an
// anonymous rule of UTF-8 byte-range sequences), every repetition a chain of anonymous rules, so
// the matcher (automaton.h) deals only in byte sets and rule references. Compilation rejects
// undefined rules, left recursion (a rule that can reach itself without consuming a byte: the
// matcher's expansion would not end) and rules that can never end (no finite derivation).
//
// Thread safety: a Grammar is immutable after Parse; share it freely.
#pragma once

#include <cstdint>
#include <climits>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace mnemo::grammar {

// 256 bits: the bytes one terminal accepts.
struct ByteSet {
  uint64_t w[4] = {0, 0, 0, 0};
  bool Has(uint8_t b) const { return (w[b >> 6] >> (b & 63)) & 1; }
  void Add(uint8_t b) { w[b >> 6] |= uint64_t{1} << (b & 63); }
  void AddRange(uint8_t lo, uint8_t hi) {
    for (int b = lo; b <= hi; ++b) Add(static_cast<uint8_t>(b));
  }
  bool operator==(const ByteSet& o) const {
    return w[0] == o.w[0] && w[1] == o.w[1] && w[2] == o.w[2] && w[3] == o.w[3];
  }
};

// One position of an alternative. Alternatives are stored back to back in one array, each ended
// by a kEnd element, so "the next element" is always pos + 1.
struct Element {
  enum Kind : uint8_t { kBytes, kRule, kEnd };
  Kind kind;
  int32_t arg;  // kBytes: ByteSet index; kRule: rule id; kEnd: the rule the alternative belongs to
};

// Limits that keep a hostile grammar from exhausting memory at compile time.
inline constexpr int32_t kMaxElements = 1 << 21;   // elements after expanding repetitions
inline constexpr int32_t kMaxRepeat = 100000;      // m and n of {m,n}

class Grammar {
 public:
  // Parses and compiles grammar text; errors (kInvalidArgument) name the line and the problem.
  static Result<Grammar> Parse(std::string_view text, std::string_view root = "root");

  int32_t root() const { return root_; }
  int32_t n_rules() const { return static_cast<int32_t>(alts_.size()); }
  const std::vector<Element>& elements() const { return elems_; }
  // Start positions (into elements()) of a rule's alternatives.
  const std::vector<int32_t>& alternatives(int32_t rule) const { return alts_[rule]; }
  const ByteSet& bytes(int32_t i) const { return sets_[i]; }
  const std::string& rule_name(int32_t rule) const { return names_[rule]; }
  // Fewest bytes that finish the alternative from `pos` on (0 at its kEnd). Saturates at kFar.
  int32_t min_bytes_from(int32_t pos) const { return min_from_[pos]; }
  static constexpr int32_t kFar = 1 << 28;

  // Repetitions, for the matcher's per-element masks (automaton.h). x{m,n} compiles to x^m R_(n-m)
  // with R_k ::= x R_(k-1) | "" (R_1 ::= x | ""), x* to R ::= x R | "": a chain of rules whose
  // first alternatives differ only in how many more x they allow. Positions in those first
  // alternatives (offset 0: the x, offset 1: the reference to the next rule) are chain positions;
  // only chains whose x cannot match the empty string are recorded.
  struct ChainPos {
    int32_t chain = -1;  // -1: not a chain position
    int32_t level = 0;   // R_level: the x here is one of at most `level` more (kUnbounded for x*)
    int32_t offset = 0;
  };
  static constexpr int32_t kUnbounded = INT32_MAX;
  const ChainPos& chain_pos(int32_t pos) const { return chain_pos_[pos]; }
  int32_t chain_length(int32_t chain) const { return chain_len_[chain]; }  // n; kUnbounded for x*
  // The longest finite chain over the same x (x{0,24} and x{0,40} of json-char share one): within
  // j bytes any chain of j or more levels behaves alike, so they share their masks too.
  int32_t chain_canon(int32_t chain) const { return chain_canon_[chain]; }
  // The position at `offset` in R_level's first alternative (chains of finite length).
  int32_t chain_at(int32_t chain, int32_t level, int32_t offset) const { return chain_starts_[chain][level] + offset; }

  // Builder interface (used by the parser): a rule is declared by name, then its alternatives
  // are added as sequences of items.
  struct Item {
    Element::Kind kind;  // kBytes or kRule
    int32_t arg;
  };
  using Seq = std::vector<Item>;

 private:
  friend class Builder;
  std::vector<std::string> names_;             // [n_rules]
  std::vector<std::vector<int32_t>> alts_;     // [n_rules][alternatives] start positions
  std::vector<Element> elems_;                 // all alternatives, each ended by kEnd
  std::vector<ByteSet> sets_;                  // terminals
  std::vector<int32_t> min_from_;              // [elems_.size()]
  std::vector<ChainPos> chain_pos_;            // [elems_.size()]
  std::vector<int32_t> chain_len_;             // [chains]
  std::vector<int32_t> chain_canon_;           // [chains]
  std::vector<std::vector<int32_t>> chain_starts_;  // [chains][level]: first alternative's start (finite chains)
  int32_t root_ = -1;
};

// Appends to `out` the UTF-8 byte-range sequences that together match exactly the code points
// [lo, hi] (surrogates D800-DFFF excluded): each sequence is 1-4 (first, last) byte ranges.
void Utf8Sequences(uint32_t lo, uint32_t hi, std::vector<std::vector<std::pair<uint8_t, uint8_t>>>* out);

// `text` as a grammar literal: "..." with ", \ and control bytes escaped (other bytes as they are).
std::string Literal(std::string_view text);

}  // namespace mnemo::grammar
