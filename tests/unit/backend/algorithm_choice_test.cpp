// AlgorithmChoice: the order request > RDMACC_ALGO_<OP> > tuning table >
// automatic rule, and the automatic rule's boundaries.
#include <gtest/gtest.h>

#include "rdmacc/error.hpp"
#include "src/backend/algorithm_choice.hpp"

using namespace rdmacc;

namespace {

AlgorithmChoice choiceFor(int size, std::map<std::string, std::string> settings = {},
                          const std::string& tuning = "",
                          algorithms::Hosts hosts = algorithms::Hosts()) {
  if (hosts.size() == 0) hosts = algorithms::Hosts::single(size);
  settings.emplace("RDMACC_TREE_MAX_BYTES", "65536");
  return AlgorithmChoice(Config::load(settings), TuningTable::parse(tuning, "tune.txt"), hosts,
                         size);
}

}  // namespace

TEST(AlgorithmChoice, AutomaticGoesBySizeAndGroup) {
  const auto eight = choiceFor(8);
  EXPECT_EQ(eight.choose(Algorithm::Auto, OpType::Allreduce, 1024), Algorithm::RecursiveDoubling);
  EXPECT_EQ(eight.choose(Algorithm::Auto, OpType::Allreduce, 65537), Algorithm::Ring);
  EXPECT_EQ(choiceFor(6).choose(Algorithm::Auto, OpType::Allreduce, 1024), Algorithm::Tree);
  EXPECT_EQ(eight.choose(Algorithm::Auto, OpType::Broadcast, 1024), Algorithm::Tree);
  EXPECT_EQ(eight.choose(Algorithm::Auto, OpType::Reduce, 1 << 20), Algorithm::Tree);
  EXPECT_EQ(eight.choose(Algorithm::Auto, OpType::Barrier, 0), Algorithm::Dissemination);
  EXPECT_EQ(eight.choose(Algorithm::Auto, OpType::Allgather, 65536), Algorithm::Linear);
  EXPECT_EQ(eight.choose(Algorithm::Auto, OpType::ReduceScatter, 65537), Algorithm::Ring);
  EXPECT_EQ(eight.choose(Algorithm::Auto, OpType::Alltoall, 1), Algorithm::Linear);
  EXPECT_EQ(choiceFor(kLinearAlltoallMaxRanks + 1).choose(Algorithm::Auto, OpType::Alltoall, 1),
            Algorithm::Pairwise);
}

TEST(AlgorithmChoice, VariantsOfACallChooseAsTheirCollective) {
  const auto eight = choiceFor(8);
  EXPECT_EQ(eight.choose(Algorithm::Auto, OpType::AllreduceCoalesced, 65537), Algorithm::Ring);
  EXPECT_EQ(eight.choose(Algorithm::Auto, OpType::AllgatherBase, 65537), Algorithm::Ring);
  EXPECT_EQ(eight.choose(Algorithm::Auto, OpType::AlltoallBase, 1), Algorithm::Linear);
  EXPECT_EQ(AlgorithmChoice::selectionOf(OpType::ReduceScatterBase), OpType::ReduceScatter);
}

TEST(AlgorithmChoice, LayeredGroupsGoHierarchicalWhereItPays) {
  // Two hosts of two ranks, consecutive: allreduce and barrier go
  // hierarchical, broadcast and reduce stay flat; interleaved, all four do.
  const auto consecutive = choiceFor(4, {}, "", algorithms::Hosts({0, 0, 1, 1}));
  EXPECT_EQ(consecutive.choose(Algorithm::Auto, OpType::Allreduce, 8), Algorithm::Hierarchical);
  EXPECT_EQ(consecutive.choose(Algorithm::Auto, OpType::Barrier, 0), Algorithm::Hierarchical);
  EXPECT_EQ(consecutive.choose(Algorithm::Auto, OpType::Broadcast, 8), Algorithm::Tree);
  const auto interleaved = choiceFor(4, {}, "", algorithms::Hosts({0, 1, 0, 1}));
  EXPECT_EQ(interleaved.choose(Algorithm::Auto, OpType::Broadcast, 8), Algorithm::Hierarchical);
  EXPECT_EQ(interleaved.choose(Algorithm::Auto, OpType::Reduce, 8), Algorithm::Hierarchical);
}

TEST(AlgorithmChoice, RequestBeatsSettingBeatsTuningBeatsAutomatic) {
  const auto tuned = choiceFor(8, {}, "allreduce 8 max ring\n");
  EXPECT_EQ(tuned.choose(Algorithm::Auto, OpType::Allreduce, 8), Algorithm::Ring);
  const auto forced = choiceFor(8, {{"RDMACC_ALGO_ALLREDUCE", "tree"}}, "allreduce 8 max ring\n");
  EXPECT_EQ(forced.choose(Algorithm::Auto, OpType::Allreduce, 8), Algorithm::Tree);
  EXPECT_EQ(forced.choose(Algorithm::Ring, OpType::Allreduce, 8), Algorithm::Ring);
  // The setting is the allreduce's only.
  EXPECT_EQ(forced.choose(Algorithm::Auto, OpType::Broadcast, 8), Algorithm::Tree);
  EXPECT_EQ(forced.choose(Algorithm::Auto, OpType::Barrier, 0), Algorithm::Dissemination);
}

TEST(AlgorithmChoice, ARequestTheCollectiveHasNotIsRefusedWithTheChoices) {
  const auto eight = choiceFor(8);
  try {
    (void)eight.choose(Algorithm::Pairwise, OpType::Allreduce, 8);
    FAIL() << "pairwise allreduce was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.info().kind, ErrorKind::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find("allreduce has no pairwise algorithm"), std::string::npos)
        << e.what();
    EXPECT_NE(e.info().hint.find("ring"), std::string::npos) << e.info().hint;
  }
  EXPECT_THROW((void)choiceFor(6).choose(Algorithm::RecursiveDoubling, OpType::Allreduce, 8),
               Error);
}
