// Per-operation options, named and shaped as c10d's.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "rdmacc/types.hpp"

namespace rdmacc {

// A timeout of kUseDefaultTimeout means the backend's (RDMACC_TIMEOUT).
inline constexpr std::chrono::milliseconds kUseDefaultTimeout{-1};

// Algorithm override for one call; Auto picks by size, world size and, for
// Hierarchical, by how the ranks spread over hosts.
enum class Algorithm {
  Auto,
  Ring,
  Tree,
  Linear,
  Pairwise,
  Dissemination,
  RecursiveDoubling,
  // Through each host (shared memory), then across hosts, then inside each
  // host again (allreduce, broadcast, reduce, barrier).
  Hierarchical,
};
const char* toString(Algorithm algorithm) noexcept;
// The algorithm called `name` ("ring", "hierarchical", ...), if there is one.
std::optional<Algorithm> algorithmNamed(std::string_view name) noexcept;
// The algorithms a collective may be asked for ("allreduce", "broadcast",
// "reduce", "barrier", "allgather", "reduce_scatter", "alltoall"), Auto
// aside; empty for other names.
std::span<const Algorithm> algorithmsOf(std::string_view collective) noexcept;

struct BroadcastOptions {
  int64_t rootRank = 0;
  int64_t rootTensor = 0;
  std::chrono::milliseconds timeout = kUseDefaultTimeout;
  Algorithm algorithm = Algorithm::Auto;  // Ring (chain), Tree (binomial), Hierarchical
};

struct AllreduceOptions {
  ReduceOp reduceOp = ReduceOp::Sum;
  double preMulFactor = 1.0;  // PreMulSum: every input is multiplied by it first
  std::chrono::milliseconds timeout = kUseDefaultTimeout;
  // Ring (reduce-scatter + allgather), Tree (reduce + broadcast),
  // RecursiveDoubling (log2 n pairwise exchanges; power-of-two groups),
  // Hierarchical (inside hosts, across hosts, inside hosts)
  Algorithm algorithm = Algorithm::Auto;
};

struct AllreduceCoalescedOptions : AllreduceOptions {};

struct ReduceOptions {
  ReduceOp reduceOp = ReduceOp::Sum;
  double preMulFactor = 1.0;
  int64_t rootRank = 0;
  int64_t rootTensor = 0;
  std::chrono::milliseconds timeout = kUseDefaultTimeout;
  Algorithm algorithm = Algorithm::Auto;  // Tree (binomial), Hierarchical
};

struct AllgatherOptions {
  std::chrono::milliseconds timeout = kUseDefaultTimeout;
  // Ring, or Linear (every rank to every rank in one step); Auto: Linear up
  // to RDMACC_TREE_MAX_BYTES of gathered output, Ring above.
  Algorithm algorithm = Algorithm::Auto;
};

struct GatherOptions {
  int64_t rootRank = 0;
  std::chrono::milliseconds timeout = kUseDefaultTimeout;
};

struct ScatterOptions {
  int64_t rootRank = 0;
  std::chrono::milliseconds timeout = kUseDefaultTimeout;
};

struct ReduceScatterOptions {
  ReduceOp reduceOp = ReduceOp::Sum;
  double preMulFactor = 1.0;
  std::chrono::milliseconds timeout = kUseDefaultTimeout;
  // Ring, or Linear (rank p gets block p from everyone in one step and sums
  // in rank order); Auto: Linear up to RDMACC_TREE_MAX_BYTES of input, Ring above.
  Algorithm algorithm = Algorithm::Auto;
};

struct AllToAllOptions {
  std::chrono::milliseconds timeout = kUseDefaultTimeout;
  // Pairwise (step i: send to rank + i, receive from rank - i), or Linear
  // (every pair at once); Auto: Linear up to 8 ranks, Pairwise above (the
  // choice may not depend on sizes: they differ between ranks).
  Algorithm algorithm = Algorithm::Auto;
};

struct BarrierOptions {
  std::chrono::milliseconds timeout = kUseDefaultTimeout;
  Algorithm algorithm = Algorithm::Auto;  // Dissemination, Hierarchical
};

}  // namespace rdmacc
