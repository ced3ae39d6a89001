// Selective context on a model that needs its history (../shared/models/recall, see its
// PROVENANCE.md): in each conversation of tests/data/convkv/recall_cases.jsonl one earlier turn
// states the fact the final question asks about. At a 50% budget with the server's defaults
// (3-factor scoring, keyword relevance, keep_last 1) the service must keep that turn and answer
// as with the whole history, in exact and in reuse mode (cached KV re-rotated). Recency-only
// selection drops the turn in every one of these cases, so replacing relevance by recency (or
// breaking relevance) fails the test. Runs in about a second: tiny model, five conversations.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../model/test_util.h"
#include "chat/chat_template.h"
#include "engine/engine.h"
#include "server/service.h"
#include "tokenizer/tokenizer.h"

namespace mnemo::testing {
namespace {

struct Case {
  std::vector<ChatMessage> messages;  // ends with the question
  int fact_turn = 0;                  // context turn holding the fact (messages 2(k-1), 2(k-1)+1)
  std::string answer;
  int eval_index = 0;
};

std::vector<Case> LoadCases() {
  std::ifstream in(std::string(MNEMO_TEST_DATA_DIR) + "/convkv/recall_cases.jsonl");
  EXPECT_TRUE(in.good());
  std::vector<Case> out;
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    Case c;
    for (const auto& m : j["turns"]) c.messages.push_back({m["role"], m["content"]});
    c.fact_turn = j["fact_turn"].get<int>() / 2 + 1;
    c.answer = j["answer"];
    c.eval_index = j["eval_index"];
    out.push_back(std::move(c));
  }
  return out;
}

// First line of the reply, trimmed, final period stripped (as the recall model's evaluation).
std::string AnswerOf(std::string s) {
  s.erase(0, s.find_first_not_of(" \n"));
  s = s.substr(0, s.find('\n'));
  while (!s.empty() && (s.back() == '.' || s.back() == ' ')) s.pop_back();
  return s;
}

struct Fixture {
  Loaded l;
  std::unique_ptr<Tokenizer> tok;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<Service> service;
  Fixture() : l(Load("models/recall/recall.gguf", "", kernels::Precision::kF32)) {
    tok = std::move(Tokenizer::Create(l.file->vocab()).value());
    EngineConfig ec;
    ec.kv_dtype = DType::F32;
    ec.t0_mb = 64;
    engine = std::move(Engine::Create(*l.model, *tok, ec).value());
    ServiceConfig sc;
    const TensorRef emb = l.file->weights().tok_embd;
    sc.embed_dim = static_cast<int>(emb.cols);
    sc.embed = [emb](int32_t token, float* out) {
      const size_t row = DTypeBytes(emb.dtype, emb.cols);
      ToF32(emb.dtype, static_cast<const uint8_t*>(emb.data) + row * token, out, emb.cols);
    };
    service = std::move(Service::Create(*engine, *tok, ChatTemplate::Fallback(), nullptr, sc).value());
  }
  ~Fixture() {
    service.reset();
    engine.reset();  // before the model it runs
  }
};

Fixture& F() {
  static Fixture f;
  return f;
}

ContextReport Select(const Case& c, const char* method, const char* relevance = "keyword") {
  TurnSpec spec;
  spec.messages = c.messages;
  spec.context.budget = 0.5;
  spec.context.mode = "exact";
  spec.context.method = method;
  spec.context.relevance = relevance;
  auto r = F().service->SelectContext(spec, spec.context.budget);
  EXPECT_TRUE(std::holds_alternative<ContextReport>(r));
  return std::holds_alternative<ContextReport>(r) ? std::get<ContextReport>(r) : ContextReport{};
}

bool Kept(const ContextReport& r, int turn) {
  return std::find(r.kept_turns.begin(), r.kept_turns.end(), turn) != r.kept_turns.end();
}

TEST(ContextRecall, ScoringKeepsTheFactsTurnThatRecencyDrops) {
  const auto cases = LoadCases();
  ASSERT_EQ(cases.size(), 5u);
  for (const Case& c : cases) {
    SCOPED_TRACE("eval row " + std::to_string(c.eval_index));
    const ContextReport recency = Select(c, "recency");
    ASSERT_TRUE(recency.applied);
    EXPECT_FALSE(Kept(recency, c.fact_turn)) << "the case no longer tells relevance from recency";
    for (const char* method : {"score", "relevance"}) {
      const ContextReport r = Select(c, method);
      EXPECT_TRUE(Kept(r, c.fact_turn)) << method;
      EXPECT_FALSE(r.dropped_turns.empty()) << method;
      EXPECT_LE(r.kept_tokens, (r.kept_tokens + r.dropped_tokens) / 2) << method;  // within the budget
    }
  }
}

TEST(ContextRecall, HalfTheHistoryAnswersAsTheWholeDoesInExactAndReuseMode) {
  Service& s = *F().service;
  for (const Case& c : LoadCases()) {
    SCOPED_TRACE("eval row " + std::to_string(c.eval_index));
    auto serve = [&](const ContextRequest* ctx, ContextReport* report) {
      TurnSpec spec;
      spec.messages = c.messages;
      spec.request.max_tokens = 8;
      spec.request.sampling.temperature = 0;
      if (ctx) spec.context = *ctx;
      auto st = s.Start(spec);
      EXPECT_TRUE(std::holds_alternative<StartedTurn>(st));
      if (!std::holds_alternative<StartedTurn>(st)) return std::string();
      StartedTurn& t = std::get<StartedTurn>(st);
      TurnResult r = t.handle->Wait();
      (void)s.Commit(t, r, std::nullopt, std::nullopt, "");
      if (report) *report = t.context;
      return AnswerOf(r.text);
    };
    EXPECT_EQ(serve(nullptr, nullptr), c.answer);  // whole history (also fills the KV reuse needs)
    for (const char* mode : {"exact", "reuse"}) {
      ContextRequest ctx;
      ctx.budget = 0.5;
      ctx.mode = mode;
      ContextReport report;
      EXPECT_EQ(serve(&ctx, &report), c.answer) << mode;
      EXPECT_TRUE(report.applied && Kept(report, c.fact_turn)) << mode;
    }
    for (const auto& v : s.Sessions("")) (void)s.DeleteSession(v.id, "");
  }
}

ContextReport Scored(const Case& c, const char* relevance) {
  TurnSpec spec;
  spec.messages = c.messages;
  spec.context.budget = 0.5;
  spec.context.mode = "exact";
  spec.context.method = "relevance";
  spec.context.relevance = relevance;
  spec.context.scores = true;
  auto r = F().service->SelectContext(spec, spec.context.budget);
  EXPECT_TRUE(std::holds_alternative<ContextReport>(r));
  return std::holds_alternative<ContextReport>(r) ? std::get<ContextReport>(r) : ContextReport{};
}

// Turns ranked above `turn` by relevance.
int RankOf(const ContextReport& r, int turn) {
  int above = 0;
  for (const auto& s : r.scores) above += s.relevance > r.scores[turn].relevance;
  return above;
}

// Attention relevance (Engine::Probe: the question's attention mass on each history turn, through
// every layer, run after the whole history) on the first 60 conversations of the recall model's
// eval.jsonl: it ranks the fact's turn first (no older turn above it) more often than the turn's
// length does (the fact turns are longer than most: a mass spread evenly over the history would
// rank them by length) and than the seed's IDF-weighted embedding. Also: the report counts the
// probe (history + question, once per request).
TEST(ContextRecall, AttentionRelevanceFindsTheFactsTurnMoreOftenThanLength) {
  std::ifstream in(SharedPath("models/recall/eval.jsonl"));
  ASSERT_TRUE(in.good());
  int attention_first = 0, length_first = 0, embedding_first = 0, n = 0;
  std::string line;
  while (n < 60 && std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    Case c;
    for (const auto& m : j["turns"]) c.messages.push_back({m["role"], m["content"]});
    c.fact_turn = j["fact_turn"].get<int>() / 2 + 1;
    const ContextReport a = Scored(c, "attention");
    ASSERT_EQ(a.scores.size(), static_cast<size_t>(a.n_turns));
    EXPECT_GT(a.probe_tokens, a.kept_tokens + a.dropped_tokens);
    attention_first += RankOf(a, c.fact_turn) == 0;
    embedding_first += RankOf(Scored(c, "embedding"), c.fact_turn) == 0;
    // Length rank among the older turns (the newest one is always kept), by the messages' tokens.
    auto len = [&](int t) {
      return F().tok->Encode(c.messages[2 * (t - 1)].content + c.messages[2 * (t - 1) + 1].content, false).size();
    };
    int longer = 0;
    for (int t = 1; t + 1 < a.n_turns; t++) longer += len(t) > len(c.fact_turn);
    length_first += longer == 0;
    n++;
  }
  std::printf("fact turn ranked first, of %d conversations: attention %d, length %d, IDF embedding %d\n", n,
              attention_first, length_first, embedding_first);
  EXPECT_GT(attention_first, length_first);
  EXPECT_GT(attention_first, embedding_first);
}

// Hidden-state relevance embeds each turn once per conversation (one probe pass per turn, cached
// with the conversation's scoring state): a second request of the same conversation runs only the
// new message through the model.
TEST(ContextRecall, HiddenRelevanceProbesEachTurnOnce) {
  const Case c = LoadCases()[0];
  const ContextReport first = Scored(c, "hidden");
  const ContextReport second = Scored(c, "hidden");
  ASSERT_TRUE(first.applied && second.applied);
  const int64_t question = static_cast<int64_t>(F().tok->Encode(c.messages.back().content, false).size());
  EXPECT_EQ(second.probe_tokens, question);
  EXPECT_GT(first.probe_tokens, question);  // the turns too (no hidden state cached before)
  for (size_t t = 1; t < second.scores.size(); t++) {
    EXPECT_TRUE(std::isfinite(second.scores[t].relevance));
    EXPECT_DOUBLE_EQ(first.scores[t].relevance, second.scores[t].relevance);
  }
}


// The word tables on the recall model's 512-piece SPM vocabulary: "cat" is two pieces, one word.
TEST(ContextRecall, KeywordTablesRebuildWordsFromPieces) {
  const Tokenizer& tok = *F().tok;
  std::vector<int32_t> fold;
  std::vector<int8_t> kind;
  KeywordTables(tok, &fold, &kind);
  ASSERT_EQ(fold.size(), static_cast<size_t>(tok.n_vocab()));
  const std::string sp = "\xe2\x96\x81";  // U+2581
  const int32_t upper = tok.TokenId(sp + "M"), lower = tok.TokenId(sp + "m");
  ASSERT_GE(upper, 0);
  ASSERT_GE(lower, 0);
  EXPECT_EQ(fold[upper], lower);
  EXPECT_EQ(fold[lower], lower);
  EXPECT_EQ(kind[tok.TokenId(sp + "c")], 1);
  EXPECT_EQ(kind[tok.TokenId("at")], 0);
  EXPECT_EQ(kind[tok.TokenId("?")], -1);
  EXPECT_EQ(kind[tok.bos()], -1);
}

}  // namespace
}  // namespace mnemo::testing
