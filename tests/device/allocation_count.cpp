// The global operator new and delete, counting: in a translation unit of their
// own (the compiler would otherwise pair inlined calls with the library's).
#include "tests/device/allocation_count.hpp"

#include <atomic>
#include <cstdlib>
#include <new>

namespace {
std::atomic<uint64_t> gCount{0};
}

namespace rdmacc::test {
uint64_t allocationCount() {
  return gCount.load();
}
}  // namespace rdmacc::test

void* operator new(std::size_t n) {
  gCount.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}
