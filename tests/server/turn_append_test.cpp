// Appending a turn to a session's exact token log (server/turn_append.h), model-free, with the real
// Llama 2 SentencePiece vocab (and GPT-2's byte-level BPE) and the fallback and Llama 2 templates:
//  - with the canonical reply tokens, appending turn by turn rebuilds Encode(whole rendering);
//  - a reply the model spelled in non-canonical pieces is kept as generated (text exact);
//  - what the template does not render is cut: trailing whitespace it trims, a stop string, a
//    final end-of-generation token; a control token inside the reply and a missing leading space
//    are the model's own and stay;
//  - an edited reply keeps only the exactly agreeing prefix.
#include "server/turn_append.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>

#include "base/rng.h"
#include "format/gguf.h"
#include "format/gguf_vocab.h"

namespace mnemo {
namespace {

using Ids = std::vector<int32_t>;

std::unique_ptr<Tokenizer> LoadVocab(const std::string& name) {
  auto file = gguf::GgufFile::Open(std::string(MNEMO_SHARED_DIR) + "/models/vocab/" + name);
  EXPECT_TRUE(file.ok()) << file.error().message;
  if (!file.ok()) return nullptr;
  auto vocab = gguf::ReadVocab(*file);
  EXPECT_TRUE(vocab.ok()) << vocab.error().message;
  auto tok = Tokenizer::Create(*vocab);
  EXPECT_TRUE(tok.ok()) << tok.error().message;
  return tok.ok() ? std::move(*tok) : nullptr;
}

ChatTemplate Llama2Template(const Tokenizer& tok) {
  std::ifstream f(std::string(MNEMO_CHAT_TEMPLATES_DIR) + "/llama-2-chat.jinja", std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  auto t = ChatTemplate::Create(ss.str(), tok.TokenText(tok.bos()), tok.TokenText(tok.eos()));
  EXPECT_TRUE(t.ok()) << t.error().message;
  return t.ok() ? std::move(*t) : ChatTemplate::Fallback();
}

// The server's tokenization of a whole rendering (Service::Encode).
Ids EncodeWhole(const Tokenizer& tok, const std::string& text) {
  const bool has_bos_text = tok.bos() >= 0 && text.rfind(tok.TokenText(tok.bos()), 0) == 0;
  return tok.Encode(text, !has_bos_text, true);
}

// What the client gets for reply tokens (the engine's stream decoder, control tokens skipped).
std::string Visible(const Tokenizer& tok, int32_t prev, const Ids& ids) {
  std::string s;
  for (int32_t id : ids) {
    s += tok.DecodePiece(prev, id, false);
    prev = id;
  }
  return s;
}

bool IsPrefix(const Ids& p, const Ids& s) { return p.size() <= s.size() && std::equal(p.begin(), p.end(), s.begin()); }

std::string RandomText(Rng& rng) {
  static const char* const kWords[] = {"hello", "world", "How", "are", "you?", "é", "你好", "I'm", "fine.", "\n", "a",
                                       "42", "code:", "x = 1", "😀", "'quoted'", ".", ")", "]", "-", "_x", "  "};
  std::string s;
  const int n = 1 + static_cast<int>(rng.Next() % 8);
  for (int i = 0; i < n; ++i) {
    if (i > 0 && rng.Next() % 3 != 0) s += " ";
    s += kWords[rng.Next() % (sizeof(kWords) / sizeof(kWords[0]))];
  }
  return s;
}

// A session as the service keeps it: the exact log and the rendering it stands for.
struct Session {
  Ids log;
  std::string text;  // rendering of the conversation so far, generation prompt included
};

// Appends reply + next user message the way the service does; returns the match. When the
// continuation fails (the service then renders and tokenizes the request whole), re-encodes all.
ReplyMatch AppendTurn(const Tokenizer& tok, const ChatTemplate& tmpl, const std::vector<ChatMessage>& history,
                      const Ids& reply_tokens, const std::string& reply_text, Session* s, int* retokenized = nullptr) {
  const size_t n_old = history.size() - 2;
  auto a = tmpl.RenderAppend(history, n_old, true);
  EXPECT_TRUE(a.ok()) << a.error().message;
  if (!a.ok()) return {};
  auto turn = AppendAfterReply(tok, s->text, s->log.back(), reply_tokens, reply_text, *a);
  s->text += a->text();
  if (!turn) {
    EXPECT_NE(retokenized, nullptr) << "no continuation: " << s->text;
    if (retokenized) ++*retokenized;
    s->log = EncodeWhole(tok, s->text);
    return {};
  }
  if (turn->keep == 0 && turn->match.keep > 0 && retokenized) ++*retokenized;  // the reply was re-tokenized
  s->log.insert(s->log.end(), reply_tokens.begin(), reply_tokens.begin() + static_cast<std::ptrdiff_t>(turn->keep));
  s->log.insert(s->log.end(), turn->tokens.begin(), turn->tokens.end());
  return turn->match;
}

// Canonical reply tokens: as tokenizing the rendering with the reply would give them.
bool CanonicalReply(const Tokenizer& tok, const std::string& prompt, const std::string& reply, Ids* out) {
  const Ids before = EncodeWhole(tok, prompt);
  const Ids after = EncodeWhole(tok, prompt + reply);
  if (!IsPrefix(before, after)) return false;
  out->assign(after.begin() + static_cast<std::ptrdiff_t>(before.size()), after.end());
  return true;
}

void IncrementalEqualsWhole(const Tokenizer& tok, const ChatTemplate& tmpl, bool with_eos, int* n_turns,
                            int* retokenized) {
  Rng rng(17);
  for (int iter = 0; iter < 60; ++iter) {
    std::vector<ChatMessage> conv;
    if (rng.Next() % 2 == 0) conv.push_back({"system", RandomText(rng)});
    conv.push_back({"user", RandomText(rng)});
    Session s;
    s.text = *tmpl.Render(conv, true);
    s.log = EncodeWhole(tok, s.text);
    const int turns = 1 + static_cast<int>(rng.Next() % 5);
    for (int t = 0; t < turns; ++t) {
      // The model's reply, as the template renders it back (the model "reproduces its format").
      std::vector<ChatMessage> next = conv;
      next.push_back({"assistant", RandomText(rng)});
      next.push_back({"user", RandomText(rng)});
      auto a = tmpl.RenderAppend(next, conv.size(), true);
      ASSERT_TRUE(a.ok()) << a.error().message;
      Ids reply;
      if (!CanonicalReply(tok, s.text, a->reply_prefix + a->reply, &reply)) continue;
      if (with_eos) reply.push_back(tok.eos());
      const std::string visible = Visible(tok, s.log.back(), reply);
      const ReplyMatch m = AppendTurn(tok, tmpl, next, reply, visible, &s, retokenized);
      EXPECT_NE(m.kind, ReplyMatch::Kind::kEdited) << visible;
      conv = next;
      ++*n_turns;
    }
    EXPECT_EQ(s.text, *tmpl.Render(conv, true));
    EXPECT_EQ(s.log, EncodeWhole(tok, s.text)) << s.text;
  }
}

TEST(TurnAppend, CanonicalRepliesRebuildTheWholeEncoding) {
  auto spm = LoadVocab("ggml-vocab-llama-spm.gguf");
  auto bpe = LoadVocab("ggml-vocab-gpt-2.gguf");
  ASSERT_TRUE(spm && bpe);
  int n = 0, retokenized = 0;
  IncrementalEqualsWhole(*spm, ChatTemplate::Fallback(), false, &n, &retokenized);
  IncrementalEqualsWhole(*spm, ChatTemplate::Fallback(), true, &n, &retokenized);  // a final EOS the fallback does not write
  IncrementalEqualsWhole(*spm, Llama2Template(*spm), false, &n, &retokenized);
  IncrementalEqualsWhole(*spm, Llama2Template(*spm), true, &n, &retokenized);      // " </s>" closes the reply
  IncrementalEqualsWhole(*bpe, ChatTemplate::Fallback(), false, &n, &retokenized);
  EXPECT_GT(n, 500);
  EXPECT_LT(retokenized, n / 20);  // Llama 2's blank replies ("▁" + " </s>" is "▁▁" "</s>")
  std::printf("%d turns appended, %d re-tokenized the reply\n", n, retokenized);
}

class FallbackSpm : public ::testing::Test {
 protected:
  void SetUp() override {
    tok = LoadVocab("ggml-vocab-llama-spm.gguf");
    ASSERT_TRUE(tok);
    conv = {{"user", "Tell me a story."}};
    s.text = *tmpl.Render(conv, true);
    s.log = EncodeWhole(*tok, s.text);
  }
  int32_t Id(const char* piece) {
    const int32_t id = tok->TokenId(piece);
    EXPECT_NE(id, kNoToken) << piece;
    return id;
  }
  // The next request after a reply whose text the client sends back as `content`.
  std::vector<ChatMessage> Next(const std::string& content) {
    auto h = conv;
    h.push_back({"assistant", content});
    h.push_back({"user", "And then?"});
    return h;
  }
  Ids Canonical(const std::string& reply) {
    Ids out;
    EXPECT_TRUE(CanonicalReply(*tok, s.text, reply, &out));
    return out;
  }

  std::unique_ptr<Tokenizer> tok;
  ChatTemplate tmpl = ChatTemplate::Fallback();
  std::vector<ChatMessage> conv;
  Session s;
};

TEST_F(FallbackSpm, NonCanonicalPiecesAreKeptAsGenerated) {
  const Ids reply = {Id("\xE2\x96\x81H"), Id("ello"), Id(".")};  // " H" "ello" ".": canonical is " Hello" "."
  ASSERT_NE(reply, Canonical(" Hello."));
  const Ids before = s.log;
  const ReplyMatch m = AppendTurn(*tok, tmpl, Next(" Hello."), reply, Visible(*tok, s.log.back(), reply), &s);
  EXPECT_EQ(m.kind, ReplyMatch::Kind::kExact);
  EXPECT_EQ(m.keep, 3u);
  Ids expected = before;
  expected.insert(expected.end(), reply.begin(), reply.end());
  ASSERT_TRUE(IsPrefix(expected, s.log));
  // The rest is the whole encoding's tail: the text is exactly the template's.
  const Ids whole = EncodeWhole(*tok, s.text);
  EXPECT_TRUE(std::equal(s.log.begin() + static_cast<std::ptrdiff_t>(expected.size()), s.log.end(),
                         whole.end() - static_cast<std::ptrdiff_t>(s.log.size() - expected.size())));
  EXPECT_EQ(tok->Decode(s.log), tok->Decode(whole));
}

TEST_F(FallbackSpm, TrailingWhitespaceTheTemplateTrimsIsCut) {
  const Ids reply = Canonical(" Hello. ");  // ... "." "▁"
  const ReplyMatch m = AppendTurn(*tok, tmpl, Next(" Hello. "), reply, " Hello. ", &s);
  EXPECT_EQ(m.kind, ReplyMatch::Kind::kWhitespace);
  EXPECT_EQ(m.keep, reply.size() - 1);
  EXPECT_EQ(s.log, EncodeWhole(*tok, s.text));  // canonical tokens: the whole encoding exactly
}

TEST_F(FallbackSpm, NewlineThatTheTailStartsWithStays) {
  const Ids reply = Canonical(" Hello.\n");
  const ReplyMatch m = AppendTurn(*tok, tmpl, Next(" Hello.\n"), reply, " Hello.\n", &s);
  EXPECT_EQ(m.kind, ReplyMatch::Kind::kExact);
  EXPECT_EQ(m.keep, reply.size());
  EXPECT_EQ(s.log, EncodeWhole(*tok, s.text));
}

TEST_F(FallbackSpm, StopStringTokensAreCut) {
  const Ids reply = Canonical(" Hello. World");
  const ReplyMatch m = AppendTurn(*tok, tmpl, Next(" Hello"), reply, " Hello", &s);  // stop: "."
  EXPECT_EQ(m.kind, ReplyMatch::Kind::kWhitespace);
  EXPECT_EQ(m.keep, Canonical(" Hello").size());
  EXPECT_EQ(s.log, EncodeWhole(*tok, s.text));
}

TEST_F(FallbackSpm, FinalEndOfGenerationIsCut) {
  Ids reply = Canonical(" Hello.");
  reply.push_back(tok->eos());
  const ReplyMatch m = AppendTurn(*tok, tmpl, Next(" Hello."), reply, " Hello.", &s);
  EXPECT_EQ(m.kind, ReplyMatch::Kind::kWhitespace);
  EXPECT_EQ(m.keep, reply.size() - 1);
  EXPECT_EQ(s.log, EncodeWhole(*tok, s.text));
}

TEST_F(FallbackSpm, ControlTokenInsideTheReplyStays) {
  // stories260K writes BOS between stories; the client never sees it.
  Ids reply = Canonical(" The end.");
  reply.push_back(tok->bos());
  reply.push_back(Id("\xE2\x96\x81Once"));
  const std::string visible = Visible(*tok, s.log.back(), reply);
  EXPECT_EQ(visible, " The end.Once");
  const Ids before = s.log;
  const ReplyMatch m = AppendTurn(*tok, tmpl, Next(visible), reply, visible, &s);
  EXPECT_EQ(m.kind, ReplyMatch::Kind::kWhitespace);
  EXPECT_EQ(m.keep, reply.size());
  EXPECT_TRUE(IsPrefix(before, s.log));
  EXPECT_EQ(s.log[before.size() + reply.size() - 2], tok->bos());
}

TEST_F(FallbackSpm, MissingLeadingSpaceIsTheModelsOwn) {
  // The model wrote its first word without the space the template puts after "Assistant:".
  const Ids reply = {Id("H"), Id("ello")};
  const std::string visible = Visible(*tok, s.log.back(), reply);
  ASSERT_EQ(visible, "Hello");
  const ReplyMatch m = AppendTurn(*tok, tmpl, Next(visible), reply, visible, &s);
  EXPECT_EQ(m.kind, ReplyMatch::Kind::kWhitespace);
  EXPECT_EQ(m.keep, 2u);
  EXPECT_EQ(m.text_used, std::string(" Hello").size());
}

TEST_F(FallbackSpm, AnEditedReplyKeepsOnlyTheAgreeingPrefix) {
  const Ids reply = Canonical(" Hello there.");
  auto a = tmpl.RenderAppend(Next(" Hello world."), 1, true);
  ASSERT_TRUE(a.ok());
  const ReplyMatch m = MatchReply(*tok, s.log.back(), reply, " Hello there.", *a);
  EXPECT_EQ(m.kind, ReplyMatch::Kind::kEdited);
  EXPECT_EQ(m.keep, 1u);  // "▁Hello"
  EXPECT_EQ(m.text_used, std::string(" Hello").size());
}

TEST(TurnAppend, ContinuationNeedsATokenBoundary) {
  auto tok = LoadVocab("ggml-vocab-llama-spm.gguf");
  ASSERT_TRUE(tok);
  EXPECT_FALSE(ContinuationTokens(*tok, "Say Hel", "lo").has_value());  // "▁Hel" | "lo" is "▁Hello"
  auto ok = ContinuationTokens(*tok, "Say hello.", " world");
  ASSERT_TRUE(ok.has_value());
  EXPECT_EQ(*ok, (Ids{tok->TokenId("\xE2\x96\x81" "world")}));
  // After a control token the run restarts: only the text from it on is tokenized.
  auto after = ContinuationTokens(*tok, "a long history</s><s>[INST] Hi [/INST]", " Yes");
  ASSERT_TRUE(after.has_value());
  EXPECT_EQ(*after, (Ids{tok->TokenId("\xE2\x96\x81" "Yes")}));
  EXPECT_TRUE(ContinuationTokens(*tok, "x", "")->empty());
}

// The tokens text + y adds after text, with the run taken from the start (no restart point): the
// definition RestartPoint must agree with.
std::optional<Ids> ContinuationFromStart(const Tokenizer& tok, const std::string& text, const std::string& y) {
  const Ids head = tok.Encode(text, false, true);
  Ids whole = tok.Encode(text + y, false, true);
  if (whole.size() < head.size() || !std::equal(head.begin(), head.end(), whole.begin())) return std::nullopt;
  whole.erase(whole.begin(), whole.begin() + static_cast<std::ptrdiff_t>(head.size()));
  return whole;
}

// Property: the restart point changes nothing. Random ChatML-like conversations on the Llama 2 vocab
// (whose vocab has no ChatML control tokens: before word restarts, the run was the whole history)
// and the Llama 2 markup, with spaces in runs, U+2581 literals, control tokens, byte-fallback text,
// cut at random places: ContinuationTokens (run from RestartPoint) equals the tokenization of the
// whole text. And the restart point of a long history lies near its end.
TEST(TurnAppend, RestartPointsNeverChangeTheContinuation) {
  auto tok = LoadVocab("ggml-vocab-llama-spm.gguf");
  ASSERT_TRUE(tok);
  EXPECT_TRUE(tok->restarts_at_words());
  Rng rng(7);
  static const char* const kPieces[] = {"<|im_start|>user\n", "<|im_end|>\n", "<|im_start|>assistant\n", " ", "  ",
                                        "</s>", "<s>", "[INST] ", " [/INST]", "\xE2\x96\x81", "\xE2\x96\x81 ", "\n"};
  int cases = 0, restarted = 0;
  for (int iter = 0; iter < 400; ++iter) {
    std::string text;
    const int n = 2 + static_cast<int>(rng.Next() % 12);
    for (int i = 0; i < n; ++i) {
      text += rng.Next() % 2 ? RandomText(rng) : kPieces[rng.Next() % (sizeof(kPieces) / sizeof(kPieces[0]))];
    }
    const size_t cut = 1 + rng.Next() % text.size();
    const std::string before = text.substr(0, cut), rest = text.substr(cut);
    const size_t p = tok->RestartPoint(before);
    ASSERT_LE(p, before.size());
    restarted += p > 0;
    ++cases;
    const auto fast = ContinuationTokens(*tok, before, rest);
    const auto slow = ContinuationFromStart(*tok, before, rest);
    ASSERT_EQ(fast.has_value(), slow.has_value()) << "before: '" << before << "' rest: '" << rest << "'";
    if (fast) {
      EXPECT_EQ(*fast, *slow) << "before: '" << before << "' rest: '" << rest << "'";
    }
  }
  EXPECT_GT(restarted, cases / 2);  // the property was tested with restart points, not only from 0
  std::string history;
  for (int i = 0; i < 2000; ++i) history += "<|im_start|>user\nTell me about item " + std::to_string(i) + ".<|im_end|>\n";
  history += "<|im_start|>assistant\n";
  EXPECT_GT(tok->RestartPoint(history), history.size() - 60);
}

// A vocab with a token that joins a character and the "▁" after it gets no word restarts.
TEST(TurnAppend, NoWordRestartsWhenATokenCrossesAWordStart) {
  Vocab v;
  v.model = "llama";
  v.tokens = {"<unk>", "<s>", "</s>", "a", "\xE2\x96\x81", "a\xE2\x96\x81"};
  v.types = {2, 3, 3, 1, 1, 1};
  v.scores = {0, 0, 0, -1, -1, -2};
  v.unk = 0;
  v.bos = 1;
  v.eos = 2;
  auto tok = Tokenizer::Create(v);
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  EXPECT_FALSE((*tok)->restarts_at_words());
  EXPECT_EQ((*tok)->RestartPoint("a a a"), 0u);
  EXPECT_EQ((*tok)->RestartPoint("a</s>a a"), 1u);  // the control token still restarts the run
}

}  // namespace
}  // namespace mnemo
