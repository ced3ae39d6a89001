#include "base/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <numeric>
#include <thread>
#include <vector>

#include "base/cpu.h"

namespace mnemo {
namespace {

// Every index runs exactly once, whatever the loop sizes and the pauses between loops (spinning
// workers, sleeping workers).
TEST(ThreadPool, RunsEveryIndexOnce) {
  for (int n : {1, 2, 3, 7, 64, 1000}) {
    for (int rep = 0; rep < 50; rep++) {
      std::vector<std::atomic<int>> hits(n);
      ThreadPool::Get().For(n, [&](int i) { hits[i].fetch_add(1); });
      for (int i = 0; i < n; i++) ASSERT_EQ(hits[i].load(), 1) << "n " << n << " index " << i;
      if (rep % 10 == 9) std::this_thread::sleep_for(std::chrono::microseconds(200));  // workers sleep
    }
  }
}

// Loops from several threads at once and loops nested in loops: each still runs every index once
// and sees its own data.
TEST(ThreadPool, ConcurrentAndNestedLoops) {
  constexpr int kCallers = 3, kLoops = 2000;
  std::vector<std::thread> callers;
  std::atomic<int> bad{0};
  for (int c = 0; c < kCallers; c++) {
    callers.emplace_back([&, c] {
      for (int l = 0; l < kLoops; l++) {
        const int n = 1 + (l * 7 + c) % 13;
        std::vector<int64_t> out(n, 0);
        ThreadPool::Get().For(n, [&](int i) {
          std::atomic<int64_t> s{0};
          ThreadPool::Get().For(3, [&](int j) { s += j; });  // nested
          out[i] = int64_t(c) * 1000000 + l * 100 + i + s.load();
        });
        for (int i = 0; i < n; i++) {
          if (out[i] != int64_t(c) * 1000000 + l * 100 + i + 3) bad.fetch_add(1);
        }
      }
    });
  }
  for (auto& t : callers) t.join();
  EXPECT_EQ(bad.load(), 0);
}

// The worker count follows SetNumThreads.
TEST(ThreadPool, FollowsTheThreadCount) {
  const int before = NumThreads();
  for (int t : {1, 3, 2}) {
    SetNumThreads(t);
    std::vector<std::atomic<int>> hits(100);
    ThreadPool::Get().For(100, [&](int i) { hits[i].fetch_add(1); });
    for (auto& h : hits) ASSERT_EQ(h.load(), 1);
  }
  SetNumThreads(before);
}

}  // namespace
}  // namespace mnemo
