#include "grammar/automaton.h"

#include <algorithm>
#include <cstring>
#include <functional>

namespace mnemo::grammar {
Automaton::Automaton(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenIndex> index)
    : grammar_(std::move(grammar)), index_(std::move(index)) {
  words_ = (static_cast<size_t>(index_->n_vocab()) + 63) / 64;
  stacks_.push_back({-1, -1, 0});  // id 0: the empty stack (the output is complete)
  walk_states_.resize(static_cast<size_t>(index_->max_depth()) + 1);
}

int32_t Automaton::InternStack(int32_t pos, int32_t parent) {
  const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(pos)) << 32) | static_cast<uint32_t>(parent);
  auto it = stack_ids_.find(key);
  if (it != stack_ids_.end()) return it->second;
  if (static_cast<int32_t>(stacks_.size()) >= kMaxStacks) {
    overflow_ = true;
    return -1;
  }
  const int64_t minc = static_cast<int64_t>(grammar_->min_bytes_from(pos)) + stacks_[parent].minc;
  const int32_t id = static_cast<int32_t>(stacks_.size());
  stacks_.push_back({pos, parent, static_cast<int32_t>(std::min<int64_t>(minc, Grammar::kFar))});
  stack_ids_.emplace(key, id);
  return id;
}

// Adds to `out` every stack reached from "match elements[pos] next, then return to parent"
// without consuming a byte: its top is a byte set, or it is the empty stack (accept). Terminates:
// the grammar has no left recursion (checked at compile time), so each nested call moves to a
// rule that cannot lead back here before a byte.
void Automaton::Expand(int32_t pos, int32_t parent, std::vector<int32_t>* out) {
  const Element& e = grammar_->elements()[pos];
  switch (e.kind) {
    case Element::kBytes: {
      const int32_t id = InternStack(pos, parent);
      if (id >= 0) out->push_back(id);
      return;
    }
    case Element::kEnd:
      if (parent == kEmptyStack) {
        out->push_back(kEmptyStack);
      } else {
        const StackNode p = stacks_[parent];
        Expand(p.pos, p.parent, out);
      }
      return;
    case Element::kRule: {
      // A reference in tail position returns straight to the parent: right recursion (x*) keeps
      // the stack flat, so its states recur and their masks are cached.
      int32_t ret = parent;
      if (grammar_->elements()[pos + 1].kind != Element::kEnd) {
        ret = InternStack(pos + 1, parent);
        if (ret < 0) return;
      }
      for (int32_t alt : grammar_->alternatives(e.arg)) Expand(alt, ret, out);
      return;
    }
  }
}

Automaton::StateId Automaton::InternState(std::vector<int32_t>& stacks) {
  std::sort(stacks.begin(), stacks.end());
  stacks.erase(std::unique(stacks.begin(), stacks.end()), stacks.end());
  if (stacks.empty()) return kDead;
  auto it = state_ids_.find(stacks);
  if (it != state_ids_.end()) return it->second;
  if (static_cast<int32_t>(states_.size()) >= kMaxStates || state_stacks_.size() + stacks.size() > kMaxStateStacks) {
    overflow_ = true;
    return kDead;
  }
  State st;
  st.first = static_cast<int32_t>(state_stacks_.size());
  st.count = static_cast<int32_t>(stacks.size());
  st.accepting = stacks[0] == kEmptyStack;
  st.final = st.accepting && stacks.size() == 1;
  st.minc = Grammar::kFar;
  for (int32_t id : stacks) st.minc = std::min(st.minc, stacks_[id].minc);
  state_stacks_.insert(state_stacks_.end(), stacks.begin(), stacks.end());
  const StateId sid = static_cast<StateId>(states_.size());
  states_.push_back(st);
  state_ids_.emplace(stacks, sid);
  return sid;
}

Automaton::StateId Automaton::ComputeTransition(StateId s, uint8_t b) {
  std::vector<int32_t> next;
  const State st = states_[s];
  for (int32_t i = 0; i < st.count; ++i) {
    const int32_t id = state_stacks_[st.first + i];
    if (id == kEmptyStack) continue;
    const StackNode node = stacks_[id];
    const Element& e = grammar_->elements()[node.pos];
    if (grammar_->bytes(e.arg).Has(b)) Expand(node.pos + 1, node.parent, &next);
  }
  return InternState(next);
}

// Bytes that the same stacks of s accept lead to the same state (ComputeTransition depends on the
// byte only through which stack tops hold it), so the 256 bytes are split into classes by that
// membership once per state: a byte no top holds is dead at once, and a transition computed for
// one byte is written for its whole class. Inside a string, one computation then serves ~250
// bytes, and a trie walk from a new state interns one next state per class, not per byte.
// Tables live in fixed blocks that never move: a growing vector copied every table on each
// doubling, and its fresh pages were most of a new state's cost.
void Automaton::NewTable(StateId s) {
  const int32_t t = n_tables_++;
  if ((t & (kTablesPerBlock - 1)) == 0) {
    trans_blocks_.emplace_back(new int32_t[kTablesPerBlock * 256]);
    class_blocks_.emplace_back(new uint16_t[kTablesPerBlock * 256]);
  }
  states_[s].trans = t;
  int32_t* trans = Table(t);
  uint16_t* classes = Classes(t);
  int16_t cls[256] = {};  // 0: held by no top so far; labels only tell classes apart
  int16_t n_cls = 1;
  // At most 257 labels after a relabel (0 and one per byte), and a set adds at most 256.
  constexpr int kLabels = 257 + 256;
  int16_t split[kLabels];  // old class -> the class its held bytes move to
  // Classes depend only on the distinct byte sets of the tops (a number's state has many
  // alternatives over one digit set).
  int32_t sets[64];
  int n_sets = 0;
  const State st = states_[s];
  for (int32_t i = 0; i < st.count; ++i) {
    const int32_t id = state_stacks_[st.first + i];
    if (id == kEmptyStack) continue;
    const int32_t set_id = grammar_->elements()[stacks_[id].pos].arg;
    if (std::find(sets, sets + n_sets, set_id) != sets + n_sets) continue;
    if (n_sets < 64) sets[n_sets++] = set_id;
    if (n_cls > 256) {  // relabel densely, so that labels stay below kLabels
      int16_t dense[kLabels];
      std::fill(dense, dense + n_cls, int16_t{-1});
      int16_t n = 1;
      dense[0] = 0;
      for (int b = 0; b < 256; ++b) {
        if (dense[cls[b]] < 0) dense[cls[b]] = n++;
        cls[b] = dense[cls[b]];
      }
      n_cls = n;
    }
    std::fill(split, split + n_cls, int16_t{-1});
    const ByteSet& set = grammar_->bytes(set_id);
    for (int w = 0; w < 4; ++w) {  // the set's bytes alone (a closing quote is one byte of 256)
      for (uint64_t bits = set.w[w]; bits; bits &= bits - 1) {
        const int b = 64 * w + __builtin_ctzll(bits);
        int16_t& to = split[cls[b]];
        if (to < 0) to = n_cls++;
        cls[b] = to;
      }
    }
  }
  for (int b = 0; b < 256; ++b) {
    classes[b] = static_cast<uint16_t>(cls[b]);
    trans[b] = cls[b] == 0 ? kDead : kUnknownTransition;
  }
}

Automaton::StateId Automaton::TransitionSlow(StateId s, uint8_t b) {
  if (states_[s].trans < 0) NewTable(s);
  int32_t* trans = Table(states_[s].trans);
  int32_t t = trans[b];
  if (t == kUnknownTransition) {
    t = ComputeTransition(s, b);
    if (overflow_) return t;  // a refusal caused by a limit is not cached
    trans = Table(states_[s].trans);
    const uint16_t* classes = Classes(states_[s].trans);
    const uint16_t c = classes[b];
    for (int x = 0; x < 256; ++x) {
      if (classes[x] == c && trans[x] == kUnknownTransition) trans[x] = t;
    }
  }
  return t;
}

Automaton::StateId Automaton::Start() {
  std::lock_guard<std::mutex> lock(mu_);
  return StartLocked();
}

Automaton::StateId Automaton::StartLocked() {
  if (start_ == kDead) {
    std::vector<int32_t> stacks;
    for (int32_t alt : grammar_->alternatives(grammar_->root())) Expand(alt, kEmptyStack, &stacks);
    start_ = InternState(stacks);
  }
  return start_;
}

void Automaton::Prepare(int max_steps) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<uint64_t> w(words_);
  StateId s = StartLocked();
  for (int step = 0; step < max_steps && s >= 0 && !overflow_ && !states_[s].final; ++step) {
    std::fill(w.begin(), w.end(), 0);
    BaseMask(s, w.data());
    if (overflow_ || states_[s].accepting) break;
    if (!states_[s].best_known) GreedyWalk(s);
    if (overflow_) break;
    s = states_[s].best;  // the greedy token's end state (kDead: none)
  }
}

Automaton::StateId Automaton::Advance(StateId s, std::string_view bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  for (unsigned char c : bytes) {
    if (s == kDead) return kDead;
    s = Transition(s, c);
  }
  return s;
}

bool Automaton::Accepting(StateId s) {
  std::lock_guard<std::mutex> lock(mu_);
  return s >= 0 && states_[s].accepting;
}

bool Automaton::Final(StateId s) {
  std::lock_guard<std::mutex> lock(mu_);
  return s >= 0 && states_[s].final;
}

int32_t Automaton::MinBytesToAccept(StateId s) {
  std::lock_guard<std::mutex> lock(mu_);
  return s >= 0 ? states_[s].minc : Grammar::kFar;
}

bool Automaton::overflowed() {
  std::lock_guard<std::mutex> lock(mu_);
  return overflow_;
}

void Automaton::set_split_masks(bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  split_ = on;
}

Automaton::Stats Automaton::stats() {
  std::lock_guard<std::mutex> lock(mu_);
  Stats s = stats_;
  s.keys = static_cast<int64_t>(keys_.size());
  s.key_bytes = static_cast<int64_t>(key_bytes_);
  s.states = static_cast<int64_t>(states_.size());
  s.stacks = static_cast<int64_t>(stacks_.size());
  // Hash tables counted at ~3x their entries' size (nodes, buckets).
  s.bytes = static_cast<int64_t>(
      trans_blocks_.size() * kTablesPerBlock * 256 * (sizeof(int32_t) + sizeof(uint16_t)) +
      mask_blocks_.size() * kMasksPerBlock * words_ * sizeof(uint64_t) + key_bytes_ + stacks_.size() * sizeof(StackNode) +
      stack_ids_.size() * 3 * 16 + states_.size() * sizeof(State) + state_stacks_.size() * sizeof(int32_t) * 4 +
      ends_.size() * sizeof(StateId));
  for (const auto& c : costly_) s.bytes += static_cast<int64_t>(c.size() * 8);
  for (const auto& g : group_ends_) s.bytes += static_cast<int64_t>(g.size() * sizeof(StateId));
  return s;
}

void Automaton::Walk(StateId s, int32_t allow, uint64_t* words, bool info, Collect* costly, const std::vector<Group>* groups,
                     const std::vector<StateId>* pre_ends) {
  const bool filter = allow != kNoLimit;
  const std::vector<TokenIndex::Node>& nodes = index_->nodes();
  const std::vector<int32_t>& ids = index_->token_ids();
  const int32_t n = static_cast<int32_t>(nodes.size());
  StateId* at = walk_states_.data();  // at[d]: the state after the first d bytes of the path
  at[0] = s;
  int32_t max_end = 0;
  int32_t best_minc = INT32_MAX, best_id = INT32_MAX;
  bool best_on_path = false;
  StateId best = kDead;
  std::vector<int32_t> ends;
  if (info && ++walk_stamp_ == 0) {  // the stamp wrapped: forget every old mark
    std::fill(end_mark_.begin(), end_mark_.end(), 0);
    walk_stamp_ = 1;
  }
  if (info && pre_ends) {
    if (end_mark_.size() < states_.size()) end_mark_.resize(states_.size(), 0);
    for (StateId t : *pre_ends) {
      if (end_mark_[t] == walk_stamp_) continue;
      end_mark_[t] = walk_stamp_;
      ends.push_back(t);
      max_end = std::max(max_end, states_[t].minc);
    }
  }
  int64_t visited = 0;
  for (int32_t i = 1; i < n;) {
    const TokenIndex::Node& node = nodes[i];
    if (groups && !NeedVisit(*groups, i)) {
      i = node.end;  // every token below is decided by the keys (in words already, or refused)
      continue;
    }
    const StateId t = Transition(at[node.depth - 1], node.byte);
    ++visited;
    if (t == kDead) {
      i = node.end;  // no token under this prefix can continue the output
      continue;
    }
    at[node.depth] = t;
    if (node.tok_begin < node.tok_end) {
      const int32_t c = filter ? states_[t].cost : 0;
      if (!filter || (c >= 0 && c <= allow)) {
        for (int32_t k = node.tok_begin; k < node.tok_end; ++k) words[ids[k] >> 6] |= uint64_t{1} << (ids[k] & 63);
        if (costly && c > costly->above && costly->out->size() <= costly->limit) {
          for (int32_t k = node.tok_begin; k < node.tok_end; ++k) costly->out->push_back({c, ids[k]});
        }
      }
      if (info) {
        const int32_t m = states_[t].minc;
        max_end = std::max(max_end, m);
        // The greedy token (GreedyWalk): along a shortest completion if any token is, then the
        // fewest bytes left, then the lowest id (ids of one node ascend: the first is the lowest).
        const bool on_path = m == states_[s].minc - node.depth;
        if (on_path > best_on_path ||
            (on_path == best_on_path && (m < best_minc || (m == best_minc && ids[node.tok_begin] < best_id)))) {
          best_on_path = on_path;
          best_minc = m;
          best_id = ids[node.tok_begin];
          best = t;
        }
        if (static_cast<size_t>(t) >= end_mark_.size()) end_mark_.resize(states_.size(), 0);
        if (end_mark_[t] != walk_stamp_) {  // each end state once (a sort of every token's was ~1/3 of a walk)
          end_mark_[t] = walk_stamp_;
          ends.push_back(t);
        }
      }
    }
    ++i;
  }
  stats_.nodes_visited += visited;
  stats_.masks_computed++;
  if (groups) stats_.masks_split++;
  if (info && !overflow_) {
    std::sort(ends.begin(), ends.end());
    State& st = states_[s];
    st.walked = true;
    st.max_end_minc = max_end;
    if (!groups) {  // a partial walk does not see every token: GreedyWalk finds the greedy one
      st.best_known = true;
      st.best = best;
    }
    st.ends = static_cast<int32_t>(ends_.size());
    st.n_ends = static_cast<int32_t>(ends.size());
    ends_.insert(ends_.end(), ends.begin(), ends.end());
  }
}

void Automaton::GreedyWalk(StateId s) {
  const std::vector<TokenIndex::Node>& nodes = index_->nodes();
  const std::vector<uint16_t>& below = index_->subtree_depth();
  const std::vector<int32_t>& ids = index_->token_ids();
  const int32_t n = static_cast<int32_t>(nodes.size());
  const int32_t m0 = states_[s].minc;
  StateId* at = walk_states_.data();
  at[0] = s;
  int32_t best_minc = INT32_MAX, best_id = INT32_MAX;
  StateId best = kDead;
  int64_t visited = 0;
  // on_path: only prefixes along a shortest completion (MinBytesToAccept one less per byte), a
  // narrow walk; the whole trie (pruned by the bound above) only when no token lies on one.
  // A byte lowers MinBytesToAccept by one only from a stack that needs the fewest bytes (after a
  // byte, a stack needs at most one byte less), so on the narrow walk the other bytes are skipped
  // before their transitions are computed: most of the states greedy walks made were theirs.
  std::vector<ByteSet>& shortest = greedy_bytes_;  // [depth]: those bytes of at[depth]
  shortest.resize(walk_states_.size());
  auto shortest_bytes = [&](StateId x, ByteSet* out) {
    *out = ByteSet{};
    const State& st = states_[x];
    for (int32_t k = 0; k < st.count; ++k) {
      const int32_t id = state_stacks_[st.first + k];
      if (id == kEmptyStack || stacks_[id].minc != st.minc) continue;
      const ByteSet& b = grammar_->bytes(grammar_->elements()[stacks_[id].pos].arg);
      for (int w = 0; w < 4; ++w) out->w[w] |= b.w[w];
    }
  };
  shortest_bytes(s, &shortest[0]);
  // Walks the trie nodes [begin, end) (whole subtrees).
  auto walk = [&](bool on_path, int32_t begin, int32_t end) {
    for (int32_t i = begin; i < end;) {
      const TokenIndex::Node& node = nodes[i];
      if (on_path && !shortest[node.depth - 1].Has(node.byte)) {
        i = node.end;
        continue;
      }
      const StateId t = Transition(at[node.depth - 1], node.byte);
      ++visited;
      if (t == kDead || (on_path && states_[t].minc != m0 - node.depth)) {
        i = node.end;
        continue;
      }
      at[node.depth] = t;
      if (on_path && i + 1 < node.end) shortest_bytes(t, &shortest[node.depth]);
      const int32_t m = states_[t].minc;
      if (node.tok_begin < node.tok_end && (m < best_minc || (m == best_minc && ids[node.tok_begin] < best_id))) {
        best_minc = m;
        best_id = ids[node.tok_begin];
        best = t;
      }
      // Strictly worse than the best so far everywhere below: skip (ties are kept, for the lowest id).
      i = m - (below[i] - node.depth) > best_minc ? node.end : i + 1;
    }
  };
  // The narrow walk enters only the first bytes' subtrees (a few of the root's ~256).
  for (int w = 0; w < 4; ++w) {
    for (uint64_t bits = shortest[0].w[w]; bits; bits &= bits - 1) {
      const int32_t c = index_->root_child(static_cast<uint8_t>(64 * w + __builtin_ctzll(bits)));
      if (c >= 0) walk(/*on_path=*/true, c, nodes[c].end);
    }
  }
  if (best == kDead && m0 < Grammar::kFar) walk(/*on_path=*/false, 1, n);
  stats_.nodes_visited += visited;
  stats_.greedy_walks++;
  if (overflow_) return;
  states_[s].best = best;
  states_[s].best_known = true;
}

void Automaton::BaseMask(StateId s, uint64_t* w) {
  if (states_[s].mask >= 0) {
    std::memcpy(w, CachedMask(states_[s].mask), words_ * sizeof(uint64_t));
    stats_.masks_cached++;
    return;
  }
  bool whole = true;
  if (split_ && Split(s, &groups_)) {
    // The keys' accepted tokens up to each group's level, their end states rebuilt on the cut,
    // then a walk of the uncertain rest.
    std::vector<StateId> pre;
    bool ok = true;
    for (size_t i = 0; i < groups_.size() && ok && !states_[s].walked; ++i) {
      const Group& g = groups_[i];
      const int32_t gi = GroupEnds(g);
      if (gi < 0) {
        ok = false;
        break;
      }
      const auto& ends = keys_[g.key].ends;
      for (size_t e = 0; e < ends.size(); ++e)
        if (ends[e].second <= g.s && group_ends_[gi][e] != kDead) pre.push_back(group_ends_[gi][e]);
    }
    if (overflow_) return;
    if (ok) {
      whole = false;
      for (const Group& g : groups_) {
        const Key& k = keys_[g.key];
        const int32_t longest = static_cast<int32_t>(k.len_slot.size()) - 1;
        const int16_t row = longest < 0 ? -1 : k.len_slot[std::min(g.s, longest)];
        if (row < 0) continue;
        const uint64_t* c = k.cum.data() + static_cast<size_t>(row) * words_;
        for (size_t i = 0; i < words_; ++i) w[i] |= c[i];
      }
      Walk(s, kNoLimit, w, /*info=*/!states_[s].walked, nullptr, &groups_, &pre);
    }
  }
  if (whole) Walk(s, kNoLimit, w, /*info=*/!states_[s].walked);
  if (overflow_) return;
  if ((static_cast<size_t>(n_masks_) + 1) * words_ * sizeof(uint64_t) <= kMaxMaskCacheBytes) {
    // In blocks that never move (a growing vector copied every mask on each doubling).
    if (n_masks_ % kMasksPerBlock == 0) mask_blocks_.emplace_back(new uint64_t[kMasksPerBlock * words_]);
    states_[s].mask = n_masks_++;
    std::memcpy(CachedMask(states_[s].mask), w, words_ * sizeof(uint64_t));
  }
}

int32_t Automaton::Cost(StateId s) {
  constexpr int32_t kComputing = -2;
  std::vector<StateId> path;  // states whose cost is one more than the next one's
  int32_t c = Grammar::kFar;
  for (StateId at = s;; at = states_[at].best) {
    const State& st = states_[at];
    if (st.cost >= 0) {
      c = st.cost;
      break;
    }
    if (st.cost == kComputing) break;  // the greedy path loops: this vocabulary cannot end it here
    if (st.final || st.accepting) {
      c = states_[at].cost = st.final ? 0 : 1;
      break;
    }
    if (!st.best_known) {
      GreedyWalk(at);
      if (overflow_) break;
    }
    if (states_[at].best == kDead) {  // nothing can follow: never ends
      states_[at].cost = Grammar::kFar;
      break;
    }
    states_[at].cost = kComputing;
    path.push_back(at);
  }
  for (size_t i = path.size(); i-- > 0;) {
    c = std::min(Grammar::kFar, c + 1);
    states_[path[i]].cost = c;
  }
  return states_[s].cost >= 0 ? states_[s].cost : Grammar::kFar;
}

int32_t Automaton::MaxEndCost(StateId s) {
  if (states_[s].max_end_cost >= 0) return states_[s].max_end_cost;
  if (!states_[s].walked) {
    scratch_mask_.assign(words_, 0);
    BaseMask(s, scratch_mask_.data());
    if (overflow_) return Grammar::kFar;
  }
  int32_t m = 0;
  // Cost() walks new states, which appends to ends_ and states_: index, do not hold references.
  for (int32_t i = 0; i < states_[s].n_ends; ++i) m = std::max(m, Cost(ends_[states_[s].ends + i]));
  if (overflow_) return Grammar::kFar;
  states_[s].max_end_cost = m;
  return m;
}

int32_t Automaton::TokensToEnd(StateId s) {
  std::lock_guard<std::mutex> lock(mu_);
  return s >= 0 ? Cost(s) : Grammar::kFar;
}

Status Automaton::FillMask(StateId s, int budget, TokenMask* mask) {
  std::lock_guard<std::mutex> lock(mu_);
  mask->assign(words_, 0);
  if (s < 0) return Status::Ok();
  uint64_t* w = mask->data();
  auto too_complex = [&] {
    return MakeError(StatusCode::kInvalidArgument,
                     "the grammar is too complex: its matcher exceeded %d states, %d stacks or %zu stack ids in all states",
                     kMaxStates, kMaxStacks, kMaxStateStacks);
  };
  BaseMask(s, w);
  if (overflow_) return too_complex();
  // Tokens left after this one. Far from the edge (TokensToEnd <= bytes + 1 with all single-byte
  // tokens), every token fits and no cost is computed.
  const int32_t limit = budget == INT_MAX ? Grammar::kFar : std::max(0, budget - 1);
  if (limit < Grammar::kFar && !(index_->all_bytes() && limit >= states_[s].max_end_minc + 1)) {
    const int32_t max_end = MaxEndCost(s);
    const int32_t cost = Cost(s);
    if (overflow_) return too_complex();
    // Feasible (cost <= budget): tokens that leave the end within reach, the greedy one among
    // them. Not: tokens that bring the end closer.
    const int32_t allow = std::max(limit, cost - 1);
    if (allow < max_end) {
      if (allow >= cost && states_[s].costly == -1) {
        // List the state's costly tokens once (the walk sets no bit w lacks: w is the base mask).
        std::vector<std::pair<int32_t, int32_t>> costly;
        stats_.budget_walks++;
        if (!(split_ && CostlySplit(s, cost, kMaxCostly, w, &costly))) {
          costly.clear();
          Collect collect{&costly, cost, kMaxCostly};
          Walk(s, Grammar::kFar, w, /*info=*/false, &collect);
        }
        if (overflow_) return too_complex();
        if (costly.size() <= kMaxCostly) {
          std::sort(costly.begin(), costly.end(), std::greater<>());
          states_[s].costly = static_cast<int32_t>(costly_.size());
          costly_.push_back(std::move(costly));
        } else {
          states_[s].costly = -2;
        }
      }
      if (allow >= cost && states_[s].costly >= 0) {
        // Every token that does not move away from the end fits; drop the costly ones that do not.
        for (const auto& [c, id] : costly_[states_[s].costly]) {
          if (c <= allow) break;
          w[id >> 6] &= ~(uint64_t{1} << (id & 63));
        }
      } else {
        stats_.budget_walks++;
        // The tokens whose end is within reach: from the keys' end states and a walk of the rest,
        // else one walk filtering every token.
        if (!(split_ && FilterSplit(s, allow, w))) {
          std::memset(w, 0, words_ * sizeof(uint64_t));
          Walk(s, allow, w, /*info=*/false);
        }
        if (overflow_) return too_complex();
      }
    }
  }
  if (states_[s].accepting) {
    for (int32_t id : index_->eog()) w[id >> 6] |= uint64_t{1} << (id & 63);
  }
  return Status::Ok();
}

Matcher::Matcher(std::shared_ptr<Automaton> automaton) : a_(std::move(automaton)), state_(a_->Start()) {}

Status Matcher::FillMask(int budget, TokenMask* mask) {
  if (done_) {
    mask->assign((static_cast<size_t>(a_->index().n_vocab()) + 63) / 64, 0);
    return Status::Ok();
  }
  return a_->FillMask(state_, budget, mask);
}

Status Matcher::Accept(int32_t token) {
  const TokenIndex& idx = a_->index();
  if (token < 0 || token >= idx.n_vocab()) return MakeError(StatusCode::kInvalidArgument, "token %d out of range", token);
  if (done_) return MakeError(StatusCode::kFailedPrecondition, "the grammar already ended");
  if (idx.is_eog(token)) {
    if (!a_->Accepting(state_)) return MakeError(StatusCode::kInvalidArgument, "end of generation before the grammar accepts");
    done_ = true;
    return Status::Ok();
  }
  const std::string& piece = idx.piece(token);
  if (piece.empty()) return MakeError(StatusCode::kInvalidArgument, "token %d has no text a grammar can match", token);
  const Automaton::StateId next = a_->Advance(state_, piece);
  if (next == Automaton::kDead) {
    if (a_->overflowed()) return MakeError(StatusCode::kInvalidArgument, "the grammar is too complex");
    return MakeError(StatusCode::kInvalidArgument, "token %d is not allowed by the grammar here", token);
  }
  state_ = next;
  return Status::Ok();
}

bool Matcher::accepting() const { return done_ || a_->Accepting(state_); }
bool Matcher::final() const { return done_ || a_->Final(state_); }
int32_t Matcher::MinBytesToAccept() const { return done_ ? 0 : a_->MinBytesToAccept(state_); }

}  // namespace mnemo::grammar
