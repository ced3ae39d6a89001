// The vocabulary as the grammar matcher sees it: each token's bytes, in a trie laid out in
// preorder so that a mask walk visits only the prefixes the grammar keeps alive (automaton.h).
//
// Thread safety: immutable after Build; share one per tokenizer.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace mnemo {
class Tokenizer;
}

namespace mnemo::grammar {

class TokenIndex {
 public:
  // pieces[id]: the bytes token id adds to the output ("" = never allowed by a grammar: control,
  // unknown and unused tokens); eog: end-of-generation ids, allowed exactly when the grammar
  // accepts. Cost: O(total piece bytes · log n_vocab) (one sort).
  static std::shared_ptr<const TokenIndex> Build(std::vector<std::string> pieces, std::vector<int32_t> eog);
  // From a tokenizer: Tokenizer::TokenToPiece of every non-control token (byte-fallback tokens
  // are their single byte, so partial UTF-8 is matched byte by byte) and its IsEog ids.
  static std::shared_ptr<const TokenIndex> Build(const Tokenizer& tok);

  // Trie node, preorder: node 0 is the root (no byte); a node's subtree is [index, end).
  struct Node {
    int32_t end;          // one past the last node of this subtree
    int32_t tok_begin;    // tokens whose piece ends here: token_ids()[tok_begin, tok_end)
    int32_t tok_end;
    uint16_t depth;       // bytes from the root (root 0)
    uint8_t byte;         // the byte on the edge into this node
  };
  const std::vector<Node>& nodes() const { return nodes_; }  // [n_nodes]
  const std::vector<int32_t>& token_ids() const { return ids_; }
  // Depth of the deepest node in each node's subtree ([n_nodes]): how many more bytes any token
  // below a prefix can add, which bounds what a walk can still find there.
  const std::vector<uint16_t>& subtree_depth() const { return subtree_depth_; }
  // The root's child for each byte (-1: no piece starts with it): a walk that can take only a
  // few first bytes goes straight to their subtrees.
  int32_t root_child(uint8_t byte) const { return root_children_[byte]; }
  const std::vector<int32_t>& eog() const { return eog_; }
  const std::string& piece(int32_t id) const { return pieces_[id]; }
  int32_t n_vocab() const { return static_cast<int32_t>(pieces_.size()); }
  int max_depth() const { return max_depth_; }  // longest piece, bytes
  bool is_eog(int32_t id) const { return id >= 0 && id < n_vocab() && eog_flag_[id]; }
  // Every byte value is a token of its own (SPM byte fallback, GPT-2 byte tokens): any output can
  // be written one byte per token, so n bytes never take more than n tokens.
  bool all_bytes() const { return all_bytes_; }

 private:
  std::vector<std::string> pieces_;  // [n_vocab]
  std::vector<Node> nodes_;
  std::vector<int32_t> ids_;         // token ids grouped by trie node
  std::vector<uint16_t> subtree_depth_;
  std::array<int32_t, 256> root_children_;
  std::vector<int32_t> eog_;
  std::vector<uint8_t> eog_flag_;    // [n_vocab]
  int max_depth_ = 0;
  bool all_bytes_ = false;
};

}  // namespace mnemo::grammar
