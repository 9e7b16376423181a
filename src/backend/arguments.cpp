#include "src/backend/arguments.hpp"

#include <cstdint>

#include <fmt/format.h>

#include "rdmacc/error.hpp"

namespace rdmacc {

void invalid(std::string message, std::string hint) {
  throw Error(ErrorKind::InvalidArgument, std::move(message), std::move(hint));
}

void checkTensor(const Tensor& t, const char* op, const char* what) {
  if (t.data == nullptr && t.numel > 0)
    invalid(fmt::format("{}: {} has {} elements but no data", op, what, t.numel));
  if (t.numel > SIZE_MAX / elementSize(t.dtype)) {
    invalid(fmt::format("{}: {} has {} elements of {} bytes: more bytes than memory can hold", op,
                        what, t.numel, elementSize(t.dtype)));
  }
}

void checkGroup(int rank, int size) {
  if (size < 1 || size > kMaxWorldSize) {
    invalid(fmt::format("a group of {} ranks: rdmacc supports 1 to {}", size, kMaxWorldSize),
            "check WORLD_SIZE (or the size passed to the backend)");
  }
  if (rank < 0 || rank >= size) {
    invalid(fmt::format("rank {} is not a rank of a group of {} (0 to {})", rank, size, size - 1),
            "check RANK and WORLD_SIZE");
  }
}

std::vector<size_t> splitCounts(const std::vector<int64_t>& given, size_t numel, int ranks,
                                const char* what) {
  const auto n = static_cast<size_t>(ranks);
  std::vector<size_t> counts;
  if (given.empty()) {
    if (numel % n != 0) {
      invalid(fmt::format("alltoall_base: the {} has {} elements, not divisible by {} ranks", what,
                          numel, ranks),
              "pass split sizes");
    }
    counts.assign(n, numel / n);
    return counts;
  }
  if (given.size() != n) {
    invalid(
        fmt::format("alltoall_base: {} {} split sizes for {} ranks", given.size(), what, ranks));
  }
  counts.reserve(n);
  size_t sum = 0;  // <= numel throughout: no addition below can wrap
  for (size_t i = 0; i < n; ++i) {
    const int64_t c = given[i];
    if (c < 0) invalid(fmt::format("alltoall_base: {} split size {} is negative ({})", what, i, c));
    if (static_cast<uint64_t>(c) > numel - sum) {
      invalid(fmt::format("alltoall_base: the {} split sizes add up to more than the {} elements "
                          "of the tensor (split {} is {}, after {} before it)",
                          what, numel, i, c, sum),
              "the split sizes must add up to the tensor's first dimension");
    }
    counts.push_back(static_cast<size_t>(c));
    sum += static_cast<size_t>(c);
  }
  if (sum != numel) {
    invalid(fmt::format(
        "alltoall_base: the {} split sizes add up to {}, but the tensor has {} elements", what, sum,
        numel));
  }
  return counts;
}

}  // namespace rdmacc
