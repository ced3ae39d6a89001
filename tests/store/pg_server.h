// A real PostgreSQL 15 server for tests. Under ctest, the fixture tests/store/pg_test_server.sh
// started one for the whole run and wrote its URL to MNEMO_PG_URL_FILE: that one is used. A test
// binary run by hand starts its own instead: initdb into a temporary directory and postgres on
// 127.0.0.1 at a free port (~1-2 s), stopped at exit.
//
// Binaries: $MNEMO_PG_BIN, else /usr/lib/postgresql/15/bin. When they are absent, Shared()
// returns null with the reason and tests GTEST_SKIP with it.
// PostgreSQL refuses to run as root (CI runs tests as root): the server is then run as the user
// `nobody`, its directory handed to that user. The server gets PR_SET_PDEATHSIG, so it dies with
// the test process even if that crashes. fsync is off: these databases are disposable.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <pwd.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <libpq-fe.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace mnemo::testing_util {

// A TCP port on 127.0.0.1 free at the time of the call (bound to port 0 and released).
inline int FreeLoopbackPort() {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = 0;
  if (bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  close(s);
  return port;
}

// Runs one statement on the database at url; false (message on stderr) on failure.
inline bool PgExec(const std::string& url, const std::string& sql) {
  PGconn* c = PQconnectdb(url.c_str());
  bool ok = PQstatus(c) == CONNECTION_OK;
  if (ok) {
    PGresult* r = PQexec(c, sql.c_str());
    ok = PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK;
    if (!ok) std::fprintf(stderr, "pg: %s: %s", sql.c_str(), PQerrorMessage(c));
    PQclear(r);
  } else {
    std::fprintf(stderr, "pg: %s", PQerrorMessage(c));
  }
  PQfinish(c);
  return ok;
}

class PgServer {
 public:
  // The process-wide server, started on first use; null (and *why the reason) when it cannot run.
  static PgServer* Shared(std::string* why) {
    static std::string reason;
    static std::unique_ptr<PgServer> server = Find(&reason);
    if (!server && why) *why = reason;
    return server.get();
  }

  ~PgServer() {
    if (pid_ > 0) {
      kill(pid_, SIGINT);  // fast shutdown: no waiting for clients
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      int status = 0;
      while (waitpid(pid_, &status, WNOHANG) == 0) {
        if (std::chrono::steady_clock::now() > deadline) {
          kill(pid_, SIGKILL);
          waitpid(pid_, &status, 0);
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
    std::error_code ec;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
  }

  std::string Url(const std::string& db) const { return base_ + "/" + db; }
  // A fresh, empty database; its URL. Empty string (and a message on stderr) on failure.
  std::string NewDatabase() {
    static std::atomic<int> n{0};
    const std::string name = "t" + std::to_string(getpid()) + "_" + std::to_string(n++);
    return Sql("CREATE DATABASE " + name) ? Url(name) : std::string();
  }
  // Runs one statement on the maintenance database; false (message on stderr) on failure.
  bool Sql(const std::string& sql) const { return PgExec(Url("postgres"), sql); }
  // Ends every connection to db but this one's own (a dropped connection, as in a network fault).
  bool TerminateConnections(const std::string& db) const {
    return Sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname='" + db +
               "' AND pid <> pg_backend_pid()");
  }

 private:
  PgServer() = default;


  // fork + exec argv as `uid` (when running as root), stdout/stderr to log; returns the pid.
  static pid_t Spawn(const std::vector<std::string>& args, const std::string& log, const std::string& cwd,
                     uid_t uid, gid_t gid) {
    pid_t pid = fork();
    if (pid != 0) return pid;
    int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
    }
    if (geteuid() == 0) {
      if (setgroups(0, nullptr) != 0 || setgid(gid) != 0 || setuid(uid) != 0) _exit(126);
    }
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // after setuid: a change of credentials clears it
    if (chdir(cwd.c_str()) != 0) _exit(126);
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }

  static std::string ReadLog(const std::string& path) {
    std::ifstream f(path);
    std::stringstream ss;
    ss << f.rdbuf();
    std::string s = ss.str();
    return s.size() > 2000 ? s.substr(s.size() - 2000) : s;
  }

  // The ctest fixture's server when it answers, else one of our own.
  static std::unique_ptr<PgServer> Find(std::string* why) {
    const char* file = std::getenv("MNEMO_PG_URL_FILE");
#ifdef MNEMO_PG_URL_FILE
    if (!file) file = MNEMO_PG_URL_FILE;
#endif
    if (file) {
      std::ifstream f(file);
      std::string url;
      if (f && std::getline(f, url) && !url.empty() && PQping((url + "/postgres").c_str()) == PQPING_OK) {
        std::unique_ptr<PgServer> s(new PgServer());
        s->base_ = url;
        return s;
      }
    }
    return Start(why);
  }

  static std::unique_ptr<PgServer> Start(std::string* why) {
    const char* env = std::getenv("MNEMO_PG_BIN");
    const std::string bin = env && *env ? env : "/usr/lib/postgresql/15/bin";
    if (access((bin + "/initdb").c_str(), X_OK) != 0 || access((bin + "/postgres").c_str(), X_OK) != 0) {
      *why = "PostgreSQL binaries not found in " + bin + " (install postgresql-15 or set MNEMO_PG_BIN)";
      return nullptr;
    }
    uid_t uid = geteuid();
    gid_t gid = getegid();
    if (uid == 0) {
      passwd* pw = getpwnam("nobody");
      if (!pw) {
        *why = "running as root and there is no user 'nobody' to run PostgreSQL as";
        return nullptr;
      }
      uid = pw->pw_uid;
      gid = pw->pw_gid;
    }
    std::unique_ptr<PgServer> s(new PgServer());
    std::string tmpl = (std::filesystem::temp_directory_path() / "mnemo_pg_XXXXXX").string();
    if (!mkdtemp(tmpl.data())) {
      *why = "cannot create a temporary directory";
      return nullptr;
    }
    s->dir_ = tmpl;
    if (chown(s->dir_.c_str(), uid, gid) != 0) {
      *why = "cannot hand " + s->dir_ + " to the PostgreSQL user";
      return nullptr;
    }
    const std::string data = s->dir_ + "/data", log = s->dir_ + "/log";
    pid_t p = Spawn({bin + "/initdb", "-D", data, "-U", "mnemo", "--auth=trust", "--no-sync", "-E", "UTF8",
                     "--no-locale", "--no-instructions"},
                    log, s->dir_, uid, gid);
    int status = 0;
    if (p < 0 || waitpid(p, &status, 0) != p || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      *why = "initdb failed: " + ReadLog(log);
      return nullptr;
    }
    for (int attempt = 0; attempt < 3; ++attempt) {  // a port taken between probe and bind: retry
      const int port = FreeLoopbackPort();
      s->base_ = "postgresql://mnemo@127.0.0.1:" + std::to_string(port);
      s->pid_ = Spawn({bin + "/postgres", "-D", data, "-p", std::to_string(port), "-k", s->dir_, "-c",
                       "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "synchronous_commit=off", "-c",
                       "full_page_writes=off", "-c", "shared_buffers=16MB", "-c", "max_connections=200"},
                      log, s->dir_, uid, gid);
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (std::chrono::steady_clock::now() < deadline) {
        if (PQping(s->Url("postgres").c_str()) == PQPING_OK) return s;
        int st = 0;
        if (waitpid(s->pid_, &st, WNOHANG) == s->pid_) break;  // it exited: try another port
        std::this_thread::sleep_for(std::chrono::milliseconds(30));
      }
      kill(s->pid_, SIGKILL);
      waitpid(s->pid_, &status, 0);
      s->pid_ = -1;
    }
    *why = "postgres did not start: " + ReadLog(log);
    return nullptr;
  }

  std::string dir_;    // our own server's directory ("" for the fixture's)
  std::string base_;   // "postgresql://mnemo@127.0.0.1:PORT"
  pid_t pid_ = -1;     // our own server's postgres (-1 for the fixture's)
};

}  // namespace mnemo::testing_util
