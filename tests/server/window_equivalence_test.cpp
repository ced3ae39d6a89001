// Turns rendered from a window of the conversation (the service's fast paths, turn_window.h) are
// the turns the whole-history path gives: the same conversations run against a server in each mode
// (`--render-whole` turns the fast paths off), greedy, and every reply text, usage count (input,
// cached, output tokens) and, after the servers stop, every stored session's token log must agree.
//   Responses: a chain with instructions, replies cut by max tokens and by a stop string; a branch
//   from an older response (a fork, then a fast turn on the fork); the main chain going on; a
//   response deleted from the middle of the chain (its history now starts after it); a restart
//   (sessions reloaded from the store, no windows: the first turn walks the chain, the next is
//   fast again).
//   Chat (whole history resent): a conversation, an edited earlier message (must not reuse the
//   session past the edit), an edited reply (a fork), and the original going on.
// The fast mode must have served turns from windows (mnemo_windowed_turns_total), the whole mode none.
#include <gtest/gtest.h>
#include <httplib.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server_process.h"
#include "store/store.h"

namespace mnemo::testing {
namespace {

using Json = nlohmann::json;

struct Http {
  explicit Http(int port) : c("127.0.0.1", port) { c.set_read_timeout(120, 0); }
  Json Send(const std::string& method, const std::string& path, const Json& body = nullptr) {
    httplib::Headers h = {{"Authorization", "Bearer k"}};
    auto r = method == "POST" ? c.Post(path.c_str(), h, body.dump(), "application/json")
             : method == "DELETE" ? c.Delete(path.c_str(), h) : c.Get(path.c_str(), h);
    EXPECT_TRUE(r && r->status == 200) << method << " " << path << ": " << (r ? r->body : "no response");
    return r && r->status == 200 ? Json::parse(r->body) : Json::object();
  }
  httplib::Client c;
};

int Metric(int port, const std::string& name) {
  httplib::Client c("127.0.0.1", port);
  auto m = c.Get("/metrics");
  if (!m) return -1;
  const auto p = m->body.find("\n" + name + " ");
  return p == std::string::npos ? -1 : std::stoi(m->body.substr(p + name.size() + 2));
}

struct Outcome {
  std::vector<std::string> turns;  // per turn: reply text and usage, as one comparable line
  std::vector<std::vector<int32_t>> logs;  // stored sessions' token logs, in id order
  int windowed = 0;
};

std::string Line(const Json& r) {
  if (r.contains("output_text")) {
    return r["output_text"].get<std::string>() + " | in " + r["usage"]["input_tokens"].dump() + " cached " +
           r["usage"]["input_tokens_details"]["cached_tokens"].dump() + " out " + r["usage"]["output_tokens"].dump();
  }
  if (!r.contains("choices")) return "error";
  return r["choices"][0]["message"]["content"].get<std::string>() + " | in " + r["usage"]["prompt_tokens"].dump() +
         " cached " + r["usage"]["prompt_tokens_details"]["cached_tokens"].dump() + " out " +
         r["usage"]["completion_tokens"].dump();
}

Outcome RunAll(bool whole) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("mnemo_window_eq_" + std::to_string(getpid()) + (whole ? "_whole" : "_fast"));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string db = (dir / "x.db").string();
  std::vector<std::string> flags = {"--db", db, "--api-key", "k"};
  if (whole) flags.push_back("--render-whole");
  Outcome run;
  std::vector<std::string> ids;  // response ids, by turn
  auto respond = [&](Http& h, const std::string& input, const std::string& prev, bool stop) {
    Json body = {{"input", input}, {"instructions", "You tell short stories."}, {"temperature", 0},
                 {"max_output_tokens", stop ? 24 : 8}};
    if (stop) body["stop"] = Json::array({"."});
    if (!prev.empty()) body["previous_response_id"] = prev;
    Json r = h.Send("POST", "/v1/responses", body);
    run.turns.push_back(Line(r));
    ids.push_back(r.value("id", ""));
    return ids.back();
  };
  {
    ServerProcess server(flags);
    EXPECT_GT(server.port(), 0) << server.log();
    Http h(server.port());
    std::string prev;
    const char* const kInputs[] = {"Tell me about a cat.", "What did it eat?", "Where did it go?", "Who did it meet?",
                                   "What happened then?", "How did it end?"};
    for (int i = 0; i < 6; ++i) prev = respond(h, kInputs[i], prev, i % 2 == 1);
    const std::string main = prev;
    std::string branch = respond(h, "Tell it with a dog instead.", ids[2], false);  // from an older response
    branch = respond(h, "And the dog's name?", branch, true);                     // fast again, on the fork
    prev = respond(h, "Is there a sequel?", main, false);                          // the main chain goes on
    h.Send("DELETE", "/v1/responses/" + ids[1]);                                   // history now starts after it
    prev = respond(h, "Summarise it.", prev, false);
    prev = respond(h, "Shorter, please.", prev, true);

    // Chat: the whole history each time.
    Json msgs = Json::array({{{"role", "system"}, {"content", "You are a storyteller."}}});
    auto chat = [&](Json m) {
      Json r = h.Send("POST", "/v1/chat/completions", {{"messages", m}, {"max_tokens", 8}, {"temperature", 0}});
      run.turns.push_back(Line(r));
      return r.contains("choices") ? r["choices"][0]["message"]["content"].get<std::string>() : std::string();
    };
    for (const char* u : {"Once upon a time", "What next?", "And then?", "Who was there?"}) {
      msgs.push_back({{"role", "user"}, {"content", u}});
      msgs.push_back({{"role", "assistant"}, {"content", chat(msgs)}});
    }
    Json edited = msgs;
    edited[3]["content"] = "What came before?";  // an earlier user message
    edited.push_back({{"role", "user"}, {"content", "Go on."}});
    chat(edited);
    Json reply_edited = msgs;
    reply_edited.back()["content"] = "Nobody was there";
    reply_edited.push_back({{"role", "user"}, {"content", "Go on."}});
    chat(reply_edited);
    msgs.push_back({{"role", "user"}, {"content", "Go on."}});
    msgs.push_back({{"role", "assistant"}, {"content", chat(msgs)}});
    msgs.push_back({{"role", "user"}, {"content", "The end?"}});
    chat(msgs);
    run.windowed += Metric(server.port(), "mnemo_windowed_turns_total");
    EXPECT_TRUE(server.StopWithin(SIGTERM, 30));
  }
  {
    ServerProcess server(flags);  // a restart: sessions come back from the store, without windows
    EXPECT_GT(server.port(), 0) << server.log();
    Http h(server.port());
    std::string prev = respond(h, "Tell it again.", ids.back(), false);
    prev = respond(h, "Once more.", prev, false);
    run.windowed += Metric(server.port(), "mnemo_windowed_turns_total");
    EXPECT_TRUE(server.StopWithin(SIGTERM, 30));
  }
  auto store = Store::Open(db);
  EXPECT_TRUE(store.ok());
  if (store.ok()) {
    auto sessions = (*store)->LoadSessions();
    EXPECT_TRUE(sessions.ok());
    if (sessions.ok()) {
      for (auto& s : *sessions) run.logs.push_back(s.tokens);
    }
  }
  std::filesystem::remove_all(dir);
  return run;
}

TEST(WindowEquivalence, WindowedTurnsEqualWholeHistoryTurns) {
  const Outcome fast = RunAll(false);
  const Outcome whole = RunAll(true);
  ASSERT_EQ(fast.turns.size(), whole.turns.size());
  for (size_t i = 0; i < fast.turns.size(); ++i) EXPECT_EQ(fast.turns[i], whole.turns[i]) << "turn " << i;
  ASSERT_EQ(fast.logs.size(), whole.logs.size());
  for (size_t i = 0; i < fast.logs.size(); ++i) EXPECT_EQ(fast.logs[i], whole.logs[i]) << "session " << i;
  EXPECT_EQ(whole.windowed, 0);
  // Responses: turns 2-6 of the chain, the turn on the fork, the main chain's next, the one after the
  // restart's first; chat: the second to fourth turns and the original going on.
  EXPECT_GE(fast.windowed, 10);
  EXPECT_GE(fast.logs.size(), 3u);  // the branch and the edits forked
}

}  // namespace
}  // namespace mnemo::testing
