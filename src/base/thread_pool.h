// The worker threads of the CPU kernels' short parallel loops.
//
// A decode step runs about five parallel loops per layer, each a few tens of microseconds long,
// so waking sleeping threads for every loop (OpenMP's passive wait: a futex round trip) cost a
// quarter of the step, and spinning between loops (OpenMP's active wait) collapses as soon as
// another process wants a core. The pool's workers spin only briefly after a loop, long enough
// to catch the next loop of the same forward pass, and then sleep on a futex.
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>
#include <type_traits>
#include <vector>

namespace mnemo {

class ThreadPool {
 public:
  // The process-wide pool: NumThreads() - 1 workers plus the calling thread.
  static ThreadPool& Get();

  // Runs fn(i) for every i in [0, n), handed out one at a time to the caller and the workers
  // (dynamic schedule), and returns when all have run. A call made while the pool is busy
  // (from inside fn, or from another thread) runs its loop on the calling thread alone.
  template <class Fn>
  void For(int n, Fn&& fn) {
    using F = std::remove_reference_t<Fn>;
    Run(n, [](void* ctx, int i) { (*static_cast<F*>(ctx))(i); },
        const_cast<void*>(static_cast<const void*>(&fn)));
  }

  ~ThreadPool();

 private:
  using Item = void (*)(void* ctx, int i);

  ThreadPool() = default;
  void Run(int n, Item item, void* ctx);
  void Resize(int workers);  // under busy_
  void WorkerLoop(uint32_t seen);
  void RunItems();

  std::atomic<bool> busy_{false};  // one loop at a time
  std::vector<std::thread> workers_;
  // The current loop, published by bumping generation_.
  Item item_ = nullptr;
  void* ctx_ = nullptr;
  int n_ = 0;
  bool stop_ = false;
  std::atomic<int> next_{0};             // next index to hand out
  std::atomic<uint32_t> generation_{0};  // futex word the workers wait on
  std::atomic<uint32_t> pending_{0};     // workers still in the loop; futex word of the caller
  std::atomic<int> sleeping_workers_{0};
  std::atomic<bool> caller_sleeping_{false};
};

}  // namespace mnemo
