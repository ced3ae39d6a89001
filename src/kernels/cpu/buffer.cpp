#include "kernels/cpu/buffer.h"

#include <cstring>

#include "base/huge_pages.h"

namespace mnemo::kernels::detail {

HugeBuffer::HugeBuffer(size_t bytes) : bytes_(bytes) {
  void* p = AllocHuge(bytes);
  if (bytes < kHugeMin) std::memset(p, 0, bytes);  // a mapping is zero already
  p_ = std::unique_ptr<void, Free>(p, Free{bytes});
}

void HugeBuffer::Free::operator()(void* p) const { FreeHuge(p, bytes); }

}  // namespace mnemo::kernels::detail
