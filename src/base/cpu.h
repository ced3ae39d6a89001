// What the CPU can do (read once from CPUID), and the process-wide thread count.
#pragma once

namespace mnemo {

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;     // with BW, VL, DQ
  bool avx512_bf16 = false;
  bool avx512_vnni = false;
  bool amx_bf16 = false;    // tile instructions usable (OS permission granted)
};

// Detected on first call; thread-safe. AMX is reported only after the kernel granted tile data
// permission (arch_prctl ARCH_REQ_XCOMP_PERM), which this call requests.
const CpuFeatures& GetCpuFeatures();

// Threads used by kernels (the ThreadPool, and OpenMP inside oneDNN). Defaults to the number of
// cores.
int NumThreads();
void SetNumThreads(int n);

}  // namespace mnemo
