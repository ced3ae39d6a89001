// mnemo bench serve: replays the synthetic multi-turn workload of `bench multiturn` over HTTP
// against a running server (mnemo serve, or llama.cpp's llama-server for comparison) and reports
// throughput, TTFT / inter-token latency / latency percentiles, and cache hits by turn index.
//
// Three client behaviours, one per --api:
//   chat       POST /v1/chat/completions with the whole message history every turn (stateless API)
//   responses  POST /v1/responses with only the new turn and previous_response_id (stateful API)
//   llamacpp   POST /completion with the whole rendered prompt, cache_prompt and a slot per
//              user (llama-server's best case)
// Every mode forces the planned reply length (ignore_eos) and decodes greedily, so all systems
// generate the same number of tokens for the same workload.
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "base/rng.h"
#include "base/status.h"
#include "bench_faults.h"
#include "commands.h"
#include "workload/workload.h"

namespace mnemo::app {
namespace {

using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

struct ServeBenchFlags {
  std::string url = "http://127.0.0.1:8080";  // server root; only loopback hosts are accepted
  std::string api = "chat";                   // chat, responses or llamacpp
  std::string api_key;                        // sent as "Authorization: Bearer ..." when set
  std::string model_name;                     // "model" field; empty = first id of GET /v1/models
  std::string label;                          // name of the system under test in the JSON (plots)
  WorkloadConfig workload;
  int users = 8;                              // closed loop: concurrent users
  double rate = 0;                            // > 0: Poisson conversation arrivals per second instead
  int slots = 0;                              // llamacpp: pin each user (open loop: conversation) to a slot; 0 = server picks
  int max_requests = 0;                       // stop issuing after this many requests; 0 = no limit
  double duration_s = 0;                      // stop issuing after this many seconds; 0 = no limit
  double timeout_s = 600;                     // per-request read timeout (s)
  bool json = false;
  std::string csv;                            // one row per request, when set
  std::string faults;                         // --fault: kill/term/restart replicas of a local cluster
  std::string cluster_dir;                    // the cluster's directory (scripts/cluster.sh up --dir)
};

// Where to send requests: a loopback host, a port and an optional path prefix.
struct Target {
  std::string host;
  int port = 80;
  std::string prefix;  // prepended to every API path, e.g. "" or "/proxy"
};

// One request of the run, as the client saw it.
struct RequestRecord {
  int conv = 0;                    // conversation index in the workload
  int turn = 0;                    // turn index in the conversation (0 = first)
  double start_s = 0;              // send time, seconds since the run started
  double ttft_s = -1;              // send to first non-empty text chunk (s); -1 if none came
  double latency_s = 0;            // send to end of stream (s)
  std::vector<double> itl_s;       // gaps between consecutive text chunks (s)
  int64_t prompt_tokens = -1;      // context tokens the server reported; -1 if not reported
  int64_t cached_tokens = -1;      // of which served from its cache; -1 if not reported
  int64_t completion_tokens = -1;  // generated tokens reported (text chunks if not reported)
  int planned_output = 0;          // the forced reply length asked for
  std::vector<int64_t> sources;    // mnemo chat usage: context tokens from t0, t1, t2, recomputed, new
  int http_status = 0;             // the response's status; 0 when none came
  std::string replica;             // X-Mnemo-Replica of the response: which replica served it
  double retry_after_s = 0;        // Retry-After of a refusal (seconds; 0 when none)
  std::string error;               // empty when the request succeeded
};

// A refusal of admission (load shedding): 429 when the server is full, 503 while it starts or drains.
bool Shed(const RequestRecord& r) { return r.http_status == 429 || r.http_status == 503; }

// Splits a byte stream into lines ("\n" or "\r\n") and hands each "data:" payload to a callback.
// Anything else (event:, comments, blank separators) is ignored; the payload's own fields say
// what it is. The first bytes are kept to explain a non-SSE error body.
class SseReader {
 public:
  explicit SseReader(std::function<void(std::string_view)> on_data) : on_data_(std::move(on_data)) {}
  void Feed(const char* data, size_t n) {
    if (head_.size() < 2000) head_.append(data, std::min(n, 2000 - head_.size()));
    buf_.append(data, n);
    size_t start = 0;
    for (size_t nl; (nl = buf_.find('\n', start)) != std::string::npos; start = nl + 1) {
      std::string_view line(buf_.data() + start, nl - start);
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (line.substr(0, 5) == "data:") {
        line.remove_prefix(5);
        if (!line.empty() && line.front() == ' ') line.remove_prefix(1);
        on_data_(line);
      }
    }
    buf_.erase(0, start);
  }
  const std::string& head() const { return head_; }

 private:
  std::function<void(std::string_view)> on_data_;
  std::string buf_;   // bytes after the last complete line
  std::string head_;  // first 2000 bytes of the body
};

// The keys of mnemo's usage.mnemo_tokens_by_source, in the order RequestRecord::sources keeps them.
constexpr const char* kSources[] = {"t0", "t1", "t2", "recomputed", "new"};

// The member `key` of `j` when j is an object that has it, else null. Unlike operator[] on a const
// json (undefined behaviour for a missing key) it is safe on any input.
const Json& Get(const Json& j, const char* key) {
  static const Json kNull;
  if (!j.is_object()) return kNull;
  auto it = j.find(key);
  return it == j.end() ? kNull : *it;
}

std::string Str(const Json& j) { return j.is_string() ? j.get<std::string>() : std::string(); }

Json Percentiles(const std::vector<double>& v) {
  double mean = 0;
  for (double x : v) mean += x;
  return {{"p50", Percentile(v, 0.5)}, {"p90", Percentile(v, 0.9)}, {"p99", Percentile(v, 0.99)},
          {"mean", v.empty() ? 0.0 : mean / v.size()}};
}

double LoadAverage() {
  double l = -1;
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &l) != 1) l = -1;
    std::fclose(f);
  }
  return l;
}

// Parses http://HOST[:PORT][/prefix]; refuses anything but the loopback address: this tool puts
// load on a server and must not be pointed at someone else's.
Result<Target> ParseUrl(const std::string& url) {
  const std::string scheme = "http://";
  if (url.compare(0, scheme.size(), scheme) != 0) {
    return MakeError("--url must start with http:// (got '%s')", url.c_str());
  }
  std::string rest = url.substr(scheme.size());
  Target t;
  size_t slash = rest.find('/');
  if (slash != std::string::npos) {
    t.prefix = rest.substr(slash);
    rest.resize(slash);
    while (!t.prefix.empty() && t.prefix.back() == '/') t.prefix.pop_back();
  }
  size_t colon = rest.rfind(':');
  t.host = rest;
  if (colon != std::string::npos) {
    t.host = rest.substr(0, colon);
    const std::string p = rest.substr(colon + 1);
    char* end = nullptr;
    long port = std::strtol(p.c_str(), &end, 10);
    if (p.empty() || *end != '\0' || port < 1 || port > 65535) {
      return MakeError("--url has a bad port '%s'", p.c_str());
    }
    t.port = static_cast<int>(port);
  }
  if (t.host == "localhost") t.host = "127.0.0.1";
  if (t.host != "127.0.0.1") {
    return MakeError("--url host '%s' refused: bench serve only targets a server on this machine (127.0.0.1)",
                     t.host.c_str());
  }
  return t;
}

std::string RenderPlain(const ConversationPlan& c, const std::vector<std::string>& replies, int turn) {
  // The same text layout the in-process benchmark feeds the engine, as one prompt.
  std::string p = "System: " + c.system_text;
  for (int t = 0; t <= turn; t++) {
    p += "\n\nUser: " + c.turns[t].user_text + "\n\nAssistant:";
    if (t < turn) p += replies[t];
  }
  return p;
}

// Runs the conversations on client threads (one per closed-loop user, or one per conversation in
// the open loop), each with its own keep-alive connection.
class ServeBench {
 public:
  ServeBench(const ServeBenchFlags& f, Target target) : f_(f), target_(std::move(target)) {}

  // Runs the workload (and the faults, when given: started with the run, joined at its end);
  // returns the per-request records sorted by (conversation, turn).
  std::vector<RequestRecord> Run(const std::vector<ConversationPlan>& convs, FaultRunner* faults);
  double wall_seconds() const { return wall_s_; }
  const std::string& model() const { return model_; }

 private:
  httplib::Headers Headers() const {
    httplib::Headers h{{"Accept", "text/event-stream"}};
    if (!f_.api_key.empty()) h.emplace("Authorization", "Bearer " + f_.api_key);
    return h;
  }
  void ResolveModel();
  // `user` is the closed-loop user running it, or -1 in the open loop.
  void RunConversation(const ConversationPlan& c, int user);
  // One streamed request; fills `rec` and returns the reply text (and, for responses, its id).
  std::string Send(httplib::Client& cli, const std::string& path, const Json& body, RequestRecord* rec,
                   std::string* response_id);
  bool ShouldStop() const {
    return stop_.load() ||
           (f_.duration_s > 0 && std::chrono::duration<double>(Clock::now() - t0_).count() >= f_.duration_s);
  }
  // Sleeps `s` seconds or until the run must stop; false if it must stop.
  bool Think(double s) {
    const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
    while (Clock::now() < until) {
      if (ShouldStop()) return false;
      std::this_thread::sleep_for(std::min<Clock::duration>(until - Clock::now(), std::chrono::milliseconds(50)));
    }
    return !ShouldStop();
  }

  const ServeBenchFlags& f_;
  Target target_;
  std::string model_;
  Clock::time_point t0_;
  double wall_s_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> issued_{0}, done_{0};
  int total_turns_ = 0;
  std::mutex mu_;                         // guards records_ (every conversation thread appends)
  std::vector<RequestRecord> records_;
};

void ServeBench::ResolveModel() {
  model_ = f_.model_name;
  if (!model_.empty() || f_.api == "llamacpp") return;
  httplib::Client cli(target_.host, target_.port);
  cli.set_read_timeout(10, 0);
  auto res = cli.Get(target_.prefix + "/v1/models", Headers());
  if (res && res->status == 200) {
    const Json j = Json::parse(res->body, nullptr, false);
    const Json& data = Get(j, "data");
    if (data.is_array() && !data.empty()) model_ = Str(Get(data[0], "id"));
  }
  if (model_.empty()) model_ = "default";
}

std::string ServeBench::Send(httplib::Client& cli, const std::string& path, const Json& body, RequestRecord* rec,
                             std::string* response_id) {
  std::string text;
  auto sent = Clock::now();
  Clock::time_point last;
  int chunks = 0;
  auto on_text = [&](const std::string& s) {
    if (s.empty()) return;
    const auto now = Clock::now();
    if (chunks == 0) {
      rec->ttft_s = std::chrono::duration<double>(now - sent).count();
    } else {
      rec->itl_s.push_back(std::chrono::duration<double>(now - last).count());
    }
    last = now;
    chunks++;
    text += s;
  };
  auto fail = [&](const std::string& msg) {
    if (rec->error.empty()) rec->error = msg;
  };
  auto num = [](const Json& j, const char* key) -> int64_t {
    const Json& v = Get(j, key);
    return v.is_number_integer() ? v.get<int64_t>() : -1;
  };
  // Stream events are read through Get/Str/num, which never insert, never throw and treat a
  // missing or mistyped field as absent: a server's odd event must not take the client down.
  bool ended = false;  // the stream's own last event came (a cut stream can end cleanly for HTTP)
  SseReader sse([&](std::string_view payload) {
    if (payload == "[DONE]") {
      ended = true;
      return;
    }
    const Json j = Json::parse(payload, nullptr, false);
    if (!j.is_object()) return fail("unparsable stream event: " + std::string(payload.substr(0, 200)));
    if (j.contains("error")) {
      const Json& e = Get(j, "error");
      return fail(e.is_object() && e.contains("message") ? Get(e, "message").dump() : e.dump());
    }
    if (f_.api == "chat") {
      const Json& choices = Get(j, "choices");
      if (choices.is_array() && !choices.empty()) on_text(Str(Get(Get(choices[0], "delta"), "content")));
      const Json& u = Get(j, "usage");
      if (u.is_object()) {
        rec->prompt_tokens = num(u, "prompt_tokens");
        rec->completion_tokens = num(u, "completion_tokens");
        rec->cached_tokens = num(Get(u, "prompt_tokens_details"), "cached_tokens");
        const Json& src = Get(u, "mnemo_tokens_by_source");  // mnemo's extension: where the context's KV came from
        if (src.is_object()) {
          rec->sources.clear();
          for (const char* k : kSources) rec->sources.push_back(std::max<int64_t>(0, num(src, k)));
        }
      }
    } else if (f_.api == "responses") {
      const std::string type = Str(Get(j, "type"));
      const Json& r = Get(j, "response");
      if (type == "response.output_text.delta") {
        on_text(Str(Get(j, "delta")));
      } else if (type == "response.created") {
        *response_id = Str(Get(r, "id"));
      } else if (type == "response.completed" || type == "response.incomplete") {
        ended = true;
        if (!Str(Get(r, "id")).empty()) *response_id = Str(Get(r, "id"));
        const Json& u = Get(r, "usage");
        if (u.is_object()) {
          rec->prompt_tokens = num(u, "input_tokens");
          rec->completion_tokens = num(u, "output_tokens");
          rec->cached_tokens = num(Get(u, "input_tokens_details"), "cached_tokens");
        }
      } else if (type == "response.failed") {
        fail("response failed: " + Get(r, "error").dump());
      }
    } else {  // llamacpp
      on_text(Str(Get(j, "content")));
      if (Get(j, "stop") == true) {
        ended = true;
        rec->prompt_tokens = num(j, "tokens_evaluated");
        rec->completion_tokens = num(j, "tokens_predicted");
        // timings.cache_n: prompt tokens reused from the slot; "tokens_cached" is the slot's whole
        // length after the reply, which counts the reply too.
        const Json& timings = Get(j, "timings");
        rec->cached_tokens = num(timings, "cache_n");
        const int64_t processed = num(timings, "prompt_n");
        if (rec->cached_tokens < 0 && processed >= 0 && rec->prompt_tokens >= 0) {
          rec->cached_tokens = rec->prompt_tokens - processed;
        }
      }
    }
  });

  httplib::Request req;
  req.method = "POST";
  req.path = target_.prefix + path;
  req.headers = Headers();
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    sse.Feed(data, n);
    return true;
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  bool ok = cli.send(req, res, err);
  if (!ok && (err == httplib::Error::Read || err == httplib::Error::Write) && sse.head().empty()) {
    // The server closed the kept-alive connection just as it was reused (llama-server does this
    // after streams): nothing was sent or received, so send again on a new connection.
    res = httplib::Response();
    sent = Clock::now();
    ok = cli.send(req, res, err);
  }
  rec->latency_s = std::chrono::duration<double>(Clock::now() - sent).count();
  if (ok) {
    rec->http_status = res.status;
    rec->replica = res.get_header_value("X-Mnemo-Replica");
    rec->retry_after_s = std::atof(res.get_header_value("Retry-After").c_str());
  }
  if (!ok) {
    rec->error = "HTTP request failed: " + httplib::to_string(err);
  } else if (res.status != 200) {
    rec->error = "HTTP " + std::to_string(res.status) + ": " + sse.head().substr(0, 300);
  } else if (rec->error.empty() && chunks == 0 && rec->planned_output > 0) {
    rec->error = "the stream ended without any text";
  } else if (rec->error.empty() && !ended) {
    // Its reply is not known complete, nor stored: the conversation cannot go on from it.
    rec->error = "the stream ended before its final event";
  }
  if (rec->completion_tokens < 0) rec->completion_tokens = chunks;
  return text;
}

void ServeBench::RunConversation(const ConversationPlan& c, int user) {
  httplib::Client cli(target_.host, target_.port);
  cli.set_keep_alive(true);
  cli.set_connection_timeout(10, 0);
  const auto timeout_us = static_cast<int64_t>(f_.timeout_s * 1e6);
  cli.set_read_timeout(timeout_us / 1000000, timeout_us % 1000000);
  cli.set_write_timeout(60, 0);
  std::vector<std::string> replies;
  std::string previous_id;
  for (int t = 0; t < static_cast<int>(c.turns.size()); t++) {
    const TurnPlan& turn = c.turns[t];
    if (!Think(turn.think_s)) return;
    if (f_.max_requests > 0 && issued_.fetch_add(1) >= f_.max_requests) {
      stop_ = true;
      return;
    }
    RequestRecord rec;
    rec.conv = c.index;
    rec.turn = t;
    rec.planned_output = turn.output_tokens;
    rec.start_s = std::chrono::duration<double>(Clock::now() - t0_).count();
    const int64_t seed = int64_t(c.index) * 1000 + t;
    Json body;
    std::string path;
    if (f_.api == "chat") {
      Json msgs = Json::array({{{"role", "system"}, {"content", c.system_text}}});
      for (int k = 0; k <= t; k++) {
        msgs.push_back({{"role", "user"}, {"content", c.turns[k].user_text}});
        if (k < t) msgs.push_back({{"role", "assistant"}, {"content", replies[k]}});
      }
      path = "/v1/chat/completions";
      body = {{"model", model_}, {"messages", std::move(msgs)}, {"stream", true},
              {"stream_options", {{"include_usage", true}}}, {"max_tokens", turn.output_tokens},
              {"min_tokens", turn.output_tokens}, {"ignore_eos", true}, {"temperature", 0}, {"seed", seed}};
    } else if (f_.api == "responses") {
      path = "/v1/responses";
      // instructions apply to one response only (they are not inherited through
      // previous_response_id), so a client that keeps its system prompt resends them each turn.
      body = {{"model", model_}, {"input", turn.user_text}, {"instructions", c.system_text}, {"stream", true},
              {"max_output_tokens", turn.output_tokens}, {"min_tokens", turn.output_tokens},
              {"ignore_eos", true}, {"temperature", 0}, {"seed", seed}};
      if (!previous_id.empty()) body["previous_response_id"] = previous_id;
    } else {
      path = "/completion";
      body = {{"prompt", RenderPlain(c, replies, t)}, {"cache_prompt", true}, {"n_predict", turn.output_tokens},
              {"ignore_eos", true}, {"stream", true}, {"temperature", 0}, {"seed", seed}};
      // llama-server's best case: a user's conversations run one after another, so pinning each user to
      // a slot keeps a conversation's prefix in its slot between turns (with users <= slots).
      if (f_.slots > 0) body["id_slot"] = (user >= 0 ? user : c.index) % f_.slots;
    }
    std::string id;
    std::string reply = Send(cli, path, body, &rec, &id);
    const bool ok = rec.error.empty();
    const bool shed = Shed(rec);
    const double retry_after_s = rec.retry_after_s;
    {
      std::lock_guard<std::mutex> lock(mu_);
      records_.push_back(std::move(rec));
    }
    Progress("%s: %d/%d requests\r", f_.api.c_str(), ++done_, total_turns_);
    if (!ok) {  // the conversation cannot go on without this reply
      // A closed-loop user refused for load waits as the server asked (as OpenAI's clients do)
      // before its next conversation, rather than hammering it with new ones.
      if (user >= 0 && shed) Think(std::min(retry_after_s, 30.0));
      return;
    }
    replies.push_back(std::move(reply));
    previous_id = id;
  }
}

std::vector<RequestRecord> ServeBench::Run(const std::vector<ConversationPlan>& convs, FaultRunner* faults) {
  ResolveModel();
  for (const auto& c : convs) total_turns_ += static_cast<int>(c.turns.size());
  t0_ = Clock::now();
  if (faults) faults->Start(t0_);
  std::vector<std::thread> threads;
  if (f_.rate > 0) {  // open loop: conversations arrive as a Poisson process (the same as bench multiturn)
    Rng rng(f_.workload.seed ^ 0x5bd1e995);
    for (const auto& c : convs) {
      if (!Think(-std::log(1 - rng.UniformDouble()) / f_.rate)) break;
      threads.emplace_back([this, &c] { RunConversation(c, -1); });
    }
  } else {  // closed loop: each user runs conversations back to back
    std::atomic<int> next{0};
    for (int u = 0; u < f_.users; u++) {
      threads.emplace_back([this, &convs, &next, u] {
        for (int i; !ShouldStop() && (i = next++) < static_cast<int>(convs.size());) RunConversation(convs[i], u);
      });
    }
    for (auto& t : threads) t.join();
    threads.clear();
  }
  for (auto& t : threads) t.join();
  wall_s_ = std::chrono::duration<double>(Clock::now() - t0_).count();
  if (faults) faults->Join();
  Progress("\n");
  std::sort(records_.begin(), records_.end(),
            [](const auto& a, const auto& b) { return std::tie(a.conv, a.turn) < std::tie(b.conv, b.turn); });
  return std::move(records_);
}

// Which replica served what (the X-Mnemo-Replica header; absent from a single server that sets
// none): answered turns per replica, the balance (max / mean), and the share of later turns served
// by the replica that served the conversation's previous turn (the one holding its KV).
void SummarizeReplicas(const std::vector<RequestRecord>& recs, Json* j) {
  std::map<std::string, int> per;
  std::map<int, std::string> last;  // conversation -> the replica of its previous answered turn
  int later = 0, same = 0;
  for (const auto& r : recs) {  // sorted by (conversation, turn)
    if (r.replica.empty() || !r.error.empty() || Shed(r)) continue;
    per[r.replica]++;
    auto it = last.find(r.conv);
    if (it != last.end()) {
      later++;
      same += it->second == r.replica;
    }
    last[r.conv] = r.replica;
  }
  if (per.empty()) return;
  int max = 0, total = 0;
  for (const auto& [name, n] : per) {
    (*j)["turns_by_replica"][name] = n;
    max = std::max(max, n);
    total += n;
  }
  (*j)["replica_balance_max_over_mean"] = double(max) * per.size() / total;
  (*j)["later_turns"] = later;
  (*j)["later_turns_same_replica_share"] = later > 0 ? double(same) / later : 0.0;
}

Json FaultsJson(const std::vector<FaultOutcome>& outcomes, const std::vector<RequestRecord>& recs) {
  Json out = Json::array();
  for (const auto& o : outcomes) {
    Json f = {{"kind", FaultName(o.fault.kind)}, {"replica", o.fault.replica}, {"at_s", o.fault.at_s}};
    if (o.applied_s >= 0) f["applied_s"] = o.applied_s;
    // kill / term: seconds until HAProxy marked the replica DOWN; restart: until it was UP.
    if (o.marked_s >= 0) f["marked_s"] = o.marked_s;
    if (!o.error.empty()) f["error"] = o.error;
    if (o.applied_s >= 0 && o.fault.kind != Fault::Kind::kRestart) {
      // Requests the client saw fail that were in flight at the fault or sent before the mark-down.
      const double until = o.applied_s + std::max(0.0, o.marked_s);
      int failed = 0, in_flight_failed = 0;
      for (const auto& r : recs) {
        if (r.error.empty() || Shed(r)) continue;
        if (r.start_s <= o.applied_s && r.start_s + r.latency_s >= o.applied_s) in_flight_failed++;
        else if (r.start_s > o.applied_s && r.start_s <= until) failed++;
      }
      f["failed_in_flight"] = in_flight_failed;
      f["failed_sent_before_mark_down"] = failed;
    }
    out.push_back(std::move(f));
  }
  return out;
}

Json Summarize(const ServeBenchFlags& f, const std::string& model, const std::vector<RequestRecord>& recs,
               double wall_s, double load_start, double load_end) {
  std::vector<double> ttft, itl, latency;
  std::map<int, std::vector<double>> ttft_by, latency_by, prompt_by;
  std::map<int, int64_t> cached_sum_by, prompt_sum_by, n_by, err_by;
  int64_t out_tokens = 0, prompt_tokens = 0, cached_tokens = 0;
  std::vector<int64_t> sources(std::size(kSources), 0);
  bool have_sources = false;
  int errors = 0, ok = 0, shed = 0;
  std::vector<double> shed_ms;
  std::map<std::string, int> error_kinds;
  for (const auto& r : recs) {
    if (Shed(r)) {  // counted apart from errors: a refusal is the server doing its job under overload
      shed++;
      shed_ms.push_back(r.latency_s * 1e3);
      continue;
    }
    if (!r.error.empty()) {
      errors++;
      err_by[r.turn]++;
      error_kinds[r.error.substr(0, 200)]++;
      continue;
    }
    ok++;
    out_tokens += std::max<int64_t>(r.completion_tokens, 0);
    if (r.ttft_s >= 0) {
      ttft.push_back(r.ttft_s * 1e3);
      ttft_by[r.turn].push_back(r.ttft_s * 1e3);
    }
    for (double x : r.itl_s) itl.push_back(x * 1e3);
    latency.push_back(r.latency_s * 1e3);
    latency_by[r.turn].push_back(r.latency_s * 1e3);
    n_by[r.turn]++;
    if (r.prompt_tokens >= 0) {
      prompt_tokens += r.prompt_tokens;
      prompt_by[r.turn].push_back(static_cast<double>(r.prompt_tokens));
      prompt_sum_by[r.turn] += r.prompt_tokens;
    }
    if (r.cached_tokens >= 0) {
      cached_tokens += r.cached_tokens;
      cached_sum_by[r.turn] += r.cached_tokens;
    }
    if (r.sources.size() == sources.size()) {
      have_sources = true;
      for (size_t i = 0; i < sources.size(); i++) sources[i] += r.sources[i];
    }
  }
  Json j;
  j["label"] = f.label.empty() ? f.api : f.label;
  j["api"] = f.api;
  j["url"] = f.url;
  j["model"] = model;
  j["users"] = f.rate > 0 ? 0 : f.users;
  j["rate"] = f.rate;
  j["think_time_s"] = f.workload.think_mean_s;
  j["seed"] = f.workload.seed;
  j["conversations"] = f.workload.conversations;
  j["wall_seconds"] = wall_s;
  j["requests"] = ok;
  j["errors"] = errors;
  j["shed"] = shed;
  j["shed_share"] = recs.empty() ? 0.0 : double(shed) / recs.size();
  j["shed_answer_ms"] = Percentiles(shed_ms);  // how long a refused client waited for its 429 / 503
  Json kinds = Json::array();
  for (const auto& [msg, n] : error_kinds) kinds.push_back({{"message", msg}, {"count", n}});
  j["error_messages"] = kinds;
  j["output_tokens"] = out_tokens;
  j["prompt_tokens"] = prompt_tokens;
  j["cached_tokens"] = cached_tokens;
  j["cache_hit_rate"] = prompt_tokens > 0 ? double(cached_tokens) / prompt_tokens : 0.0;
  if (have_sources) {  // the same field bench multiturn writes (chat API against mnemo only)
    for (size_t i = 0; i < sources.size(); i++) j["tokens_by_source"][kSources[i]] = sources[i];
  }
  j["throughput_output_tokens_per_s"] = wall_s > 0 ? out_tokens / wall_s : 0.0;
  j["throughput_requests_per_s"] = wall_s > 0 ? ok / wall_s : 0.0;
  j["ttft_ms"] = Percentiles(ttft);
  j["itl_ms"] = Percentiles(itl);
  j["latency_ms"] = Percentiles(latency);
  // Per-turn arrays are indexed by turn index 0..max; a turn index nobody reached is left out of
  // the maps, so walk every index up to the largest seen and write 0 where there is no data.
  int max_turn = -1;
  for (const auto& r : recs) max_turn = std::max(max_turn, r.turn);
  Json t50 = Json::array(), t90 = Json::array(), l50 = Json::array(), n = Json::array(), e = Json::array(),
       p50 = Json::array(), hit = Json::array();
  for (int t = 0; t <= max_turn; t++) {
    t50.push_back(Percentile(ttft_by[t], 0.5));
    t90.push_back(Percentile(ttft_by[t], 0.9));
    l50.push_back(Percentile(latency_by[t], 0.5));
    n.push_back(n_by[t]);
    e.push_back(err_by[t]);
    p50.push_back(Percentile(prompt_by[t], 0.5));
    hit.push_back(prompt_sum_by[t] > 0 ? double(cached_sum_by[t]) / prompt_sum_by[t] : 0.0);
  }
  j["ttft_ms_p50_by_turn"] = t50;
  j["ttft_ms_p90_by_turn"] = t90;
  j["latency_ms_p50_by_turn"] = l50;
  j["requests_by_turn"] = n;
  j["errors_by_turn"] = e;
  j["prompt_tokens_p50_by_turn"] = p50;
  j["cache_hit_rate_by_turn"] = hit;
  j["load_average"] = {{"start", load_start}, {"end", load_end}};
  SummarizeReplicas(recs, &j);
  return j;
}

Status WriteCsv(const std::string& path, const std::vector<RequestRecord>& recs) {
  std::ofstream out(path);
  if (!out) return MakeError("cannot write %s", path.c_str());
  out << "conversation,turn,start_s,ttft_ms,latency_ms,itl_ms_mean,itl_ms_max,prompt_tokens,cached_tokens,"
         "completion_tokens,planned_output_tokens,http_status,replica,error\n";
  for (const auto& r : recs) {
    double mean = 0, mx = 0;
    for (double x : r.itl_s) {
      mean += x;
      mx = std::max(mx, x);
    }
    if (!r.itl_s.empty()) mean /= r.itl_s.size();
    std::string err = r.error;
    for (char& ch : err) {
      if (ch == '"' || ch == '\n' || ch == '\r') ch = '\'';
    }
    char line[512];
    std::snprintf(line, sizeof line, "%d,%d,%.4f,%.3f,%.3f,%.3f,%.3f,%lld,%lld,%lld,%d,%d,", r.conv, r.turn, r.start_s,
                  r.ttft_s >= 0 ? r.ttft_s * 1e3 : -1.0, r.latency_s * 1e3, mean * 1e3, mx * 1e3,
                  static_cast<long long>(r.prompt_tokens), static_cast<long long>(r.cached_tokens),
                  static_cast<long long>(r.completion_tokens), r.planned_output, r.http_status);
    std::string replica = r.replica;  // a header value: keep it one CSV field
    for (char& ch : replica) {
      if (ch == '"' || ch == ',' || ch == '\n' || ch == '\r') ch = '_';
    }
    out << line << replica << ',' << '"' << err << "\"\n";
  }
  if (!out.good()) return MakeError("error writing %s", path.c_str());
  return {};
}

void PrintHuman(const Json& j) {
  std::printf("%s: %d requests, %d errors, %d shed in %.1f s: %.1f out tok/s, %.2f req/s, cache hits %.1f%%\n",
              j["label"].get<std::string>().c_str(), j["requests"].get<int>(), j["errors"].get<int>(),
              j["shed"].get<int>(),
              j["wall_seconds"].get<double>(), j["throughput_output_tokens_per_s"].get<double>(),
              j["throughput_requests_per_s"].get<double>(), 100 * j["cache_hit_rate"].get<double>());
  for (const char* k : {"ttft_ms", "itl_ms", "latency_ms"}) {
    std::printf("  %-10s p50 %8.1f  p90 %8.1f  p99 %8.1f\n", k, j[k]["p50"].get<double>(), j[k]["p90"].get<double>(),
                j[k]["p99"].get<double>());
  }
  std::printf("  TTFT p50 by turn (ms):");
  for (const auto& v : j["ttft_ms_p50_by_turn"]) std::printf(" %.1f", v.get<double>());
  std::printf("\n  cache hit rate by turn:");
  for (const auto& v : j["cache_hit_rate_by_turn"]) std::printf(" %.2f", v.get<double>());
  std::printf("\n");
  for (const auto& e : j["error_messages"]) {
    std::printf("  error x%d: %s\n", e["count"].get<int>(), e["message"].get<std::string>().c_str());
  }
  if (j.contains("turns_by_replica")) {
    std::printf("  turns by replica:");
    for (const auto& [name, n] : j["turns_by_replica"].items()) std::printf(" %s %d", name.c_str(), n.get<int>());
    std::printf(" (max/mean %.2f); later turns on the previous turn's replica: %.1f%% of %d\n",
                j["replica_balance_max_over_mean"].get<double>(),
                100 * j["later_turns_same_replica_share"].get<double>(), j["later_turns"].get<int>());
  }
  if (j.contains("faults")) {
    for (const auto& f : j["faults"]) std::printf("  fault: %s\n", f.dump().c_str());
  }
}

int RunServeBench(const ServeBenchFlags& f) {
  auto target = ParseUrl(f.url);
  if (!target.ok()) {
    std::fprintf(stderr, "error: %s\n", target.error().message.c_str());
    return 1;
  }
  std::unique_ptr<FaultRunner> faults;
  if (!f.faults.empty() || !f.cluster_dir.empty()) {
    if (f.faults.empty() || f.cluster_dir.empty()) {
      std::fprintf(stderr, "error: --fault and --cluster-dir go together\n");
      return 1;
    }
    auto parsed = ParseFaults(f.faults);
    Status st = parsed.ok() ? Status() : Status(parsed.error());
    if (st.ok()) {
      faults = std::make_unique<FaultRunner>(f.cluster_dir, *parsed);
      st = faults->Check();
    }
    if (!st.ok()) {
      std::fprintf(stderr, "error: %s\n", st.error().message.c_str());
      return 1;
    }
  }
  auto convs = MakeWorkload(f.workload);
  const double load_start = LoadAverage();
  ServeBench bench(f, *target);
  auto recs = bench.Run(convs, faults.get());
  Json j = Summarize(f, bench.model(), recs, bench.wall_seconds(), load_start, LoadAverage());
  if (faults) j["faults"] = FaultsJson(faults->outcomes(), recs);
  if (!f.csv.empty()) {
    Status st = WriteCsv(f.csv, recs);
    if (!st.ok()) {
      std::fprintf(stderr, "error: %s\n", st.error().message.c_str());
      return 1;
    }
  }
  if (f.json) {
    std::cout << j.dump() << std::endl;
  } else {
    PrintHuman(j);
  }
  // Every request failing means the server or the flags are wrong, not a slow run.
  return j["requests"].get<int>() == 0 && j["errors"].get<int>() > 0 ? 1 : 0;
}

}  // namespace

void RegisterBenchServe(CLI::App* bench) {
  auto f = std::make_shared<ServeBenchFlags>();
  auto* cmd = bench->add_subcommand("serve", "replay the multi-turn workload over HTTP against a running server");
  cmd->add_option("--url", f->url, "server root, e.g. http://127.0.0.1:8080 (this machine only)");
  cmd->add_option("--api", f->api, "client behaviour: chat (full history), responses (previous_response_id), "
                                   "llamacpp (llama-server /completion with cache_prompt)")
      ->check(CLI::IsMember({"chat", "responses", "llamacpp"}));
  cmd->add_option("--api-key", f->api_key, "bearer token for the Authorization header");
  cmd->add_option("--model-name", f->model_name, "model field of requests (default: first of /v1/models)");
  cmd->add_option("--label", f->label, "name of the system under test in the JSON output (default: the api)");
  AddWorkloadFlags(cmd, &f->workload, &f->users, &f->rate);
  cmd->add_option("--slots", f->slots, "llamacpp: id_slot = user % slots (open loop: conversation % slots; 0: the server picks)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--max-requests", f->max_requests, "stop issuing requests after this many (0: no limit)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--duration", f->duration_s, "stop issuing requests after this many seconds (0: no limit)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--timeout", f->timeout_s, "per-request read timeout (s)")->check(CLI::PositiveNumber);
  cmd->add_flag("--json", f->json, "print one JSON object");
  cmd->add_option("--csv", f->csv, "write one row per request to this file");
  cmd->add_option("--fault", f->faults,
                  "faults in a local cluster: kill:I@S, term:I@S, restart:I@S (replica I at S seconds), "
                  "comma-separated; with --cluster-dir");
  cmd->add_option("--cluster-dir", f->cluster_dir, "the directory of scripts/cluster.sh up (for --fault)");
  cmd->callback([f] {
    int rc = RunServeBench(*f);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace mnemo::app
