#include "bench_faults.h"

#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>

extern char** environ;

namespace mnemo::app {
namespace {

using Clock = std::chrono::steady_clock;

// How long a fault waits for HAProxy to see its effect (a check every 250 ms; fall 2, rise 2).
constexpr double kMarkWaitS = 30;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The pid in DIR/replica-I.pid if that process is this cluster's replica I (its command line is
// `mnemo serve ... --replica-id rI`): a stale pid file must never signal an unrelated process.
Result<pid_t> ReplicaPid(const std::string& dir, int i) {
  const std::string file = dir + "/replica-" + std::to_string(i) + ".pid";
  const std::string text = ReadFile(file);
  char* end = nullptr;
  const long pid = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || pid <= 1) return MakeError("%s holds no pid", file.c_str());
  std::string cmdline = ReadFile("/proc/" + std::to_string(pid) + "/cmdline");
  std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
  if (cmdline.find(" serve ") == std::string::npos ||
      cmdline.find(" --replica-id r" + std::to_string(i) + " ") == std::string::npos) {
    return MakeError("process %ld of %s is not replica %d (exited?)", pid, file.c_str(), i);
  }
  return static_cast<pid_t>(pid);
}

// Runs `bash DIR/replica-I.sh` (it starts the replica in the background and returns).
Status RunRestartScript(const std::string& dir, int i) {
  const std::string script = dir + "/replica-" + std::to_string(i) + ".sh";
  std::string bash = "/bin/bash";
  char* argv[] = {bash.data(), const_cast<char*>(script.c_str()), nullptr};
  pid_t pid = 0;
  if (int rc = posix_spawn(&pid, bash.c_str(), nullptr, nullptr, argv, environ); rc != 0) {
    return MakeError("cannot run %s: %s", script.c_str(), std::strerror(rc));
  }
  int status = 0;
  if (waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return MakeError("%s failed (status %d)", script.c_str(), status);
  }
  return {};
}

// One CSV line split at commas (HAProxy's stat fields hold no quoted commas).
std::vector<std::string> SplitCsv(const std::string& line) {
  std::vector<std::string> out;
  std::string field;
  std::istringstream in(line);
  while (std::getline(in, field, ',')) out.push_back(field);
  return out;
}

bool IsDown(const std::string& status) { return status.rfind("DOWN", 0) == 0; }
bool IsUp(const std::string& status) { return status == "UP"; }  // not "UP 1/2": failing checks

}  // namespace

const char* FaultName(Fault::Kind k) {
  switch (k) {
    case Fault::Kind::kKill: return "kill";
    case Fault::Kind::kTerm: return "term";
    case Fault::Kind::kRestart: return "restart";
  }
  return "?";
}

Result<std::vector<Fault>> ParseFaults(const std::string& spec) {
  std::vector<Fault> out;
  std::istringstream in(spec);
  for (std::string item; std::getline(in, item, ',');) {
    const size_t colon = item.find(':'), at = item.find('@');
    if (colon == std::string::npos || at == std::string::npos || at < colon) {
      return MakeError("--fault item '%s' is not KIND:REPLICA@SECONDS (e.g. kill:1@10)", item.c_str());
    }
    const std::string kind = item.substr(0, colon), replica = item.substr(colon + 1, at - colon - 1),
                      secs = item.substr(at + 1);
    Fault f;
    if (kind == "kill") {
      f.kind = Fault::Kind::kKill;
    } else if (kind == "term") {
      f.kind = Fault::Kind::kTerm;
    } else if (kind == "restart") {
      f.kind = Fault::Kind::kRestart;
    } else {
      return MakeError("--fault kind '%s' unknown (kill, term, restart)", kind.c_str());
    }
    char* end = nullptr;
    const long r = std::strtol(replica.c_str(), &end, 10);
    if (replica.empty() || *end != '\0' || r < 0 || r > 1000) {
      return MakeError("--fault item '%s': bad replica index", item.c_str());
    }
    f.replica = static_cast<int>(r);
    const double s = std::strtod(secs.c_str(), &end);
    if (secs.empty() || *end != '\0' || !(s >= 0) || s > 1e6) {
      return MakeError("--fault item '%s': bad time", item.c_str());
    }
    f.at_s = s;
    out.push_back(f);
  }
  if (out.empty()) return MakeError("--fault is empty");
  std::stable_sort(out.begin(), out.end(), [](const Fault& a, const Fault& b) { return a.at_s < b.at_s; });
  return out;
}

Result<std::vector<std::pair<std::string, std::string>>> HaproxyServerStatus(const std::string& socket_path,
                                                                             const std::string& backend) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket_path.size() >= sizeof addr.sun_path) return MakeError("socket path too long: %s", socket_path.c_str());
  std::memcpy(addr.sun_path, socket_path.c_str(), socket_path.size() + 1);
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return MakeError("socket: %s", std::strerror(errno));
  timeval tv{2, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::string reply;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    const char cmd[] = "show stat\n";
    if (write(fd, cmd, sizeof cmd - 1) == static_cast<ssize_t>(sizeof cmd - 1)) {
      char buf[65536];
      for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) reply.append(buf, static_cast<size_t>(n));
    }
  }
  close(fd);
  if (reply.rfind("# pxname,", 0) != 0) {
    return MakeError("HAProxy's stats socket %s did not answer 'show stat'", socket_path.c_str());
  }
  std::istringstream in(reply);
  std::string line;
  std::getline(in, line);
  const std::vector<std::string> header = SplitCsv(line.substr(2));
  const auto status_col = std::find(header.begin(), header.end(), "status") - header.begin();
  std::vector<std::pair<std::string, std::string>> out;
  while (std::getline(in, line)) {
    const auto f = SplitCsv(line);
    if (f.size() <= static_cast<size_t>(status_col) || f[0] != backend) continue;
    if (f[1] == "BACKEND" || f[1] == "FRONTEND") continue;
    out.emplace_back(f[1], f[static_cast<size_t>(status_col)]);
  }
  return out;
}

Status FaultRunner::Check() const {
  auto st = HaproxyServerStatus(dir_ + "/haproxy.sock", "mnemo_replicas");
  if (!st.ok()) return st.error();
  for (const Fault& f : faults_) {
    const std::string name = "r" + std::to_string(f.replica);
    if (std::none_of(st->begin(), st->end(), [&](const auto& s) { return s.first == name; })) {
      return MakeError("--fault names replica %d, which the cluster in %s does not have", f.replica, dir_.c_str());
    }
    if (f.kind == Fault::Kind::kRestart && access((dir_ + "/replica-" + std::to_string(f.replica) + ".sh").c_str(), R_OK) != 0) {
      return MakeError("%s/replica-%d.sh is missing (start the cluster with scripts/cluster.sh up)", dir_.c_str(), f.replica);
    }
  }
  return {};
}

void FaultRunner::Start(Clock::time_point t0) {
  thread_ = std::thread([this, t0] { Run(t0); });
}

void FaultRunner::Join() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

std::vector<FaultOutcome> FaultRunner::outcomes() {
  std::lock_guard<std::mutex> lock(mu_);
  return outcomes_;
}

void FaultRunner::Run(Clock::time_point t0) {
  for (const Fault& f : faults_) {
    const auto due = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(f.at_s));
    bool stopped = false;
    while (Clock::now() < due) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        stopped = stop_;
      }
      if (stopped) break;
      std::this_thread::sleep_for(std::min<Clock::duration>(due - Clock::now(), std::chrono::milliseconds(20)));
    }
    FaultOutcome o;
    if (stopped) {
      o.fault = f;
      o.error = "the run ended first";
    } else {
      o = Apply(f, t0);
    }
    std::lock_guard<std::mutex> lock(mu_);
    outcomes_.push_back(o);
  }
}

FaultOutcome FaultRunner::Apply(const Fault& f, Clock::time_point t0) {
  FaultOutcome o;
  o.fault = f;
  const auto since = [&](Clock::time_point t) { return std::chrono::duration<double>(t - t0).count(); };
  if (f.kind == Fault::Kind::kRestart) {
    Status st = RunRestartScript(dir_, f.replica);
    if (!st.ok()) {
      o.error = st.error().message;
      return o;
    }
  } else {
    auto pid = ReplicaPid(dir_, f.replica);
    if (!pid.ok()) {
      o.error = pid.error().message;
      return o;
    }
    if (kill(*pid, f.kind == Fault::Kind::kKill ? SIGKILL : SIGTERM) != 0) {
      o.error = std::string("kill: ") + std::strerror(errno);
      return o;
    }
  }
  const auto applied = Clock::now();
  o.applied_s = since(applied);
  // Poll HAProxy until it shows the replica's new state.
  const std::string name = "r" + std::to_string(f.replica);
  while (std::chrono::duration<double>(Clock::now() - applied).count() < kMarkWaitS) {
    auto st = HaproxyServerStatus(dir_ + "/haproxy.sock", "mnemo_replicas");
    if (st.ok()) {
      for (const auto& [server, status] : *st) {
        if (server != name) continue;
        if (f.kind == Fault::Kind::kRestart ? IsUp(status) : IsDown(status)) {
          o.marked_s = std::chrono::duration<double>(Clock::now() - applied).count();
          return o;
        }
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  o.error = "HAProxy did not show the replica " + std::string(f.kind == Fault::Kind::kRestart ? "UP" : "DOWN") +
            " within 30 s";
  return o;
}

}  // namespace mnemo::app
