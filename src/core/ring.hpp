// A first-in first-out queue in one array that grows only when full: the
// engine's per-peer and per-queue-pair queues cycle through a bounded number
// of entries (slots, send-queue entries), so after the first operations they
// never allocate again. std::deque allocates and frees a block every few
// hundred bytes of traffic.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

namespace rdmacc {

template <typename T>
class Ring {
 public:
  bool empty() const noexcept { return count_ == 0; }
  size_t size() const noexcept { return count_; }
  size_t capacity() const noexcept { return items_.size(); }

  T& front() noexcept { return items_[head_]; }
  const T& front() const noexcept { return items_[head_]; }
  // i-th entry from the front.
  T& operator[](size_t i) noexcept { return items_[(head_ + i) % items_.size()]; }
  const T& operator[](size_t i) const noexcept { return items_[(head_ + i) % items_.size()]; }

  void reserve(size_t n) {
    if (n > items_.size()) regrow(n);
  }
  void push_back(T value) {
    if (count_ == items_.size()) regrow(items_.empty() ? 8 : 2 * items_.size());
    items_[(head_ + count_) % items_.size()] = std::move(value);
    ++count_;
  }
  void pop_front() noexcept {
    head_ = (head_ + 1) % items_.size();
    --count_;
  }

 private:
  void regrow(size_t n) {
    std::vector<T> bigger(n);
    for (size_t i = 0; i < count_; ++i) bigger[i] = std::move((*this)[i]);
    items_.swap(bigger);
    head_ = 0;
  }

  std::vector<T> items_;
  size_t head_ = 0;
  size_t count_ = 0;
};

}  // namespace rdmacc
