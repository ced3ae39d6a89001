// mnemo bench turns: how the server's per-turn cost grows with a conversation's length.
//
// Drives one long conversation through a running `mnemo serve` (max_output_tokens small, greedy)
// and, at the turn counts given by --at, reads the server's own CPU time for the request path from
// /metrics (mnemo_request_cpu_seconds_total of the route: the handler thread's CPU, which excludes
// the engine's compute) before and after each of the --samples turns ending there. Reports per
// checkpoint the median server CPU per turn and the median client wall time per turn (the latter
// includes the model).
//   --api responses: each turn sends only the new input and previous_response_id (the stateful path:
//                    history from the store, the session found from the response)
//   --api chat:      each turn sends the whole history (the stateless path: the session found by
//                    the rendering's prefix)
#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <sstream>

#include <nlohmann/json.hpp>

#include "commands.h"

namespace mnemo::app {
namespace {

using Json = nlohmann::json;

struct TurnsFlags {
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string api = "responses";
  std::vector<int> at = {10, 100, 1000};  // checkpoints (turn counts)
  int samples = 5;                        // turns measured per checkpoint (the ones ending at it)
  int max_output_tokens = 4;
  bool json = false;
};

// The server's handler CPU seconds for `route`, from /metrics; < 0 when absent.
double ServerCpu(httplib::Client& cli, const std::string& route) {
  auto res = cli.Get("/metrics");
  if (!res || res->status != 200) return -1;
  const std::string key = "mnemo_request_cpu_seconds_total{route=\"" + route + "\"} ";
  const size_t at = res->body.find(key);
  if (at == std::string::npos) return -1;
  return std::strtod(res->body.c_str() + at + key.size(), nullptr);
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int RunTurns(const TurnsFlags& f) {
  httplib::Client cli(f.host, f.port);
  cli.set_read_timeout(600, 0);
  const int last = *std::max_element(f.at.begin(), f.at.end());
  const std::string route = f.api == "chat" ? "/v1/chat/completions" : "/v1/responses";
  Json history = Json::array();  // chat: the whole conversation so far
  std::string prev;              // responses: the previous response id
  struct Point {
    int turn;
    int64_t context_tokens = 0;
    std::vector<double> cpu_ms, wall_ms;
  };
  std::vector<Point> points;
  for (int at : f.at) points.push_back(Point{at, 0, {}, {}});
  for (int turn = 1; turn <= last; turn++) {
    Point* p = nullptr;
    for (auto& q : points) {
      if (turn > q.turn - f.samples && turn <= q.turn) p = &q;
    }
    const std::string user = "Tell me about item " + std::to_string(turn) + " on the list, and the town it came from.";
    Json body;
    if (f.api == "chat") {
      history.push_back({{"role", "user"}, {"content", user}});
      body = {{"messages", history}, {"max_tokens", f.max_output_tokens}, {"temperature", 0}};
    } else {
      body = {{"input", user}, {"max_output_tokens", f.max_output_tokens}, {"temperature", 0}};
      if (!prev.empty()) body["previous_response_id"] = prev;
    }
    const double cpu0 = p ? ServerCpu(cli, route) : 0;
    const auto t0 = std::chrono::steady_clock::now();
    auto res = cli.Post(route, body.dump(), "application/json");
    const double wall = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (!res || res->status != 200) {
      std::fprintf(stderr, "error: turn %d: %s\n", turn, res ? res->body.substr(0, 300).c_str() : "no response");
      return 1;
    }
    const Json j = Json::parse(res->body, nullptr, false);
    if (f.api == "chat") {
      history.push_back({{"role", "assistant"}, {"content", j["choices"][0]["message"]["content"]}});
      if (p) p->context_tokens = j["usage"]["prompt_tokens"].get<int64_t>();
    } else {
      prev = j["id"].get<std::string>();
      if (p) p->context_tokens = j["usage"]["input_tokens"].get<int64_t>();
    }
    if (p) {
      const double cpu1 = ServerCpu(cli, route);
      if (cpu0 < 0 || cpu1 < 0) {
        std::fprintf(stderr, "error: the server exports no mnemo_request_cpu_seconds_total for %s\n", route.c_str());
        return 1;
      }
      p->cpu_ms.push_back((cpu1 - cpu0) * 1e3);
      p->wall_ms.push_back(wall);
    }
  }
  Json out = Json::array();
  if (!f.json) std::printf("%-6s %-14s %-22s %s\n", "turn", "context_tokens", "server_cpu_ms_per_turn", "wall_ms_per_turn");
  for (const auto& p : points) {
    const double cpu = Median(p.cpu_ms), wall = Median(p.wall_ms);
    out.push_back({{"turn", p.turn}, {"context_tokens", p.context_tokens}, {"server_cpu_ms_p50", cpu},
                   {"wall_ms_p50", wall}, {"samples", p.cpu_ms.size()}});
    if (!f.json) std::printf("%-6d %-14lld %-22.3f %.3f\n", p.turn, static_cast<long long>(p.context_tokens), cpu, wall);
  }
  if (f.json) std::printf("%s\n", Json{{"api", f.api}, {"points", out}}.dump().c_str());
  return 0;
}

}  // namespace

void RegisterBenchTurns(CLI::App* bench) {
  auto f = std::make_shared<TurnsFlags>();
  auto* cmd = bench->add_subcommand("turns", "server CPU per turn as one conversation grows (against mnemo serve)");
  cmd->add_option("--host", f->host, "server host (this machine)");
  cmd->add_option("--port", f->port, "server port");
  cmd->add_option("--api", f->api, "responses (previous_response_id) or chat (whole history)")
      ->check(CLI::IsMember({"chat", "responses"}));
  cmd->add_option("--at", f->at, "turn counts to measure at")->check(CLI::PositiveNumber);
  cmd->add_option("--samples", f->samples, "turns measured per checkpoint (median)")->check(CLI::PositiveNumber);
  cmd->add_option("--max-output-tokens", f->max_output_tokens, "reply length per turn")->check(CLI::PositiveNumber);
  cmd->add_flag("--json", f->json, "print one JSON object");
  cmd->callback([f] {
    if (int rc = RunTurns(*f); rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace mnemo::app
