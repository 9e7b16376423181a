#pragma once

#include <atomic>
#include <mutex>
#include <thread>

namespace rdmacc {

// A mutex that knows whether the calling thread holds it: std::mutex leaves
// try_lock by its owner undefined, and a Work callback run under the
// progress lock may call a collective whose fast path would try it.
class OwnedMutex {
 public:
  void lock() {
    mutex_.lock();
    owner_.store(std::this_thread::get_id(), std::memory_order_relaxed);
  }
  // False for its owner (as a recursive attempt), not undefined.
  bool try_lock() {
    if (heldByThisThread() || !mutex_.try_lock()) return false;
    owner_.store(std::this_thread::get_id(), std::memory_order_relaxed);
    return true;
  }
  void unlock() {
    owner_.store(std::thread::id(), std::memory_order_relaxed);
    mutex_.unlock();
  }
  // Only this thread stores its own id, so the answer is exact for it.
  bool heldByThisThread() const {
    return owner_.load(std::memory_order_relaxed) == std::this_thread::get_id();
  }

 private:
  std::mutex mutex_;
  std::atomic<std::thread::id> owner_{};
};

}  // namespace rdmacc
