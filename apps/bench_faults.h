// Faults injected into a local cluster (scripts/cluster.sh) during `bench serve` (issue 14):
// `--fault kill:1@10,restart:1@25 --cluster-dir DIR` kills replica 1 with SIGKILL 10 s into the run
// and starts it again at 25 s. Each fault is timed against HAProxy's own view of the replica, read
// from the cluster's stats socket (DIR/haproxy.sock, `show stat`): how long after a kill it was
// marked DOWN, how long after a restart it was UP again.
//
//   kill:I@S     SIGKILL replica I (DIR/replica-I.pid) at S seconds
//   term:I@S     SIGTERM: the replica drains (its /ready answers 503) and exits
//   restart:I@S  runs DIR/replica-I.sh, which starts replica I again on its port
#pragma once

#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/status.h"

namespace mnemo::app {

struct Fault {
  enum class Kind { kKill, kTerm, kRestart };
  Kind kind = Kind::kKill;
  int replica = 0;  // index i: DIR/replica-i.pid, HAProxy server "ri"
  double at_s = 0;  // seconds since the run started
};

const char* FaultName(Fault::Kind k);

// "kill:1@10,restart:1@25" -> faults sorted by time. Errors name the bad item.
Result<std::vector<Fault>> ParseFaults(const std::string& spec);

// What happened to one fault.
struct FaultOutcome {
  Fault fault;
  double applied_s = -1;  // when it was applied (s since the run started); -1 if it was not
  double marked_s = -1;   // from applied to HAProxy showing the replica DOWN (kill, term) or UP
                          // (restart); -1 if not seen within the wait
  std::string error;      // why it was not applied or not seen
};

// Applies the faults on their schedule on its own thread.
class FaultRunner {
 public:
  FaultRunner(std::string cluster_dir, std::vector<Fault> faults)
      : dir_(std::move(cluster_dir)), faults_(std::move(faults)) {}
  ~FaultRunner() { Join(); }

  // Checks the cluster directory has what the faults need (pid files, restart scripts, the
  // stats socket answering) before the run starts.
  Status Check() const;
  void Start(std::chrono::steady_clock::time_point t0);
  // Stops waiting for faults not yet due (they are reported as not applied) and joins.
  void Join();
  std::vector<FaultOutcome> outcomes();

 private:
  void Run(std::chrono::steady_clock::time_point t0);
  FaultOutcome Apply(const Fault& f, std::chrono::steady_clock::time_point t0);

  std::string dir_;
  std::vector<Fault> faults_;
  std::thread thread_;
  std::mutex mu_;  // guards outcomes_ and stop_
  bool stop_ = false;
  std::vector<FaultOutcome> outcomes_;
};

// HAProxy's status of each server of a backend ("UP", "DOWN", "UP 1/2", "MAINT", ...) through a
// stats socket; an Error when the socket does not answer.
Result<std::vector<std::pair<std::string, std::string>>> HaproxyServerStatus(const std::string& socket_path,
                                                                             const std::string& backend);

}  // namespace mnemo::app
