// Crash safety (kill -9 mid-commit), bad files, concurrent use, and the cost of a durable commit.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <thread>

#include "base/rng.h"
#include "store/store.h"
#include "test_util.h"

namespace mnemo {
namespace {

using testing_util::TempDir;

// ---- crash safety ----

// Commit i of the crash workload: session 1 + i % 3, 5 + i % 7 tokens valued i * 100 + j.
constexpr int kCrashSessions = 3;
int64_t CrashSession(int64_t i) { return 1 + i % kCrashSessions; }
std::vector<int32_t> CrashTokens(int64_t i) {
  std::vector<int32_t> t(5 + i % 7);
  for (size_t j = 0; j < t.size(); ++j) t[j] = static_cast<int32_t>(i * 100 + j);
  return t;
}
std::string CrashResponseId(int64_t i) { return "resp_crash_" + std::to_string(i); }
std::string CrashItemId(int64_t i) { return "msg_crash_" + std::to_string(i); }

// The child: commits turns forever, writing i to fd after commit i returned OK. Never returns.
[[noreturn]] void CrashChild(const std::string& path, int fd) {
  auto opened = Store::Open(path);
  if (!opened.ok()) _exit(2);
  Store& store = **opened;
  StoredConversation c;
  c.id = "conv_crash";
  auto got = store.GetConversation(c.id, "");
  if (!got.ok()) _exit(3);
  if (!got->has_value() && !store.CreateConversation(c, {}).ok()) _exit(4);
  int64_t len[kCrashSessions + 1] = {0, 0, 0, 0};
  for (int64_t i = 0;; ++i) {
    int64_t sid = CrashSession(i);
    std::vector<int32_t> toks = CrashTokens(i);
    TurnCommit tc;
    tc.session_id = sid;
    tc.create_session = i < kCrashSessions;
    tc.begin = len[sid];
    tc.prompt_end = len[sid] + 2;
    tc.tokens = toks;
    tc.response = testing_util::MakeResponse(CrashResponseId(i));
    tc.response->output_json = std::string(200, 'x');
    tc.conversation = ConversationUpdate{c.id, {{CrashItemId(i), R"({"type":"message"})"}}};
    if (!store.CommitTurn(tc).ok()) _exit(5);
    len[sid] += static_cast<int64_t>(toks.size());
    if (write(fd, &i, sizeof i) != sizeof i) _exit(6);
  }
}

// Kills a committing child at a random moment, several times; every reported commit must be
// there after reopening, with its response and item, and nothing of a later commit but possibly
// the one in flight, whole.
TEST(StoreCrash, KillNineLosesNoReportedCommit) {
  TempDir dir;
  const std::string path = dir.File("crash.db");
  Rng rng(2024);
  int64_t reported_total = 0;
  for (int round = 0; round < 6; ++round) {
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      close(fds[0]);
      CrashChild(path, fds[1]);
    }
    close(fds[1]);
    // Read reports until a random deadline, then kill -9 and drain what is left in the pipe.
    int64_t last = -1;
    auto drain = [&](int timeout_ms) {
      pollfd p{fds[0], POLLIN, 0};
      while (poll(&p, 1, timeout_ms) > 0) {
        int64_t buf[512];
        ssize_t n = read(fds[0], buf, sizeof buf);
        if (n <= 0) return;
        ASSERT_EQ(n % static_cast<ssize_t>(sizeof(int64_t)), 0);  // pipe writes <= PIPE_BUF are atomic
        for (ssize_t k = 0; k < n / 8; ++k) {
          ASSERT_EQ(buf[k], last + 1);
          last = buf[k];
        }
        timeout_ms = std::min(timeout_ms, 5);
      }
    };
    // The random deadline runs from the child's first report, not from the fork: on a loaded
    // machine opening the database can take longer than the whole window, and a round that kills
    // the child before its first commit checks nothing.
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (last < 0 && std::chrono::steady_clock::now() < give_up) drain(5);
    auto deadline = std::chrono::steady_clock::now() +
                    std::chrono::milliseconds(30 + static_cast<int>(rng.Next() % 300));
    while (std::chrono::steady_clock::now() < deadline) drain(5);
    ASSERT_EQ(kill(pid, SIGKILL), 0);
    int wstatus = 0;
    ASSERT_EQ(waitpid(pid, &wstatus, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(wstatus)) << "child exited with " << WEXITSTATUS(wstatus);
    drain(100);
    close(fds[0]);

    auto opened = Store::Open(path);  // includes an integrity check
    ASSERT_TRUE(opened.ok()) << opened.error().message;
    Store& store = **opened;
    auto sessions = store.LoadSessions();
    ASSERT_TRUE(sessions.ok()) << sessions.error().message;
    // The commits present: every session's turns, interleaved as the child made them.
    int64_t present = 0;
    for (const StoredSession& s : *sessions) present += static_cast<int64_t>(s.turns.size());
    ASSERT_GE(present, last + 1) << "round " << round << ": a reported commit is missing";
    ASSERT_LE(present, last + 2) << "round " << round;
    for (const StoredSession& s : *sessions) {
      std::vector<int32_t> want;
      for (int64_t i = s.id - 1; i < present; i += kCrashSessions) {
        auto t = CrashTokens(i);
        want.insert(want.end(), t.begin(), t.end());
      }
      ASSERT_EQ(s.tokens, want) << "session " << s.id;
    }
    for (int64_t i = 0; i <= present; ++i) {  // all-or-nothing: turn, response and item together
      auto r = store.GetResponse(CrashResponseId(i), "");
      ASSERT_TRUE(r.ok());
      EXPECT_EQ(r->has_value(), i < present) << "response of commit " << i;
      auto item = store.GetConversationItem("conv_crash", "", CrashItemId(i));
      ASSERT_TRUE(item.ok());
      EXPECT_EQ(item->has_value(), i < present) << "item of commit " << i;
    }
    auto items = store.ListConversationItems("conv_crash", "", testing_util::Paging(true, "", 10000));
    if (present > 0) {
      ASSERT_TRUE(items.ok() && items->has_value());
      EXPECT_EQ(static_cast<int64_t>((*items)->items.size()), std::min<int64_t>(present, 10000));
    }
    reported_total += last + 1;
    // Next round the child starts a fresh database (the workload's ids restart at 0).
    opened->reset();
    for (const char* suffix : {"", "-wal", "-shm"}) std::remove((path + suffix).c_str());
  }
  std::printf("[ store    ] crash rounds: 6, commits reported before kill -9: %lld (all found)\n",
              static_cast<long long>(reported_total));
  EXPECT_GT(reported_total, 0);
}

// ---- bad files ----

TEST(StoreOpen, NotADatabaseIsAnError) {
  TempDir dir;
  const std::string path = dir.File("text.db");
  {
    std::ofstream f(path);
    for (int i = 0; i < 400; ++i) f << "this is not a database, just some text\n";
  }
  auto s = Store::Open(path);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("not a database"), std::string::npos) << s.error().message;
}

// SQLite would take a zero-byte file for a new database: the store refuses it instead of
// starting empty over what was a store (issue 13).
TEST(StoreOpen, ZeroByteFileIsAnError) {
  TempDir dir;
  const std::string path = dir.File("empty.db");
  { std::ofstream f(path); }
  auto s = Store::Open(path);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("empty file"), std::string::npos) << s.error().message;
  // A missing file is a new store.
  EXPECT_TRUE(Store::Open(dir.File("new.db")).ok());
}

TEST(StoreOpen, CorruptDatabaseIsAnError) {
  TempDir dir;
  const std::string path = dir.File("c.db");
  {
    auto s = Store::Open(path);
    ASSERT_TRUE(s.ok());
    for (int id = 1; id <= 50; ++id) {
      ASSERT_TRUE((*s)->CreateSession(id, "").ok());
      ASSERT_TRUE((*s)->AppendTurn(id, 0, 1, std::vector<int32_t>(500, id), true).ok());
    }
  }  // closed: checkpointed into the main file
  std::vector<char> bytes;
  {
    std::ifstream f(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(f), {});
  }
  ASSERT_GT(bytes.size(), 16384u);
  Rng rng(5);
  for (size_t i = 4096; i < bytes.size(); ++i) bytes[i] = static_cast<char>(rng.Next());  // all but page 1
  {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  auto s = Store::Open(path);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("corrupt"), std::string::npos) << s.error().message;
  // Without the integrity check it opens or not, but reading gives Errors, never a crash.
  auto unchecked = Store::Open(path, StoreOptions{Durability::kFull, 5000, false});
  if (unchecked.ok()) {
    auto all = (*unchecked)->LoadSessions();
    EXPECT_FALSE(all.ok());
  }
}

TEST(StoreOpen, ForeignOrNewerDatabaseIsAnError) {
  TempDir dir;
  const std::string foreign = dir.File("foreign.db");
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(foreign.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "CREATE TABLE t(x); INSERT INTO t VALUES(1);", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);
  auto s = Store::Open(foreign);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("not a mnemo store"), std::string::npos) << s.error().message;

  const std::string newer = dir.File("newer.db");
  ASSERT_TRUE(Store::Open(newer).ok());
  ASSERT_EQ(sqlite3_open(newer.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "INSERT INTO schema_version VALUES(99, 0)", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);
  s = Store::Open(newer);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("newer"), std::string::npos) << s.error().message;
}

// A store written by schema version 1 (item ids unique across the store) opens at the current
// version with its items, which are then unique per conversation only.
TEST(StoreOpen, VersionOneItemsMigrate) {
  TempDir dir;
  const std::string path = dir.File("v1.db");
  ASSERT_TRUE(Store::Open(path).ok());
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  const char* v1 = R"sql(
DROP TABLE conversation_items;
CREATE TABLE conversation_items(
  id TEXT PRIMARY KEY,
  conversation_id TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
  position INTEGER NOT NULL,
  item_json TEXT NOT NULL,
  created_at REAL NOT NULL,
  UNIQUE(conversation_id, position)
);
DROP TABLE request_records;
DROP TABLE session_prefixes;
ALTER TABLE sessions DROP COLUMN cuts;
DELETE FROM schema_version WHERE version >= 2;
INSERT INTO conversations(id, owner, created_at, metadata_json) VALUES('conv_a', 'alice', 1, '{}');
INSERT INTO conversations(id, owner, created_at, metadata_json) VALUES('conv_b', 'bob', 1, '{}');
INSERT INTO conversation_items VALUES('msg_1', 'conv_a', 0, '{"type":"message"}', 1);
INSERT INTO conversation_items VALUES('msg_2', 'conv_a', 1, '{"type":"message"}', 2);
)sql";
  char* err = nullptr;
  ASSERT_EQ(sqlite3_exec(db, v1, nullptr, nullptr, &err), SQLITE_OK) << (err ? err : "");
  sqlite3_close(db);
  auto s = Store::Open(path);
  ASSERT_TRUE(s.ok()) << s.error().message;
  auto page = (*s)->ListConversationItems("conv_a", "alice", {});
  ASSERT_TRUE(page.ok() && page->has_value());
  ASSERT_EQ((*page)->items.size(), 2u);
  EXPECT_EQ((*page)->items[1].id, "msg_2");
  auto added = (*s)->AddConversationItems("conv_b", "bob", std::vector<NewItem>{{"msg_1", R"({"type":"message"})"}});
  ASSERT_TRUE(added.ok()) << added.error().message;
  ASSERT_TRUE(added->has_value());
}

TEST(StoreOpen, UnwritablePathsAreErrors) {
  TempDir dir;
  auto s = Store::Open(dir.File("no/such/dir/s.db"));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("no/such/dir/s.db"), std::string::npos) << s.error().message;
  EXPECT_FALSE(Store::Open(dir.path()).ok());  // a directory
  EXPECT_FALSE(Store::Open("").ok());
  EXPECT_FALSE(Store::Open(":memory:").ok());
}

// A write-protected file. Root ignores permissions, so as root the open runs in a child that
// drops to uid 65534 (nobody).
TEST(StoreOpen, ReadOnlyFileIsAnError) {
  TempDir dir;
  const std::string ro = dir.File("ro.db");
  ASSERT_TRUE(Store::Open(ro).ok());
  ASSERT_EQ(chmod(ro.c_str(), 0444), 0);
  ASSERT_EQ(chmod(dir.path().c_str(), 0755), 0);
  auto check = [&] {
    auto s = Store::Open(ro);
    return !s.ok() && s.error().message.find("read-only") != std::string::npos;
  };
  if (geteuid() != 0) {
    EXPECT_TRUE(check());
    return;
  }
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (setgid(65534) != 0 || setuid(65534) != 0) _exit(2);
    _exit(check() ? 0 : 1);
  }
  int wstatus = 0;
  ASSERT_EQ(waitpid(pid, &wstatus, 0), pid);
  ASSERT_TRUE(WIFEXITED(wstatus));
  EXPECT_EQ(WEXITSTATUS(wstatus), 0) << "1: opened or wrong message; 2: could not drop root";
}

// ---- threads ----

// (snprintf, not operator+: GCC 12 warns falsely on short string concatenations, bug 105329.)
std::string WriterOwner(int writer) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "w%d", writer);
  return buf;
}

std::string WriterResponseId(int writer, int turn) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "resp_%d_%d", writer, turn);
  return buf;
}

// Writers commit turns into their own sessions while readers load sessions and responses; every
// read sees a consistent log (turns tile it) and, in the end, everything is there.
TEST(StoreThreads, ConcurrentWritersAndReaders) {
  TempDir dir;
  auto opened = Store::Open(dir.File("t.db"), testing_util::WithDurability(Durability::kNormal));
  ASSERT_TRUE(opened.ok());
  Store& store = **opened;
  const int kWriters = 4, kTurns = 60;
  std::atomic<bool> done{false};
  std::atomic<int> failures{0}, reads{0};
  std::vector<std::thread> threads;
  for (int w = 0; w < kWriters; ++w) {
    threads.emplace_back([&, w] {
      int64_t sid = 100 + w, len = 0;
      for (int t = 0; t < kTurns; ++t) {
        std::vector<int32_t> toks(3 + t % 5, w * 1000 + t);
        TurnCommit tc;
        tc.session_id = sid;
        tc.create_session = t == 0;
        tc.begin = len;
        tc.prompt_end = len + 1;
        tc.tokens = toks;
        tc.response = testing_util::MakeResponse(WriterResponseId(w, t), WriterOwner(w));
        if (!store.CommitTurn(tc).ok()) failures++;
        len += static_cast<int64_t>(toks.size());
      }
    });
  }
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      while (!done.load()) {
        auto all = store.LoadSessions();
        if (!all.ok()) failures++;
        else
          for (const StoredSession& s : *all) {
            int64_t pos = 0;
            for (const StoredTurn& t : s.turns) {
              if (t.begin != pos) failures++;
              pos = t.end;
            }
            if (pos != static_cast<int64_t>(s.tokens.size())) failures++;
          }
        auto resp = store.GetResponse(WriterResponseId(r, 0), WriterOwner(r));
        if (!resp.ok()) failures++;
        reads++;
      }
    });
  }
  for (int w = 0; w < kWriters; ++w) threads[w].join();
  done = true;
  for (size_t i = kWriters; i < threads.size(); ++i) threads[i].join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_GT(reads.load(), 0);
  auto all = store.LoadSessions();
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(static_cast<int>(all->size()), kWriters);
  for (const StoredSession& s : *all) EXPECT_EQ(static_cast<int>(s.turns.size()), kTurns);
  for (int w = 0; w < kWriters; ++w) {
    auto r = store.GetResponse(WriterResponseId(w, kTurns - 1), WriterOwner(w));
    ASSERT_TRUE(r.ok() && r->has_value());
  }
}

// ---- cost ----

// The latency of one CommitTurn (200 tokens, a response row, two items) at each durability level.
// Reported, not asserted: it is the disk's fsync cost.
TEST(StoreCost, CommitLatency) {
  for (Durability d : {Durability::kFull, Durability::kNormal}) {
    TempDir dir;
    auto opened = Store::Open(dir.File("l.db"), testing_util::WithDurability(d));
    ASSERT_TRUE(opened.ok());
    Store& store = **opened;
    auto conv = store.CreateConversation({}, {});
    ASSERT_TRUE(conv.ok());
    const int kCommits = 100;
    std::vector<int32_t> toks(200, 7);
    std::vector<double> ms;
    for (int i = 0; i < kCommits; ++i) {
      TurnCommit tc;
      tc.session_id = 1;
      tc.create_session = i == 0;
      tc.begin = int64_t{i} * 200;
      tc.prompt_end = tc.begin + 150;
      tc.tokens = toks;
      tc.response = testing_util::MakeResponse(NewId("resp_"));
      tc.response->request_json = std::string(1000, 'r');
      tc.response->output_json = std::string(1000, 'o');
      tc.conversation = ConversationUpdate{conv->id, {{"", R"({"type":"message","role":"user"})"},
                                                      {"", R"({"type":"message","role":"assistant"})"}}};
      auto t0 = std::chrono::steady_clock::now();
      ASSERT_TRUE(store.CommitTurn(tc).ok());
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    double mean = 0;
    for (double x : ms) mean += x / kCommits;
    std::printf("[ store    ] CommitTurn %s: mean %.3f ms, p50 %.3f ms, p99 %.3f ms\n",
                d == Durability::kFull ? "synchronous=FULL  " : "synchronous=NORMAL", mean, ms[kCommits / 2],
                ms[kCommits * 99 / 100]);
  }
}

}  // namespace
}  // namespace mnemo
