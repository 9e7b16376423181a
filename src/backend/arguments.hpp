// Checks of what a caller passes to a collective, before anything is sized
// or copied from it: pure, host-tested (tests/unit/backend/arguments_test.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "rdmacc/types.hpp"

namespace rdmacc {

// Throws Error(InvalidArgument) with the message and the hint.
[[noreturn]] void invalid(std::string message, std::string hint = {});

// A tensor's data must exist when it has elements, and its byte size must
// fit a size_t (numel x element size never wraps).
void checkTensor(const Tensor& t, const char* op, const char* what);

// A group's shape: 1 <= size <= kMaxWorldSize and 0 <= rank < size. The limit
// is the width of the peer field of a work request id (src/transport/rdma/wr_id.hpp).
constexpr int kMaxWorldSize = 65536;
void checkGroup(int rank, int size);

// alltoall_base's split sizes for one side: `given` (empty: numel split
// evenly) must hold one non-negative count per rank and add up to exactly
// `numel`, in checked arithmetic (counts whose sum wraps are refused).
std::vector<size_t> splitCounts(const std::vector<int64_t>& given, size_t numel, int ranks,
                                const char* what);

}  // namespace rdmacc
