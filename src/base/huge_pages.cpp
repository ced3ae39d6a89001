#include "base/huge_pages.h"

#include <sys/mman.h>

#include <cstdint>
#include <cstring>

namespace mnemo {

namespace {

// Under AddressSanitizer large blocks come from its heap (2 MB aligned, exactly `bytes` long, no
// huge pages): it checks heap blocks for overruns, not mappings, and a kernel reading past a weight
// buffer is exactly what the ASan build is for.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kMapLarge = false;
#else
constexpr bool kMapLarge = true;
#endif

size_t RoundUp(size_t bytes) { return (bytes + kHugePage - 1) & ~(kHugePage - 1); }

}  // namespace

void* AllocHuge(size_t bytes) {
  if (bytes < kHugeMin) return ::operator new(bytes == 0 ? 1 : bytes, std::align_val_t(kSmallAlign));
  if (!kMapLarge) return std::memset(::operator new(bytes, std::align_val_t(kHugePage)), 0, bytes);
  const size_t size = RoundUp(bytes);
  // Over-map by one huge page and trim both ends, so that the region starts on a 2 MB boundary
  // (a huge page can only back an aligned 2 MB range).
  void* raw = mmap(nullptr, size + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) throw std::bad_alloc();
  const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (start + kHugePage - 1) & ~(kHugePage - 1);
  if (aligned > start) munmap(raw, aligned - start);
  const uintptr_t end = aligned + size;
  const uintptr_t raw_end = start + size + kHugePage;
  if (raw_end > end) munmap(reinterpret_cast<void*>(end), raw_end - end);
  void* p = reinterpret_cast<void*>(aligned);
  madvise(p, size, MADV_HUGEPAGE);  // EINVAL where THP is compiled out: ordinary pages then
  return p;
}

void FreeHuge(void* p, size_t bytes) noexcept {
  if (p == nullptr) return;
  if (bytes < kHugeMin) {
    ::operator delete(p, std::align_val_t(kSmallAlign));
    return;
  }
  if (!kMapLarge) {
    ::operator delete(p, std::align_val_t(kHugePage));
    return;
  }
  munmap(p, RoundUp(bytes));
}

}  // namespace mnemo
