// Windows of a conversation (server/turn_window.h), model-free, with the real templates of
// tests/chat/templates:
//  - the next prompt's window built from the last one (O(new)) equals the window of the whole;
//  - for every template the probe accepts, RenderAppend over the window equals RenderAppend over
//    the whole conversation on random conversations (lengths, contents, system prompts) far longer
//    than the probe's; templates that number turns or read the clock are refused.
#include "server/turn_window.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "base/rng.h"

namespace mnemo {
namespace {

std::string RandomContent(Rng& rng) {
  static const char* const kWords[] = {"hello", "world", " ", "\n", "How", "are", "you?", "  padded  ", "é", "42", "x"};
  std::string s;
  const int n = static_cast<int>(rng.Next() % 6);
  for (int i = 0; i < n; ++i) s += kWords[rng.Next() % (sizeof(kWords) / sizeof(kWords[0]))];
  return s;
}

// [system?] then user/assistant exchanges, ending with an assistant reply at index r.
std::vector<ChatMessage> RandomConversation(Rng& rng, int exchanges, bool system) {
  std::vector<ChatMessage> m;
  if (system) m.push_back({"system", "Sys " + RandomContent(rng)});
  for (int i = 0; i < exchanges; ++i) {
    m.push_back({"user", "Q" + std::to_string(i) + " " + RandomContent(rng)});
    m.push_back({"assistant", RandomContent(rng)});
  }
  return m;
}

TEST(TurnWindow, ExtendingAWindowEqualsTheWindowOfTheWhole) {
  Rng rng(3);
  for (int iter = 0; iter < 300; ++iter) {
    std::vector<ChatMessage> m;
    const int n = 1 + static_cast<int>(rng.Next() % 9);
    for (int i = 0; i < n; ++i) {
      static const char* const kRoles[] = {"system", "user", "assistant", "system"};
      m.push_back({kRoles[rng.Next() % 4], RandomContent(rng)});
    }
    const size_t r = rng.Next() % m.size();
    const std::span<const ChatMessage> all(m);
    const TurnWindow whole = WindowOfPrompt(all);
    if (r + 1 > m.size()) continue;
    const TurnWindow ext = ExtendWindow(WindowOfPrompt(all.first(r)), m[r], all.subspan(r + 1));
    ASSERT_EQ(ext.n, whole.n);
    EXPECT_TRUE(ext.prompt_hash == whole.prompt_hash);
    ASSERT_EQ(ext.head.size(), whole.head.size()) << "r " << r << " n " << n;
    ASSERT_EQ(ext.recent.size(), whole.recent.size()) << "r " << r << " n " << n;
    for (size_t i = 0; i < ext.head.size(); ++i) EXPECT_EQ(ext.head[i].content, whole.head[i].content);
    for (size_t i = 0; i < ext.recent.size(); ++i) EXPECT_EQ(ext.recent[i].content, whole.recent[i].content);
  }
  // The hash tells a role from content, and the boundary between messages.
  EXPECT_FALSE(HashMessages(std::vector<ChatMessage>{{"user", "ab"}}) == HashMessages(std::vector<ChatMessage>{{"usera", "b"}}));
  EXPECT_FALSE(HashMessages(std::vector<ChatMessage>{{"user", "a"}, {"user", "b"}}) ==
               HashMessages(std::vector<ChatMessage>{{"user", "ab"}}));
}

ChatTemplate Load(const std::string& file) {
  std::ifstream f(std::string(MNEMO_CHAT_TEMPLATES_DIR) + "/" + file, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  auto t = ChatTemplate::Create(ss.str(), "<s>", "</s>");
  EXPECT_TRUE(t.ok()) << file << ": " << t.error().message;
  return t.ok() ? std::move(*t) : ChatTemplate::Fallback();
}

TEST(TurnWindow, AcceptedTemplatesRenderWindowsAsTheWholeConversation) {
  int accepted = 0;
  for (const auto& entry : std::filesystem::directory_iterator(MNEMO_CHAT_TEMPLATES_DIR)) {
    if (entry.path().extension() != ".jinja") continue;
    const std::string name = entry.path().filename().string();
    ChatTemplate t = Load(name);
    t.WithFixedTime(1700000000);
    if (!TemplateRendersWindows(t)) continue;
    ++accepted;
    Rng rng(11);
    for (int iter = 0; iter < 40; ++iter) {
      const bool system = rng.Next() % 2;
      std::vector<ChatMessage> m = RandomConversation(rng, 1 + static_cast<int>(rng.Next() % 12), system);
      const size_t r = m.size() - 1;
      std::vector<ChatMessage> more = {{"user", RandomContent(rng)}};
      std::vector<ChatMessage> whole = m;
      whole.insert(whole.end(), more.begin(), more.end());
      const auto full = t.RenderAppend(whole, r, true);
      size_t n_old = 0;
      const auto win = WindowMessages(WindowOfPrompt(std::span<const ChatMessage>(m).first(r)), m[r], more, &n_old);
      EXPECT_LE(win.size(), 6u);
      const auto part = t.RenderAppend(win, n_old, true);
      ASSERT_EQ(full.ok(), part.ok()) << name << " iter " << iter;
      if (!full.ok()) continue;
      EXPECT_EQ(full->reply_prefix, part->reply_prefix) << name;
      EXPECT_EQ(full->reply, part->reply) << name;
      EXPECT_EQ(full->tail, part->tail) << name;
    }
  }
  EXPECT_GE(accepted, 8);  // ChatML, Llama 2/3, Gemma, Phi-3, Qwen, Mistral ... render windows
  EXPECT_TRUE(TemplateRendersWindows(Load("chatml.jinja")));
  EXPECT_TRUE(TemplateRendersWindows(Load("llama-2-chat.jinja")));  // alternation checked by index parity
  EXPECT_TRUE(TemplateRendersWindows(ChatTemplate::Fallback()));
}

TEST(TurnWindow, PositionDependentTemplatesAreRefused) {
  auto numbered = ChatTemplate::Create(
      "{% for m in messages %}[{{ loop.index }}] {{ m.role }}: {{ m.content }}\n{% endfor %}"
      "{% if add_generation_prompt %}[{{ messages | length + 1 }}] assistant:{% endif %}",
      "<s>", "</s>");
  ASSERT_TRUE(numbered.ok());
  EXPECT_FALSE(TemplateRendersWindows(*numbered));
  auto dated = ChatTemplate::Create(
      "{{ strftime_now('%d %b %Y') }}{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}", "<s>", "</s>");
  ASSERT_TRUE(dated.ok());
  EXPECT_FALSE(TemplateRendersWindows(*dated));
}

}  // namespace
}  // namespace mnemo
