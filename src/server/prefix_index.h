// The service's session match, indexed: which session of an owner shares the longest token prefix
// with a request. A radix tree (compressed trie over token ids) per owner; each session sits at the
// node where its log ends with its Use (what a request may make of it), and each node counts the
// sessions at or below it that may be continued (idle) and that may be forked (idle, or busy with
// a committed log).
//
// Best(owner, tokens) answers what a scan of every session would (Service::BestSession's rule):
//   the idle session (Use::kContinue) of `owner` maximising n = LCP(its log, tokens), n > 0; among
//   those with the largest n, one whose whole log is the shared prefix (the caller continues it
//   rather than forking it) if there is one. Returns {-1, 0} when no idle session shares a token.
//   Among sessions that are equally good, which one is returned is unspecified (a scan over a hash
//   map picked one as arbitrarily).
// BestFork(owner, tokens): the same over the sessions that may be forked (kContinue or kFork),
//   without the preference: the caller forks whichever it gets. When its n is larger than Best's,
//   the session it returns is busy (kFork): an idle one sharing n tokens would have been Best's.
//
// Costs (L = the request's tokens, D = the branch points on its path, i.e. the tree's nodes along
// it, at most one per fork or divergence point, never more than the sessions sharing the prefix):
//   Best, BestFork: O(L) token compares + O(D) hash probes, plus, only when the best match lies on
//             a side branch, a walk down to one matching session under it (child maps scanned
//             until one with a count).
//   Insert:   O(log length + D).      Remove: O(D + sessions ending at the same node).
//   Append:   O(appended tokens + D); O(appended) alone in the common case (the session is the only
//             one at a leaf: its edge grows in place).
//   Truncate: O(D + removed tokens on the session's own leaf edge), else a remove and re-insert.
//   SetUse:   O(D) (the counts on the path to the root).
// Nodes are never merged back (a node left with one child and no session stays as a pass-through):
// merging would copy edges, O(length), on removals; leaves without sessions are deleted.
//
// Thread-safety: none; the service calls it under its lock.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace mnemo {

class PrefixIndex {
 public:
  // What a request may make of an indexed session (ordered: each allows what the one before does).
  enum class Use : uint8_t {
    kNone,      // nothing (a busy session whose log cannot be forked yet)
    kFork,      // fork it where the request diverges (a busy session: its log is what it committed)
    kContinue,  // continue it, or fork it (an idle session)
  };

  PrefixIndex() = default;
  PrefixIndex(const PrefixIndex&) = delete;
  PrefixIndex& operator=(const PrefixIndex&) = delete;

  // Adds session id (absent) with its log. CHECK-fails when id is present.
  void Insert(int64_t id, const std::string& owner, std::span<const int32_t> tokens, Use use);
  // Forgets id; absent ids are ignored.
  void Remove(int64_t id);
  // The session's log grows by `more`. CHECK-fails when id is absent.
  void Append(int64_t id, std::span<const int32_t> more);
  // Cuts the session's log to its first n tokens (n <= its length). CHECK-fails when id is absent.
  void Truncate(int64_t id, size_t n);
  // Absent ids are ignored.
  void SetUse(int64_t id, Use use);

  // See the header comment: {session, shared prefix length}, or {-1, 0}.
  std::pair<int64_t, size_t> Best(const std::string& owner, std::span<const int32_t> tokens) const {
    return Match(owner, tokens, &Node::continue_below, Use::kContinue);
  }
  std::pair<int64_t, size_t> BestFork(const std::string& owner, std::span<const int32_t> tokens) const {
    return Match(owner, tokens, &Node::fork_below, Use::kFork);
  }

  bool Contains(int64_t id) const { return sessions_.count(id) != 0; }
  size_t Length(int64_t id) const;  // the indexed log length of id (0 when absent)
  size_t size() const { return sessions_.size(); }
  size_t num_nodes() const { return num_nodes_; }

  // Recounts everything from scratch and CHECK-fails on any mismatch (tests): edge keys, depths,
  // parent links, both counts, session positions, no empty leaves.
  void CheckInvariants() const;

 private:
  struct Node {
    Node* parent = nullptr;
    std::vector<int32_t> edge;  // [edge_len] tokens from the parent's end to this node's end (root: empty)
    size_t depth = 0;           // tokens from the root to this node's end
    std::unordered_map<int32_t, std::unique_ptr<Node>> children;  // keyed by their edge's first token
    std::vector<int64_t> here;  // sessions whose log ends exactly here, in insertion order
    int64_t continue_below = 0;  // kContinue sessions here or in the subtree
    int64_t fork_below = 0;      // kContinue and kFork sessions here or in the subtree
  };
  struct Rec {
    std::string owner;
    Node* node = nullptr;
    Use use = Use::kContinue;
  };
  using Count = int64_t Node::*;  // continue_below or fork_below

  Node* Root(const std::string& owner);
  // Descends from `from` along tokens (splitting an edge where they diverge inside it, adding a
  // leaf for what no edge holds) and returns the node where tokens end.
  Node* Descend(Node* from, std::span<const int32_t> tokens);
  // Splits child c's edge after k tokens (0 < k < edge size): a new node takes c's place.
  Node* Split(Node* c, size_t k);
  // Adds delta to the counts that `use` is in, on n and its ancestors.
  static void AddUse(Node* n, Use use, int64_t delta);
  void Detach(int64_t id, Rec& r);  // takes id off its node (counts included)
  void Prune(Node* n);              // deletes n and its ancestors while they are empty leaves
  // Best and BestFork: count is what sessions of Use at least `least` add to.
  std::pair<int64_t, size_t> Match(const std::string& owner, std::span<const int32_t> tokens, Count count,
                                   Use least) const;
  // A session of Use at least `least` at or below n (n->*count > 0), preferring one that ends at n.
  int64_t AnyAtLeast(const Node* n, Count count, Use least) const;
  size_t CheckNode(const Node* n, const std::string& owner, std::unordered_map<int64_t, const Node*>* seen) const;

  std::unordered_map<std::string, std::unique_ptr<Node>> roots_;  // by owner
  std::unordered_map<int64_t, Rec> sessions_;                      // by session id
  size_t num_nodes_ = 0;                                           // non-root nodes
};

}  // namespace mnemo
