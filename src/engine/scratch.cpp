#include "src/engine/scratch.hpp"

#include <algorithm>
#include <utility>

namespace rdmacc {

ScratchPool::Buffer ScratchPool::take(size_t bytes) {
  {
    std::lock_guard lock(mutex_);
    auto best = kept_.end();
    for (auto it = kept_.begin(); it != kept_.end(); ++it) {
      if (it->bytes >= bytes && (best == kept_.end() || it->bytes < best->bytes)) best = it;
    }
    if (best != kept_.end()) {
      Buffer b = std::move(*best);
      kept_.erase(best);
      keptBytes_ -= b.bytes;
      return b;
    }
  }
  // Default-initialised: no zero-filling of memory the operation overwrites.
  return Buffer{std::unique_ptr<uint8_t[]>(new uint8_t[bytes]), bytes};
}

void ScratchPool::give(Buffer b) {
  if (!b.data) return;
  std::lock_guard lock(mutex_);
  // Room is made by dropping smaller kept buffers: the larger one serves
  // every size they served.
  std::sort(kept_.begin(), kept_.end(),
            [](const Buffer& x, const Buffer& y) { return x.bytes < y.bytes; });
  while (!kept_.empty() && kept_.front().bytes < b.bytes &&
         (kept_.size() >= kMaxKept || keptBytes_ + b.bytes > maxBytes_)) {
    keptBytes_ -= kept_.front().bytes;
    kept_.erase(kept_.begin());
  }
  if (kept_.size() >= kMaxKept || keptBytes_ + b.bytes > maxBytes_) return;  // freed here
  keptBytes_ += b.bytes;
  kept_.push_back(std::move(b));
}

size_t ScratchPool::keptBytes() const {
  std::lock_guard lock(mutex_);
  return keptBytes_;
}

Scratch& Scratch::operator=(Scratch&& other) noexcept {
  if (this != &other) {
    release();
    buffer_ = std::move(other.buffer_);
    size_ = std::exchange(other.size_, 0);
    pool_ = std::move(other.pool_);
    other.buffer_.bytes = 0;
  }
  return *this;
}

uint8_t* Scratch::allocate(size_t bytes, const std::shared_ptr<ScratchPool>& pool) {
  release();
  size_ = bytes;
  if (pool && bytes >= ScratchPool::kPooledMinBytes) {
    buffer_ = pool->take(bytes);
    pool_ = pool;
  } else {
    // At least one byte: data() of an empty scratch is still a pointer.
    const size_t n = std::max<size_t>(bytes, 1);
    buffer_ = ScratchPool::Buffer{std::unique_ptr<uint8_t[]>(new uint8_t[n]), n};
  }
  return buffer_.data.get();
}

void Scratch::release() {
  if (pool_) {
    pool_->give(std::move(buffer_));
    pool_.reset();
  }
  buffer_ = {};
  size_ = 0;
}

}  // namespace rdmacc
