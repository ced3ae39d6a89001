// Token-level appending with the real Llama 2 SentencePiece vocab and the Llama 2 chat template:
// when is Encode(whole rendering) == Encode(first part) + Encode(appended parts)?
//
// Findings (asserted below):
//  1. Tokenize renderings with parse_special = true (else "<s>" / "</s>" become the raw pieces
//     "<", "s", ">") and add_special = false when the template renders BOS itself (Llama 2 does:
//     add_special = true would give two BOS tokens).
//  2. Cutting the text immediately before a control token (here "<s>" or "</s>") is exact:
//     Encode(a) + Encode(b) == Encode(a + b). SPM restarts its dummy-prefix space after every
//     control token and BPE merges never cross one, so the pieces do not interact.
//  3. Cutting anywhere else is not: the appended piece gets a dummy-prefix "▁" it does not have in
//     the whole text (" </s>" alone is [▁▁][</s>], in the whole text it is [▁][</s>]).
//  4. The old prompt's tokens stay valid: Encode(old prompt) is a prefix of Encode(whole) (Llama 2
//     replies start with a space, and no SPM piece joins "]" with "▁").
//  5. So after the generated reply the caller appends: the raw text that ends the reply's run
//     before the first control token of the tail (Llama 2: one space, unless the model generated
//     it), tokenized as a continuation of that run: Encode(run + head) minus Encode(run), run = the
//     text since the last control token; then Encode(rest of the tail). This rebuilds
//     Encode(whole) exactly when the model's reply tokens are the canonical ones.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "base/rng.h"
#include "chat/chat_template.h"
#include "format/gguf.h"
#include "format/gguf_vocab.h"
#include "tokenizer/tokenizer.h"

namespace mnemo {
namespace {

using Ids = std::vector<int32_t>;

class ChatTokens : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto file = gguf::GgufFile::Open(std::string(MNEMO_SHARED_DIR) + "/models/vocab/ggml-vocab-llama-spm.gguf");
    ASSERT_TRUE(file.ok()) << file.error().message;
    auto vocab = gguf::ReadVocab(*file);
    ASSERT_TRUE(vocab.ok()) << vocab.error().message;
    auto tok = Tokenizer::Create(*vocab);
    ASSERT_TRUE(tok.ok()) << tok.error().message;
    tok_ = tok->release();
    std::ifstream f(std::string(MNEMO_CHAT_TEMPLATES_DIR) + "/llama-2-chat.jinja", std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    auto t = ChatTemplate::Create(ss.str(), tok_->TokenText(tok_->bos()), tok_->TokenText(tok_->eos()));
    ASSERT_TRUE(t.ok()) << t.error().message;
    tmpl_ = new ChatTemplate(std::move(*t));
  }
  static void TearDownTestSuite() {
    delete tmpl_;
    delete tok_;
  }

  static Ids Encode(const std::string& s) { return tok_->Encode(s, /*add_special=*/false, /*parse_special=*/true); }
  static std::string Render(const std::vector<ChatMessage>& m) {
    auto r = tmpl_->Render(m, true);
    EXPECT_TRUE(r.ok()) << r.error().message;
    return r.ok() ? *r : "";
  }

  // Offsets where a control token's text starts (the cut points of rule 2).
  static std::vector<size_t> SpecialStarts(const std::string& s) {
    std::vector<size_t> cuts;
    for (const std::string& special : {tok_->TokenText(tok_->bos()), tok_->TokenText(tok_->eos())}) {
      for (size_t k = s.find(special); k != std::string::npos; k = s.find(special, k + 1)) cuts.push_back(k);
    }
    std::sort(cuts.begin(), cuts.end());
    return cuts;
  }

  static Tokenizer* tok_;
  static ChatTemplate* tmpl_;
};
Tokenizer* ChatTokens::tok_ = nullptr;
ChatTemplate* ChatTokens::tmpl_ = nullptr;

std::string RandomText(Rng& rng) {
  static const char* const kWords[] = {"hello", "world", "How", "are", "you?", "é", "你好", "I'm", "fine.", "\n", "a",
                                       "42", "code:", "x = 1", "😀", "<tag>", "'quoted'", ".", ")", "]", "-", "_x"};
  std::string s;
  const int n = 1 + static_cast<int>(rng.Next() % 8);
  for (int i = 0; i < n; ++i) {
    if (i > 0 && rng.Next() % 3 != 0) s += " ";
    s += kWords[rng.Next() % (sizeof(kWords) / sizeof(kWords[0]))];
  }
  return s;
}

std::vector<ChatMessage> RandomConversation(Rng& rng) {
  std::vector<ChatMessage> m;
  if (rng.Next() % 2 == 0) m.push_back({"system", RandomText(rng)});
  const int turns = 1 + static_cast<int>(rng.Next() % 6);
  for (int i = 0; i < turns; ++i) {
    if (i > 0) m.push_back({"assistant", RandomText(rng)});
    m.push_back({"user", RandomText(rng)});
  }
  return m;
}

Ids Concat(Ids a, const Ids& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

bool IsPrefix(const Ids& p, const Ids& s) { return p.size() <= s.size() && std::equal(p.begin(), p.end(), s.begin()); }

TEST_F(ChatTokens, SpecialTokensNeedParseSpecialAndNoExtraBos) {
  ASSERT_NE(tmpl_, nullptr);
  EXPECT_TRUE(tmpl_->renders_bos());
  const std::string prompt = Render({{"user", "Hello"}});
  EXPECT_EQ(prompt, "<s>[INST] Hello [/INST]");
  const Ids ids = Encode(prompt);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids[0], tok_->bos());
  EXPECT_NE(ids[1], tok_->bos());
  const Ids doubled = tok_->Encode(prompt, /*add_special=*/true, /*parse_special=*/true);
  EXPECT_EQ(doubled[0], tok_->bos());
  EXPECT_EQ(doubled[1], tok_->bos());  // add_special would add a second BOS
  const Ids raw = tok_->Encode(prompt, /*add_special=*/false, /*parse_special=*/false);
  EXPECT_EQ(std::count(raw.begin(), raw.end(), tok_->bos()), 0);  // "<s>" as plain text
}

TEST_F(ChatTokens, CutsBeforeControlTokensAreExact) {
  ASSERT_NE(tmpl_, nullptr);
  Rng rng(7);
  int n_cuts = 0;
  for (int iter = 0; iter < 100; ++iter) {
    const std::string whole = Render(RandomConversation(rng));
    const Ids expected = Encode(whole);
    Ids pieces;
    size_t begin = 0;
    for (size_t cut : SpecialStarts(whole)) {
      pieces = Concat(pieces, Encode(whole.substr(begin, cut - begin)));
      begin = cut;
      ++n_cuts;
    }
    pieces = Concat(pieces, Encode(whole.substr(begin)));
    EXPECT_EQ(pieces, expected) << whole;
  }
  EXPECT_GT(n_cuts, 300);
}

TEST_F(ChatTokens, CutsInsideARawRunAreNot) {
  ASSERT_NE(tmpl_, nullptr);
  const std::vector<ChatMessage> h = {{"user", "Hello"}, {"assistant", "Hi there"}, {"user", "Who are you"}};
  auto a = tmpl_->RenderAppend(h, 1, true);
  ASSERT_TRUE(a.ok()) << a.error().message;
  const std::string old = Render({h[0]});
  const Ids whole = Encode(old + a->text());
  // The reply's space and the tail's " </s>" each get a dummy-prefix space when encoded alone.
  EXPECT_NE(Concat(Encode(old), Encode(a->text())), whole);
  EXPECT_EQ(Encode(" </s>"), (Ids{tok_->TokenId("\xE2\x96\x81\xE2\x96\x81"), tok_->eos()}));
  const Ids tail_in_whole(whole.end() - static_cast<std::ptrdiff_t>(Encode(a->tail).size()), whole.end());
  EXPECT_NE(Encode(a->tail), tail_in_whole);
}

// Appends `text` to a token log whose text since the last control token is `run`: exact when
// `text` starts with a control token; otherwise its first raw part continues `run` and is
// tokenized as Encode(run + head) minus Encode(run). Returns false when that difference is not
// a clean extension (then the caller must re-tokenize).
bool AppendText(const Tokenizer& tok, const std::string& text, std::string* run, Ids* log,
                const std::vector<std::string>& specials) {
  size_t first_special = std::string::npos;
  for (const std::string& s : specials) first_special = std::min(first_special, text.find(s));
  const std::string head = text.substr(0, first_special);
  if (!head.empty()) {
    const Ids before = tok.Encode(*run, false, true);
    const Ids after = tok.Encode(*run + head, false, true);
    if (!IsPrefix(before, after)) return false;
    log->insert(log->end(), after.begin() + static_cast<std::ptrdiff_t>(before.size()), after.end());
    *run += head;
  }
  if (first_special != std::string::npos) {
    const std::string rest = text.substr(first_special);
    const Ids ids = tok.Encode(rest, false, true);
    log->insert(log->end(), ids.begin(), ids.end());
    size_t last = 0;  // the new run: text after the last control token of `rest`
    for (const std::string& s : specials) {
      const size_t k = rest.rfind(s);
      if (k != std::string::npos) last = std::max(last, k + s.size());
    }
    *run = rest.substr(last);
  }
  return true;
}

// The server's view: the log holds the first prompt's tokens, then for every turn the model's
// reply tokens (here: the canonical tokens of the reply in context, as a model that reproduces its
// training format would generate) and the appended tail. The result equals tokenizing the whole
// conversation at once.
TEST_F(ChatTokens, IncrementalTokenLogEqualsWholeEncoding) {
  ASSERT_NE(tmpl_, nullptr);
  const std::vector<std::string> specials = {tok_->TokenText(tok_->bos()), tok_->TokenText(tok_->eos())};
  Rng rng(11);
  int n_turns = 0, n_retokenized = 0;
  for (int iter = 0; iter < 100; ++iter) {
    const std::vector<ChatMessage> conv = RandomConversation(rng);
    size_t n_old = conv[0].role == "system" ? 2 : 1;
    std::string text = Render({conv.begin(), conv.begin() + static_cast<std::ptrdiff_t>(n_old)});
    Ids log = Encode(text);
    std::string run = text.substr(text.rfind(specials[0]) + specials[0].size());
    const bool model_emits_space = iter % 2 == 1;  // the model generates the " " before </s> itself
    while (n_old < conv.size()) {
      const std::vector<ChatMessage> history(conv.begin(), conv.begin() + static_cast<std::ptrdiff_t>(n_old + 2));
      auto a = tmpl_->RenderAppend(history, n_old, true);
      ASSERT_TRUE(a.ok()) << a.error().message;
      // Rule 4: the tokens already in the log stay a prefix of the longer text's tokens.
      std::string generated = a->reply_prefix + a->reply;
      if (model_emits_space && a->tail.rfind(" ", 0) == 0) generated += " ";
      const Ids longer = Encode(text + generated);
      ASSERT_TRUE(IsPrefix(log, longer)) << text + generated;
      log.assign(longer.begin(), longer.end());  // the model's reply tokens
      run += generated;
      text += generated;
      const std::string rest = a->text().substr(generated.size());
      if (!AppendText(*tok_, rest, &run, &log, specials)) {
        // Only a blank reply lets the tail's space meet the reply prefix's space ("▁▁" is one
        // piece): the caller re-tokenizes the run (here: everything).
        EXPECT_EQ(a->reply, "") << "run: " << run << " rest: " << rest;
        ++n_retokenized;
        log = Encode(text + rest);
        run = (text + rest).substr((text + rest).rfind(specials[0]) + specials[0].size());
      }
      text += rest;
      ++n_turns;
      n_old += 2;
    }
    EXPECT_EQ(text, Render(conv));
    EXPECT_EQ(log, Encode(text)) << text;
  }
  EXPECT_GT(n_turns, 150);
  EXPECT_LT(n_retokenized, n_turns / 10);
  std::printf("%d turns appended, %d needed re-tokenizing (blank replies)\n", n_turns, n_retokenized);
}

}  // namespace
}  // namespace mnemo
