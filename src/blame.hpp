// Who the group is stuck on when a collective times out. A rank that times
// out knows only the ranks it waits for directly; with a stopped or hung
// rank, every other rank of a ring waits for its own neighbour, and each
// would name a different, healthy rank. So on a timeout each rank publishes
// what it waits for through the store and follows the chain: the rank at the
// end of it, one that does not report within the grace period (stopped,
// hung, or not in this operation at all), is the one the group is stuck on.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "rdmacc/store.hpp"

namespace rdmacc {

// Publishes that `rank` waits for `awaited` under `prefix` (one key per
// rank: the group's, the same on every rank; not the operation's, since the
// ranks of a stuck group need not be in the same operation: a rank that got
// all its data goes on to the next collective and waits there for one still
// stuck in the previous), then follows the chains
// from `awaited` through the other ranks' reports, waiting up to `grace` in
// all for reports not there yet. Returns the ranks at the ends of the
// chains, ascending; empty when every chain ends in a cycle (ranks waiting
// for each other: different collectives, not a stuck rank). A report that
// is not a list of ranks of the group (hostile or corrupt) ends its chain at
// the rank that wrote it. Store errors end the search (best effort: the
// timeout is reported either way), and so does `grace` even when the store's
// host is frozen (CallBudget; torch's stores bound only their waits).
// *storeAnswered (when given) says whether every store call succeeded.
std::vector<int> stuckOn(Store& store, const std::string& prefix, int rank, int size,
                         const std::vector<int>& awaited, std::chrono::milliseconds grace,
                         bool* storeAnswered = nullptr);

}  // namespace rdmacc
