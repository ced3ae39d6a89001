#include "base/cpu.h"

#include <cpuid.h>
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <thread>

namespace mnemo {
namespace {

bool RequestAmx() {
  constexpr long kArchReqXcompPerm = 0x1023;
  constexpr long kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

CpuFeatures Detect() {
  CpuFeatures f;
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  f.fma = c & bit_FMA;
  f.f16c = c & bit_F16C;
  bool osxsave = c & bit_OSXSAVE;
  unsigned long long xcr0 = 0;
  if (osxsave) {
    unsigned lo, hi;
    __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    xcr0 = (static_cast<unsigned long long>(hi) << 32) | lo;
  }
  bool ymm_os = (xcr0 & 0x6) == 0x6;
  bool zmm_os = (xcr0 & 0xe6) == 0xe6;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
    f.avx2 = ymm_os && (b & bit_AVX2);
    f.avx512f = zmm_os && (b & bit_AVX512F) && (b & bit_AVX512BW) && (b & bit_AVX512VL) &&
                (b & bit_AVX512DQ);
    f.avx512_vnni = f.avx512f && (c & bit_AVX512VNNI);
    bool amx_tile = d & (1u << 24);
    bool amx_bf16 = d & (1u << 22);
    if (amx_tile && amx_bf16) f.amx_bf16 = RequestAmx();
  }
  if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) f.avx512_bf16 = f.avx512f && (a & (1u << 5));
  return f;
}

// Kernel thread count; 0 until set or first read. Read by every kernel call from any thread (the
// engine, transfer and test threads), set at start-up: an atomic, relaxed (a count, not a publication).
std::atomic<int> g_threads{0};

}  // namespace

const CpuFeatures& GetCpuFeatures() {
  static const CpuFeatures f = Detect();
  return f;
}

int NumThreads() {
  int t = g_threads.load(std::memory_order_relaxed);
  if (t <= 0) {
    unsigned n = std::thread::hardware_concurrency();
    t = n ? static_cast<int>(n) : 1;
    int expected = 0;
    // Concurrent first readers agree on the same value; a SetNumThreads in between wins.
    if (!g_threads.compare_exchange_strong(expected, t, std::memory_order_relaxed)) t = expected;
  }
  return t;
}

void SetNumThreads(int n) {
  g_threads.store(n > 0 ? n : 0, std::memory_order_relaxed);
  omp_set_num_threads(NumThreads());
}

}  // namespace mnemo
