// Restarting `mnemo serve` on another model with the same --db (issue 11: the disk tier and the
// stored sessions outlive the process). The restarted server must answer exactly as a fresh
// server on the new model does: the old model's KV is never read back, and token logs of another
// vocabulary are never restored.
#include <gtest/gtest.h>
#include <httplib.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "format/make_model.h"
#include "server_process.h"

namespace mnemo::testing {
namespace {

using Json = nlohmann::json;
namespace fs = std::filesystem;

class ModelChange : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("mnemo-model-change-" + std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Make(const std::string& name, uint64_t seed, const std::string& vocab) {
    MakeModelOptions o;
    o.preset = "tiny";
    o.seed = seed;
    o.dtype = DType::F32;
    o.vocab_path = vocab;
    o.output_path = (dir_ / name).string();
    Status st = MakeModel(o);
    EXPECT_TRUE(st.ok()) << st.error().message;
    return o.output_path;
  }
  // The reply to a fixed two-turn conversation's second turn (greedy), asked of a server on `model`.
  // With db, the first turn's session is stored (and its KV written to the disk tier at exit).
  static std::string SecondTurn(const std::string& model, const std::string& db, std::string* first_reply) {
    std::vector<std::string> flags = {"--threads", "1"};
    if (!db.empty()) flags.insert(flags.end(), {"--db", db, "--kv-disk-mb", "8"});
    ServerProcess server(flags, model);
    EXPECT_GT(server.port(), 0) << server.log();
    httplib::Client c("127.0.0.1", server.port());
    c.set_read_timeout(60, 0);
    Json msgs = Json::array({{{"role", "user"}, {"content", "Once upon a time there was a little girl named Lily."}}});
    auto ask = [&](const Json& m) {
      auto r = c.Post("/v1/chat/completions", Json{{"messages", m}, {"max_tokens", 12}, {"temperature", 0}}.dump(),
                      "application/json");
      EXPECT_TRUE(r && r->status == 200) << (r ? r->body : "no response") << server.log();
      return r && r->status == 200 ? Json::parse(r->body)["choices"][0]["message"]["content"].get<std::string>() : "";
    };
    if (first_reply->empty()) *first_reply = ask(msgs);
    msgs.push_back({{"role", "assistant"}, {"content", *first_reply}});
    msgs.push_back({{"role", "user"}, {"content", "What did she do next?"}});
    return ask(msgs);
  }
  fs::path dir_;
};

TEST_F(ModelChange, SameVocabularyOtherWeightsRecomputesTheKv) {
  const std::string vocab = std::string(MNEMO_SHARED_DIR) + "/models/stories260K/stories260K.gguf";
  const std::string a = Make("a.gguf", 7, vocab), b = Make("b.gguf", 8, vocab);
  const std::string db = (dir_ / "db.sqlite").string();
  std::string reply;  // the first turn's reply, from model a: the conversation both servers continue
  SecondTurn(a, db, &reply);   // serves and stores turn 1 (and turn 2) on a; KV goes to disk at exit
  ASSERT_FALSE(reply.empty());
  std::string reply_again = reply;
  const std::string restarted = SecondTurn(b, db, &reply_again);  // b on a's db: a's session is restored
  std::string fresh_reply = reply;
  const std::string fresh = SecondTurn(b, "", &fresh_reply);  // b with nothing stored
  EXPECT_EQ(restarted, fresh) << "the restarted server answered from the old model's KV";
}

// A Responses chain continues its stored session by id: after a restart on another vocabulary that
// session's token log is another vocabulary's ids, so it must be gone, and the chain continue from
// its text, as the same history given in full does on a fresh server.
TEST_F(ModelChange, OtherVocabularyDoesNotRestoreTheSessions) {
  const std::string gpt2 = std::string(MNEMO_SHARED_DIR) + "/models/vocab/ggml-vocab-gpt-2.gguf";
  const std::string spm = std::string(MNEMO_SHARED_DIR) + "/models/stories260K/stories260K.gguf";
  const std::string a = Make("a.gguf", 7, gpt2), b = Make("b.gguf", 8, spm);
  const std::string db = (dir_ / "db.sqlite").string();
  const std::string q1 = "Once upon a time there was a little girl named Lily.", q2 = "What did she do next?";
  auto post = [](ServerProcess& s, const Json& body) {
    httplib::Client c("127.0.0.1", s.port());
    c.set_read_timeout(60, 0);
    auto r = c.Post("/v1/responses", body.dump(), "application/json");
    EXPECT_TRUE(r && r->status == 200) << (r ? r->body : "no response") << s.log();
    return r && r->status == 200 ? Json::parse(r->body) : Json();
  };
  auto text = [](const Json& r) { return r.is_object() ? r["output"][0]["content"][0]["text"].get<std::string>() : ""; };
  std::string id, reply;
  {
    ServerProcess server({"--db", db, "--kv-disk-mb", "8", "--threads", "1"}, a);
    ASSERT_GT(server.port(), 0) << server.log();
    Json r = post(server, {{"input", q1}, {"max_output_tokens", 12}, {"temperature", 0}});
    ASSERT_TRUE(r.is_object());
    id = r["id"];
    reply = text(r);
  }
  std::string restarted, fresh;
  {
    ServerProcess server({"--db", db, "--kv-disk-mb", "8", "--threads", "1"}, b);
    ASSERT_GT(server.port(), 0) << server.log();
    restarted = text(post(server, {{"input", q2}, {"previous_response_id", id}, {"max_output_tokens", 12},
                                   {"temperature", 0}}));
  }
  {
    ServerProcess server({"--threads", "1"}, b);
    ASSERT_GT(server.port(), 0) << server.log();
    Json input = Json::array({{{"role", "user"}, {"content", q1}}, {{"role", "assistant"}, {"content", reply}},
                              {{"role", "user"}, {"content", q2}}});
    fresh = text(post(server, {{"input", input}, {"max_output_tokens", 12}, {"temperature", 0}}));
  }
  EXPECT_FALSE(fresh.empty());
  EXPECT_EQ(restarted, fresh);
}

}  // namespace
}  // namespace mnemo::testing
