#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "rdmacc/store.hpp"

// Bootstrap through the launcher's PMIx server (srun --mpi=pmix, Open MPI's
// mpirun): rank, size and local rank come from it, and records are exchanged
// the way Open MPI and UCX exchange theirs (put, commit, one fence that
// collects everything, then local gets).
namespace rdmacc::pmix {

// Built with libpmix-dev.
bool compiledIn();

// A PMIx server started this process (PMIX_NAMESPACE and PMIX_RANK are set,
// the test Open MPI makes to choose PMIx).
bool launched();

struct Job {
  int rank = 0;
  int size = 1;
  int localRank = 0;
  int localSize = 1;
  std::string nspace;
};

// The process's one PMIx client: initialised on first use, finalised at exit
// (a launcher treats a process that initialised and did not finalise as a
// failed one). Throws Error(InvalidArgument) when not compiledIn(), or
// Error(Store) naming the PMIx status when the server refuses.
const Job& job();

// Every rank of `participants` calls it with the same key, in the same
// order: puts this rank's value, one fence over those ranks collects them,
// and the values are read locally. Returns the values of `wanted` ranks.
// Fails with Error(Timeout) after `timeout` if the fence does not complete
// (a rank that never calls).
std::vector<Bytes> allGather(const std::string& key, const Bytes& mine,
                             const std::vector<int>& participants, const std::vector<int>& wanted,
                             std::chrono::milliseconds timeout);

// Puts and commits this rank's value of `key` (no fence): peers read it with
// lookup, from the next fence's data or, before one, from the server.
void publish(const std::string& key, const Bytes& value);

// `rank`'s value of `key`, waiting up to `timeout` for it.
Bytes lookup(int rank, const std::string& key, std::chrono::milliseconds timeout);

}  // namespace rdmacc::pmix
