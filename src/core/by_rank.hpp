// One entry per rank of a group, indexed by the rank itself: ranks are ints
// everywhere (the c10d contract, the wire, the schedules), so a plain vector
// would want a size_t cast at every use, and a negative rank would wrap
// around silently instead of failing the bounds check below.
#pragma once

#include <cassert>
#include <cstddef>
#include <utility>
#include <vector>

namespace rdmacc {

template <class T>
class ByRank {
 public:
  ByRank() = default;
  explicit ByRank(int ranks) : v_(index(ranks)) {}
  ByRank(int ranks, const T& value) : v_(index(ranks), value) {}
  explicit ByRank(std::vector<T> byRank) : v_(std::move(byRank)) {}

  void assign(int ranks, const T& value) { v_.assign(index(ranks), value); }
  void resize(int ranks) { v_.resize(index(ranks)); }
  // decltype(auto): std::vector<bool> hands out a proxy, not a reference.
  decltype(auto) operator[](int rank) { return v_[checked(rank)]; }
  decltype(auto) operator[](int rank) const { return v_[checked(rank)]; }
  // Bounds-checked in every build: throws std::out_of_range.
  decltype(auto) at(int rank) { return v_.at(static_cast<size_t>(rank)); }
  decltype(auto) at(int rank) const { return v_.at(static_cast<size_t>(rank)); }
  int size() const noexcept { return static_cast<int>(v_.size()); }
  bool empty() const noexcept { return v_.empty(); }
  auto begin() noexcept { return v_.begin(); }
  auto end() noexcept { return v_.end(); }
  auto begin() const noexcept { return v_.begin(); }
  auto end() const noexcept { return v_.end(); }
  // For interfaces that take the whole vector.
  const std::vector<T>& vector() const noexcept { return v_; }

 private:
  static size_t index(int ranks) { return static_cast<size_t>(ranks < 0 ? 0 : ranks); }
  size_t checked(int rank) const {
    assert(rank >= 0 && static_cast<size_t>(rank) < v_.size());
    return static_cast<size_t>(rank);
  }
  std::vector<T> v_;
};

}  // namespace rdmacc
