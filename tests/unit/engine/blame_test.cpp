// Who a timed-out group is stuck on (src/engine/blame.hpp): the chains through the
// reports the ranks sent, with a clock the test controls.
#include "src/engine/blame.hpp"

#include <gtest/gtest.h>

#include <chrono>

namespace rdmacc {
namespace {

using namespace std::chrono_literals;
using Clock = StuckSearch::Clock;

const Clock::time_point t0{};
const Clock::time_point deadline = t0 + 1s;

// A ring of 4 with rank 1 stopped: 0 waits for 3, 3 for 2, 2 for 1, and 1
// never answers: known only at the deadline.
TEST(Blame, TheChainEndsAtTheRankThatDoesNotReport) {
  StuckSearch s(0, 4, {3}, deadline);
  s.report(3, std::vector<int>{2});
  s.report(2, std::vector<int>{1});
  EXPECT_EQ(s.conclusion(t0 + 10ms), std::nullopt);  // rank 1 may still answer
  EXPECT_EQ(s.conclusion(deadline), (std::vector<int>{1}));
}

TEST(Blame, AReportArrivingWithinTheGraceIsFollowed) {
  StuckSearch s(0, 4, {2}, deadline);
  EXPECT_EQ(s.conclusion(t0 + 100ms), std::nullopt);
  s.report(2, std::vector<int>{3});
  s.report(3, std::vector<int>{});  // waits for nobody: known at once
  EXPECT_EQ(s.conclusion(t0 + 200ms), (std::vector<int>{3}));
}

TEST(Blame, WaitingForTheWaiterIsACycleNotACulprit) {
  StuckSearch s(0, 2, {1}, deadline);
  s.report(1, std::vector<int>{0});  // 0 and 1 wait for each other: different collectives
  EXPECT_EQ(s.conclusion(t0), (std::vector<int>{}));
}

TEST(Blame, EveryBranchIsFollowed) {
  StuckSearch s(0, 5, {1, 3}, deadline);
  s.report(1, std::vector<int>{2});
  s.report(3, std::vector<int>{4});
  EXPECT_EQ(s.conclusion(deadline), (std::vector<int>{2, 4}));
  // A branch that loops back and one that ends: only the end is named.
  StuckSearch t(0, 4, {1, 2}, deadline);
  t.report(1, std::vector<int>{0});
  t.report(2, std::vector<int>{3});
  EXPECT_EQ(t.conclusion(t0), std::nullopt);
  EXPECT_EQ(t.conclusion(deadline), (std::vector<int>{3}));
}

// A report is hostile input: anything but ranks of the group ends the chain
// at its writer, and nothing is read out of range.
TEST(Blame, ACorruptReportEndsTheChainAtItsWriter) {
  for (const std::string& bad :
       std::vector<std::string>{"x", "1,", "-1", "99", "1;2", ",", std::string(10000, '1')}) {
    EXPECT_EQ(parseRanks(bad, 4), std::nullopt) << bad;
    StuckSearch s(0, 4, {1}, deadline);
    s.report(1, parseRanks(bad, 4));
    EXPECT_EQ(s.conclusion(t0), (std::vector<int>{1})) << bad;
  }
  // Reports from outside the group, from itself, or a second one are ignored.
  StuckSearch s(0, 4, {1}, deadline);
  s.report(-1, std::vector<int>{});
  s.report(7, std::vector<int>{});
  s.report(0, std::vector<int>{});
  s.report(1, std::vector<int>{2});
  s.report(1, std::vector<int>{});
  EXPECT_EQ(s.conclusion(deadline), (std::vector<int>{2}));
}

TEST(Blame, ARankThatWaitsForNobodyIsTheEnd) {
  StuckSearch s(0, 3, {1}, deadline);
  s.report(1, std::vector<int>{});
  EXPECT_EQ(s.conclusion(t0), (std::vector<int>{1}));
}

TEST(Blame, RanksTravelAsTextWithinABound) {
  EXPECT_EQ(formatRanks({2, 5, 11}, 100), "2,5,11");
  EXPECT_EQ(parseRanks("2,5,11", 12), (std::vector<int>{2, 5, 11}));
  EXPECT_EQ(parseRanks("", 4), std::vector<int>{});
  EXPECT_EQ(formatRanks({2, 5, 11}, 4), "2,5");  // cut at an entry, still parses
  EXPECT_EQ(formatRanks({}, 4), "");
}

}  // namespace
}  // namespace rdmacc
