// Which algorithm a collective runs: the call's request, else
// RDMACC_ALGO_<OP>, else the tuning table (RDMACC_TUNE_FILE), else the
// automatic rule. The one place that decides it, keyed by OpType; the
// schedules themselves are built in src/schedule/algorithms/.
#pragma once

#include <cstddef>

#include "rdmacc/config.hpp"
#include "rdmacc/tuning.hpp"
#include "rdmacc/types.hpp"
#include "rdmacc/work.hpp"
#include "src/schedule/algorithms/algorithms.hpp"

namespace rdmacc {

// Auto alltoall: every pair at once up to this many ranks, pairwise steps above.
constexpr int kLinearAlltoallMaxRanks = 8;

class AlgorithmChoice {
 public:
  AlgorithmChoice() = default;
  // Reads RDMACC_ALGO_<OP> and RDMACC_TREE_MAX_BYTES once (validated by
  // Config): a configuration lookup per call was a visible share of a small
  // allreduce's cost.
  // `hosts` says which ranks share a host (hierarchical algorithms).
  AlgorithmChoice(const Config& config, TuningTable tuning, const algorithms::Hosts& hosts,
                  int size);

  // The algorithm for an operation of `type` whose automatic choice goes by
  // `bytes`; throws InvalidArgument when `requested` is not one of the
  // collective's algorithms or does not fit the group (recursive doubling
  // in a group that is not a power of two).
  Algorithm choose(Algorithm requested, OpType type, size_t bytes) const;
  // What the automatic rule picks for `collective` (selectionOf'd).
  Algorithm automatic(OpType collective, size_t bytes) const;
  // The collective whose algorithms an operation chooses among: the
  // variants of a call (coalesced, _base) share their collective's.
  static OpType selectionOf(OpType type) noexcept;
  // RDMACC_TREE_MAX_BYTES: above it trees and single-step exchanges give
  // way to rings (the hierarchical builders split by it too).
  size_t treeMaxBytes() const noexcept { return treeMaxBytes_; }
  // RDMACC_ALGO_<OP> for collective (Auto: not set).
  Algorithm forced(OpType collective) const;

 private:
  int size_ = 1;
  size_t treeMaxBytes_ = 0;
  TuningTable tuning_;
  bool layered_ = false;    // algorithms::Hosts::layered: a hierarchy differs from the group
  bool contiguous_ = true;  // algorithms::Hosts::contiguous: each host's ranks consecutive
  Algorithm allreduce_ = Algorithm::Auto, broadcast_ = Algorithm::Auto, reduce_ = Algorithm::Auto,
            barrier_ = Algorithm::Auto;  // RDMACC_ALGO_<OP>
};

}  // namespace rdmacc
