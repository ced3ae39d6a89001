// The service's session match, indexed: which idle session of an owner shares the longest token
// prefix with a request. A radix tree (compressed trie over token ids) per owner; each session sits
// at the node where its log ends, and each node counts the idle sessions at or below it.
//
// Best(owner, tokens) answers what a scan of every session would (Service::BestSession's rule):
//   the idle session of `owner` maximising n = LCP(its log, tokens), n > 0; among those with the
//   largest n, one whose whole log is the shared prefix (the caller continues it rather than
//   forking it) if there is one. Returns {-1, 0} when no idle session shares a token. Among
//   sessions that are equally good, which one is returned is unspecified (a scan over a hash map
//   picked one as arbitrarily).
//
// Costs (L = the request's tokens, D = the branch points on its path, i.e. the tree's nodes along
// it, at most one per fork or divergence point, never more than the sessions sharing the prefix):
//   Best:     O(L) token compares + O(D) hash probes, plus, only when the best match lies on a side
//             branch, a walk down to one idle session under it (child maps scanned until one with
//             an idle count).
//   Insert:   O(log length + D).      Remove: O(D + sessions ending at the same node).
//   Append:   O(appended tokens + D); O(appended) alone in the common case (the session is the only
//             one at a leaf: its edge grows in place).
//   Truncate: O(D + removed tokens on the session's own leaf edge), else a remove and re-insert.
//   SetIdle:  O(D) (the counts on the path to the root).
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
  PrefixIndex() = default;
  PrefixIndex(const PrefixIndex&) = delete;
  PrefixIndex& operator=(const PrefixIndex&) = delete;

  // Adds session id (absent) with its log. CHECK-fails when id is present.
  void Insert(int64_t id, const std::string& owner, std::span<const int32_t> tokens, bool idle);
  // Forgets id; absent ids are ignored.
  void Remove(int64_t id);
  // The session's log grows by `more`. CHECK-fails when id is absent.
  void Append(int64_t id, std::span<const int32_t> more);
  // Cuts the session's log to its first n tokens (n <= its length). CHECK-fails when id is absent.
  void Truncate(int64_t id, size_t n);
  // Busy sessions (idle = false) are indexed but never matched. Absent ids are ignored.
  void SetIdle(int64_t id, bool idle);

  // See the header comment: {session, shared prefix length}, or {-1, 0}.
  std::pair<int64_t, size_t> Best(const std::string& owner, std::span<const int32_t> tokens) const;

  bool Contains(int64_t id) const { return sessions_.count(id) != 0; }
  size_t Length(int64_t id) const;  // the indexed log length of id (0 when absent)
  size_t size() const { return sessions_.size(); }
  size_t num_nodes() const { return num_nodes_; }

  // Recounts everything from scratch and CHECK-fails on any mismatch (tests): edge keys, depths,
  // parent links, idle counts, session positions, no empty leaves.
  void CheckInvariants() const;

 private:
  struct Node {
    Node* parent = nullptr;
    std::vector<int32_t> edge;  // [edge_len] tokens from the parent's end to this node's end (root: empty)
    size_t depth = 0;           // tokens from the root to this node's end
    std::unordered_map<int32_t, std::unique_ptr<Node>> children;  // keyed by their edge's first token
    std::vector<int64_t> here;  // sessions whose log ends exactly here, in insertion order
    int64_t idle_below = 0;     // idle sessions here or in the subtree
  };
  struct Rec {
    std::string owner;
    Node* node = nullptr;
    bool idle = true;
  };

  Node* Root(const std::string& owner);
  // Descends from `from` along tokens (splitting an edge where they diverge inside it, adding a
  // leaf for what no edge holds) and returns the node where tokens end.
  Node* Descend(Node* from, std::span<const int32_t> tokens);
  // Splits child c's edge after k tokens (0 < k < edge size): a new node takes c's place.
  Node* Split(Node* c, size_t k);
  void AddIdle(Node* n, int64_t delta);
  void Detach(int64_t id, Rec& r);  // takes id off its node (idle count included)
  void Prune(Node* n);              // deletes n and its ancestors while they are empty leaves
  // An idle session at or below n (n->idle_below > 0), preferring one that ends at n.
  static int64_t AnyIdle(const Node* n, const std::unordered_map<int64_t, Rec>& sessions);
  size_t CheckNode(const Node* n, const std::string& owner, std::unordered_map<int64_t, const Node*>* seen) const;

  std::unordered_map<std::string, std::unique_ptr<Node>> roots_;  // by owner
  std::unordered_map<int64_t, Rec> sessions_;                      // by session id
  size_t num_nodes_ = 0;                                           // non-root nodes
};

}  // namespace mnemo
