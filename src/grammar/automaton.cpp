#include "grammar/automaton.h"

#include <algorithm>
#include <cstring>
#include <functional>

namespace mnemo::grammar {
namespace {
constexpr int32_t kUnknown = -2;  // a transition not computed yet
constexpr int32_t kEmptyStack = 0;
}  // namespace

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
  if (static_cast<int32_t>(states_.size()) >= kMaxStates) {
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

Automaton::StateId Automaton::Transition(StateId s, uint8_t b) {
  if (states_[s].trans < 0) {
    states_[s].trans = static_cast<int32_t>(trans_.size());
    trans_.resize(trans_.size() + 256, kUnknown);
  }
  int32_t t = trans_[states_[s].trans + b];
  if (t == kUnknown) {
    t = ComputeTransition(s, b);
    if (!overflow_) trans_[states_[s].trans + b] = t;  // a refusal caused by a limit is not cached
  }
  return t;
}

Automaton::StateId Automaton::Start() {
  std::lock_guard<std::mutex> lock(mu_);
  if (start_ == kDead) {
    std::vector<int32_t> stacks;
    for (int32_t alt : grammar_->alternatives(grammar_->root())) Expand(alt, kEmptyStack, &stacks);
    start_ = InternState(stacks);
  }
  return start_;
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

Automaton::Stats Automaton::stats() {
  std::lock_guard<std::mutex> lock(mu_);
  Stats s = stats_;
  s.states = static_cast<int64_t>(states_.size());
  s.stacks = static_cast<int64_t>(stacks_.size());
  return s;
}

int32_t Automaton::Walk(StateId s, int32_t limit, uint64_t* words, std::vector<std::pair<int32_t, int32_t>>* costly) {
  const int32_t minc_s = states_[s].minc;
  const std::vector<TokenIndex::Node>& nodes = index_->nodes();
  const std::vector<int32_t>& ids = index_->token_ids();
  const int32_t n = static_cast<int32_t>(nodes.size());
  StateId* at = walk_states_.data();  // at[d]: the state after the first d bytes of the path
  at[0] = s;
  int32_t max_end = 0;
  int64_t visited = 0;
  for (int32_t i = 1; i < n;) {
    const TokenIndex::Node& node = nodes[i];
    const StateId t = Transition(at[node.depth - 1], node.byte);
    ++visited;
    if (t == kDead) {
      i = node.end;  // no token under this prefix can continue the output
      continue;
    }
    at[node.depth] = t;
    if (node.tok_begin < node.tok_end) {
      const int32_t m = states_[t].minc;
      if (m <= limit) {
        max_end = std::max(max_end, m);
        for (int32_t k = node.tok_begin; k < node.tok_end; ++k) {
          words[ids[k] >> 6] |= uint64_t{1} << (ids[k] & 63);
          if (costly && m > minc_s && costly->size() <= kMaxCostly) costly->push_back({m, ids[k]});
        }
      }
    }
    ++i;
  }
  stats_.nodes_visited += visited;
  stats_.masks_computed++;
  return max_end;
}

Status Automaton::FillMask(StateId s, int budget, TokenMask* mask) {
  std::lock_guard<std::mutex> lock(mu_);
  mask->assign(words_, 0);
  if (s < 0) return Status::Ok();
  uint64_t* w = mask->data();
  const int32_t limit = budget == INT_MAX ? Grammar::kFar : std::max(0, budget - 1);
  if (states_[s].mask < 0) {
    std::vector<std::pair<int32_t, int32_t>> costly;
    const int32_t max_end = Walk(s, Grammar::kFar, w, &costly);
    if (overflow_)
      return MakeError(StatusCode::kInvalidArgument,
                       "the grammar is too complex: its matcher exceeded %d states or %d stacks", kMaxStates, kMaxStacks);
    states_[s].max_end_minc = max_end;
    if ((mask_pool_.size() + words_) * sizeof(uint64_t) <= kMaxMaskCacheBytes) {
      states_[s].mask = static_cast<int32_t>(mask_pool_.size() / words_);
      mask_pool_.insert(mask_pool_.end(), w, w + words_);
      if (costly.size() <= kMaxCostly) {
        std::sort(costly.begin(), costly.end(), std::greater<>());
        states_[s].costly = static_cast<int32_t>(costly_.size());
        costly_.push_back(std::move(costly));
      }
    }
  } else {
    std::memcpy(w, mask_pool_.data() + static_cast<size_t>(states_[s].mask) * words_, words_ * sizeof(uint64_t));
    stats_.masks_cached++;
  }
  if (limit < states_[s].max_end_minc && limit >= states_[s].minc && states_[s].costly >= 0) {
    // Every token that does not move away from completion fits; drop the costly ones that do not.
    for (const auto& [m, id] : costly_[states_[s].costly]) {
      if (m <= limit) break;
      w[id >> 6] &= ~(uint64_t{1} << (id & 63));
    }
  } else if (limit < states_[s].max_end_minc) {
    // Few tokens left: keep only tokens after which the output can still be completed in time.
    std::vector<uint64_t> budgeted(words_, 0);
    Walk(s, limit, budgeted.data());
    bool any = false;
    for (uint64_t x : budgeted) any |= x != 0;
    // Nothing fits (the budget was short from the start): fall back to every grammatical token.
    if (any || states_[s].accepting) std::memcpy(w, budgeted.data(), words_ * sizeof(uint64_t));
    if (overflow_) return MakeError(StatusCode::kInvalidArgument, "the grammar is too complex");
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
