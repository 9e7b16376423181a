// Memory an operation owns while it runs: reduce_scatter's partial sums,
// the packed blocks of gather, scatter, alltoall and the coalesced
// collectives, a copy of an in-place input. A training loop repeats the same
// collectives, so large buffers go back to the backend's ScratchPool when
// their operation ends and serve the next one: a fresh large buffer per
// operation costs its page faults and zero-filling every time
// (docs/performance.md, "Numbers behind code comments").
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace rdmacc {

class ScratchPool {
 public:
  // Buffers smaller than this are allocated and freed with their operation
  // (malloc keeps those cheaply itself).
  static constexpr size_t kPooledMinBytes = 64 * 1024;
  // At most this many buffers are kept: operations hold theirs from submission
  // to completion, and callers issue several before waiting (rdmacc-perf: 16).
  static constexpr size_t kMaxKept = 16;

  // Keeps at most `maxBytes` in all (RDMACC_SCRATCH_CACHE_BYTES; 0: none).
  explicit ScratchPool(size_t maxBytes) : maxBytes_(maxBytes) {}

  struct Buffer {
    std::unique_ptr<uint8_t[]> data;
    size_t bytes = 0;
  };
  // A buffer of at least `bytes` (its contents are whatever they were): the
  // smallest kept one that fits, or a new one.
  Buffer take(size_t bytes);
  // Keeps `b` for a later take() if the limits allow, else frees it.
  void give(Buffer b);
  size_t keptBytes() const;

 private:
  const size_t maxBytes_;
  mutable std::mutex mutex_;
  std::vector<Buffer> kept_;
  size_t keptBytes_ = 0;
};

// An operation's scratch memory; a large one returns to its pool when the
// operation is destroyed.
class Scratch {
 public:
  Scratch() = default;
  ~Scratch() { release(); }
  Scratch(Scratch&& other) noexcept { *this = std::move(other); }
  Scratch& operator=(Scratch&& other) noexcept;
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;

  // `bytes` of memory for the operation (contents undefined; the callers
  // write before they read), from `pool` when large. Replaces what it held.
  uint8_t* allocate(size_t bytes, const std::shared_ptr<ScratchPool>& pool);
  uint8_t* data() const { return buffer_.data.get(); }
  size_t size() const { return size_; }

 private:
  void release();
  ScratchPool::Buffer buffer_;
  size_t size_ = 0;
  std::shared_ptr<ScratchPool> pool_;  // null: not from a pool
};

}  // namespace rdmacc
