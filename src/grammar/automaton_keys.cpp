// Per-element masks (automaton.h, "Per-element masks"): a new state's groups (its stacks cut into
// a local part and what lies below), the keys (one walk of the trie per local part), their end
// states rebuilt on what lies below, and the budget's lists and filtered masks made from them.
#include <algorithm>
#include <cstring>

#include "grammar/automaton.h"

namespace mnemo::grammar {

const ByteSet& Automaton::First(int32_t stack) {
  auto it = first_ids_.find(stack);
  if (it != first_ids_.end()) return firsts_[it->second];
  ByteSet f;
  if (stack != kEmptyStack) {
    std::vector<int32_t> tops;
    Expand(stacks_[stack].pos, stacks_[stack].parent, &tops);
    for (int32_t id : tops) {
      if (id == kEmptyStack) continue;
      const ByteSet& b = grammar_->bytes(grammar_->elements()[stacks_[id].pos].arg);
      for (int i = 0; i < 4; ++i) f.w[i] |= b.w[i];
    }
  }
  first_ids_.emplace(stack, static_cast<int32_t>(firsts_.size()));
  firsts_.push_back(f);
  return firsts_.back();
}

bool Automaton::Split(StateId s, std::vector<Group>* groups) {
  constexpr int kSearch = 4;     // nodes below the top searched for a repetition
  constexpr size_t kMaxGroups = 8;
  groups->clear();
  std::vector<std::vector<int32_t>> locals;  // per group, its local stacks
  const Grammar& g = *grammar_;
  const int32_t max_depth = index_->max_depth();
  const State st = states_[s];
  for (int32_t i = 0; i < st.count; ++i) {
    const int32_t id = state_stacks_[st.first + i];
    if (id == kEmptyStack) continue;
    int32_t path[kSearch];
    int n = 0, found = -1;
    for (int32_t x = id; x != kEmptyStack && n < kSearch; x = stacks_[x].parent) {
      path[n++] = x;
      if (g.chain_pos(stacks_[x].pos).chain >= 0) {
        found = n - 1;
        break;
      }
    }
    Group grp{-1, 0, -1, -1, 0, 254};
    int32_t bottom_pos;
    int last;  // index in path of the bottom of the local part
    if (found >= 0) {
      last = found;
      const Grammar::ChainPos cp = g.chain_pos(stacks_[path[last]].pos);
      grp.chain = cp.chain;
      bottom_pos = stacks_[path[last]].pos;
      grp.canon = cp.chain;
      if (cp.level != Grammar::kUnbounded) {
        grp.canon = g.chain_canon(cp.chain);
        const int32_t len = g.chain_length(grp.canon);
        grp.shift = len - cp.level;
        bottom_pos = g.chain_at(grp.canon, len, cp.offset);
        // Tokens of at most `level` bytes are decided by the key; 254 stands for all of them.
        grp.s = cp.level >= max_depth ? 254 : std::min(cp.level, 253);
      }
    } else {
      last = 0;
      bottom_pos = stacks_[id].pos;
    }
    grp.cut = stacks_[path[last]].parent;
    int32_t local = InternStack(bottom_pos, kEmptyStack);
    for (int k = last - 1; k >= 0 && local >= 0; --k) local = InternStack(stacks_[path[k]].pos, local);
    if (local < 0) return false;  // a limit
    size_t gi = 0;
    while (gi < groups->size() && !((*groups)[gi].cut == grp.cut && (*groups)[gi].chain == grp.chain && (*groups)[gi].shift == grp.shift)) ++gi;
    if (gi == groups->size()) {
      if (gi == kMaxGroups) return false;
      groups->push_back(grp);
      locals.emplace_back();
    }
    locals[gi].push_back(local);
  }
  for (size_t gi = 0; gi < groups->size(); ++gi) {
    const StateId l = InternState(locals[gi]);
    if (l == kDead) return false;
    const ByteSet first = First((*groups)[gi].cut);
    const int32_t key = KeyFor(l, first);
    if (key < 0) return false;
    (*groups)[gi].key = key;
  }
  // Keys that could take the same token: its end state would merge both; walk the state whole.
  for (size_t a = 0; a < groups->size(); ++a)
    for (size_t b = a + 1; b < groups->size(); ++b) {
      const uint64_t* x = keys_[(*groups)[a].key].touch.data();
      const uint64_t* y = keys_[(*groups)[b].key].touch.data();
      for (size_t i = 0; i < words_; ++i)
        if (x[i] & y[i]) return false;
    }
  return !groups->empty();
}

int32_t Automaton::KeyFor(StateId local, const ByteSet& first) {
  auto it = key_ids_.find({local, first});
  if (it != key_ids_.end()) return keys_[it->second].ok ? it->second : -1;
  const int32_t id = static_cast<int32_t>(keys_.size());
  key_ids_.emplace(std::make_pair(local, first), id);
  keys_.emplace_back();
  keys_.back().local = local;
  keys_.back().first = first;
  if (key_bytes_ + index_->nodes().size() + 2 * words_ * sizeof(uint64_t) > kMaxKeyBytes) return -1;
  Key k = std::move(keys_.back());
  BuildKey(&k);
  if (overflow_) k.ok = false;
  keys_[id] = std::move(k);
  return keys_[id].ok ? id : -1;
}

void Automaton::BuildKey(Key* k) {
  const std::vector<TokenIndex::Node>& nodes = index_->nodes();
  const std::vector<int32_t>& ids = index_->token_ids();
  const int32_t n = static_cast<int32_t>(nodes.size());
  // need is filled in a scratch array over the whole trie, then kept for the range of nodes it
  // marks (most keys mark one small subtree: a fresh array per key was mostly page faults).
  std::vector<uint8_t>& need = need_scratch_;  // all zero between calls
  need.resize(static_cast<size_t>(n), 0);
  int32_t lo = n, hi = 0;
  k->touch.assign(words_, 0);
  // The trie nodes whose tokens the local part accepts, with their local end state and length.
  struct Hit {
    StateId end;
    int32_t len, node;
  };
  // Scratch kept by the thread across keys and automata (the engine thread builds them all):
  // fresh pages for a string key's ~30,000 entries cost as much as its walk.
  static thread_local std::vector<Hit> hits, by_len;
  static thread_local std::vector<int32_t> of;
  hits.clear();
  const int32_t max_depth = index_->max_depth();
  std::vector<StateId> at(static_cast<size_t>(max_depth) + 1);
  std::vector<int32_t> path(static_cast<size_t>(max_depth) + 1, 0);
  at[0] = k->local;
  constexpr int32_t kNotYet = -2;
  std::vector<int32_t>& memo = levels_memo_;  // [n_states] LevelsTaken, kNotYet between calls
  std::vector<StateId> memo_set;
  // The repetition at the bottom of the local part (raised to its longest level), if any.
  int32_t chain = -1;
  {
    const State st = states_[k->local];
    for (int32_t x = 0; x < st.count && chain < 0; ++x) {
      const Grammar::ChainPos& cp = grammar_->chain_pos(stacks_[Bottom(state_stacks_[st.first + x])].pos);
      if (cp.chain >= 0 && cp.level != Grammar::kUnbounded) chain = cp.chain;
    }
  }
  int32_t depth = 0;  // of the last node on the path
  // A node's need is the largest of its own and its children's: each is folded into its parent
  // when the walk leaves it (once per node, not once per token per ancestor).
  auto fold_to = [&](int32_t d) {
    for (; depth >= d && depth > 0; --depth) {
      uint8_t& up = need[path[depth - 1]];
      up = std::max(up, need[path[depth]]);
    }
  };
  int64_t visited = 0;
  for (int32_t i = 1; i < n;) {
    const TokenIndex::Node& node = nodes[i];
    fold_to(node.depth);
    const StateId p = at[node.depth - 1];
    path[node.depth] = i;
    depth = node.depth;
    ++visited;
    if (states_[p].accepting && k->first.Has(node.byte)) {
      // The local part may end before this byte and what lies below go on: uncertain subtree.
      lo = std::min(lo, path[1]);
      hi = std::max(hi, node.end - 1);
      for (int32_t j = i; j < node.end; ++j) {
        need[j] = 255;
        for (int32_t t = nodes[j].tok_begin; t < nodes[j].tok_end; ++t) k->touch[ids[t] >> 6] |= uint64_t{1} << (ids[t] & 63);
      }
      i = node.end;
      continue;
    }
    const StateId t = Transition(p, node.byte);
    if (overflow_) {
      std::fill(need.begin(), need.end(), 0);
      for (StateId x : memo_set) memo[x] = kNotYet;
      return;
    }
    if (t == kDead) {
      i = node.end;
      continue;
    }
    at[node.depth] = t;
    if (node.tok_begin < node.tok_end) {
      // Its length is the levels it takes where its end state tells them, else its bytes (and
      // then, if longer than a group's level, the group's walk decides it).
      int32_t len = std::min<int32_t>(node.depth, 254);
      int32_t levels = -1;
      if (chain >= 0) {  // once per end state (a string's ~30,000 tokens end in a few dozen)
        if (memo.size() <= static_cast<size_t>(t)) memo.resize(states_.size(), kNotYet);
        if (memo[t] == kNotYet) {
          memo[t] = LevelsTaken(t, chain);
          memo_set.push_back(t);
        }
        levels = memo[t];
      }
      const bool exact = levels >= 0 && levels <= len;
      if (exact) len = levels;
      for (int32_t x = node.tok_begin; x < node.tok_end; ++x) k->touch[ids[x] >> 6] |= uint64_t{1} << (ids[x] & 63);
      if (!exact) need[i] = std::max(need[i], static_cast<uint8_t>(len));
      lo = std::min(lo, path[1]);
      hi = std::max(hi, i);
      hits.push_back({t, len, i});
    }
    ++i;
  }
  fold_to(1);
  for (StateId t : memo_set) memo[t] = kNotYet;
  stats_.nodes_visited += visited;
  // The root's entry is never read (walks start below it).
  k->need_lo = lo;
  if (lo <= hi) {
    k->need.assign(need.begin() + lo, need.begin() + hi + 1);
    std::fill(need.begin() + lo, need.begin() + hi + 1, 0);
  }
  need[0] = 0;
  // The accepted tokens by end state, then length: two stable counting sorts (a comparison sort
  // of a string key's ~30,000 tokens was half of building it).
  int32_t longest = -1;
  for (const Hit& h : hits) longest = std::max(longest, h.len);
  std::vector<int32_t> count(static_cast<size_t>(longest) + 2, 0);
  for (const Hit& h : hits) count[h.len + 1]++;
  for (size_t x = 1; x < count.size(); ++x) count[x] += count[x - 1];
  by_len.resize(hits.size());
  for (const Hit& h : hits) by_len[count[h.len]++] = h;
  // Rows of cum: the accepted tokens of at most each length.
  k->len_slot.assign(static_cast<size_t>(longest) + 1, -1);
  int16_t rows = 0;
  for (size_t x = 0; x < by_len.size();) {
    const int32_t len = by_len[x].len;
    const size_t off = k->cum.size();
    k->cum.resize(off + words_, 0);
    if (rows > 0) std::memcpy(k->cum.data() + off, k->cum.data() + off - words_, words_ * sizeof(uint64_t));
    for (; x < by_len.size() && by_len[x].len == len; ++x) {
      const TokenIndex::Node& node = nodes[by_len[x].node];
      for (int32_t t = node.tok_begin; t < node.tok_end; ++t) k->cum[off + (ids[t] >> 6)] |= uint64_t{1} << (ids[t] & 63);
    }
    k->len_slot[len] = rows++;
  }
  for (size_t len = 1; len < k->len_slot.size(); ++len)
    if (k->len_slot[len] < 0) k->len_slot[len] = k->len_slot[len - 1];
  // Distinct end states, each a bucket (in order of first appearance); the tokens bucket by
  // bucket, by length within.
  std::vector<StateId> ends;
  std::vector<int32_t>& bucket = end_bucket_;  // [n_states], -1 between calls
  if (bucket.size() < states_.size()) bucket.resize(states_.size(), -1);
  of.resize(by_len.size());
  for (size_t x = 0; x < by_len.size(); ++x) {
    int32_t& b = bucket[by_len[x].end];
    if (b < 0) {
      b = static_cast<int32_t>(ends.size());
      ends.push_back(by_len[x].end);
    }
    of[x] = b;
  }
  for (StateId e : ends) bucket[e] = -1;
  std::vector<int32_t> first(ends.size() + 1, 0);
  for (size_t x = 0; x < by_len.size(); ++x) {
    const TokenIndex::Node& node = nodes[by_len[x].node];
    first[of[x] + 1] += node.tok_end - node.tok_begin;
  }
  for (size_t e = 1; e < first.size(); ++e) first[e] += first[e - 1];
  k->tokens.resize(static_cast<size_t>(first.back()));
  k->end_tokens.assign(first.begin(), first.end());
  k->ends.resize(ends.size());
  for (size_t e = 0; e < ends.size(); ++e) k->ends[e] = {ends[e], -1};
  for (size_t x = 0; x < by_len.size(); ++x) {
    auto& shortest = k->ends[of[x]].second;
    if (shortest < 0) shortest = by_len[x].len;  // by length: the first is the shortest
    const TokenIndex::Node& node = nodes[by_len[x].node];
    for (int32_t t = node.tok_begin; t < node.tok_end; ++t) k->tokens[first[of[x]]++] = {by_len[x].len, ids[t]};
  }
  key_bytes_ += k->need.size() + (k->cum.size() + k->touch.size()) * sizeof(uint64_t) + k->ends.size() * 12 +
                k->tokens.size() * 8 + k->len_slot.size() * 2;
  k->ok = true;
}

int32_t Automaton::Bottom(int32_t stack) const {
  if (stack == kEmptyStack) return stack;
  while (stacks_[stack].parent != kEmptyStack) stack = stacks_[stack].parent;
  return stack;
}

int32_t Automaton::LevelsTaken(StateId t, int32_t chain) const {
  const State& st = states_[t];
  bool between = false;  // the local part may end here: the last x is complete
  int32_t lo = INT32_MAX, hi = -1;
  for (int32_t x = 0; x < st.count; ++x) {
    const int32_t id = state_stacks_[st.first + x];
    if (id == kEmptyStack) {
      between = true;
      continue;
    }
    const Grammar::ChainPos& cp = grammar_->chain_pos(stacks_[Bottom(id)].pos);
    if (cp.chain != chain || cp.level == Grammar::kUnbounded) return -1;
    lo = std::min(lo, cp.level);
    hi = std::max(hi, cp.level);
  }
  if (hi < 0) return -1;
  const int32_t top = grammar_->chain_length(chain);
  // Between two x: every stack starts the x of R_lo, so the x of R_(lo+1) was the last taken.
  if (between) return lo == hi ? top - lo : -1;
  // Inside an x (of R_hi at the most): it takes that level too.
  return top - hi + 1;
}

bool Automaton::Reroot(StateId local_end, const Group& g, StateId* out) {
  const Grammar& gr = *grammar_;
  std::vector<int32_t> stacks, pos;
  const State st = states_[local_end];
  for (int32_t i = 0; i < st.count; ++i) {
    const int32_t id = state_stacks_[st.first + i];
    if (id == kEmptyStack) {  // the local part ended: what lies below goes on
      if (g.cut == kEmptyStack) stacks.push_back(kEmptyStack);
      else Expand(stacks_[g.cut].pos, stacks_[g.cut].parent, &stacks);
      continue;
    }
    pos.clear();
    for (int32_t x = id; x != kEmptyStack; x = stacks_[x].parent) pos.push_back(stacks_[x].pos);
    size_t m = pos.size();
    if (g.shift > 0 || g.chain != g.canon) {
      // The bottom is a node of the raised repetition: lower it back (into the real chain). A
      // level below 1 is an x the real repetition does not allow (its "" alternative is in the
      // state too). Not a node of it: x's own nodes below R_1 (x is in tail position there),
      // which the real chain has alike at its level 1.
      const Grammar::ChainPos cp = gr.chain_pos(pos.back());
      if (cp.chain == g.canon && cp.level != Grammar::kUnbounded) {
        const int32_t level = cp.level - g.shift;
        if (level < 1) continue;
        pos.back() = gr.chain_at(g.chain, level, cp.offset);
        // R_1 ::= x | "": x is in tail position there, so the automaton pushes no node for it.
        if (gr.elements()[pos.back()].kind == Element::kEnd) --m;
      } else if (g.shift > 0) {
        return false;
      }
    }
    int32_t parent = g.cut;
    for (size_t k = m; k-- > 0;) {
      parent = InternStack(pos[k], parent);
      if (parent < 0) return false;
    }
    stacks.push_back(parent);
  }
  if (overflow_) return false;
  const StateId r = InternState(stacks);
  if (overflow_) return false;
  *out = r;
  return true;
}

int32_t Automaton::GroupEnds(const Group& g) {
  constexpr StateId kNotYet = -3;
  auto [it, fresh] = group_end_ids_.try_emplace({g.key, g.cut, g.chain, g.shift}, static_cast<int32_t>(group_ends_.size()));
  const int32_t gi = it->second;
  if (fresh) group_ends_.emplace_back(keys_[g.key].ends.size(), kNotYet);
  const auto& ends = keys_[g.key].ends;
  for (size_t e = 0; e < ends.size(); ++e) {
    if (ends[e].second > g.s || group_ends_[gi][e] != kNotYet) continue;
    StateId r;
    if (!Reroot(ends[e].first, g, &r)) return -1;
    group_ends_[gi][e] = r;
  }
  return gi;
}

template <class Fn>
bool Automaton::EachKeyEnd(StateId s, Fn&& fn) {
  if (!Split(s, &groups_)) return false;
  for (const Group& g : groups_) {
    const int32_t gi = GroupEnds(g);
    if (gi < 0) return false;
    const Key& k = keys_[g.key];
    for (size_t e = 0; e < k.ends.size(); ++e) {
      if (k.ends[e].second > g.s || group_ends_[gi][e] == kDead) continue;
      const int32_t c = states_[group_ends_[gi][e]].cost;  // known: one of s's end states (MaxEndCost)
      if (c < 0) return false;
      const auto* begin = k.tokens.data() + k.end_tokens[e];
      const auto* end = k.tokens.data() + k.end_tokens[e + 1];
      // By length: the group's level decides the tokens of at most g.s bytes.
      end = std::partition_point(begin, end, [&](const std::pair<int32_t, int32_t>& t) { return t.first <= g.s; });
      fn(c, begin, end);
    }
  }
  return true;
}

bool Automaton::CostlySplit(StateId s, int32_t above, size_t limit, uint64_t* w, std::vector<std::pair<int32_t, int32_t>>* out) {
  const bool ok = EachKeyEnd(s, [&](int32_t c, const std::pair<int32_t, int32_t>* t, const std::pair<int32_t, int32_t>* end) {
    if (c <= above) return;
    for (; t < end && out->size() <= limit; ++t) out->push_back({c, t->second});
  });
  if (!ok) return false;
  if (out->size() > limit) return true;  // too many to list: the caller gives up on the list
  Collect collect{out, above, limit};
  Walk(s, Grammar::kFar, w, /*info=*/false, &collect, &groups_);
  return !overflow_;
}

bool Automaton::FilterSplit(StateId s, int32_t allow, uint64_t* w) {
  std::memset(w, 0, words_ * sizeof(uint64_t));
  const bool ok = EachKeyEnd(s, [&](int32_t c, const std::pair<int32_t, int32_t>* t, const std::pair<int32_t, int32_t>* end) {
    if (c > allow) return;
    for (; t < end; ++t) w[t->second >> 6] |= uint64_t{1} << (t->second & 63);
  });
  if (!ok) return false;
  Walk(s, allow, w, /*info=*/false, nullptr, &groups_);
  return !overflow_;
}

}  // namespace mnemo::grammar
