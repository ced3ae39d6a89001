// Issue 10's "done when": a Q4_K_M file of each architecture serves a multi-turn conversation
// through `mnemo serve` with cached tokens growing turn over turn. Per architecture: make-model's
// tiny preset (stories260K's 512-token vocab, the family's real chat template written into the
// file), `mnemo quantize --type Q4_K_M`, the real server on 127.0.0.1, three chat turns over
// HTTP. Each turn must answer (completion tokens, non-empty text), and each turn after the first
// must find at least the whole previous prompt in the cache: the previous prompt is a prefix of
// the new one whatever the template does with the reply, so
//
//   cached(k) >= prompt(k-1)  and  cached(k) > cached(k-1).
//
// Tiny files (about 1 MB each) keep the whole test at a few seconds.
#include <gtest/gtest.h>
#include <httplib.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "format/gguf.h"
#include "server_process.h"

namespace mnemo::testing {
namespace {

using Json = nlohmann::json;

struct Arch {
  std::string name;      // make-model --arch
  std::string tmpl;      // tests/chat/templates/<tmpl>.jinja: the family's GGUF chat template
  bool system = true;    // the template accepts a system message (Gemma 2's raises)
};

std::string Shell(const std::string& cmd) {
  const int rc = std::system((cmd + " 2>&1").c_str());
  return rc == 0 ? "" : "command failed (" + std::to_string(rc) + "): " + cmd;
}

class ArchServe : public ::testing::TestWithParam<Arch> {};

TEST_P(ArchServe, Q4KMServesMultiTurnWithGrowingCache) {
  const Arch& a = GetParam();
  const std::string bin = std::string(MNEMO_BINARY_DIR) + "/apps/mnemo";
  const std::string base = std::string(MNEMO_BINARY_DIR) + "/arch_serve_" + a.name + "." + std::to_string(getpid());
  const std::string f32 = base + ".f32.gguf", q = base + ".q4_k_m.gguf";
  struct Cleanup {
    std::vector<std::string> paths;
    ~Cleanup() {
      for (auto& p : paths) std::filesystem::remove(p);
    }
  } cleanup{{f32, q}};
  ASSERT_EQ(Shell(bin + " make-model --arch " + a.name + " --preset tiny --dtype f32 --seed 3 --vocab " +
                MNEMO_SHARED_DIR + "/models/stories260K/stories260K.gguf --chat-template " +
                MNEMO_CHAT_TEMPLATES_DIR + "/" + a.tmpl + ".jinja --out " + f32),
            "");
  ASSERT_EQ(Shell(bin + " quantize " + f32 + " " + q + " --type Q4_K_M --threads 1"), "");
  {
    // The quantized file really is a K-quant mix (Q4_K matrices).
    auto g = gguf::GgufFile::Open(q);
    ASSERT_TRUE(g.ok()) << g.error().message;
    int q4k = 0;
    for (const auto& t : g->tensors()) q4k += t.type == 12;  // GGML_TYPE_Q4_K
    EXPECT_GT(q4k, 0) << a.name;
  }

  ServerProcess server({"--threads", "1", "--http-threads", "2"}, q);
  ASSERT_GT(server.port(), 0) << server.log();
  httplib::Client c("127.0.0.1", server.port());
  c.set_read_timeout(60, 0);

  Json msgs = Json::array();
  if (a.system) msgs.push_back({{"role", "system"}, {"content", "You are a storyteller."}});
  const char* const users[] = {"Tell me a story about a cat.", "What did the cat eat?", "Where did it go next?"};
  int prev_prompt = 0, prev_cached = -1;
  for (int k = 0; k < 3; k++) {
    SCOPED_TRACE(a.name + " turn " + std::to_string(k));
    msgs.push_back({{"role", "user"}, {"content", users[k]}});
    Json body = {{"messages", msgs}, {"max_tokens", 8}, {"min_tokens", 8}, {"temperature", 0}, {"ignore_eos", true}};
    auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
    ASSERT_TRUE(r) << server.log();
    ASSERT_EQ(r->status, 200) << r->body;
    const Json j = Json::parse(r->body);
    const std::string text = j["choices"][0]["message"]["content"];
    const int prompt = j["usage"]["prompt_tokens"], completion = j["usage"]["completion_tokens"];
    const int cached = j["usage"]["prompt_tokens_details"]["cached_tokens"];
    std::printf("%s turn %d: prompt %d, cached %d, completion %d\n", a.name.c_str(), k, prompt, cached, completion);
    EXPECT_EQ(completion, 8);
    EXPECT_FALSE(text.empty());
    if (k > 0) {
      EXPECT_GE(cached, prev_prompt);
      EXPECT_GT(cached, prev_cached);
      EXPECT_GT(prompt, prev_prompt);
    }
    msgs.push_back({{"role", "assistant"}, {"content", text}});
    prev_prompt = prompt;
    prev_cached = cached;
  }
}

INSTANTIATE_TEST_SUITE_P(Archs, ArchServe,
                         ::testing::Values(Arch{"llama3", "llama-3.1-instruct"}, Arch{"qwen2", "qwen2.5-instruct"},
                                           Arch{"qwen3", "qwen3"}, Arch{"phi3", "phi-3.5-mini"},
                                           Arch{"gemma2", "gemma-2-it", false}, Arch{"gemma3", "gemma-3-it"}),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace mnemo::testing
