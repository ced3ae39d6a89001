// mnemo chat: an interactive multi-turn conversation on one engine session, streaming tokens as
// they come. Each turn sends only the new message; the session's KV stays in the cache.
// Commands: /stats (cache residency of the session and engine counters), /reset (new session),
// /quit.
#include <cstdio>
#include <iostream>
#include <string>

#include "commands.h"
#include "runtime.h"

namespace mnemo::app {
namespace {

struct ChatFlags {
  std::string model, tokenizer, system;
  int max_tokens = 256;
  SamplingParams sampling;
  RuntimeFlags runtime;
  EngineFlags engine;
};

// Plain fallback format for models without a chat template: "User: ...\nAssistant:".
std::string RenderTurn(const std::string& system, const std::string& user, bool first) {
  std::string s;
  if (first && !system.empty()) s += system + "\n";
  s += (first ? "" : "\n") + std::string("User: ") + user + "\nAssistant:";
  return s;
}

void PrintStats(Engine& e, SessionId s) {
  auto info = e.GetSession(s);
  EngineStats st = e.Stats();
  if (info.ok()) {
    std::printf("[session %lld: %zu tokens, %zu turns, KV for %d positions; chunks t0 %d, t1 %d, t2 %d, dropped %d]\n",
                static_cast<long long>(s), info->tokens.size(), info->turns.size(), info->kv_tokens,
                info->chunks_by_tier[0], info->chunks_by_tier[1], info->chunks_by_tier[2], info->chunks_by_tier[3]);
  }
  std::printf("[engine: %lld turns, context from t0 %lld, t1 %lld, t2 %lld, recomputed %lld, new %lld; "
              "blocks used t0 %d/%d t1 %d/%d t2 %d/%d]\n",
              static_cast<long long>(st.turns_done), static_cast<long long>(st.sources.t0),
              static_cast<long long>(st.sources.t1), static_cast<long long>(st.sources.t2),
              static_cast<long long>(st.sources.recomputed), static_cast<long long>(st.sources.fresh),
              st.used_blocks[0], st.capacity[0], st.used_blocks[1], st.capacity[1], st.used_blocks[2], st.capacity[2]);
}

int RunChat(const ChatFlags& f) {
  auto started = StartEngine(f.model, f.tokenizer, f.runtime, f.engine);
  if (!started.ok()) {
    std::fprintf(stderr, "error: %s\n", started.error().message.c_str());
    return 1;
  }
  Runtime& rt = started->rt;
  Engine& e = *started->engine;
  SessionId s = e.CreateSession();
  bool first = true;
  std::fprintf(stderr, "mnemo chat: type a message; /stats, /reset, /quit\n");
  std::string line;
  for (;;) {
    std::printf("> ");
    std::fflush(stdout);
    if (!std::getline(std::cin, line) || line == "/quit") break;
    if (line.empty()) continue;
    if (line == "/stats") {
      PrintStats(e, s);
      continue;
    }
    if (line == "/reset") {
      (void)e.DeleteSession(s);
      s = e.CreateSession();
      first = true;
      std::printf("[new session %lld]\n", static_cast<long long>(s));
      continue;
    }
    TurnRequest req;
    req.session = s;
    req.append = rt.tokenizer->Encode(RenderTurn(f.system, line, first), /*add_special=*/first);
    req.max_tokens = f.max_tokens;
    req.sampling = f.sampling;
    req.stop = {"\nUser:"};
    auto h = e.Submit(req);
    if (!h.ok()) {
      std::printf("[error: %s]\n", h.error().message.c_str());
      continue;
    }
    first = false;
    TurnEvent ev;
    while ((*h)->Next(&ev)) {
      if (ev.kind == TurnEvent::kText) {
        std::fwrite(ev.text.data(), 1, ev.text.size(), stdout);
        std::fflush(stdout);
      } else {
        const TurnResult& r = ev.result;
        std::printf("\n[%zu tokens, TTFT %.1f ms, context %d: %lld cached, %lld recomputed, %lld new; %s]\n",
                    r.tokens.size(), r.ttft_seconds * 1000, r.prompt_tokens,
                    static_cast<long long>(r.sources.cached()), static_cast<long long>(r.sources.recomputed),
                    static_cast<long long>(r.sources.fresh), FinishReasonName(r.finish_reason));
        if (r.finish_reason == FinishReason::kError) std::printf("[error: %s]\n", r.error.message.c_str());
      }
    }
  }
  return 0;
}

}  // namespace

void RegisterChat(CLI::App& app) {
  auto f = std::make_shared<ChatFlags>();
  f->sampling.temperature = 0.7f;
  auto* cmd = app.add_subcommand("chat", "interactive multi-turn chat on one session");
  cmd->add_option("--model", f->model, "model file")->required()->check(CLI::ExistingFile);
  cmd->add_option("--tokenizer", f->tokenizer, "llama2.c tokenizer file for .bin models");
  cmd->add_option("--system", f->system, "system prompt");
  cmd->add_option("--max-tokens", f->max_tokens, "tokens per reply at most");
  cmd->add_option("--temperature", f->sampling.temperature, "0 = greedy");
  cmd->add_option("--top-p", f->sampling.top_p, "1 = off");
  cmd->add_option("--seed", f->sampling.seed, "random seed");
  AddRuntimeFlags(cmd, &f->runtime);
  AddEngineFlags(cmd, &f->engine);
  cmd->callback([f] {
    int rc = RunChat(*f);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace mnemo::app
