#include "grammar/token_index.h"

#include <algorithm>

#include "base/status.h"
#include "tokenizer/tokenizer.h"

namespace mnemo::grammar {

std::shared_ptr<const TokenIndex> TokenIndex::Build(std::vector<std::string> pieces, std::vector<int32_t> eog) {
  auto t = std::make_shared<TokenIndex>();
  t->pieces_ = std::move(pieces);
  const int32_t n = static_cast<int32_t>(t->pieces_.size());
  t->eog_flag_.assign(n, 0);
  for (int32_t id : eog) {
    if (id >= 0 && id < n && !t->eog_flag_[id]) {
      t->eog_flag_[id] = 1;
      t->eog_.push_back(id);
    }
  }
  std::vector<int32_t> order;
  for (int32_t id = 0; id < n; ++id) {
    // A piece longer than the depth field (never seen in real vocabularies) is left out.
    if (!t->pieces_[id].empty() && !t->eog_flag_[id] && t->pieces_[id].size() < 65535) order.push_back(id);
  }
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    const std::string& pa = t->pieces_[a];
    const std::string& pb = t->pieces_[b];
    return pa != pb ? pa < pb : a < b;
  });
  // Sorted pieces give the trie in preorder: each piece shares its prefix with the previous one.
  t->nodes_.push_back({0, 0, 0, 0, 0});
  std::vector<int32_t> path = {0};  // node index per depth along the current piece
  const std::string* prev = nullptr;
  for (int32_t id : order) {
    const std::string& p = t->pieces_[id];
    size_t common = 0;
    if (prev) {
      while (common < p.size() && common < prev->size() && p[common] == (*prev)[common]) ++common;
    }
    // Close the subtrees deeper than the shared prefix.
    while (path.size() > common + 1) {
      t->nodes_[path.back()].end = static_cast<int32_t>(t->nodes_.size());
      path.pop_back();
    }
    for (size_t d = common; d < p.size(); ++d) {
      path.push_back(static_cast<int32_t>(t->nodes_.size()));
      const int32_t k = static_cast<int32_t>(t->ids_.size());
      t->nodes_.push_back({0, k, k, static_cast<uint16_t>(d + 1), static_cast<uint8_t>(p[d])});
    }
    Node& leaf = t->nodes_[path.back()];
    // Tokens of one node must be contiguous in ids_: equal pieces are adjacent in `order`.
    if (leaf.tok_end != static_cast<int32_t>(t->ids_.size())) leaf.tok_begin = leaf.tok_end = static_cast<int32_t>(t->ids_.size());
    t->ids_.push_back(id);
    leaf.tok_end++;
    t->max_depth_ = std::max(t->max_depth_, static_cast<int>(p.size()));
    prev = &p;
  }
  while (!path.empty()) {
    t->nodes_[path.back()].end = static_cast<int32_t>(t->nodes_.size());
    path.pop_back();
  }
  const int32_t n_nodes = static_cast<int32_t>(t->nodes_.size());
  t->subtree_depth_.resize(n_nodes);
  for (int32_t i = n_nodes; i-- > 0;) {  // children come after their parent: fill from the back
    uint16_t d = t->nodes_[i].depth;
    for (int32_t c = i + 1; c < t->nodes_[i].end; c = t->nodes_[c].end) d = std::max(d, t->subtree_depth_[c]);
    t->subtree_depth_[i] = d;
  }
  int single = 0;  // depth-1 nodes holding a token: one per byte value
  t->root_children_.fill(-1);
  for (int32_t i = 1; i < n_nodes; i = t->nodes_[i].end) {
    const Node& node = t->nodes_[i];
    t->root_children_[node.byte] = i;
    single += node.tok_begin < node.tok_end;
  }
  t->all_bytes_ = single == 256;
  return t;
}

std::shared_ptr<const TokenIndex> TokenIndex::Build(const Tokenizer& tok) {
  std::vector<std::string> pieces(tok.n_vocab());
  std::vector<int32_t> eog;
  for (int32_t id = 0; id < tok.n_vocab(); ++id) {
    if (tok.IsEog(id)) eog.push_back(id);
    if (tok.IsControl(id)) continue;
    pieces[id] = tok.TokenToPiece(id, /*special=*/false);
  }
  return Build(std::move(pieces), std::move(eog));
}

}  // namespace mnemo::grammar
