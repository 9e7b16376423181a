// What to do when a scope is left by an exception, and only then (a
// formation that fails half-way hands back what it took; one that
// succeeds keeps it).
#pragma once

#include <exception>
#include <utility>

namespace rdmacc {

template <typename F>
class OnFailure {
 public:
  explicit OnFailure(F f) : f_(std::move(f)), uncaught_(std::uncaught_exceptions()) {}
  ~OnFailure() {
    if (std::uncaught_exceptions() > uncaught_) f_();
  }
  OnFailure(const OnFailure&) = delete;
  OnFailure& operator=(const OnFailure&) = delete;

 private:
  F f_;
  int uncaught_;
};

}  // namespace rdmacc
