#include "kernels/cpu/dispatch.h"

#include <cstdlib>
#include <cstring>

namespace mnemo::kernels::detail {

const CpuFeatures& KernelFeatures() {
  static const CpuFeatures f = [] {
    const char* portable = std::getenv("MNEMO_KERNELS_PORTABLE");
    if (portable != nullptr && *portable != '\0' && std::strcmp(portable, "0") != 0) return CpuFeatures{};
    const char* family = std::getenv("MNEMO_KERNELS");
    if (family != nullptr && std::strcmp(family, "portable") == 0) return CpuFeatures{};
    CpuFeatures c = GetCpuFeatures();
    if (family != nullptr && std::strcmp(family, "avx2") == 0) {
      c.avx512f = c.avx512_bf16 = c.avx512_vnni = c.amx_bf16 = false;
    }
    return c;
  }();
  return f;
}

}  // namespace mnemo::kernels::detail
