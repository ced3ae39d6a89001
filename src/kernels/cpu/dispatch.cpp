#include "kernels/cpu/dispatch.h"

#include <cstdlib>
#include <cstring>

namespace mnemo::kernels::detail {

const CpuFeatures& KernelFeatures() {
  static const CpuFeatures f = [] {
    const char* env = std::getenv("MNEMO_KERNELS_PORTABLE");
    if (env != nullptr && *env != '\0' && std::strcmp(env, "0") != 0) return CpuFeatures{};
    return GetCpuFeatures();
  }();
  return f;
}

}  // namespace mnemo::kernels::detail
