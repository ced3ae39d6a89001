// String languages for JSON Schema's `pattern` and `format` (json_schema.h): an ECMA-262 regex
// subset parsed into a tree over code points, turned into grammar text for a JSON string's
// contents (the decoded characters, each written as JSON may write it), or into an NFA when
// several constraints hold at once (a format, a pattern, length bounds), whose product is written
// as right-linear rules.
//
// The subset: literals, `.`, classes `[a-z]` `[^...]`, `\d \w \s \D \W \S`, escapes (`\.` `\/`
// `\t` `\xHH` `\uHHHH` `\u{H...}` `\cX` `\0`), groups `( )` `(?: )` `(?<name> )`, `|`, quantifiers
// `* + ? {n} {n,} {n,m}` (n, m <= kMaxCount; lazy forms are the same language), `^` at the start
// and `$` at the end of the pattern or of a top-level alternative. A side without its anchor
// allows any characters there (patterns are not implicitly anchored). Refused: backreferences,
// lookaround, `\b` `\B`, `\p{...}`, anchors elsewhere, lone surrogates.
//
// Cost: a parsed tree is as large as the pattern; grammar text and NFAs expand counted
// repetitions (bounded by kMaxExpanded positions); an NFA stops at kMaxTransitions (a chain of
// optional items has a transition from each to every later one), a product at kMaxProductStates
// or kMaxTransitions: a schema compiles in at most a few tenths of a second.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"

namespace mnemo::grammar {

// Sorted, disjoint, non-adjacent code-point ranges, never holding surrogates (no JSON form).
using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

inline constexpr int32_t kMaxCount = 1000;             // n, m of a pattern's {n,m}
// Character positions after expanding counts. An unanchored pattern keeps every partial match
// alive in the matcher, so n positions can cost n^2 stack steps per new state on the engine
// thread: ((a|b|c|d) written 4,000 times took 8 s for 20 tokens, 1,000 positions ~0.1 s.
inline constexpr int64_t kMaxExpanded = 1000;
inline constexpr int32_t kMaxProductStates = 20000;    // states of an intersection
inline constexpr int64_t kMaxTransitions = 200000;     // transitions of an NFA or of an intersection
inline constexpr int32_t kMaxGroupDepth = 100;         // nested groups in a pattern
inline constexpr int64_t kMinLengthCap = 16;           // IntersectionExpr lowers maxLength no further

// A regular language over code points.
struct Regex {
  enum Kind : uint8_t { kChars, kSeq, kAlt, kRepeat };
  Kind kind = kSeq;  // an empty kSeq is the empty string
  Ranges chars;                // kChars
  std::vector<Regex> kids;     // kSeq, kAlt; kRepeat: one
  int32_t min = 0, max = 0;    // kRepeat; max -1: unbounded
};

// The strings `pattern` matches somewhere (ECMA-262 search semantics), as a language of whole
// strings: unanchored sides get any-character runs. Errors (kInvalidArgument) say what is not
// supported and where in the pattern.
Result<Regex> ParsePattern(std::string_view pattern);

// The anchored pattern this compiler generates for a JSON Schema format, or nullptr when the
// format is unknown (an annotation). See docs/api.md for what each one covers.
const char* FormatPattern(std::string_view format);
// True when every string of `format`'s language matches `pattern` (a pattern outside the subset
// that a client library writes next to the format: zod 4's duration and hostname).
bool FormatImpliesPattern(std::string_view format, std::string_view pattern);

// Shortest and longest string of a language in code points (longest -1: unbounded).
std::pair<int64_t, int64_t> LengthRange(const Regex& re);

// Where grammar rules go (the SchemaCompiler): Shared makes (or finds) a rule with this body,
// Reserve names a rule whose body comes later through Define.
struct RuleSink {
  std::function<std::string(const std::string& hint, const std::string& body)> shared;
  std::function<std::string(const std::string& hint)> reserve;
  std::function<void(const std::string& name, const std::string& body)> define;
};

// Grammar alternatives for one character of `set` inside a JSON string: raw UTF-8 where JSON
// allows it, the escapes JSON requires (`\"`, `\\`, control characters), `\/` for '/', and, for
// sets as wide as `.` or a negated class, any `\uXXXX` of a member (what json-char allows).
std::string EncodeSet(const Ranges& set);

// Grammar text for a JSON string's contents (between the quotes) in `re`'s language; empty when
// the tree has a repetition of something that can be empty (the grammar refuses those: use the
// NFA path).
std::string RegexExpr(const Regex& re, const RuleSink& sink);

// An NFA without empty moves: state 0 starts.
struct Nfa {
  struct Edge {
    Ranges set;
    int32_t to;
  };
  std::vector<std::vector<Edge>> out;  // [states]
  std::vector<bool> accept;            // [states]
};
Result<Nfa> BuildNfa(const Regex& re);
bool NfaMatches(const Nfa& nfa, const std::vector<uint32_t>& code_points);

// Grammar text (a reference to the first of new right-linear rules) for a JSON string's contents
// whose decoded characters every NFA accepts and whose length is in [min_len, max_len] (max_len
// -1: unbounded). Errors: no such string, or over kMaxProductStates.
Result<std::string> IntersectionExpr(const std::vector<const Nfa*>& nfas, int64_t min_len, int64_t max_len,
                                     const RuleSink& sink);

}  // namespace mnemo::grammar
