// Incremental grammar matching over bytes and per-step token masks.
//
// The matcher is a pushdown automaton run on all parses at once: a parse is a stack of grammar
// positions (the element to match next, then return positions in the enclosing rules), a matcher
// state is the set of such stacks. Stacks are interned as (position, parent stack) nodes and
// states as sorted sets of stack ids, so equal states are equal ids, and the automaton builds a
// DFA lazily: the transition (state, byte) is computed once (expand rule references, pop finished
// alternatives) and then read from a 256-entry table per state.
//
// A token mask walks the vocabulary trie (token_index.h) in preorder from the current state, one
// table lookup per trie edge, skipping every subtree whose prefix the grammar refuses: the cost is
// the number of live prefixes, not the vocabulary size times the token length. Masks are cached
// per state (states recur: inside an unbounded string, every character leads back to the same
// state). Tokens whose bytes end mid-way through a UTF-8 character (byte-fallback pieces) are
// matched byte by byte like any other. End-of-generation tokens are allowed exactly when the
// grammar accepts the output so far.
//
// Per-element masks: most of a walk is spent on tokens that a stack's top element decides alone
// (inside a string, a token of plain characters is allowed whatever encloses the string), and a
// bounded string's states are all new (they differ by the characters left), so a walk per state
// would be paid at every token. So a new state's stacks are cut into a local part, the top node
// down to the first repetition node within a few nodes (else the top node alone), and what lies
// below (the cut). The local part is walked once per key: its stacks with the cut replaced by the
// empty stack and the repetition raised to its longest level (for tokens of at most j bytes, R_j
// and any longer R behave alike: each x takes a byte), plus the bytes the cut can take first.
// That walk sorts the tokens into accepted whatever lies below (kept per token length: the
// repetition levels the token takes, as its end state's bottom nodes tell them, else its bytes),
// and uncertain: those that leave the local part and go on with a byte the cut takes, or, at
// level j, are longer than j bytes and their levels unknown. A state's mask is then its keys'
// accepted tokens up to its levels, plus a walk from the state itself that enters only the trie
// subtrees holding an uncertain token. (A bounded string with j characters left used to walk
// every token of more than j bytes: most of the vocabulary for a small j.)
// The end states of the accepted tokens (for the budget below) are the local end states rebuilt
// on the cut, so near the budget's edge the lists of tokens to drop come from them too, not from
// a second whole walk. Repetitions over one x share keys (json-char{0,24} and json-char{0,40}).
// A state whose keys could accept the same token (their end states would merge) is walked whole,
// as before. Keys take at most kMaxKeyBytes per automaton; past that, states are walked whole.
//
// Closing in time: with a budget of B tokens left (this one included), a token is allowed only if
// the turn can still end within the B - 1 tokens after it. What ending costs from a state is
// counted in tokens (TokensToEnd): 0 when the output is final (the engine stops there), 1 when it
// is accepting (the end-of-generation token), else one more than from the state after a greedy
// step: the longest token along a shortest completion (each of its bytes lowers the bytes still
// needed by one; the lowest id among ties), found by a walk down those prefixes alone; where no
// token lies on one, the token whose end state needs the fewest bytes. That is an upper bound on the
// tokens really needed, and it is kept as the budget shrinks: the greedy token itself always
// fits. So a turn whose budget covers TokensToEnd of the start state always ends complete,
// with an end-of-generation token or in a final state, never cut by max_tokens. Bytes bound the
// cost where the vocabulary has all 256 single-byte tokens (TokensToEnd <= bytes + 1), so states
// far from the budget's edge skip it. When even the greedy path cannot fit (the budget was short
// from the start), only tokens that bring the end closer are allowed: the output gets as far as
// it can and is then cut.
//
// Thread safety: an Automaton is shared by every request using the same grammar; its methods lock
// an internal mutex (the engine thread is the only caller on the hot path, so it is uncontended).
// A Matcher belongs to one request.
#pragma once

#include <array>
#include <climits>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "grammar/grammar.h"
#include "grammar/token_index.h"

namespace mnemo::grammar {

// Bits over the vocabulary: bit id set = token id allowed. [ceil(n_vocab / 64)] words.
using TokenMask = std::vector<uint64_t>;
inline bool MaskHas(const TokenMask& m, int32_t id) { return (m[id >> 6] >> (id & 63)) & 1; }

class Automaton {
 public:
  using StateId = int32_t;
  static constexpr StateId kDead = -1;
  // Limits on what one automaton may build (memory: ~1 KB of transitions per state visited).
  static constexpr int32_t kMaxStates = 100000;
  static constexpr int32_t kMaxStacks = 4000000;
  static constexpr size_t kMaxMaskCacheBytes = size_t{64} << 20;
  static constexpr size_t kMaxKeyBytes = size_t{64} << 20;  // per-element data (see above)
  // Stack ids of all states together (a state of an ambiguous grammar holds thousands).
  static constexpr size_t kMaxStateStacks = size_t{16} << 20;

  Automaton(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenIndex> index);
  Automaton(const Automaton&) = delete;
  Automaton& operator=(const Automaton&) = delete;

  StateId Start();
  // Builds ahead what every output of the grammar needs: the masks (and so the per-element keys)
  // of the states along the greedy path from the start (at most max_steps tokens). Meant for
  // where the grammar is compiled (GrammarCache::Get, on the request's thread), so that a
  // schema's first request does not build on the engine thread, between decode steps of every
  // running turn, what its outputs share: a JSON string's characters are one walk of the whole
  // vocabulary (~30,000 tokens), met by the greedy path at its first string.
  void Prepare(int max_steps = 256);
  // The state after `bytes`, or kDead when the grammar refuses them (or a limit was hit: see
  // overflowed()).
  StateId Advance(StateId s, std::string_view bytes);
  bool Accepting(StateId s);
  // Accepting, and no byte can follow: only end-of-generation tokens are allowed.
  bool Final(StateId s);
  // Fewest bytes that complete an accepted output from s (0 when accepting).
  int32_t MinBytesToAccept(StateId s);
  // Tokens that end a turn from s along the greedy path (see above); Grammar::kFar when the
  // vocabulary cannot end it. Costs a trie walk per state on the path the first time.
  int32_t TokensToEnd(StateId s);
  // Writes the tokens allowed after state s into mask ([words] zeroed first), with `budget` tokens
  // left (INT_MAX: no limit). Errors only when a limit on states was hit.
  Status FillMask(StateId s, int budget, TokenMask* mask);

  struct Stats {
    int64_t states = 0, stacks = 0;       // interned so far
    int64_t masks_computed = 0;           // trie walks for masks (budget_walks included)
    int64_t budget_walks = 0;             // of which second walks of a state near the budget's edge
    int64_t greedy_walks = 0;             // pruned walks for a greedy token alone (GreedyWalk)
    int64_t masks_cached = 0;             // masks answered from the cache
    int64_t nodes_visited = 0;            // trie nodes visited by all walks of both kinds
    int64_t masks_split = 0;              // of masks_computed, those from per-element masks
    int64_t keys = 0;                     // per-element keys walked
    int64_t key_bytes = 0;                // their memory
    int64_t bytes = 0;                    // all the automaton holds (tables, masks, keys, stacks), about
  };
  Stats stats();
  // Per-element masks on (default) or off (every new state walks the whole trie, as a reference).
  void set_split_masks(bool on);
  const TokenIndex& index() const { return *index_; }
  const Grammar& grammar() const { return *grammar_; }
  bool overflowed();

 private:
  static constexpr int32_t kEmptyStack = 0;  // the empty stack's id: the output is complete
  struct StackNode {
    int32_t pos;     // element to match next; -1 for the empty stack (id 0)
    int32_t parent;  // stack to return to (id), -1 for the empty stack
    int32_t minc;    // fewest bytes to empty this stack
  };
  struct State {
    int32_t first, count;   // its stacks: state_stacks_[first, first + count), sorted ids
    int32_t trans = -1;     // its table of 256 transitions (Table()), -1 until first used
    int32_t mask = -1;      // cached unbudgeted mask (CachedMask()), -1 none
    int32_t minc = 0;
    // Known once walked (walked): the largest MinBytesToAccept after an allowed token, the end
    // state of the greedy token (kDead when no token is allowed), and the distinct end states of
    // the allowed tokens: ends_[ends, ends + n_ends).
    int32_t max_end_minc = 0;
    int32_t best = -1;
    int32_t ends = 0, n_ends = 0;
    int32_t cost = -1;          // TokensToEnd; -1 unknown, -2 while being computed (a cycle)
    int32_t max_end_cost = -1;  // the largest TokensToEnd after an allowed token; -1 unknown
    // Its allowed tokens that move away from the end (TokensToEnd after > cost), largest first,
    // in costly_[costly]: with few tokens left but at least `cost`, the budgeted mask is the
    // cached one minus a prefix of this list (no second trie walk). -1: not listed yet,
    // -2: too many to list.
    int32_t costly = -1;
    bool walked = false;
    bool best_known = false;    // best is set (by a full walk, or by GreedyWalk)
    bool accepting = false;
    bool final = false;
  };
  struct VecHash {
    size_t operator()(const std::vector<int32_t>& v) const {
      uint64_t h = 1469598103934665603ull;
      for (int32_t x : v) h = (h ^ static_cast<uint32_t>(x)) * 1099511628211ull;
      return static_cast<size_t>(h);
    }
  };

  // A local key's walk (see the top of this file): the local state (stacks ending in the empty
  // stack) and the bytes the cut below can take first.
  struct Key {
    StateId local;
    ByteSet first;
    bool ok = false;                 // built (false: over the memory limit)
    // Per trie node from need_lo on: 255 when its subtree holds a token that leaves the local
    // part, else the longest accepted token below it whose levels are unknown (bytes, capped at
    // 254); 0 for none (and for the nodes past the array).
    int32_t need_lo = 0;
    std::vector<uint8_t> need;
    uint8_t Need(int32_t node) const {
      const uint32_t i = static_cast<uint32_t>(node - need_lo);
      return i < need.size() ? need[i] : 0;
    }
    std::vector<int16_t> len_slot;   // [longest + 1] token length (levels) -> row of cum, -1 none
    std::vector<uint64_t> cum;       // [rows][words]: accepted tokens of at most that length
    std::vector<uint64_t> touch;     // [words] accepted or uncertain tokens (overlap test)
    std::vector<std::pair<StateId, int32_t>> ends;  // local end states, shortest token length
    // The accepted tokens of ends[i] as (length, token), by length: tokens[end_tokens[i], end_tokens[i + 1]).
    std::vector<int32_t> end_tokens;
    std::vector<std::pair<int32_t, int32_t>> tokens;
  };
  // One group of a state's stacks: those with the same cut, repetition and level.
  struct Group {
    int32_t key;
    int32_t cut;      // the stack below the local part
    int32_t chain;    // the repetition raised (-1 none)
    int32_t canon;    // the chain its key uses (Grammar::chain_canon)
    int32_t shift;    // levels raised by (to the top of canon)
    int32_t s;        // tokens of at most s bytes are decided by the key (254: all)
  };
  struct KeyHash {
    size_t operator()(const std::pair<StateId, ByteSet>& k) const {
      uint64_t h = static_cast<uint64_t>(k.first) * 0x9E3779B97F4A7C15ull;
      for (uint64_t w : k.second.w) h = (h ^ w) * 1099511628211ull;
      return static_cast<size_t>(h);
    }
  };
  struct KeyEq {
    bool operator()(const std::pair<StateId, ByteSet>& a, const std::pair<StateId, ByteSet>& b) const {
      return a.first == b.first && a.second == b.second;
    }
  };
  // Collects (TokensToEnd after, token) of a walk's allowed tokens whose TokensToEnd after is
  // above `above`, while fewer than `limit + 1` are listed.
  struct Collect {
    std::vector<std::pair<int32_t, int32_t>>* out;
    int32_t above;
    size_t limit;
  };
  // Calls fn(cost, begin, end) for each end state of s's keys' accepted tokens: its TokensToEnd
  // (known: MaxEndCost(s) first) and those tokens, (length, token) pairs. false when s is not
  // split, a limit was hit or a cost is unknown (fn may have been called for some ends).
  template <class Fn>
  bool EachKeyEnd(StateId s, Fn&& fn);
  // The same list for s from its keys' end states and a walk of the uncertain rest (w: s's base
  // mask, unchanged); false when s is not split (or a limit was hit).
  bool CostlySplit(StateId s, int32_t above, size_t limit, uint64_t* w, std::vector<std::pair<int32_t, int32_t>>* out);
  // w = s's tokens whose end state's TokensToEnd is <= allow (as Walk with a limit), split.
  bool FilterSplit(StateId s, int32_t allow, uint64_t* w);
  // s's groups and their keys (walking new keys); false when s is walked whole instead.
  bool Split(StateId s, std::vector<Group>* groups);
  int32_t KeyFor(StateId local, const ByteSet& first);  // -1 when over the memory limit
  void BuildKey(Key* k);
  int32_t Bottom(int32_t stack) const;  // its node just above the empty stack
  // Levels of the repetition `chain` that a key's token took to reach its local end state t, as
  // the stacks' bottom nodes tell (R_level: the x there is one of at most level more), counted
  // from the chain's longest level: a group of level s allows the token exactly when that is at
  // most s (all of t's stacks lowered below level 1 otherwise). -1 when t does not tell (its
  // stacks on other nodes, or levels that disagree): the token's bytes bound it instead.
  int32_t LevelsTaken(StateId t, int32_t chain) const;
  const ByteSet& First(int32_t stack);
  // The real state after a key's local end state: its stacks rebuilt on `cut`, the repetition
  // lowered by `shift` levels. false on a limit.
  bool Reroot(StateId local_end, const Group& g, StateId* out);
  // Index into group_ends_ of g's real end states (aligned with its key's ends; computed for the
  // ends of tokens of at most g.s bytes), -1 on a limit.
  int32_t GroupEnds(const Group& g);
  bool NeedVisit(const std::vector<Group>& groups, int32_t node) const {
    for (const Group& g : groups)
      if (keys_[g.key].Need(node) > g.s) return true;
    return false;
  }

  StateId StartLocked();
  int32_t InternStack(int32_t pos, int32_t parent);
  StateId InternState(std::vector<int32_t>& stacks);  // sorts and dedups `stacks`
  void Expand(int32_t pos, int32_t parent, std::vector<int32_t>* out);
  // The state after byte b: a table lookup once computed (the walks' inner loop), else
  // TransitionSlow (a new table, ComputeTransition).
  StateId Transition(StateId s, uint8_t b) {
    const int32_t t = states_[s].trans;
    if (t >= 0) {
      const int32_t next = Table(t)[b];
      if (next != kUnknownTransition) return next;
    }
    return TransitionSlow(s, b);
  }
  StateId TransitionSlow(StateId s, uint8_t b);
  static constexpr int32_t kUnknownTransition = -2;
  void NewTable(StateId s);  // s's transition table (all unknown, dead bytes dead) and byte classes
  StateId ComputeTransition(StateId s, uint8_t b);
  // One trie walk from s setting the bits of allowed tokens in words ([words_], not cleared):
  // every grammatical token when allow is kNoLimit, else those whose end state's TokensToEnd is
  // <= allow (all of them must be known: MaxEndCost(s) first). costly (optional): see Collect.
  // info (optional): records the walk's facts into s's State (walked). groups (optional): enter
  // only the subtrees that hold a token the groups' keys leave uncertain; with info, pre_ends
  // are the end states known already (the keys' accepted tokens).
  static constexpr int32_t kNoLimit = INT32_MAX;
  void Walk(StateId s, int32_t allow, uint64_t* words, bool info, Collect* costly = nullptr,
            const std::vector<Group>* groups = nullptr, const std::vector<StateId>* pre_ends = nullptr);
  // Sets s's greedy token's end state (State::best) with a walk that skips every subtree that
  // cannot hold a token as good: a byte lowers MinBytesToAccept by at most one, so below a prefix
  // whose state needs m bytes, with at most k more bytes in its subtree, no token ends under m - k.
  // Cost() needs only this of the states along a greedy path, not their masks.
  void GreedyWalk(StateId s);
  // s's unbudgeted mask into words ([words_], zeroed), from the cache or a walk.
  void BaseMask(StateId s, uint64_t* words);
  int32_t Cost(StateId s);         // TokensToEnd without the lock
  int32_t MaxEndCost(StateId s);   // State::max_end_cost, computed on first use

  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<const TokenIndex> index_;
  std::mutex mu_;
  std::vector<StackNode> stacks_;                        // [n_stacks]
  std::unordered_map<uint64_t, int32_t> stack_ids_;      // (pos, parent) -> id
  std::vector<State> states_;                            // [n_states]
  std::vector<int32_t> state_stacks_;                    // stacks of all states, back to back
  std::unordered_map<std::vector<int32_t>, int32_t, VecHash> state_ids_;
  // Per table, 256 state ids (kUnknown = not computed) and 256 byte classes (bytes of one class
  // go to one state), in blocks of kTablesPerBlock tables.
  static constexpr int32_t kTablesPerBlock = 256;
  std::vector<std::unique_ptr<int32_t[]>> trans_blocks_;
  std::vector<std::unique_ptr<uint16_t[]>> class_blocks_;
  int32_t n_tables_ = 0;
  int32_t* Table(int32_t t) { return trans_blocks_[t / kTablesPerBlock].get() + (t % kTablesPerBlock) * 256; }
  uint16_t* Classes(int32_t t) { return class_blocks_[t / kTablesPerBlock].get() + (t % kTablesPerBlock) * 256; }
  static constexpr int32_t kMasksPerBlock = 64;
  std::vector<std::unique_ptr<uint64_t[]>> mask_blocks_;  // [cached masks][words], in blocks
  int32_t n_masks_ = 0;
  uint64_t* CachedMask(int32_t i) { return mask_blocks_[i / kMasksPerBlock].get() + static_cast<size_t>(i % kMasksPerBlock) * words_; }
  std::vector<int32_t> ends_;                            // end states of walked states, back to back
  // Per listed state, its costly tokens (State::costly) as (TokensToEnd after, token), largest first.
  std::vector<std::vector<std::pair<int32_t, int32_t>>> costly_;
  static constexpr size_t kMaxCostly = 4096;
  std::vector<StateId> walk_states_;                     // [max_depth + 1] scratch of Walk
  std::vector<uint32_t> end_mark_;                       // [n_states] walk_stamp_ once listed in a walk's ends
  uint32_t walk_stamp_ = 0;
  std::vector<uint64_t> scratch_mask_;                   // [words_] scratch of Cost's walks
  std::vector<int32_t> scratch_;                         // scratch of ComputeTransition
  bool split_ = true;
  std::vector<Key> keys_;
  std::unordered_map<std::pair<StateId, ByteSet>, int32_t, KeyHash, KeyEq> key_ids_;
  std::unordered_map<int32_t, int32_t> first_ids_;       // stack -> index into firsts_
  std::vector<ByteSet> firsts_;
  struct GroupKeyHash {
    size_t operator()(const std::array<int32_t, 4>& k) const {
      uint64_t h = 1469598103934665603ull;
      for (int32_t x : k) h = (h ^ static_cast<uint32_t>(x)) * 1099511628211ull;
      return static_cast<size_t>(h);
    }
  };
  std::unordered_map<std::array<int32_t, 4>, int32_t, GroupKeyHash> group_end_ids_;  // (key, cut, chain, shift) -> index in group_ends_
  std::vector<std::vector<StateId>> group_ends_;
  size_t key_bytes_ = 0;
  std::vector<Group> groups_;                            // scratch of BaseMask
  std::vector<uint8_t> need_scratch_;                    // scratch of BuildKey
  std::vector<int32_t> end_bucket_;                      // scratch of BuildKey: [n_states], -1
  std::vector<int32_t> levels_memo_;                     // scratch of BuildKey
  std::vector<ByteSet> greedy_bytes_;                    // scratch of GreedyWalk
  StateId start_ = kDead;
  bool overflow_ = false;
  size_t words_;                                         // ceil(n_vocab / 64)
  Stats stats_;
};

// One request's position in a grammar.
class Matcher {
 public:
  explicit Matcher(std::shared_ptr<Automaton> automaton);

  // Fills `mask` with the tokens allowed next ([words], resized). `budget`: tokens the turn may
  // still generate, this one included (INT_MAX: unbounded).
  Status FillMask(int budget, TokenMask* mask);
  // Feeds the sampled token. Its bytes must be allowed (an error otherwise, and the state is
  // unchanged); an end-of-generation token is allowed when accepting and ends the match.
  Status Accept(int32_t token);
  bool accepting() const;
  bool final() const;         // nothing but end of generation can follow
  bool done() const { return done_; }  // an end-of-generation token was accepted
  int32_t MinBytesToAccept() const;
  Automaton& automaton() { return *a_; }

 private:
  std::shared_ptr<Automaton> a_;
  Automaton::StateId state_;
  bool done_ = false;
};

}  // namespace mnemo::grammar
