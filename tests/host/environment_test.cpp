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
          "MASTER_ADDR", "MASTER_PORT"}) {
      ::unsetenv(name);
    }
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

}  // namespace
}  // namespace rdmacc
