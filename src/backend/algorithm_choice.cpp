#include "src/backend/algorithm_choice.hpp"

#include <algorithm>
#include <string>

#include <fmt/format.h>

#include "rdmacc/error.hpp"
#include "src/backend/arguments.hpp"

namespace rdmacc {

AlgorithmChoice::AlgorithmChoice(const Config& config, TuningTable tuning,
                                 const algorithms::Hosts& hosts, int size)
    : size_(size),
      treeMaxBytes_(static_cast<size_t>(config.getInt("RDMACC_TREE_MAX_BYTES"))),
      tuning_(std::move(tuning)),
      layered_(hosts.layered()),
      contiguous_(hosts.contiguous()) {
  auto read = [&](const char* name) {
    return algorithmNamed(config.getString(name)).value_or(Algorithm::Auto);
  };
  allreduce_ = read("RDMACC_ALGO_ALLREDUCE");
  broadcast_ = read("RDMACC_ALGO_BROADCAST");
  reduce_ = read("RDMACC_ALGO_REDUCE");
  barrier_ = read("RDMACC_ALGO_BARRIER");
}

Algorithm AlgorithmChoice::forced(OpType collective) const {
  switch (collective) {
    case OpType::Allreduce:
      return allreduce_;
    case OpType::Broadcast:
      return broadcast_;
    case OpType::Reduce:
      return reduce_;
    case OpType::Barrier:
      return barrier_;
    default:
      return Algorithm::Auto;
  }
}

OpType AlgorithmChoice::selectionOf(OpType type) noexcept {
  switch (type) {
    case OpType::AllreduceCoalesced:
      return OpType::Allreduce;
    case OpType::AllgatherBase:
    case OpType::AllgatherCoalesced:
      return OpType::Allgather;
    case OpType::ReduceScatterBase:
      return OpType::ReduceScatter;
    case OpType::AlltoallBase:
      return OpType::Alltoall;
    default:
      return type;
  }
}

// The choice must be one of the collective's algorithms (algorithmsOf, by
// the name the tuning file also uses): RDMACC_ALGO_* and the tuning table
// were checked against the collective when read, automatic() picks only its
// own, so the call's request is checked here.
Algorithm AlgorithmChoice::choose(Algorithm requested, OpType type, size_t bytes) const {
  const OpType collective = selectionOf(type);
  const std::string_view name = toString(collective);
  Algorithm algo = requested;
  if (algo == Algorithm::Auto) algo = forced(collective);
  if (algo == Algorithm::Auto) {
    if (auto tuned = tuning_.lookup(name, size_, bytes)) algo = *tuned;
  }
  if (algo == Algorithm::Auto) algo = automatic(collective, bytes);
  if (requested != Algorithm::Auto) {
    const auto allowed = algorithmsOf(name);
    if (std::find(allowed.begin(), allowed.end(), algo) == allowed.end()) {
      std::string names;
      for (Algorithm a : allowed)
        names += fmt::format("{}{}", names.empty() ? "" : ", ", toString(a));
      invalid(fmt::format("{} has no {} algorithm", name, toString(algo)),
              fmt::format("use auto, {}", names));
    }
  }
  if (algo == Algorithm::RecursiveDoubling && !algorithms::isPowerOfTwo(size_)) {
    invalid(fmt::format("recursive doubling needs a power-of-two group, not {} ranks", size_),
            "use ring or tree (or auto) for this group");
  }
  return algo;
}

// Hierarchical allreduce and barrier whenever the group is layered (fewer
// and shared network steps); hierarchical broadcast and reduce only when
// ranks of a host are not consecutive: with consecutive ones the flat chain
// or tree already crosses each host boundary once, and forwards one copy per
// rank (docs/performance.md, the hierarchical table).
Algorithm AlgorithmChoice::automatic(OpType collective, size_t bytes) const {
  // Latency-bound allgathers and reduce-scatters (by the gathered or whole
  // size, the same on every rank) go to every rank at once, larger ones
  // around the ring.
  if (collective == OpType::Allgather || collective == OpType::ReduceScatter) {
    return bytes <= treeMaxBytes_ ? Algorithm::Linear : Algorithm::Ring;
  }
  // Alltoall sizes may differ between ranks, so only the group decides:
  // every pair at once in small groups, pairwise steps (no incast) in
  // larger ones.
  if (collective == OpType::Alltoall) {
    return size_ <= kLinearAlltoallMaxRanks ? Algorithm::Linear : Algorithm::Pairwise;
  }
  const bool topological = collective == OpType::Allreduce || collective == OpType::Barrier;
  if (layered_ && (topological || !contiguous_)) return Algorithm::Hierarchical;
  if (collective == OpType::Barrier) return Algorithm::Dissemination;
  if (collective == OpType::Reduce) return Algorithm::Tree;
  if (bytes > treeMaxBytes_) return Algorithm::Ring;
  // Small allreduces in power-of-two groups: log2 n exchanges instead of a
  // tree's 2 log2 n hops.
  return collective == OpType::Allreduce && size_ > 1 && algorithms::isPowerOfTwo(size_)
             ? Algorithm::RecursiveDoubling
             : Algorithm::Tree;
}

}  // namespace rdmacc
