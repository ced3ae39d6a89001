#include "split_walks.h"

#include <gtest/gtest.h>

#include <climits>

namespace mnemo::test {

using grammar::Matcher;
using grammar::MaskHas;
using grammar::TokenIndex;
using grammar::TokenMask;

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

}  // namespace mnemo::test
