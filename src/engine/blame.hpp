// Who the group is stuck on when a collective times out. A rank that times
// out knows only the ranks it waits for directly; with a stopped or hung
// rank, every other rank of a ring waits for its own neighbour, and each
// would name a different, healthy rank. So a rank whose collective timed out
// tells every peer what it waits for (a Stuck message through the transport,
// not the store: the store may live in the stopped rank), a rank that hears
// one answers once with what it waits for itself (timed out or not: it may be
// a collective ahead, waiting there for a rank still stuck in the previous
// one), and each timed-out rank follows the chains: the rank at the end of
// one, which does not answer within the grace period (stopped, hung) or waits
// for nobody (not in a collective at all), is the one the group is stuck on.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "src/core/by_rank.hpp"

namespace rdmacc {

// "2,5" <-> {2, 5}. parseRanks: nullopt unless every entry is a rank of a
// group of `size` (a report is hostile input); "" is the empty list.
std::optional<std::vector<int>> parseRanks(std::string_view text, int size);
// At most maxBytes long: later ranks are left off (a report is a hint).
std::string formatRanks(const std::vector<int>& ranks, size_t maxBytes);

class StuckSearch {
 public:
  using Clock = std::chrono::steady_clock;

  // `rank` waits for `awaited`; reports count until `deadline`.
  StuckSearch(int rank, int size, std::vector<int> awaited, Clock::time_point deadline);

  // What `peer` reported it waits for; nullopt: a corrupt report, which ends
  // its chain at the peer. Later reports of the same peer are ignored.
  void report(int peer, std::optional<std::vector<int>> waitsFor);

  // The ranks at the ends of the chains from `awaited`, ascending; empty when
  // every chain ends in a cycle (ranks waiting for each other: different
  // collectives, not a stuck rank). Known before the deadline once every rank
  // on the chains reported; at the deadline, the ranks that did not report
  // end their chains. nullopt: not known yet.
  std::optional<std::vector<int>> conclusion(Clock::time_point now) const;

  const std::vector<int>& awaited() const noexcept { return awaited_; }

 private:
  int rank_;
  std::vector<int> awaited_;
  Clock::time_point deadline_;
  ByRank<bool> reported_;
  ByRank<std::optional<std::vector<int>>> reports_;  // nullopt: corrupt
};

}  // namespace rdmacc
