#include <gtest/gtest.h>

#include <limits>

#include "rdmacc/error.hpp"
#include "rdmacc/tuning.hpp"

using namespace rdmacc;

TEST(Tuning, PicksTheFirstRuleWhoseBoundHoldsForTheNearestWorldSize) {
  auto t = TuningTable::parse(
      "# a comment\n"
      "allreduce 2 4096 tree   # trailing comment\n"
      "allreduce 2 max ring\n"
      "allreduce 8 65536 tree\n"
      "allreduce 8 max ring\n"
      "\n"
      "broadcast 4 max tree\n",
      "t");
  EXPECT_EQ(t.lookup("allreduce", 2, 8), Algorithm::Tree);
  EXPECT_EQ(t.lookup("allreduce", 2, 4096), Algorithm::Tree);
  EXPECT_EQ(t.lookup("allreduce", 2, 4097), Algorithm::Ring);
  EXPECT_EQ(t.lookup("allreduce", 3, 8192), Algorithm::Ring);  // nearest: 2
  EXPECT_EQ(t.lookup("allreduce", 6, 8192), Algorithm::Tree);  // nearest: 8
  EXPECT_EQ(t.lookup("allreduce", 5, 8192), Algorithm::Ring);  // tie 2/8: the smaller
  EXPECT_EQ(t.lookup("broadcast", 64, 1 << 30), Algorithm::Tree);
  EXPECT_EQ(t.lookup("reduce", 2, 8), std::nullopt);
}

TEST(Tuning, SizesPastTheLastBoundFallThrough) {
  auto t = TuningTable::parse("allreduce 4 1024 tree\n", "t");
  EXPECT_EQ(t.lookup("allreduce", 4, 2048), std::nullopt);
}

TEST(Tuning, BadLinesAreNamedWithFileAndLine) {
  auto message = [](const char* text) {
    try {
      TuningTable::parse(text, "tune.txt");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("allreduce 4 1024\n").find("tune.txt:1: expected 4 fields"), std::string::npos);
  EXPECT_NE(
      message("\nalltoall 4 1024 ring\n")
          .find("tune.txt:2: unknown collective 'alltoall' (allreduce, broadcast, allgather)"),
      std::string::npos);
  EXPECT_NE(message("allgather 4 1024 tree\n")
                .find("unknown algorithm 'tree' for allgather (ring, linear)"),
            std::string::npos);
  EXPECT_EQ(TuningTable::parse("allgather 4 1024 linear\nallgather 4 max ring\n", "t")
                .lookup("allgather", 4, 512),
            Algorithm::Linear);
  EXPECT_NE(message("allreduce 0 1024 ring\n").find("bad rank count"), std::string::npos);
  EXPECT_NE(message("allreduce 4 -5 ring\n").find("bad byte bound"), std::string::npos);
  EXPECT_NE(message("allreduce 4 1k ring\n").find("bad byte bound"), std::string::npos);
  EXPECT_NE(message("allreduce 4 max doubling\n").find("unknown algorithm"), std::string::npos);
  EXPECT_NE(message("allreduce 4 max ring extra\n").find("expected 4 fields"), std::string::npos);
  EXPECT_THROW(TuningTable::load("/nonexistent/tune.txt"), Error);
}

TEST(Tuning, FormatParsesBack) {
  TuningTable t;
  t.add({.collective = "allreduce", .ranks = 4, .upTo = 65536, .algorithm = Algorithm::Tree});
  t.add({.collective = "allreduce",
         .ranks = 4,
         .upTo = std::numeric_limits<size_t>::max(),
         .algorithm = Algorithm::Ring});
  std::string text = t.format("measured on rxe0\n4 ranks");
  EXPECT_NE(text.find("# measured on rxe0\n# 4 ranks\n"), std::string::npos);
  EXPECT_NE(text.find("allreduce 4 max ring\n"), std::string::npos);
  auto back = TuningTable::parse(text, "t");
  ASSERT_EQ(back.rules().size(), 2u);
  EXPECT_EQ(back.lookup("allreduce", 4, 65536), Algorithm::Tree);
  EXPECT_EQ(back.lookup("allreduce", 4, 65537), Algorithm::Ring);
}
