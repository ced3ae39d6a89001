// Grammar text, UTF-8 classes, integer ranges, and the matcher's masks against a brute-force
// check of every token.
#include <gtest/gtest.h>

#include <climits>

#include "base/rng.h"
#include "grammar/automaton.h"
#include "grammar/grammar.h"
#include "grammar/json_schema.h"
#include "split_walks.h"

namespace mnemo::grammar {
namespace {

std::shared_ptr<Automaton> Make(const std::string& text, const std::shared_ptr<const TokenIndex>& idx) {
  auto g = Grammar::Parse(text);
  EXPECT_TRUE(g.ok()) << g.error().message << "\n" << text;
  if (!g.ok()) return nullptr;
  return std::make_shared<Automaton>(std::make_shared<Grammar>(std::move(*g)), idx);
}

// Whether the grammar accepts exactly `bytes`.
bool Accepts(Automaton& a, std::string_view bytes) {
  const auto s = a.Advance(a.Start(), bytes);
  return s != Automaton::kDead && a.Accepting(s);
}

std::shared_ptr<const TokenIndex> ByteVocab() {  // every single byte, plus EOS as id 256
  std::vector<std::string> pieces;
  for (int b = 0; b < 256; ++b) pieces.push_back(std::string(1, static_cast<char>(b)));
  pieces.push_back("");
  return TokenIndex::Build(pieces, {256});
}

TEST(GrammarParse, RejectsBadGrammarsWithTheReason) {
  auto err = [](const std::string& text) {
    auto g = Grammar::Parse(text);
    return g.ok() ? std::string("ok") : g.error().message;
  };
  EXPECT_NE(err("root ::= a").find("'a' is used but not defined"), std::string::npos);
  EXPECT_NE(err("x ::= \"a\"").find("no 'root' rule"), std::string::npos);
  EXPECT_NE(err("root ::= root \"a\" | \"b\"").find("left recursion"), std::string::npos);
  EXPECT_NE(err("root ::= (\"a\"?)*").find("left recursion"), std::string::npos);
  EXPECT_NE(err("root ::= \"a\" root").find("never end"), std::string::npos);
  EXPECT_NE(err("root ::= \"a").find("unterminated"), std::string::npos);
  EXPECT_NE(err("root ::= [b-a]").find("end before start"), std::string::npos);
  EXPECT_NE(err("root ::= \"a\"{3,2}").find("n < m"), std::string::npos);
  EXPECT_NE(err("root ::= \"a\"\nroot ::= \"b\"").find("defined twice"), std::string::npos);
  EXPECT_NE(err("root ::= \"a\"{200000}").find("over"), std::string::npos);
  EXPECT_EQ(err("root ::= | \"a\" # a comment\n  | \"b\" x\nx ::= [^\\]\\\\]"), "ok");
}

TEST(GrammarParse, LiteralsClassesAndRepetitions) {
  auto idx = ByteVocab();
  auto a = Make("root ::= \"a\\n\\x41\\u00e9\" [0-9]{2,3} ( \"x\" | \"yz\" )+ .? [^a-z\\u00e9]*", idx);
  ASSERT_TRUE(a);
  EXPECT_TRUE(Accepts(*a, "a\nA\xC3\xA9" "12x"));
  EXPECT_TRUE(Accepts(*a, "a\nA\xC3\xA9" "123yzx\xE2\x82\xAC" "ABC\xF0\x9F\x98\x80"));
  EXPECT_FALSE(Accepts(*a, "a\nA\xC3\xA9" "1x"));        // too few digits
  EXPECT_FALSE(Accepts(*a, "a\nA\xC3\xA9" "1234x"));     // too many
  EXPECT_FALSE(Accepts(*a, "a\nA\xC3\xA9" "12"));        // + needs one
  EXPECT_FALSE(Accepts(*a, "a\nA\xC3\xA9" "12xqa"));     // [^a-z] refuses a
  EXPECT_FALSE(Accepts(*a, "a\nA\xC3\xA9" "12xq\xC3\xA9"));  // ... and é
  EXPECT_FALSE(Accepts(*a, "a\nA\xC3\xA9" "12x\xC3"));   // half a character
  EXPECT_FALSE(Accepts(*a, "a\nA\xC3\xA9" "12x\xED\xA0\x80"));  // an encoded surrogate
}

TEST(Utf8Sequences, MatchExactlyTheRange) {
  Rng rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    uint32_t lo = static_cast<uint32_t>(rng.Next() % 0x110000), hi = static_cast<uint32_t>(rng.Next() % 0x110000);
    if (trial % 3 == 0) hi = lo + static_cast<uint32_t>(rng.Next() % 300);
    if (lo > hi) std::swap(lo, hi);
    std::vector<std::vector<std::pair<uint8_t, uint8_t>>> seqs;
    Utf8Sequences(lo, hi, &seqs);
    for (int k = 0; k < 300; ++k) {
      uint32_t cp = k < 100 ? lo + static_cast<uint32_t>(rng.Next() % (hi - lo + 1)) : static_cast<uint32_t>(rng.Next() % 0x110000);
      if (k == 100) cp = lo;
      if (k == 101) cp = hi;
      if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) continue;
      std::string u;
      if (cp < 0x80) u = {static_cast<char>(cp)};
      else if (cp < 0x800) u = {static_cast<char>(0xC0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3F))};
      else if (cp < 0x10000) u = {static_cast<char>(0xE0 | (cp >> 12)), static_cast<char>(0x80 | ((cp >> 6) & 0x3F)), static_cast<char>(0x80 | (cp & 0x3F))};
      else u = {static_cast<char>(0xF0 | (cp >> 18)), static_cast<char>(0x80 | ((cp >> 12) & 0x3F)), static_cast<char>(0x80 | ((cp >> 6) & 0x3F)), static_cast<char>(0x80 | (cp & 0x3F))};
      int matches = 0;
      for (const auto& s : seqs) {
        if (s.size() != u.size()) continue;
        bool m = true;
        for (size_t i = 0; i < s.size(); ++i) m &= static_cast<uint8_t>(u[i]) >= s[i].first && static_cast<uint8_t>(u[i]) <= s[i].second;
        matches += m;
      }
      EXPECT_EQ(matches, cp >= lo && cp <= hi ? 1 : 0) << std::hex << cp << " in [" << lo << ", " << hi << "]";
    }
  }
}

TEST(IntegerRange, ExactlyTheIntegersWithinBounds) {
  auto idx = ByteVocab();
  const int64_t bounds[] = {-1000, -101, -100, -99, -10, -9, -1, 0, 1, 7, 9, 10, 19, 20, 99, 100, 101, 150, 999, 1000};
  for (int64_t lo : bounds) {
    for (int64_t hi : bounds) {
      if (lo > hi) continue;
      auto a = Make("root ::= " + IntegerRangeExpr(&lo, &hi), idx);
      ASSERT_TRUE(a);
      for (int64_t v = -1100; v <= 1100; ++v) ASSERT_EQ(Accepts(*a, std::to_string(v)), v >= lo && v <= hi) << v << " in [" << lo << ", " << hi << "]";
      for (const char* bad : {"-0", "00", "01", "+1", "", "-"}) ASSERT_FALSE(Accepts(*a, bad)) << bad;
    }
    // One-sided.
    auto up = Make("root ::= " + IntegerRangeExpr(&lo, nullptr), idx);
    auto down = Make("root ::= " + IntegerRangeExpr(nullptr, &lo), idx);
    for (int64_t v = -3000; v <= 3000; v += 7) {
      ASSERT_EQ(Accepts(*up, std::to_string(v)), v >= lo) << v << " >= " << lo;
      ASSERT_EQ(Accepts(*down, std::to_string(v)), v <= lo) << v << " <= " << lo;
    }
  }
  // zod's safe-integer bounds: a small grammar, exact at the edges.
  const int64_t big = 9007199254740991;
  const int64_t nbig = -big;
  const std::string expr = IntegerRangeExpr(&nbig, &big);
  EXPECT_LT(expr.size(), 20000u);
  auto a = Make("root ::= " + expr, idx);
  for (int64_t v : {big, big - 1, nbig, int64_t{0}, int64_t{123456789012345}}) EXPECT_TRUE(Accepts(*a, std::to_string(v))) << v;
  for (int64_t v : {big + 1, nbig - 1, big * 10}) EXPECT_FALSE(Accepts(*a, std::to_string(v))) << v;
}

// multipleOf (json_schema.h): exactly the multiples within the bounds, whether the bounds are
// multiples or not, as a list (few multiples) or the remainder automaton (many).
TEST(MultipleOf, ExactlyTheMultiplesWithinBounds) {
  auto idx = ByteVocab();
  auto make = [&](const char* schema) {
    auto text = SchemaToGrammar(OrderedJson::parse(schema));
    EXPECT_TRUE(text.ok()) << schema << ": " << (text.ok() ? "" : text.error().message);
    return text.ok() ? Make(*text, idx) : nullptr;
  };
  for (int64_t m : {1, 2, 3, 7, 12, 25, 40, 1000}) {
    for (auto [lo, hi] : {std::pair<int64_t, int64_t>{-20, 103}, {-2999, 3001}, {0, 2000}, {-1000, -7}, {13, 14}}) {
      const std::string schema = R"({"type": "integer", "multipleOf": )" + std::to_string(m) + R"(, "minimum": )" + std::to_string(lo) +
                                 R"(, "maximum": )" + std::to_string(hi) + "}";
      auto r = SchemaToGrammar(OrderedJson::parse(schema));
      const int64_t first = lo >= 0 ? (lo + m - 1) / m * m : -(-lo / m * m);
      if (first > hi) {
        EXPECT_FALSE(r.ok()) << schema;
        continue;
      }
      auto a = make(schema.c_str());
      ASSERT_TRUE(a);
      for (int64_t v = -3100; v <= 3100; ++v) ASSERT_EQ(Accepts(*a, std::to_string(v)), v % m == 0 && v >= lo && v <= hi) << v << " " << schema;
      for (const char* bad : {"-0", "00", "007", "+7", "", "-", "7.0"}) ASSERT_FALSE(Accepts(*a, bad)) << bad;
    }
  }
  // Unbounded (the +-(10^18 - 1) clamp), zod's safe-integer bounds, fractions on integers.
  auto seven = make(R"({"type": "integer", "multipleOf": 7})");
  for (int64_t v : {int64_t{0}, int64_t{-7}, int64_t{7} * 123456789012345, int64_t{999999999999999995}})
    EXPECT_EQ(Accepts(*seven, std::to_string(v)), v % 7 == 0) << v;
  EXPECT_FALSE(Accepts(*seven, "1000000000000000004"));  // 19 digits: past the clamp
  auto five = make(R"({"type": "integer", "multipleOf": 5, "minimum": -9007199254740991, "maximum": 9007199254740991})");
  for (const char* v : {"9007199254740990", "-9007199254740990", "0", "-5", "1234567890"}) EXPECT_TRUE(Accepts(*five, v)) << v;
  for (const char* v : {"9007199254740995", "9007199254740991", "-3", "12"}) EXPECT_FALSE(Accepts(*five, v)) << v;
  auto half = make(R"({"type": "integer", "multipleOf": 2.5})");  // integers: multiples of 5
  EXPECT_TRUE(Accepts(*half, "15"));
  EXPECT_FALSE(Accepts(*half, "12"));
  // Numbers: 10^-k is at most k fraction digits and no exponent; an integer m gives integers.
  auto cents = make(R"({"type": "number", "multipleOf": 0.01, "minimum": -2.5, "maximum": 10})");
  for (const char* v : {"0", "-2", "9.99", "1.5", "-1.25", "10"}) EXPECT_TRUE(Accepts(*cents, v)) << v;
  for (const char* v : {"1.255", "10.5", "1e1", "-3", "11"}) EXPECT_FALSE(Accepts(*cents, v)) << v;
  auto tenths = make(R"({"type": "number", "multipleOf": 0.1})");
  for (const char* v : {"-123.4", "7", "0.1"}) EXPECT_TRUE(Accepts(*tenths, v)) << v;
  for (const char* v : {"0.11", "1e5", "1.0e1"}) EXPECT_FALSE(Accepts(*tenths, v)) << v;
  auto threes = make(R"({"type": "number", "multipleOf": 3, "minimum": 0.5, "maximum": 10})");
  for (const char* v : {"3", "6", "9"}) EXPECT_TRUE(Accepts(*threes, v)) << v;
  for (const char* v : {"0", "3.0", "12", "4"}) EXPECT_FALSE(Accepts(*threes, v)) << v;
}

// A toy vocabulary: all strings of length 1..3 over a small alphabet, plus multi-byte UTF-8 split
// across tokens, plus EOS.
std::shared_ptr<const TokenIndex> ToyVocab(int32_t* eos) {
  const std::string alpha[] = {"{", "}", "a", "b", "x", "y", "z", "\"", ",", " ", "\xC3", "\xA9", "1", "0"};
  std::vector<std::string> pieces = {""};  // id 0: a control token (never allowed)
  for (const auto& a : alpha) {
    pieces.push_back(a);
    for (const auto& b : alpha) {
      pieces.push_back(a + b);
      pieces.push_back(a + b + "x");
    }
  }
  pieces.push_back("\xC3\xA9");  // é whole
  pieces.push_back("ab");        // a duplicate piece
  *eos = static_cast<int32_t>(pieces.size());
  pieces.push_back("");
  return TokenIndex::Build(pieces, {*eos});
}

// TokensToEnd by its definition, from scratch: 0 final, 1 accepting, else one more than after
// the greedy token: the longest along a shortest completion (its end needs its length fewer
// bytes), else the one whose end state needs the fewest bytes; the lowest id among ties.
int32_t BruteCost(Automaton& a, Automaton::StateId s, const TokenIndex& idx, int depth = 0) {
  if (a.Final(s)) return 0;
  if (a.Accepting(s)) return 1;
  if (depth > 500) return Grammar::kFar;
  const int32_t m0 = a.MinBytesToAccept(s);
  int32_t best_m = INT32_MAX;
  bool best_on_path = false;
  Automaton::StateId best = Automaton::kDead;
  for (int32_t t = 0; t < idx.n_vocab(); ++t) {
    if (idx.is_eog(t) || idx.piece(t).empty()) continue;
    const auto n = a.Advance(s, idx.piece(t));
    if (n == Automaton::kDead) continue;
    const int32_t m = a.MinBytesToAccept(n);
    const bool on_path = m == m0 - static_cast<int32_t>(idx.piece(t).size());
    if (on_path > best_on_path || (on_path == best_on_path && m < best_m)) {
      best_on_path = on_path;
      best_m = m;
      best = n;
    }
  }
  if (best == Automaton::kDead) return Grammar::kFar;
  return std::min(Grammar::kFar, 1 + BruteCost(a, best, idx, depth + 1));
}

// Brute force: token t is allowed iff its piece keeps the state alive; EOS iff accepting; with a
// budget, iff the turn can still end in budget - 1 tokens after it (or, when even that cannot
// be, iff it brings the end closer).
TokenMask BruteMask(Automaton& a, Automaton::StateId s, const TokenIndex& idx, int budget) {
  TokenMask m((idx.n_vocab() + 63) / 64, 0);
  const int32_t allow = budget == INT_MAX ? INT32_MAX : std::max(budget - 1, BruteCost(a, s, idx) - 1);
  for (int32_t t = 0; t < idx.n_vocab(); ++t) {
    if (idx.is_eog(t)) {
      if (a.Accepting(s)) m[t >> 6] |= uint64_t{1} << (t & 63);
      continue;
    }
    if (idx.piece(t).empty()) continue;
    const auto n = a.Advance(s, idx.piece(t));
    if (n == Automaton::kDead) continue;
    if (budget != INT_MAX && BruteCost(a, n, idx) > allow) continue;
    m[t >> 6] |= uint64_t{1} << (t & 63);
  }
  return m;
}

TEST(Matcher, MasksEqualBruteForceAlongRandomWalks) {
  int32_t eos;
  auto idx = ToyVocab(&eos);
  auto a = Make(
      "root ::= \"{\" ws ( pair ( \",\" ws pair )* )? \"}\"\n"
      "pair ::= \"\\\"\" [a-z\\u00e9]{0,4} \"\\\"\" ws num ws\n"
      "num ::= \"0\" | \"1\" [01]*\n"
      "ws ::= \" \"?\n",
      idx);
  ASSERT_TRUE(a);
  Rng rng(1);
  int ended = 0;
  const int32_t start_cost = a->TokensToEnd(a->Start());
  EXPECT_EQ(start_cost, BruteCost(*a, a->Start(), *idx));
  for (int walk = 0; walk < 60; ++walk) {
    Matcher m(a);
    std::string out;
    // Budgets from the start's cost (every walk must end in time) to unbounded.
    const int budget0 = walk % 3 == 0 ? INT_MAX : walk % 3 == 1 ? start_cost + walk % 5 : 40;
    const int steps = budget0 == INT_MAX ? 200 : budget0;
    for (int step = 0; step < steps && !m.done(); ++step) {
      const int budget = budget0 == INT_MAX ? INT_MAX : budget0 - step;
      TokenMask mask;
      ASSERT_TRUE(m.FillMask(budget, &mask).ok());
      // The matcher's state is reached by the output so far.
      const auto s = a->Advance(a->Start(), out);
      ASSERT_EQ(a->TokensToEnd(s), BruteCost(*a, s, *idx)) << "after '" << out << "'";
      ASSERT_EQ(mask, BruteMask(*a, s, *idx, budget)) << "after '" << out << "' budget " << budget;
      std::vector<int32_t> allowed;
      for (int32_t t = 0; t < idx->n_vocab(); ++t)
        if (MaskHas(mask, t)) allowed.push_back(t);
      ASSERT_FALSE(allowed.empty()) << out;
      // Prefer continuing early on, so walks get long.
      int32_t t = allowed[rng.Next() % allowed.size()];
      if (t == eos && step < 10 && allowed.size() > 1) t = allowed[rng.Next() % allowed.size()];
      ASSERT_TRUE(m.Accept(t).ok());
      if (t != eos) out += idx->piece(t);
      if (m.final()) break;  // the engine stops here
    }
    if (m.done() || m.final()) {
      ++ended;
      EXPECT_TRUE(Accepts(*a, out)) << out;
    }
    if (budget0 != INT_MAX) {
      EXPECT_TRUE(m.done() || m.final()) << "budget " << budget0 << " ran out with '" << out << "'";
    }
  }
  EXPECT_GT(ended, 30);
  const auto st = a->stats();
  EXPECT_GT(st.masks_cached, 0);
}

// The same random paths through two automata of one grammar, split and whole: equal masks at
// every step, budgets from unbounded down to below the start's cost (the budget's edge is where
// the end states matter).
void ExpectSplitMasksEqual(const std::string& text, const std::shared_ptr<const TokenIndex>& idx, int walks, uint64_t seed) {
  auto a = Make(text, idx);
  auto whole = Make(text, idx);
  ASSERT_TRUE(a && whole);
  whole->set_split_masks(false);
  Rng rng(seed);
  test::ExpectSplitMasksEqual(
      a, whole, walks,
      [](int walk, int cost) {
        const int kinds[] = {INT_MAX, cost + walk % 4, cost + 12, std::max(1, cost - 1), 2 * cost + 5};
        return kinds[walk % 5];
      },
      60, rng, text);
  if (::testing::Test::HasFatalFailure()) return;
  const auto st = a->stats();
  EXPECT_GT(st.masks_split, 0) << text;
  EXPECT_GT(st.keys, 0) << text;
}

TEST(Matcher, SplitMasksEqualWholeWalks) {
  int32_t eos;
  auto toy = ToyVocab(&eos);
  auto bytes = ByteVocab();
  const std::string grammars[] = {
      // Bounded strings of rules (multi-byte x) and of byte sets, sharing x across lengths; a
      // repetition with a minimum; unbounded ones; what follows a string overlapping its content.
      "root ::= \"{\" ws ( pair ( \",\" ws pair )* )? \"}\"\n"
      "pair ::= \"\\\"\" ch{0,7} \"\\\"\" ws ( num | \"\\\"\" ch{2,3} \"\\\"\" ) ws\n"
      "ch ::= [a-z] | \"\\u00e9\" | \"1\" [01]\n"
      "num ::= \"0\" | \"1\" [01]{0,9}\n"
      "ws ::= \" \"{0,3}\n",
      // Repetitions at the root (nothing below them), nested bounded repetitions, ambiguous x.
      "root ::= ( \"a\" | \"ab\" | \"b\" ){0,12} x{1,4}\n"
      "x ::= \"{\" [a-z]{0,5} \"}\" | \"y\"\n",
      "root ::= ( [a-z]{1,3} \",\" ){0,6} \"z\"* \"}\"\n",
      // Strings a byte-at-a-time vocabulary spells out.
      "root ::= \"\\\"\" [^\"\\\\]{0,20} \"\\\"\" ( \",\" [0-9]{1,12} )? \"\\\"\"?\n",
  };
  for (const auto& g : grammars) {
    ExpectSplitMasksEqual(g, toy, 60, 11);
    ExpectSplitMasksEqual(g, bytes, 30, 12);
  }
}

// A tool call's wrapper is long in bytes and short in tokens: a budget far below its bytes but
// covering its tokens still ends every walk complete, and a second call is opened only when it
// can close in time.
TEST(Matcher, TokenBudgetClosesWhereBytesWouldNot) {
  std::vector<std::string> pieces;
  for (int b = 0; b < 256; ++b) pieces.push_back(std::string(1, static_cast<char>(b)));
  for (const char* p : {"<tool_call>", "\n{\"name\": \"weather\", \"arguments\": ", "{\"city\":\"", "\"}", "}\n</tool_call>",
                        "Paris", "London", "ab", "\n<", "tool", "_call>"})
    pieces.push_back(p);
  const int32_t eos = static_cast<int32_t>(pieces.size());
  pieces.push_back("");
  auto idx = TokenIndex::Build(pieces, {eos});
  ASSERT_TRUE(idx->all_bytes());
  auto a = Make(
      "root ::= call ( \"\\n\" call ){0,3}\n"
      "call ::= \"<tool_call>\\n{\\\"name\\\": \\\"weather\\\", \\\"arguments\\\": \" args \"}\\n</tool_call>\"\n"
      "args ::= \"{\\\"city\\\":\\\"\" [a-zA-Z ]{0,12} \"\\\"}\"\n",
      idx);
  ASSERT_TRUE(a);
  const int32_t bytes = a->MinBytesToAccept(a->Start());
  const int32_t cost = a->TokensToEnd(a->Start());
  EXPECT_GT(bytes, 60);
  EXPECT_EQ(cost, 6);  // <tool_call> \n{"name"... {"city":" "} }\n</tool_call> EOS
  Rng rng(3);
  int second_calls = 0;
  for (int walk = 0; walk < 200; ++walk) {
    const int budget0 = cost + walk % 30;
    Matcher m(a);
    std::string out;
    for (int step = 0; step < budget0 && !m.done() && !m.final(); ++step) {
      TokenMask mask;
      ASSERT_TRUE(m.FillMask(budget0 - step, &mask).ok());
      std::vector<int32_t> allowed;
      for (int32_t t = 0; t < idx->n_vocab(); ++t)
        if (MaskHas(mask, t)) allowed.push_back(t);
      ASSERT_FALSE(allowed.empty()) << out;
      const int32_t t = allowed[rng.Next() % allowed.size()];  // a model that knows no JSON
      ASSERT_TRUE(m.Accept(t).ok());
      if (t != eos) out += idx->piece(t);
    }
    ASSERT_TRUE(m.done() || m.final()) << "budget " << budget0 << " ran out with '" << out << "'";
    EXPECT_TRUE(Accepts(*a, out)) << out;
    second_calls += out.find("<tool_call>", 1) != std::string::npos;
  }
  EXPECT_GT(second_calls, 0);  // larger budgets do open more calls
  // A budget below the cost: the output gets as close to the end as it can.
  Matcher m(a);
  std::string out;
  for (int step = 0; step < cost - 1; ++step) {
    TokenMask mask;
    ASSERT_TRUE(m.FillMask(cost - 1 - step, &mask).ok());
    int32_t t = 0;
    while (!MaskHas(mask, t)) ++t;
    ASSERT_TRUE(m.Accept(t).ok());
    out += idx->piece(t);
  }
  EXPECT_EQ(m.MinBytesToAccept(), 0) << out;  // all but the end-of-generation token
}

TEST(Matcher, RefusesWhatTheGrammarDoesNot) {
  int32_t eos;
  auto idx = ToyVocab(&eos);
  auto a = Make("root ::= \"ab\" \"x\"?", idx);
  Matcher m(a);
  EXPECT_FALSE(m.Accept(eos).ok());  // not accepting yet
  EXPECT_FALSE(m.Accept(0).ok());    // a token without text
  // "abx" is one token and finishes the grammar: final, only EOS may follow.
  int32_t abx = -1;
  for (int32_t t = 0; t < idx->n_vocab(); ++t)
    if (idx->piece(t) == "abx") abx = t;
  ASSERT_TRUE(m.Accept(abx).ok());
  EXPECT_TRUE(m.final());
  TokenMask mask;
  ASSERT_TRUE(m.FillMask(INT_MAX, &mask).ok());
  for (int32_t t = 0; t < idx->n_vocab(); ++t) EXPECT_EQ(MaskHas(mask, t), t == eos) << t;
  EXPECT_TRUE(m.Accept(eos).ok());
  EXPECT_TRUE(m.done());
}

}  // namespace
}  // namespace mnemo::grammar
