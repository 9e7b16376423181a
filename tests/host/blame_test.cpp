// Who a timed-out group is stuck on (src/blame.hpp), with an in-process store
// standing in for the other ranks' reports.
#include "src/blame.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "src/socket.hpp"

namespace rdmacc {
namespace {

using namespace std::chrono_literals;

const std::string kPrefix = "rdmacc/stuck/g";

void report(Store& store, int rank, const std::string& waitsFor) {
  store.set(kPrefix + "/" + std::to_string(rank), toBytes(waitsFor));
}

// A ring of 4 with rank 1 stopped: 0 waits for 3, 3 for 2, 2 for 1.
TEST(Blame, TheChainEndsAtTheRankThatDoesNotReport) {
  HashStore store;
  report(store, 3, "2");
  report(store, 2, "1");
  bool answered = false;
  EXPECT_EQ(stuckOn(store, kPrefix, 0, 4, {3}, 200ms, &answered), (std::vector<int>{1}));
  EXPECT_TRUE(answered);
  // and rank 0 published what it waits for
  EXPECT_EQ(toString(store.get(kPrefix + "/0")), "3");
}

TEST(Blame, AReportArrivingWithinTheGraceIsFollowed) {
  HashStore store;
  std::thread late([&] {
    std::this_thread::sleep_for(100ms);
    report(store, 2, "3");
  });
  EXPECT_EQ(stuckOn(store, kPrefix, 0, 4, {2}, 1000ms), (std::vector<int>{3}));
  late.join();
}

TEST(Blame, WaitingForTheWaiterIsACycleNotACulprit) {
  HashStore store;
  report(store, 1, "0");  // 0 and 1 wait for each other: different collectives
  EXPECT_EQ(stuckOn(store, kPrefix, 0, 2, {1}, 100ms), (std::vector<int>{}));
}

TEST(Blame, EveryBranchIsFollowed) {
  HashStore store;
  report(store, 1, "2");
  report(store, 3, "4");
  EXPECT_EQ(stuckOn(store, kPrefix, 0, 5, {1, 3}, 100ms), (std::vector<int>{2, 4}));
}

// A report is hostile input: anything but ranks of the group ends the chain
// at its writer, and nothing is read out of range.
TEST(Blame, ACorruptReportEndsTheChainAtItsWriter) {
  for (const std::string& bad :
       std::vector<std::string>{"x", "1,", "-1", "99", "1;2", std::string(10000, '1')}) {
    HashStore store;
    report(store, 1, bad);
    EXPECT_EQ(stuckOn(store, kPrefix, 0, 4, {1}, 100ms), (std::vector<int>{1})) << bad;
  }
}

TEST(Blame, ARankThatWaitsForNobodyIsTheEnd) {
  HashStore store;
  report(store, 1, "");
  EXPECT_EQ(stuckOn(store, kPrefix, 0, 3, {1}, 100ms), (std::vector<int>{1}));
}

// The stopped rank is rank 0, and the store lives in it: its server is
// frozen (the kernel still accepts connections). The search ends within its
// grace instead of the store's timeout (a survivor hung for minutes).
TEST(Blame, AFrozenStoreHostEndsTheSearchWithinTheGrace) {
  auto listener = net::listenTcp("127.0.0.1", 0);  // accepts; nobody answers
  TCPStore store("127.0.0.1", net::localPort(listener.get()),
                 TCPStoreOptions{.timeout = 60s, .connectTimeout = 1s});
  const auto start = std::chrono::steady_clock::now();
  bool answered = true;
  EXPECT_EQ(stuckOn(store, kPrefix, 2, 4, {1}, 300ms, &answered), (std::vector<int>{}));
  EXPECT_FALSE(answered);  // the error says so
  EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
}

}  // namespace
}  // namespace rdmacc
