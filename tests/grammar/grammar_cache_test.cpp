// The grammar cache: automata shared by text, prepared when compiled, bounded by count and by the
// memory they hold together (grammar_cache.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "grammar/grammar_cache.h"
#include "split_walks.h"

namespace mnemo::grammar {
namespace {

std::shared_ptr<const TokenIndex> Index() {
  auto idx = test::LoadIndex("stories260K/stories260K.gguf");
  EXPECT_TRUE(idx);
  return idx;
}

const char* kA = R"(root ::= "{" [a-z]{1,20} "}")";
const char* kB = R"(root ::= "[" [0-9]{1,9} "]")";
const char* kC = R"(root ::= ("yes" | "no") " " [a-z]*)";

TEST(GrammarCache, SharesAndPreparesByText) {
  GrammarCache cache(Index());
  auto a = cache.Get(kA);
  ASSERT_TRUE(a.ok()) << a.error().message;
  EXPECT_GT((*a)->stats().masks_computed, 0);  // prepared: the start's mask is walked already
  EXPECT_GT((*a)->stats().bytes, 0);
  auto again = cache.Get(kA);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(a->get(), again->get());
  auto b = cache.Get(kB);
  ASSERT_TRUE(b.ok());
  EXPECT_NE(a->get(), b->get());
  auto bad = cache.Get("root ::= root");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, StatusCode::kInvalidArgument);
}

TEST(GrammarCache, LeastRecentlyUsedGoPastTheCount) {
  GrammarCache cache(Index(), /*capacity=*/2);
  auto a = cache.Get(kA), b = cache.Get(kB);  // held, so that no new one takes a freed address
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(*cache.Get(kA), *a);  // A is now the most recent
  ASSERT_TRUE(cache.Get(kC).ok());  // B goes
  EXPECT_EQ(*cache.Get(kA), *a);
  EXPECT_NE(*cache.Get(kB), *b);  // compiled anew
}

TEST(GrammarCache, BoundedByTheBytesItsAutomataHold) {
  auto idx = Index();
  // Five grammars of one shape, so of about one size.
  std::vector<std::string> texts;
  for (char c : std::string("abcde")) texts.push_back(std::string("root ::= \"") + c + "\" [a-z]{1,20} \"}\"");
  int64_t size = 0;
  {
    GrammarCache probe(idx);
    for (const auto& t : texts) size = std::max(size, (*probe.Get(t))->stats().bytes);
  }
  ASSERT_GT(size, 0);
  // Room for four: each is fresh (at most a quarter of the bound), and the fifth pushes the least
  // recently used out.
  GrammarCache cache(idx, 64, /*max_bytes=*/4 * size);
  std::vector<std::shared_ptr<Automaton>> first;  // held, so that no new one takes a freed address
  for (const auto& t : texts) first.push_back(*cache.Get(t));
  EXPECT_EQ(*cache.Get(texts[4]), first[4]);
  EXPECT_EQ(*cache.Get(texts[1]), first[1]);
  EXPECT_NE(*cache.Get(texts[0]), first[0]);  // went when the fifth came in
  // An automaton past a quarter of the bound serves no new request: compiled anew each time.
  GrammarCache tiny(idx, 64, /*max_bytes=*/1);
  auto a = tiny.Get(kA);
  ASSERT_TRUE(a.ok());
  EXPECT_NE(*tiny.Get(kA), *a);
}

}  // namespace
}  // namespace mnemo::grammar
