#include "src/core/buffer.hpp"

#include <sys/mman.h>

#include <cerrno>

#include <fmt/format.h>

#include "rdmacc/error.hpp"

namespace rdmacc {

void PageUnmap::operator()(uint8_t* p) const noexcept {
  ::munmap(p, size);
}

PageBuffer::PageBuffer(size_t bytes) {
  if (bytes == 0) return;
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    throw errnoError(ErrorKind::Internal, "mmap", errno,
                     fmt::format("cannot allocate {} bytes", bytes));
  }
  memory_ = std::unique_ptr<uint8_t, PageUnmap>(static_cast<uint8_t*>(p), PageUnmap{bytes});
  // Slot and staging regions are registered with the device: a child of
  // fork() (DataLoader workers) must not share or copy them, or on kernels
  // without fork support (< 5.13) the parent's next write to a page would
  // move it away from what the device reads and writes. The child never
  // touches them. Best effort: the kernel refuses only for bad arguments.
  ::madvise(p, bytes, MADV_DONTFORK);
}

}  // namespace rdmacc
