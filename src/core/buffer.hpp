// Page-aligned anonymous memory (what registration wants), owned by RAII,
// and the byte copy every layer uses.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>

namespace rdmacc {

// n rounded up to a multiple of `to` (regions and their entries: cache lines).
constexpr size_t roundUp(size_t n, size_t to) {
  return (n + to - 1) / to * to;
}

// memcpy for ranges that may be empty: an empty tensor's or payload's
// pointer may be null, and memcpy with a null pointer is undefined even for
// zero bytes (UBSan reports it).
inline void copyBytes(void* dst, const void* src, size_t bytes) noexcept {
  if (bytes > 0) std::memcpy(dst, src, bytes);
}

struct PageUnmap {
  size_t size = 0;
  void operator()(uint8_t* p) const noexcept;
};

class PageBuffer {
 public:
  PageBuffer() = default;
  explicit PageBuffer(size_t bytes);  // throws Error on failure; zero-filled

  uint8_t* data() const noexcept { return memory_.get(); }
  size_t size() const noexcept { return memory_.get_deleter().size; }

 private:
  std::unique_ptr<uint8_t, PageUnmap> memory_;
};

}  // namespace rdmacc
