#include "split_walks.h"

#include <gtest/gtest.h>

#include <climits>

#include "format/gguf.h"
#include "format/gguf_vocab.h"
#include "tokenizer/tokenizer.h"

namespace mnemo::test {

using grammar::Automaton;
using grammar::Grammar;
using grammar::Matcher;
using grammar::MaskHas;
using grammar::TokenIndex;
using grammar::TokenMask;
using grammar::OrderedJson;
using grammar::SchemaToGrammar;

void ExpectSplitMasksEqual(const std::shared_ptr<grammar::Automaton>& a, const std::shared_ptr<grammar::Automaton>& whole, int walks,
                           const std::function<int(int walk, int cost)>& budget, int unbounded_steps, Rng& rng,
                           const std::string& what) {
  const TokenIndex& idx = a->index();
  const int32_t cost = whole->TokensToEnd(whole->Start());
  TokenMask mask, want;
  std::vector<int32_t> allowed;
  for (int walk = 0; walk < walks; ++walk) {
    const int budget0 = budget(walk, cost);
    const int steps = budget0 == INT_MAX ? unbounded_steps : budget0;
    Matcher m(a), r(whole);
    std::string out;
    for (int step = 0; step < steps && !m.done() && !m.final(); ++step) {
      const int left = budget0 == INT_MAX ? INT_MAX : budget0 - step;
      ASSERT_TRUE(m.FillMask(left, &mask).ok());
      ASSERT_TRUE(r.FillMask(left, &want).ok());
      ASSERT_TRUE(mask == want) << "after '" << out << "' budget " << left << " (walk " << walk << ")\n" << what;
      allowed.clear();
      for (int32_t t = 0; t < idx.n_vocab(); ++t)
        if (MaskHas(mask, t) && !idx.is_eog(t)) allowed.push_back(t);
      if (allowed.empty()) break;
      const int32_t t = allowed[rng.Next() % allowed.size()];
      ASSERT_TRUE(m.Accept(t).ok());
      ASSERT_TRUE(r.Accept(t).ok());
      out += idx.piece(t);
    }
  }
}

std::shared_ptr<Automaton> ExpectSchemaSplitMasksEqual(const OrderedJson& schema, const std::shared_ptr<const TokenIndex>& idx,
                                                       int walks, const std::function<int(int walk, int cost)>& budget,
                                                       int unbounded_steps, Rng& rng) {
  auto text = SchemaToGrammar(schema);
  EXPECT_TRUE(text.ok()) << text.error().message;
  if (!text.ok()) return nullptr;
  auto make = [&]() -> std::shared_ptr<Automaton> {
    auto g = Grammar::Parse(*text);
    EXPECT_TRUE(g.ok()) << g.error().message;
    if (!g.ok()) return nullptr;
    return std::make_shared<Automaton>(std::make_shared<Grammar>(std::move(*g)), idx);
  };
  auto a = make(), whole = make();
  if (!a || !whole) return nullptr;
  whole->set_split_masks(false);
  a->Prepare();  // as the server compiles it: the greedy path's masks and keys built ahead
  EXPECT_GT(a->stats().masks_computed, 0) << schema.dump();
  ExpectSplitMasksEqual(a, whole, walks, budget, unbounded_steps, rng, "schema " + schema.dump());
  return a;
}

std::shared_ptr<const TokenIndex> LoadIndex(const std::string& file) {
  auto f = gguf::GgufFile::Open(std::string(MNEMO_SHARED_DIR) + "/models/" + file);
  if (!f.ok()) return nullptr;
  auto v = gguf::ReadVocab(*f);
  if (!v.ok()) return nullptr;
  auto tok = Tokenizer::Create(*v);
  if (!tok.ok()) return nullptr;
  return TokenIndex::Build(**tok);
}

std::string RandomWalk(const std::shared_ptr<grammar::Automaton>& a, Rng& rng, int budget, bool* ended) {
  Matcher m(a);
  const TokenIndex& idx = a->index();
  std::string out;
  TokenMask mask;
  std::vector<int32_t> allowed;
  for (int step = 0; step < budget && !m.done(); ++step) {
    EXPECT_TRUE(m.FillMask(budget - step, &mask).ok());
    allowed.clear();
    bool eos = false;
    for (int32_t t = 0; t < idx.n_vocab(); ++t) {
      if (!MaskHas(mask, t)) continue;
      if (idx.is_eog(t)) eos = true;
      else allowed.push_back(t);
    }
    int32_t t;
    if (eos && (allowed.empty() || rng.Next() % 2 == 0)) t = idx.eog()[0];
    else if (allowed.empty()) break;
    else t = allowed[rng.Next() % allowed.size()];
    EXPECT_TRUE(m.Accept(t).ok());
    if (!idx.is_eog(t)) out += idx.piece(t);
  }
  *ended = m.accepting();
  return out;
}

}  // namespace mnemo::test
