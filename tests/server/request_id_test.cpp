// X-Mnemo-Request-Id over real HTTP on stories260K (issue 14): a retried turn is answered from the
// store without adding a turn (chat completions, completions, Responses in a conversation); a retry
// while the first attempt runs gets 409 request_in_progress; a reused id with another body 422;
// malformed ids 400; an attempt that failed leaves the id free.
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "server_process.h"

namespace mnemo::testing {
namespace {

using Json = nlohmann::json;

class RequestIds : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_GT(server_.port(), 0) << server_.log();
    c_.set_read_timeout(60, 0);
  }
  httplib::Result Post(const std::string& path, const Json& body, const std::string& request_id) {
    httplib::Headers h;
    if (!request_id.empty()) h.emplace("X-Mnemo-Request-Id", request_id);
    return c_.Post(path.c_str(), h, body.dump(), "application/json");
  }
  // The number of sessions and the turns of the first one (GET /v1/sessions).
  std::pair<size_t, int> Sessions() {
    auto r = c_.Get("/v1/sessions");
    EXPECT_TRUE(r && r->status == 200);
    const Json data = Json::parse(r->body)["data"];
    return {data.size(), data.empty() ? 0 : data[0]["turns"].get<int>()};
  }
  ServerProcess server_{{}};
  httplib::Client c_{"127.0.0.1", server_.port()};
};

const Json kChat = {{"messages", {{{"role", "user"}, {"content", "Tell me about a frog."}}}},
                    {"max_tokens", 8}, {"temperature", 0.8}};

TEST_F(RequestIds, RetriedChatTurnIsAnsweredFromTheStore) {
  auto first = Post("/v1/chat/completions", kChat, "chat-1");
  ASSERT_TRUE(first && first->status == 200) << (first ? first->body : "no response");
  EXPECT_FALSE(first->has_header("X-Mnemo-Deduplicated"));
  EXPECT_EQ(Sessions(), std::make_pair(size_t{1}, 1));
  auto retry = Post("/v1/chat/completions", kChat, "chat-1");
  ASSERT_TRUE(retry && retry->status == 200) << (retry ? retry->body : "no response");
  EXPECT_EQ(retry->get_header_value("X-Mnemo-Deduplicated"), "true");
  EXPECT_EQ(Json::parse(retry->body), Json::parse(first->body));  // the same answer: id, text, usage
  EXPECT_EQ(Sessions(), std::make_pair(size_t{1}, 1)) << "the retry added no turn";

  // The same id with another body is another request: refused. Another id runs.
  Json other = kChat;
  other["max_tokens"] = 9;
  auto reused = Post("/v1/chat/completions", other, "chat-1");
  ASSERT_TRUE(reused);
  EXPECT_EQ(reused->status, 422);
  EXPECT_EQ(Json::parse(reused->body)["error"]["code"], "request_id_reused");
  auto fresh = Post("/v1/completions", {{"prompt", "Once upon"}, {"max_tokens", 4}}, "chat-1");  // another route
  ASSERT_TRUE(fresh);
  EXPECT_EQ(fresh->status, 422);

  // Completions: the same rule.
  const Json cmpl = {{"prompt", "The dog ran"}, {"max_tokens", 6}};
  auto c1 = Post("/v1/completions", cmpl, "cmpl-1");
  auto c2 = Post("/v1/completions", cmpl, "cmpl-1");
  ASSERT_TRUE(c1 && c2 && c1->status == 200 && c2->status == 200);
  EXPECT_EQ(c2->get_header_value("X-Mnemo-Deduplicated"), "true");
  EXPECT_EQ(Json::parse(c2->body)["id"], Json::parse(c1->body)["id"]);
}

TEST_F(RequestIds, RetriedResponseAddsOneTurnToItsConversation) {
  auto conv = c_.Post("/v1/conversations", "{}", "application/json");
  ASSERT_TRUE(conv && conv->status == 200);
  const std::string cid = Json::parse(conv->body)["id"];
  // The first attempt streams; its retry gets the recorded answer: the response object (not a stream).
  const Json turn = {{"input", "Tell me a story about a cat."}, {"conversation", cid}, {"max_output_tokens", 8},
                     {"stream", true}};
  auto first = Post("/v1/responses", turn, "resp-turn-1");
  ASSERT_TRUE(first && first->status == 200) << (first ? first->body : "no response");
  const size_t done = first->body.find("event: response.incomplete");  // max_output_tokens ends it
  ASSERT_NE(done, std::string::npos) << first->body;
  const size_t data = first->body.find("data: ", done) + 6;
  const Json completed = Json::parse(first->body.substr(data, first->body.find('\n', data) - data))["response"];
  auto retry = Post("/v1/responses", turn, "resp-turn-1");
  ASSERT_TRUE(retry && retry->status == 200);
  EXPECT_EQ(retry->get_header_value("X-Mnemo-Deduplicated"), "true");
  EXPECT_EQ(retry->get_header_value("Content-Type"), "application/json");
  EXPECT_EQ(Json::parse(retry->body), completed);
  auto items = c_.Get(("/v1/conversations/" + cid + "/items").c_str());
  ASSERT_TRUE(items && items->status == 200);
  EXPECT_EQ(Json::parse(items->body)["data"].size(), 2u) << "one turn: its input and its reply\n" << items->body;
}

TEST_F(RequestIds, MalformedIdsAreRefused) {
  for (const std::string& bad : {std::string(129, 'a'), std::string("caf\xc3\xa9")}) {
    auto r = Post("/v1/chat/completions", kChat, bad);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << r->body;
    EXPECT_EQ(Json::parse(r->body)["error"]["code"], "invalid_request_id");
  }
  EXPECT_EQ(Sessions().first, 0u);
  auto ok = Post("/v1/chat/completions", kChat, std::string(128, 'a'));  // the longest allowed
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
}

// A stream sent with a request id and read to its end; after its first chunk, a retry is sent.
struct Streamed {
  std::string body;  // what arrived
  int retry_status = 0;  // the status of the retry sent after the first chunk (0: none sent)
  std::string retry_after, retry_code;
};
Streamed Stream(int port, const Json& body, const std::string& request_id) {
  Streamed out;
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/chat/completions";
  req.set_header("Content-Type", "application/json");
  req.set_header("X-Mnemo-Request-Id", request_id);
  req.body = body.dump();
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    if (out.retry_status == 0) {  // the first chunk: the turn runs
      httplib::Client other("127.0.0.1", port);
      const httplib::Headers h = {{"X-Mnemo-Request-Id", request_id}};
      auto r = other.Post("/v1/chat/completions", h, body.dump(), "application/json");
      out.retry_status = r ? r->status : -1;
      if (r) {
        out.retry_after = r->get_header_value("Retry-After");
        out.retry_code = Json::parse(r->body)["error"].value("code", "");
      }
    }
    out.body.append(data, n);
    return true;
  };
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(60, 0);
  httplib::Response res;
  httplib::Error err;
  c.send(req, res, err);
  return out;
}

// A retry while the first attempt streams gets 409 with Retry-After; once the stream ended, a
// retry gets its non-streamed equivalent.
TEST_F(RequestIds, RetryWhileRunningIsRefusedThenAStreamIsReplayedWhole) {
  const Json body = {{"messages", {{{"role", "user"}, {"content", "Once upon a time"}}}}, {"max_tokens", 400},
                     {"ignore_eos", true}, {"stream", true}};
  const Streamed s = Stream(server_.port(), body, "long-1");
  EXPECT_EQ(s.retry_status, 409);
  EXPECT_EQ(s.retry_code, "request_in_progress");
  EXPECT_EQ(s.retry_after, "1");
  std::string id, text;
  for (size_t at = 0; (at = s.body.find("data: {", at)) != std::string::npos; ++at) {
    const Json chunk = Json::parse(s.body.substr(at + 6, s.body.find('\n', at) - at - 6));
    id = chunk["id"];
    for (const Json& ch : chunk["choices"]) text += ch["delta"].value("content", "");
  }
  ASSERT_FALSE(id.empty()) << s.body;
  auto retry = Post("/v1/chat/completions", body, "long-1");
  ASSERT_TRUE(retry && retry->status == 200);
  EXPECT_EQ(retry->get_header_value("X-Mnemo-Deduplicated"), "true");
  const Json whole = Json::parse(retry->body);
  EXPECT_EQ(whole["object"], "chat.completion");
  EXPECT_EQ(whole["id"], id);
  EXPECT_EQ(whole["choices"][0]["message"]["content"], text);
  EXPECT_EQ(whole["usage"]["completion_tokens"], 400);
}

// An attempt that did not commit (here: refused, a sampling value out of range) records nothing:
// the id is free for the next request.
TEST_F(RequestIds, FailedAttemptLeavesNoRecord) {
  Json bad = kChat;
  bad["temperature"] = -1;
  auto r = Post("/v1/chat/completions", bad, "fail-1");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body;
  r = Post("/v1/chat/completions", kChat, "fail-1");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_FALSE(r->has_header("X-Mnemo-Deduplicated"));
}

}  // namespace
}  // namespace mnemo::testing
