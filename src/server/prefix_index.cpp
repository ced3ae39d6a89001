#include "server/prefix_index.h"

#include <algorithm>

#include "base/status.h"

namespace mnemo {

PrefixIndex::Node* PrefixIndex::Root(const std::string& owner) {
  auto& root = roots_[owner];
  if (!root) root = std::make_unique<Node>();
  return root.get();
}

PrefixIndex::Node* PrefixIndex::Split(Node* c, size_t k) {
  MNEMO_CHECK(c->parent && k > 0 && k < c->edge.size());
  Node* p = c->parent;
  auto slot = p->children.find(c->edge[0]);
  MNEMO_CHECK(slot != p->children.end() && slot->second.get() == c);
  auto mid = std::make_unique<Node>();
  mid->parent = p;
  mid->edge.assign(c->edge.begin(), c->edge.begin() + static_cast<std::ptrdiff_t>(k));
  mid->depth = p->depth + k;
  mid->continue_below = c->continue_below;
  mid->fork_below = c->fork_below;
  std::unique_ptr<Node> owned = std::move(slot->second);
  owned->edge.erase(owned->edge.begin(), owned->edge.begin() + static_cast<std::ptrdiff_t>(k));
  owned->parent = mid.get();
  Node* m = mid.get();
  m->children.emplace(owned->edge[0], std::move(owned));
  slot->second = std::move(mid);
  num_nodes_++;
  return m;
}

PrefixIndex::Node* PrefixIndex::Descend(Node* from, std::span<const int32_t> tokens) {
  Node* n = from;
  size_t i = 0;
  while (i < tokens.size()) {
    auto it = n->children.find(tokens[i]);
    if (it == n->children.end()) {  // nothing holds the rest: one new leaf
      auto leaf = std::make_unique<Node>();
      leaf->parent = n;
      leaf->edge.assign(tokens.begin() + static_cast<std::ptrdiff_t>(i), tokens.end());
      leaf->depth = n->depth + leaf->edge.size();
      Node* l = leaf.get();
      n->children.emplace(tokens[i], std::move(leaf));
      num_nodes_++;
      return l;
    }
    Node* c = it->second.get();
    const size_t max = std::min(c->edge.size(), tokens.size() - i);
    size_t k = 1;  // the key is the first token
    while (k < max && c->edge[k] == tokens[i + k]) k++;
    n = k == c->edge.size() ? c : Split(c, k);
    i += k;
  }
  return n;
}

void PrefixIndex::AddUse(Node* n, Use use, int64_t delta) {
  if (use == Use::kNone) return;
  const int64_t cont = use == Use::kContinue ? delta : 0;
  for (; n; n = n->parent) {
    n->continue_below += cont;
    n->fork_below += delta;
  }
}

void PrefixIndex::Detach(int64_t id, Rec& r) {
  auto& here = r.node->here;
  auto it = std::find(here.begin(), here.end(), id);
  MNEMO_CHECK(it != here.end());
  here.erase(it);
  AddUse(r.node, r.use, -1);
}

void PrefixIndex::Prune(Node* n) {
  while (n->parent && n->here.empty() && n->children.empty()) {
    Node* p = n->parent;
    p->children.erase(n->edge[0]);  // destroys n
    num_nodes_--;
    n = p;
  }
}

void PrefixIndex::Insert(int64_t id, const std::string& owner, std::span<const int32_t> tokens, Use use) {
  MNEMO_CHECK_MSG(!sessions_.count(id), "PrefixIndex::Insert: the session is indexed already");
  Node* n = Descend(Root(owner), tokens);
  n->here.push_back(id);
  sessions_.emplace(id, Rec{owner, n, use});
  AddUse(n, use, 1);
}

void PrefixIndex::Remove(int64_t id) {
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return;
  Node* n = it->second.node;
  Detach(id, it->second);
  sessions_.erase(it);
  Prune(n);
}

void PrefixIndex::Append(int64_t id, std::span<const int32_t> more) {
  Rec& r = sessions_.at(id);
  if (more.empty()) return;
  Node* n = r.node;
  if (n->parent && n->children.empty() && n->here.size() == 1) {  // alone on a leaf: grow its edge
    n->edge.insert(n->edge.end(), more.begin(), more.end());
    n->depth += more.size();
    return;
  }
  Detach(id, r);
  Node* m = Descend(n, more);  // below n: n is not pruned
  m->here.push_back(id);
  r.node = m;
  AddUse(m, r.use, 1);
}

void PrefixIndex::Truncate(int64_t id, size_t n) {
  Rec& r = sessions_.at(id);
  Node* x = r.node;
  MNEMO_CHECK_MSG(n <= x->depth, "PrefixIndex::Truncate past the log's end");
  if (n == x->depth) return;
  if (x->children.empty() && x->here.size() == 1 && x->parent->depth < n) {  // alone on a leaf: shrink it
    x->edge.resize(x->edge.size() - (x->depth - n));
    x->depth = n;
    return;
  }
  Node* y = x;  // the node whose edge holds position n: y->parent->depth < n <= y->depth (or the root)
  while (y->parent && y->parent->depth >= n) y = y->parent;
  Node* target = y->depth == n ? y : Split(y, n - y->parent->depth);
  Detach(id, r);
  target->here.push_back(id);
  r.node = target;
  AddUse(target, r.use, 1);
  Prune(x);
}

void PrefixIndex::SetUse(int64_t id, Use use) {
  auto it = sessions_.find(id);
  if (it == sessions_.end() || it->second.use == use) return;
  AddUse(it->second.node, it->second.use, -1);
  it->second.use = use;
  AddUse(it->second.node, use, 1);
}

size_t PrefixIndex::Length(int64_t id) const {
  auto it = sessions_.find(id);
  return it == sessions_.end() ? 0 : it->second.node->depth;
}

int64_t PrefixIndex::AnyAtLeast(const Node* n, Count count, Use least) const {
  for (;;) {
    MNEMO_CHECK(n->*count > 0);
    for (int64_t id : n->here) {
      if (sessions_.at(id).use >= least) return id;
    }
    const Node* next = nullptr;
    for (const auto& [token, c] : n->children) {
      if (c.get()->*count > 0) {
        next = c.get();
        break;
      }
    }
    MNEMO_CHECK_MSG(next, "PrefixIndex: a count without its session");
    n = next;
  }
}

std::pair<int64_t, size_t> PrefixIndex::Match(const std::string& owner, std::span<const int32_t> tokens, Count count,
                                              Use least) const {
  auto rit = roots_.find(owner);
  if (rit == roots_.end()) return {-1, 0};
  // Counts only shrink going down: the deepest path node with one bounds the shared prefix.
  const Node* n = rit->second.get();
  const Node* deepest = nullptr;  // the deepest fully matched path node with a matching session below
  size_t i = 0;
  for (;;) {
    if (n->*count == 0) break;
    deepest = n;
    if (i == tokens.size()) break;
    auto it = n->children.find(tokens[i]);
    if (it == n->children.end()) break;
    const Node* c = it->second.get();
    const size_t max = std::min(c->edge.size(), tokens.size() - i);
    size_t k = 1;
    while (k < max && c->edge[k] == tokens[i + k]) k++;
    if (k < c->edge.size()) {
      // The request leaves c's edge after k tokens: every session under c shares exactly i + k
      // tokens and its log is longer; the sessions at or beside `deepest` share only i.
      if (c->*count > 0) return {AnyAtLeast(c, count, least), i + k};
      break;
    }
    n = c;
    i += k;
  }
  // Sessions ending at `deepest` share all of their log; those on its side branches share its depth.
  if (!deepest || deepest->depth == 0) return {-1, 0};
  return {AnyAtLeast(deepest, count, least), deepest->depth};
}

size_t PrefixIndex::CheckNode(const Node* n, const std::string& owner,
                              std::unordered_map<int64_t, const Node*>* seen) const {
  size_t nodes = 0;
  int64_t cont = 0, fork = 0;
  for (int64_t id : n->here) {
    auto it = sessions_.find(id);
    MNEMO_CHECK_MSG(it != sessions_.end(), "PrefixIndex: a node holds an unknown session");
    MNEMO_CHECK_MSG(it->second.node == n && it->second.owner == owner, "PrefixIndex: a session's node or owner");
    MNEMO_CHECK_MSG(seen->emplace(id, n).second, "PrefixIndex: a session at two nodes");
    cont += it->second.use == Use::kContinue ? 1 : 0;
    fork += it->second.use != Use::kNone ? 1 : 0;
  }
  for (const auto& [token, c] : n->children) {
    MNEMO_CHECK_MSG(c->parent == n && !c->edge.empty() && c->edge[0] == token, "PrefixIndex: a child's key or parent");
    MNEMO_CHECK_MSG(c->depth == n->depth + c->edge.size(), "PrefixIndex: a child's depth");
    MNEMO_CHECK_MSG(!c->here.empty() || !c->children.empty(), "PrefixIndex: an empty leaf");
    nodes += 1 + CheckNode(c.get(), owner, seen);
    cont += c->continue_below;
    fork += c->fork_below;
  }
  MNEMO_CHECK_MSG(cont == n->continue_below, "PrefixIndex: a count of sessions to continue");
  MNEMO_CHECK_MSG(fork == n->fork_below, "PrefixIndex: a count of sessions to fork");
  return nodes;
}

void PrefixIndex::CheckInvariants() const {
  std::unordered_map<int64_t, const Node*> seen;
  size_t nodes = 0;
  for (const auto& [owner, root] : roots_) {
    MNEMO_CHECK_MSG(!root->parent && root->edge.empty() && root->depth == 0, "PrefixIndex: a root");
    nodes += CheckNode(root.get(), owner, &seen);
  }
  MNEMO_CHECK_MSG(nodes == num_nodes_, "PrefixIndex: the node count");
  MNEMO_CHECK_MSG(seen.size() == sessions_.size(), "PrefixIndex: a session on no node");
}

}  // namespace mnemo
