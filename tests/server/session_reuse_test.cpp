// One engine session per conversation, over real HTTP with stories260K: a 4-turn conversation via
// /v1/responses (previous_response_id) and via /v1/chat/completions (the client sends the whole
// history back, each assistant message being the text the server returned) runs in ONE session,
// and each turn finds the previous turn's whole context in the cache:
//
//   cached(k) >= prompt(k-1) + completion(k-1) - 1
//
// prompt and completion from the previous turn's usage; the 1 is the reply's last token, which
// was sampled but never fed through the model (it has no KV yet; the next turn computes it). It
// also covers the only tokens the template re-renders differently in these conversations: the
// stop-string or trailing-whitespace token that ends a reply (the fallback template trims the
// reply; a stop string is not in the text the client gets), always the reply's last token here.
//
// Two kinds of replies: cut at max_tokens (ignore_eos, as `mnemo bench serve` asks), and ended by
// a stop string "." (the model's "." token is in its log, not in the text: before the fix every
// such turn forked a new session). And: a client that really edits its history gets a fork, the
// original conversation keeps its session.
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <filesystem>
#include <thread>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server_process.h"

namespace mnemo::testing {
namespace {

using Json = nlohmann::json;

struct Client {
  Client(int port, std::string key) : c("127.0.0.1", port), key(std::move(key)) {
    c.set_read_timeout(120, 0);
    c.set_connection_timeout(5, 0);
  }
  Json Post(const std::string& path, const Json& body) {
    auto r = c.Post(path.c_str(), {{"Authorization", "Bearer " + key}}, body.dump(), "application/json");
    EXPECT_TRUE(r && r->status == 200) << path << ": " << (r ? r->body : "no response");
    return r && r->status == 200 ? Json::parse(r->body) : Json();
  }
  Json Get(const std::string& path) {
    auto r = c.Get(path.c_str(), {{"Authorization", "Bearer " + key}});
    EXPECT_TRUE(r && r->status == 200) << path;
    return r && r->status == 200 ? Json::parse(r->body) : Json();
  }
  httplib::Client c;
  std::string key;
};

int Metric(int port, const std::string& name) {
  httplib::Client c("127.0.0.1", port);
  auto m = c.Get("/metrics");
  if (!m) return -1;
  const auto p = m->body.find("\n" + name + " ");
  return p == std::string::npos ? -1 : std::stoi(m->body.substr(p + name.size() + 2));
}

// Per turn: prompt tokens, cached tokens, completion tokens, reply text.
struct TurnUsage {
  int prompt = 0, cached = 0, completion = 0;
  std::string text, finish;
};

const char* const kUser[] = {"Tell me a story about a cat.", "What did the cat eat?", "Where did it go next?",
                             "How did the story end?"};
const char* const kSystem = "You are a storyteller.";

// The sampling of each kind of reply.
Json Sampling(bool stop) {
  if (stop) return {{"temperature", 0}, {"stop", Json::array({"."})}};
  return {{"temperature", 0}, {"ignore_eos", true}};
}

std::vector<TurnUsage> RunResponses(Client& c, bool stop, int max_tokens) {
  std::vector<TurnUsage> out;
  std::string prev;
  for (const char* user : kUser) {
    Json body = Sampling(stop);
    body["input"] = user;
    body["instructions"] = kSystem;  // as clients do: instructions are not inherited
    body["max_output_tokens"] = max_tokens;
    if (!stop) body["min_tokens"] = max_tokens;
    if (!prev.empty()) body["previous_response_id"] = prev;
    Json r = c.Post("/v1/responses", body);
    if (!r.is_object()) return out;
    prev = r["id"];
    out.push_back({r["usage"]["input_tokens"], r["usage"]["input_tokens_details"]["cached_tokens"],
                   r["usage"]["output_tokens"], r["output_text"], r["status"]});
  }
  return out;
}

std::vector<TurnUsage> RunChat(Client& c, bool stop, int max_tokens, Json* history) {
  std::vector<TurnUsage> out;
  Json msgs = Json::array({{{"role", "system"}, {"content", kSystem}}});
  for (const char* user : kUser) {
    msgs.push_back({{"role", "user"}, {"content", user}});
    Json body = Sampling(stop);
    body["messages"] = msgs;
    body["max_tokens"] = max_tokens;
    if (!stop) body["min_tokens"] = max_tokens;
    Json r = c.Post("/v1/chat/completions", body);
    if (!r.is_object()) return out;
    const std::string text = r["choices"][0]["message"]["content"];
    msgs.push_back({{"role", "assistant"}, {"content", text}});
    out.push_back({r["usage"]["prompt_tokens"], r["usage"]["prompt_tokens_details"]["cached_tokens"],
                   r["usage"]["completion_tokens"], text, r["choices"][0]["finish_reason"]});
  }
  if (history) *history = msgs;
  return out;
}

// Every turn after the first found the previous turn's context (prompt and reply) in the cache.
void ExpectWholeContextCached(const std::vector<TurnUsage>& turns, const std::string& what) {
  ASSERT_EQ(turns.size(), 4u) << what;
  for (size_t k = 1; k < turns.size(); ++k) {
    const TurnUsage& p = turns[k - 1];
    EXPECT_GE(turns[k].cached, p.prompt + p.completion - 1)
        << what << " turn " << k << ": cached " << turns[k].cached << " of " << turns[k].prompt
        << "; the previous turn had " << p.prompt << " + " << p.completion << " tokens, reply '" << p.text
        << "' (" << p.finish << ")";
    EXPECT_GT(turns[k].prompt, p.prompt + p.completion - 1) << what << " turn " << k;
  }
}

// The caller's sessions: exactly one, holding the four turns.
void ExpectOneSession(Client& c, const std::vector<TurnUsage>& turns, const std::string& what) {
  Json s = c.Get("/v1/sessions");
  ASSERT_TRUE(s.is_object()) << what;
  ASSERT_EQ(s["data"].size(), 1u) << what << ": " << s.dump();
  EXPECT_EQ(s["data"][0]["turns"], 4) << what << ": " << s.dump();
  EXPECT_EQ(s["data"][0]["tokens"], turns.back().prompt + turns.back().completion) << what << ": " << s.dump();
}

bool AnyStopped(const std::vector<TurnUsage>& turns) {
  for (size_t k = 0; k + 1 < turns.size(); ++k) {
    if (turns[k].finish == "stop" || turns[k].finish == "completed") return true;
  }
  return false;
}

TEST(SessionReuse, ResponsesConversationStaysInOneSession) {
  ServerProcess server({"--api-key", "plain", "--api-key", "stop"});
  ASSERT_GT(server.port(), 0) << server.log();
  Client plain(server.port(), "plain"), stop(server.port(), "stop");
  auto a = RunResponses(plain, /*stop=*/false, 24);
  ExpectWholeContextCached(a, "max_tokens replies");
  ExpectOneSession(plain, a, "max_tokens replies");
  auto b = RunResponses(stop, /*stop=*/true, 48);
  ExpectWholeContextCached(b, "stop-string replies");
  ExpectOneSession(stop, b, "stop-string replies");
  EXPECT_TRUE(AnyStopped(b)) << "no reply ended by the stop string: the test does not test it";
  EXPECT_EQ(Metric(server.port(), "mnemo_sessions"), 2) << server.log();
}

TEST(SessionReuse, StatelessChatConversationStaysInOneSession) {
  ServerProcess server({"--api-key", "plain", "--api-key", "stop"});
  ASSERT_GT(server.port(), 0) << server.log();
  Client plain(server.port(), "plain"), stop(server.port(), "stop");
  auto a = RunChat(plain, /*stop=*/false, 24, nullptr);
  ExpectWholeContextCached(a, "max_tokens replies");
  ExpectOneSession(plain, a, "max_tokens replies");
  auto b = RunChat(stop, /*stop=*/true, 48, nullptr);
  ExpectWholeContextCached(b, "stop-string replies");
  ExpectOneSession(stop, b, "stop-string replies");
  EXPECT_TRUE(AnyStopped(b)) << "no reply ended by the stop string: the test does not test it";
  EXPECT_EQ(Metric(server.port(), "mnemo_sessions"), 2) << server.log();
}

// A client that edits its history (here: an earlier user message, then the last reply) gets a
// fork that shares the unchanged prefix; the original conversation still continues in its own
// session with its whole context cached.
TEST(SessionReuse, EditedHistoryForksAndTheOriginalGoesOn) {
  ServerProcess server({"--api-key", "k"});
  ASSERT_GT(server.port(), 0) << server.log();
  Client c(server.port(), "k");
  Json history;
  auto turns = RunChat(c, /*stop=*/true, 48, &history);
  ASSERT_EQ(turns.size(), 4u);
  ASSERT_EQ(c.Get("/v1/sessions")["data"].size(), 1u);

  // Edit the second user message (history: system, user, assistant, user, assistant, ...).
  Json edited = history;
  edited[3]["content"] = "What did the dog drink?";
  edited.push_back({{"role", "user"}, {"content", "And then?"}});
  Json r = c.Post("/v1/chat/completions", {{"messages", edited}, {"max_tokens", 8}, {"temperature", 0}});
  ASSERT_TRUE(r.is_object());
  const int cached_edit = r["usage"]["prompt_tokens_details"]["cached_tokens"];
  EXPECT_GE(cached_edit, turns[0].prompt + turns[0].completion - 1);  // the first turn is shared
  EXPECT_LT(cached_edit, turns[1].prompt);                          // nothing after the edit
  EXPECT_EQ(c.Get("/v1/sessions")["data"].size(), 2u);

  // Edit the last reply: a fork too, sharing everything before the change.
  Json reply_edited = history;
  reply_edited.back()["content"] = "The cat slept all day";
  reply_edited.push_back({{"role", "user"}, {"content", "And then?"}});
  r = c.Post("/v1/chat/completions", {{"messages", reply_edited}, {"max_tokens", 8}, {"temperature", 0}});
  ASSERT_TRUE(r.is_object());
  EXPECT_GE(r["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), turns[3].prompt);
  EXPECT_EQ(c.Get("/v1/sessions")["data"].size(), 3u);

  // The original history goes on in its own session, its whole context cached.
  history.push_back({{"role", "user"}, {"content", "And then?"}});
  r = c.Post("/v1/chat/completions", {{"messages", history}, {"max_tokens", 8}, {"temperature", 0}});
  ASSERT_TRUE(r.is_object());
  EXPECT_GE(r["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), turns[3].prompt + turns[3].completion - 1);
  Json s = c.Get("/v1/sessions");
  EXPECT_EQ(s["data"].size(), 3u) << s.dump();
  int five_turns = 0;
  for (const auto& x : s["data"]) five_turns += x["turns"] == 5;
  EXPECT_EQ(five_turns, 1) << s.dump();
  // The forks copied the partial chunk at their fork points instead of recomputing it.
  EXPECT_GE(Metric(server.port(), "mnemo_cow_copies_total"), 1) << server.log();
  EXPECT_EQ(Metric(server.port(), "mnemo_cow_recomputes_total"), 0) << server.log();
}

// Raw prompts (/v1/completions) find their session by token prefix alone (the service's prefix
// index): each continues the session holding its longest prefix, another owner's sessions are
// never matched, and a prompt that leaves a session's log part-way forks it there.
TEST(SessionReuse, RawPromptsContinueTheSessionSharingTheLongestPrefix) {
  ServerProcess server({"--api-key", "k", "--api-key", "other"});
  ASSERT_GT(server.port(), 0) << server.log();
  Client c(server.port(), "k"), other(server.port(), "other");
  auto complete = [&](Client& cl, const std::string& prompt) {
    Json r = cl.Post("/v1/completions", {{"prompt", prompt}, {"max_tokens", 8}, {"temperature", 0}, {"ignore_eos", true}});
    return r.is_object() ? r : Json{{"choices", {{{"text", ""}}}}, {"usage", {{"prompt_tokens", -1}}}};
  };
  auto cached = [](const Json& r) { return r["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(); };
  const std::string p1 = "Once upon a time there was a little cat who liked to sleep in the warm sun all day long.";
  const std::string p2 = "Lily and Ben went to the park with their big red ball and played until the sun went down.";
  Json a1 = complete(c, p1), b1 = complete(c, p2);
  EXPECT_EQ(c.Get("/v1/sessions")["data"].size(), 2u);
  const std::string a_text = p1 + a1["choices"][0]["text"].get<std::string>();
  const std::string b_text = p2 + b1["choices"][0]["text"].get<std::string>();
  Json b2 = complete(c, b_text + " Then they went home.");  // continues the second session
  EXPECT_GE(cached(b2), b1["usage"]["prompt_tokens"].get<int>());
  Json a2 = complete(c, a_text + " The cat woke up.");  // continues the first
  EXPECT_GE(cached(a2), a1["usage"]["prompt_tokens"].get<int>());
  EXPECT_EQ(c.Get("/v1/sessions")["data"].size(), 2u);
  Json o = complete(other, p1);  // the same prompt from another owner: no match, a session of its own
  EXPECT_EQ(cached(o), 0);
  EXPECT_EQ(other.Get("/v1/sessions")["data"].size(), 1u);
  Json a3 = complete(c, a_text + " A dog barked at the door.");  // leaves the first session's log: a fork
  EXPECT_GE(cached(a3), a1["usage"]["prompt_tokens"].get<int>());
  EXPECT_LT(cached(a3), a2["usage"]["prompt_tokens"].get<int>());
  EXPECT_EQ(c.Get("/v1/sessions")["data"].size(), 3u);
}

}  // namespace
}  // namespace mnemo::testing

namespace mnemo::testing {
namespace {

// Waits (bounded) until the server holds no engine session: the engine expired them.
bool WaitNoSessions(int port) {
  for (int i = 0; i < 100; i++) {
    if (Metric(port, "mnemo_sessions") == 0) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

// Sessions the engine expires (--session-ttl) lose their KV, not their conversations: the next
// turn, whether named by previous_response_id or sent as a whole history, starts a new session
// with its whole context (nothing cached), and the turn after that continues that session.
TEST(SessionReuse, ExpiredSessionsContinueFromTheirHistory) {
  ServerProcess server({"--api-key", "k", "--session-ttl", "1"});
  ASSERT_GT(server.port(), 0) << server.log();
  Client c(server.port(), "k");

  Json r1 = c.Post("/v1/responses", {{"input", kUser[0]}, {"max_output_tokens", 8}, {"temperature", 0}});
  ASSERT_TRUE(r1.is_object());
  ASSERT_TRUE(WaitNoSessions(server.port())) << server.log();
  Json r2 = c.Post("/v1/responses", {{"input", kUser[1]}, {"previous_response_id", r1["id"]},
                                     {"max_output_tokens", 8}, {"temperature", 0}});
  ASSERT_TRUE(r2.is_object()) << server.log();
  EXPECT_EQ(r2["status"], "incomplete");  // cut at max_output_tokens: a real reply
  EXPECT_EQ(r2["usage"]["input_tokens_details"]["cached_tokens"], 0);
  EXPECT_GT(r2["usage"]["input_tokens"].get<int>(),
            r1["usage"]["input_tokens"].get<int>() + r1["usage"]["output_tokens"].get<int>() - 1);
  Json r3 = c.Post("/v1/responses", {{"input", kUser[2]}, {"previous_response_id", r2["id"]},
                                     {"max_output_tokens", 8}, {"temperature", 0}});
  ASSERT_TRUE(r3.is_object());
  EXPECT_GE(r3["usage"]["input_tokens_details"]["cached_tokens"].get<int>(),
            r2["usage"]["input_tokens"].get<int>() + r2["usage"]["output_tokens"].get<int>() - 1);

  Json msgs = Json::array({{{"role", "user"}, {"content", kUser[0]}}});
  Json a = c.Post("/v1/chat/completions", {{"messages", msgs}, {"max_tokens", 8}, {"temperature", 0}});
  ASSERT_TRUE(a.is_object());
  msgs.push_back({{"role", "assistant"}, {"content", a["choices"][0]["message"]["content"]}});
  msgs.push_back({{"role", "user"}, {"content", kUser[1]}});
  ASSERT_TRUE(WaitNoSessions(server.port())) << server.log();
  Json b = c.Post("/v1/chat/completions", {{"messages", msgs}, {"max_tokens", 8}, {"temperature", 0}});
  ASSERT_TRUE(b.is_object()) << server.log();
  EXPECT_EQ(b["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  Json s = c.Get("/v1/sessions");
  EXPECT_EQ(s["data"].size(), 1u) << s.dump();  // the expired ones are forgotten
}

}  // namespace
}  // namespace mnemo::testing
