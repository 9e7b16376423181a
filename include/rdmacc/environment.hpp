// Who am I and where is the store: read from the launcher's environment.
#pragma once

#include <memory>
#include <string>

#include "rdmacc/config.hpp"
#include "rdmacc/store.hpp"

namespace rdmacc {

struct GroupEnvironment {
  int rank = 0;
  int size = 1;
  int localRank = 0;     // localRankFromEnvironment()
  std::string launcher;  // "torchrun/rdmacc-run", "mpirun", "srun" or "single process"
  std::shared_ptr<Store> store;
  // The launcher's exchange among these ranks (PMIx); empty: the store.
  AllGather allGather;
};

// Rank and size from RANK/WORLD_SIZE (torchrun, rdmacc-run),
// OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE (Open MPI), PMI_RANK/PMI_SIZE
// (MPICH, Intel MPI) or SLURM_PROCID/SLURM_NTASKS (srun); with none of them,
// a group of one. The store is a TCPStore at MASTER_ADDR:MASTER_PORT, hosted by
// rank 0 unless RDMACC_AGENT_STORE=1 says the launcher hosts it. Throws Error
// naming the variable that is missing or malformed.
GroupEnvironment groupFromEnvironment(const Config& config);

// The job's shared secret: RDMACC_AUTH_KEY, or the contents of
// RDMACC_AUTH_KEY_FILE (mode 600); "" when neither is set. Throws
// Error(InvalidArgument) naming what is wrong with the file.
std::string authKey(const Config& config);

// The limits of a TCP store server hosted by this process, from the
// configuration (RDMACC_STORE_MEMORY).
TCPStoreServerLimits storeServerLimits(const Config& config);

// This process's rank among the ranks of its host, from LOCAL_RANK,
// OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID or SLURM_LOCALID (the launcher
// that set the rank); 0 when none is set. Throws Error naming a malformed one.
int localRankFromEnvironment();
// How many ranks the launcher started on this host, from LOCAL_WORLD_SIZE,
// OMPI_COMM_WORLD_LOCAL_SIZE, MPI_LOCALNRANKS or srun's
// SLURM_STEP_TASKS_PER_NODE at SLURM_NODEID; 0 when unknown (a plain
// environment launch). Throws Error naming a malformed one.
int localSizeFromEnvironment();

// This host's name (gethostname), "" when it has none: for log lines, file
// names and JSON records.
std::string hostName();

// The launcher variables of this process (RANK, WORLD_SIZE, LOCAL_RANK,
// MASTER_ADDR, MASTER_PORT, OMPI_COMM_WORLD_*, PMI_*, SLURM_PROCID, ...) as
// "NAME=value" in a fixed order, for the startup log line; empty when none
// is set (a caller that passed its own store).
std::vector<std::string> launcherVariables();

}  // namespace rdmacc
