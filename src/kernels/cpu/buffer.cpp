#include "kernels/cpu/buffer.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

namespace mnemo::kernels::detail {

namespace {
constexpr size_t kHugePage = size_t(2) << 20;
}

HugeBuffer::HugeBuffer(size_t bytes) : bytes_(bytes) {
  // Below one huge page, rounding up would waste more than it saves: plain cache-line alignment.
  const size_t align = bytes >= kHugePage ? kHugePage : 64;
  const size_t rounded = std::max(align, (bytes + align - 1) / align * align);
  void* p = std::aligned_alloc(align, rounded);
  if (p == nullptr) throw std::bad_alloc();
  // Advice only: without THP support this is a no-op and the memory still works.
  if (align == kHugePage) madvise(p, rounded, MADV_HUGEPAGE);
  std::memset(p, 0, rounded);  // first touch after the advice, so huge pages back it
  p_.reset(p);
}

void HugeBuffer::Free::operator()(void* p) const { std::free(p); }

}  // namespace mnemo::kernels::detail
