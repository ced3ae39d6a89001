#include "sampling/stop.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <ostream>
#include <string>
#include <vector>

#include "base/rng.h"

namespace mnemo {

void PrintTo(const StopMatcher::Output& o, std::ostream* os) {
  *os << "{\"" << o.text << "\", " << (o.stopped ? "stopped" : "running") << "}";
}

namespace {

struct Streamed {
  std::string text;      // everything emitted, Flush included
  bool stopped = false;  // a stop string was hit
};

Streamed Stream(const std::vector<std::string>& stops, const std::vector<std::string>& pieces) {
  StopMatcher m(stops);
  Streamed r;
  for (const std::string& p : pieces) {
    StopMatcher::Output o = m.Push(p);
    r.text += o.text;
    if (o.stopped) {
      r.stopped = true;
      EXPECT_EQ(m.Push("more"), (StopMatcher::Output{"", true}));  // stays stopped
      break;
    }
  }
  r.text += m.Flush();
  return r;
}

// Reference on the whole text: the stop completing first wins; on a tie the longest.
Streamed Reference(const std::vector<std::string>& stops, const std::string& text) {
  for (size_t end = 1; end <= text.size(); ++end) {
    size_t best = 0;
    for (const std::string& s : stops)
      if (s.size() <= end && text.compare(end - s.size(), s.size(), s) == 0) best = std::max(best, s.size());
    if (best > 0) return {text.substr(0, end - best), true};
  }
  return {text, false};
}

// True when `s` is a sequence of complete UTF-8 characters (no cut sequence at either end).
bool CompleteUtf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = s[i];
    const size_t n = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    i += n;
  }
  return true;
}

TEST(StopMatcher, ValidateLimits) {
  EXPECT_TRUE(StopMatcher::Validate({}).ok());
  EXPECT_TRUE(StopMatcher::Validate({"a", "b", "c", "d"}).ok());
  Status five = StopMatcher::Validate({"a", "b", "c", "d", "e"});
  ASSERT_FALSE(five.ok());
  EXPECT_NE(five.error().message.find("at most 4"), std::string::npos) << five.error().message;
  Status empty = StopMatcher::Validate({"a", ""});
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.error().message.find("empty"), std::string::npos) << empty.error().message;
  EXPECT_FALSE(StopMatcher::Create({""}).ok());
  EXPECT_TRUE(StopMatcher::Create({"\n\n"}).ok());
}

TEST(StopMatcher, NoStopsPassesThrough) {
  StopMatcher m({});
  EXPECT_EQ(m.Push("hello "), (StopMatcher::Output{"hello ", false}));
  EXPECT_EQ(m.Push("world"), (StopMatcher::Output{"world", false}));
  EXPECT_EQ(m.Flush(), "");
}

TEST(StopMatcher, StopSplitAcrossPieces) {
  StopMatcher m({"###"});
  EXPECT_EQ(m.Push("Hello #"), (StopMatcher::Output{"Hello ", false}));
  EXPECT_EQ(m.held(), 1u);
  EXPECT_EQ(m.Push("#"), (StopMatcher::Output{"", false}));
  EXPECT_EQ(m.Push("# world"), (StopMatcher::Output{"", true}));
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.Push("more"), (StopMatcher::Output{"", true}));
  EXPECT_EQ(m.Flush(), "");
}

TEST(StopMatcher, HeldPrefixIsReleasedWhenItDiverges) {
  StopMatcher m({"###"});
  EXPECT_EQ(m.Push("a##"), (StopMatcher::Output{"a", false}));
  EXPECT_EQ(m.Push("b"), (StopMatcher::Output{"##b", false}));
  EXPECT_EQ(m.Push("</"), (StopMatcher::Output{"</", false}));
  EXPECT_EQ(m.held(), 0u);
  EXPECT_EQ(m.Push("x#"), (StopMatcher::Output{"x", false}));
  EXPECT_EQ(m.Flush(), "#");  // end of generation: held text is emitted
}

TEST(StopMatcher, OverlappingPrefixes) {
  StopMatcher m({"ab"});
  EXPECT_EQ(m.Push("a"), (StopMatcher::Output{"", false}));
  EXPECT_EQ(m.Push("a"), (StopMatcher::Output{"a", false}));
  EXPECT_EQ(m.Push("b"), (StopMatcher::Output{"", true}));
  EXPECT_EQ(Stream({"ab"}, {"aab"}).text, "a");
  EXPECT_EQ(Stream({"abab"}, {"aba", "bab"}).text, "");  // a match restarting inside a partial one
  EXPECT_EQ(Stream({"abab"}, {"ab", "aab", "ab"}).text, "aba");
  EXPECT_EQ(Stream({"aab"}, {"a", "a", "a", "b", "c"}).text, "a");
  Streamed none = Stream({"aab"}, {"a", "a", "a", "c"});
  EXPECT_EQ(none.text, "aaac");
  EXPECT_FALSE(none.stopped);
}

TEST(StopMatcher, MultipleStops) {
  EXPECT_EQ(Stream({"END", "STOP", "\n\n"}, {"one\n", "two STO", "P three\n\nEND"}).text, "one\ntwo ");
  // The stop that completes first wins, even if a longer one started earlier.
  EXPECT_EQ(Stream({"abcd", "bc"}, {"xabcd"}).text, "xa");
  EXPECT_EQ(Stream({"abcd", "bc"}, {"x", "a", "b", "c", "d"}).text, "xa");
  // Same end: the longest (earliest start) wins.
  EXPECT_EQ(Stream({"bc", "abc"}, {"zab", "c"}).text, "z");
  // A held prefix of one stop does not hide a completed other stop.
  EXPECT_EQ(Stream({"<|im_end|>", "|"}, {"hi <|"}).text, "hi <");
}

TEST(StopMatcher, Unicode) {
  const std::string text = "你好。再见";  // 。 is E3 80 82
  // Every split into byte pieces gives the same result, and emits only whole characters.
  for (size_t cut1 = 0; cut1 <= text.size(); ++cut1) {
    for (size_t cut2 = cut1; cut2 <= text.size(); ++cut2) {
      StopMatcher m({"。"});
      std::string out;
      for (std::string piece : {text.substr(0, cut1), text.substr(cut1, cut2 - cut1), text.substr(cut2)}) {
        StopMatcher::Output o = m.Push(piece);
        EXPECT_TRUE(CompleteUtf8(o.text)) << cut1 << " " << cut2;
        out += o.text;
      }
      out += m.Flush();
      EXPECT_EQ(out, "你好") << cut1 << " " << cut2;
    }
  }
  // Without stops, a character cut between tokens (byte fallback) is held until complete.
  StopMatcher m({});
  EXPECT_EQ(m.Push("a\xE4\xBD").text, "a");
  EXPECT_EQ(m.Push("\xA0!").text, "你!");
  EXPECT_EQ(m.Push("\xF0\x9F").text, "");
  EXPECT_EQ(m.Flush(), "\xF0\x9F");  // an unfinished character at the end is emitted as is
  // Stray continuation bytes cannot be completed, so they are not held.
  StopMatcher raw({});
  EXPECT_EQ(raw.Push("x\x80\x80\x80\x80").text, "x\x80\x80\x80\x80");
  // A stop that shares a lead byte with the text but differs later.
  EXPECT_EQ(Stream({"é!"}, {"caf\xC3", "\xA9", "s é", "!x"}).text, "cafés ");
}

// Property: any split of the text into pieces gives the reference answer on the whole text, and
// every emitted chunk is whole UTF-8 characters.
TEST(StopMatcher, RandomSplitsMatchWholeTextReference) {
  const std::vector<std::string> alphabet = {"a", "b", "c", "é", "\n"};
  const std::vector<std::vector<std::string>> stop_sets = {
      {"abc"}, {"aa", "ab"}, {"aab", "b\n", "éa"}, {"\n\n", "cac", "bcb", "ééé"}, {"a"}, {}};
  Rng rng(17);
  for (int trial = 0; trial < 3000; ++trial) {
    const auto& stops = stop_sets[trial % stop_sets.size()];
    std::string text;
    const int len = 1 + static_cast<int>(rng.Next() % 24);
    for (int i = 0; i < len; ++i) text += alphabet[rng.Next() % alphabet.size()];
    std::vector<std::string> pieces;
    for (size_t i = 0; i < text.size();) {
      const size_t n = std::min<size_t>(text.size() - i, 1 + rng.Next() % 5);  // may cut é
      pieces.push_back(text.substr(i, n));
      i += n;
    }
    StopMatcher m(stops);
    Streamed got;
    for (const std::string& p : pieces) {
      StopMatcher::Output o = m.Push(p);
      ASSERT_TRUE(CompleteUtf8(o.text)) << text;
      got.text += o.text;
      if (o.stopped) {
        got.stopped = true;
        break;
      }
    }
    got.text += m.Flush();
    const Streamed want = Reference(stops, text);
    ASSERT_EQ(got.text, want.text) << "text '" << text << "' stops " << stops.size();
    ASSERT_EQ(got.stopped, want.stopped) << text;
  }
}

// Under tools with tool_choice auto, stops apply to the text before a call and not from the call's
// opener on, however the stream is cut into pieces.
TEST(StopMatcher, CallStartLiftsTheStops) {
  CallStart hermes{{"<tool_call>"}, {}, true};
  const std::string call = "<tool_call>\n{\"name\": \"f\"}\n</tool_call>";
  for (size_t cut = 0; cut <= call.size(); ++cut) {
    StopMatcher m({"\n", "}"}, hermes);
    std::string out = m.Push("Sure. " + call.substr(0, cut)).text;
    StopMatcher::Output o = m.Push(call.substr(cut));
    EXPECT_FALSE(o.stopped) << cut;
    EXPECT_EQ(out + o.text + m.Flush(), "Sure. " + call) << cut;
  }
  // Text before the call still stops.
  StopMatcher before({"\n"}, hermes);
  EXPECT_EQ(before.Push("Sure.\n" + call), (StopMatcher::Output{"Sure.", true}));
  // At the start only: "{" after leading whitespace opens a call, later it does not.
  CallStart llama{{"<|python_tag|>"}, {"{"}, true};
  StopMatcher first({"\n"}, llama);
  EXPECT_EQ(first.Push(" {\"a\":\n1}").text + first.Flush(), " {\"a\":\n1}");
  StopMatcher later({"\n"}, llama);
  EXPECT_EQ(later.Push("x {\"a\":\n1}"), (StopMatcher::Output{"x {\"a\":", true}));
  // A control token seen by the caller lifts them too, releasing what was held for them.
  StopMatcher control({"ab"}, llama);
  EXPECT_EQ(control.Push("xa").text, "x");
  control.Lift();
  EXPECT_EQ(control.Push("b").text, "ab");
}

}  // namespace
}  // namespace mnemo
