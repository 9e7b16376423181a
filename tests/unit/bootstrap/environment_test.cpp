// Rank, size and store from the launcher's variables: what a process that
// was started wrongly learns at once instead of waiting for its peers.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "rdmacc/config.hpp"
#include "rdmacc/environment.hpp"
#include "rdmacc/error.hpp"

namespace rdmacc {
namespace {

// The launcher variables of one test; everything else of the kind unset.
class LauncherEnvironment : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* name :
         {"RANK", "WORLD_SIZE", "LOCAL_RANK", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
          "PMI_RANK", "PMI_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_STEP_ID",
          "MASTER_ADDR", "MASTER_PORT", "PMIX_NAMESPACE", "PMIX_RANK", "RDMACC_BOOTSTRAP",
          "LOCAL_WORLD_SIZE", "SLURM_NODEID", "SLURM_STEP_TASKS_PER_NODE"}) {
      ::unsetenv(name);
    }
  }
  static std::string localSizeError() {
    try {
      localSizeFromEnvironment();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
  static std::string error() {
    try {
      groupFromEnvironment(Config::load());
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
};

// sbatch runs the batch script once, with the allocation's SLURM_NTASKS and
// SLURM_PROCID=0 but no job step of srun's: without srun nobody starts the
// other ranks, and rank 0 would wait for them until the connect timeout.
TEST_F(LauncherEnvironment, TheBatchScriptOfAnSbatchJobIsNotAGroupOfFour) {
  ::setenv("SLURM_PROCID", "0", 1);
  ::setenv("SLURM_NTASKS", "4", 1);
  ::setenv("MASTER_ADDR", "127.0.0.1", 1);  // as docs/multi-node.md has the script export it
  ::setenv("MASTER_PORT", "29431", 1);
  const std::string unset = error();
  EXPECT_NE(unset.find("SLURM_NTASKS=4 but this process is not a task of an srun step "
                       "(SLURM_STEP_ID unset)"),
            std::string::npos)
      << unset;
  EXPECT_NE(unset.find("srun python3 train.py"), std::string::npos) << unset;
  ::setenv("SLURM_STEP_ID", "4294967294", 1);  // the batch step
  EXPECT_NE(error().find("(SLURM_STEP_ID 4294967294)"), std::string::npos) << error();
}

TEST_F(LauncherEnvironment, AnSrunTaskGoesOnToTheStore) {
  ::setenv("SLURM_PROCID", "2", 1);
  ::setenv("SLURM_NTASKS", "4", 1);
  ::setenv("SLURM_STEP_ID", "0", 1);
  // Past the srun check: what it lacks now is the store's address.
  EXPECT_NE(error().find("MASTER_ADDR/MASTER_PORT are not set"), std::string::npos) << error();
  // One task needs no other rank, step or not.
  ::unsetenv("SLURM_STEP_ID");
  ::setenv("SLURM_PROCID", "0", 1);
  ::setenv("SLURM_NTASKS", "1", 1);
  GroupEnvironment g = groupFromEnvironment(Config::load());
  EXPECT_EQ(g.size, 1);
  EXPECT_EQ(g.launcher, "srun");
}

// RDMACC_BOOTSTRAP=pmix is a promise that a PMIx launcher started the rank:
// without one the rank says so at once instead of falling back to variables.
TEST_F(LauncherEnvironment, PmixRequiredWithoutAPmixLauncherIsAnError) {
  ::setenv("RDMACC_BOOTSTRAP", "pmix", 1);
  ::setenv("SLURM_PROCID", "0", 1);
  ::setenv("SLURM_NTASKS", "2", 1);
  ::setenv("SLURM_STEP_ID", "0", 1);
  const std::string e = error();
  EXPECT_NE(e.find("RDMACC_BOOTSTRAP=pmix but no PMIx server started this process"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("srun --mpi=pmix"), std::string::npos) << e;
  ::setenv("RDMACC_BOOTSTRAP", "pmi", 1);
  EXPECT_NE(error().find("RDMACC_BOOTSTRAP='pmi' is not one of auto, pmix, env"), std::string::npos)
      << error();
}

// torchrun inside an srun step inherits srun's PMIX_* variables, which
// describe srun's tasks: RANK/WORLD_SIZE (torchrun's) win under auto, and
// RDMACC_BOOTSTRAP=env ignores PMIx outright. Both paths then need
// MASTER_ADDR, which proves neither went to PMIx (no server here).
TEST_F(LauncherEnvironment, TorchrunsRankWinsOverInheritedPmixVariables) {
  ::setenv("PMIX_NAMESPACE", "slurm.pmix.7.0", 1);
  ::setenv("PMIX_RANK", "0", 1);
  ::setenv("RANK", "1", 1);
  ::setenv("WORLD_SIZE", "2", 1);
  EXPECT_NE(error().find("MASTER_ADDR/MASTER_PORT are not set"), std::string::npos) << error();
  ::unsetenv("RANK");
  ::unsetenv("WORLD_SIZE");
  ::setenv("RDMACC_BOOTSTRAP", "env", 1);
  ::setenv("OMPI_COMM_WORLD_RANK", "1", 1);
  ::setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
  const std::string e = error();
  EXPECT_NE(e.find("MASTER_ADDR/MASTER_PORT are not set"), std::string::npos) << e;
  EXPECT_NE(e.find("Open MPI's mpirun starts ranks through PMIx"), std::string::npos) << e;
}

// srun gives no local size of its own, only a compressed count per node of
// the step; a group that spans nodes knows it needs RDMA from that before
// the host exchange (2 store requests per rank instead of 5).
TEST_F(LauncherEnvironment, AnSrunTasksLocalSizeIsItsNodesCount) {
  ::setenv("SLURM_PROCID", "9", 1);
  ::setenv("SLURM_NTASKS", "11", 1);
  EXPECT_EQ(localSizeFromEnvironment(), 0);  // no list: unknown
  ::setenv("SLURM_STEP_TASKS_PER_NODE", "4(x2),3", 1);
  ::setenv("SLURM_NODEID", "0", 1);
  EXPECT_EQ(localSizeFromEnvironment(), 4);
  ::setenv("SLURM_NODEID", "1", 1);
  EXPECT_EQ(localSizeFromEnvironment(), 4);
  ::setenv("SLURM_NODEID", "2", 1);
  EXPECT_EQ(localSizeFromEnvironment(), 3);
  ::setenv("SLURM_STEP_TASKS_PER_NODE", "8", 1);
  ::setenv("SLURM_NODEID", "0", 1);
  EXPECT_EQ(localSizeFromEnvironment(), 8);
}

TEST_F(LauncherEnvironment, AMalformedSrunCountPerNodeIsNamed) {
  ::setenv("SLURM_PROCID", "0", 1);
  ::setenv("SLURM_NTASKS", "8", 1);
  ::setenv("SLURM_NODEID", "0", 1);
  for (const char* bad : {"4(x2", "x2", "4,,3", "4(x0)", "0", "99999999999", "4;3", "4(x2),"}) {
    ::setenv("SLURM_STEP_TASKS_PER_NODE", bad, 1);
    const std::string e = localSizeError();
    EXPECT_NE(e.find(std::string("SLURM_STEP_TASKS_PER_NODE=") + bad + " is not a list of counts"),
              std::string::npos)
        << bad << ": " << e;
  }
  ::setenv("SLURM_STEP_TASKS_PER_NODE", "4(x2)", 1);
  ::setenv("SLURM_NODEID", "2", 1);
  EXPECT_NE(localSizeError().find("has no count for this node (SLURM_NODEID=2)"), std::string::npos)
      << localSizeError();
}

}  // namespace
}  // namespace rdmacc
