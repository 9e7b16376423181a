// A deadline `timeout` from now that saturates: a timeout near the limits of
// its type (RDMACC_TIMEOUT in hours with twelve digits, Python's
// timedelta.max) means "never", not a time point that wrapped into the past.
#pragma once

#include <chrono>

namespace rdmacc {

inline std::chrono::steady_clock::time_point deadlineAfter(std::chrono::milliseconds timeout) {
  using Clock = std::chrono::steady_clock;
  const auto now = Clock::now();
  if (timeout.count() <= 0) return now;
  // Compared in milliseconds: the clock's nanoseconds cannot hold every timeout.
  const auto room =
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::time_point::max() - now);
  if (timeout >= room) return Clock::time_point::max();
  return now + timeout;
}

}  // namespace rdmacc
