// Internal to src/kernels/cpu: which kernel family runs.
#pragma once

#include "base/cpu.h"

namespace mnemo::kernels::detail {

// CPU features the kernels may use: GetCpuFeatures(), narrowed by the environment (read once):
//   MNEMO_KERNELS=portable  none of the SIMD ones (the portable C++ kernels everywhere);
//   MNEMO_KERNELS=avx2      no AVX-512 (the AVX2 kernels, as on AMD Zen 2/3), where AVX2 exists;
//   MNEMO_KERNELS_PORTABLE  set to anything but "" or "0": as MNEMO_KERNELS=portable.
// Any other MNEMO_KERNELS value (or none) keeps every feature. Tests use these to run each kernel
// family on one machine.
const CpuFeatures& KernelFeatures();

// The AVX2 kernels (*_avx2.cpp) need AVX2, FMA and F16C; they run where AVX-512 does not.
inline bool UseAvx2Kernels(const CpuFeatures& f) { return !f.avx512f && f.avx2 && f.fma && f.f16c; }

}  // namespace mnemo::kernels::detail
