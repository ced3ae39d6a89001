// Internal to src/kernels/cpu: which kernel family runs.
#pragma once

#include "base/cpu.h"

namespace mnemo::kernels::detail {

// CPU features the kernels may use: GetCpuFeatures(), or none of the SIMD ones when the
// environment variable MNEMO_KERNELS_PORTABLE is set to anything but "" or "0" (read once).
// That runs the portable paths, as on a CPU without AVX-512, so tests cover them here too.
const CpuFeatures& KernelFeatures();

}  // namespace mnemo::kernels::detail
