// Failures on a real device: every surviving rank learns within the timeout,
// with the culprit named, and nothing hangs. Run under `rdmacc-run -n 3`.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "rdmacc/backend.hpp"
#include "rdmacc/error.hpp"
#include "rdmacc/log.hpp"
#include "tests/device/group.hpp"

namespace rdmacc {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

std::shared_ptr<VerbsBackend> makeBackend(const std::string& group) {
  return test::groupFromEnvironment(
      group, {{"RDMACC_SLOT_BYTES", "4096"}, {"RDMACC_SLOTS_PER_PEER", "4"}});
}

// Waits for w and returns its error text ("" on success) and how long it took.
std::pair<std::string, Clock::duration> outcome(const std::shared_ptr<Work>& w,
                                                Clock::time_point since) {
  try {
    w->wait();
    return {"", Clock::now() - since};
  } catch (const Error& e) {
    return {e.what(), Clock::now() - since};
  }
}

TEST(Failure, RankKilledMidAllreduceIsNamedByEverySurvivor) {
  auto backend = makeBackend("killed");
  const int rank = backend->getRank(), size = backend->getSize();
  ASSERT_GE(size, 3);
  const int victim = size - 1;
  // Three independent 1 MiB allreduces issued without waiting (they run at
  // once): many chunks still in flight when the victim dies.
  std::vector<std::vector<float>> data(3, std::vector<float>(1 << 18, 1.0f));
  backend->barrier()->wait();
  auto start = Clock::now();
  std::vector<std::shared_ptr<Work>> works;
  for (auto& d : data) {
    std::vector<Tensor> t{Tensor{d.data(), d.size(), DataType::Float32}};
    works.push_back(
        backend->allreduce(t, AllreduceOptions{.timeout = 20s, .algorithm = Algorithm::Ring}));
  }
  // The victim dies at once: through shared memory 3 MiB take well under a
  // millisecond, so any wait could let the allreduces finish first.
  if (rank == victim) {
    std::fflush(stdout);
    std::_Exit(
        0);  // no destructors, no goodbye: the kernel tears the connections down, as on a crash
  }
  for (const auto& w : works) {
    auto [error, took] = outcome(w, start);
    EXPECT_NE(error, "") << "an allreduce succeeded without rank " << victim;
    EXPECT_NE(error.find(fmt::format("rank {}", victim)), std::string::npos) << error;
    EXPECT_LT(took, 20s + 5s) << error;
    fmt::print("rank {} learned after {} ms: {}\n", rank,
               std::chrono::duration_cast<std::chrono::milliseconds>(took).count(), error);
  }
  // Later operations fail at once; the backend is destroyed cleanly afterwards.
  auto later = outcome(backend->barrier(), Clock::now());
  EXPECT_NE(later.first, "");
  EXPECT_LT(later.second, 2s);
}

// The dead rank's death is passed on: a survivor whose own operation does not
// involve it (rank 2 waits for rank 1, which waits for the dead rank 0) fails
// at once, naming rank 0 as the cause, instead of waiting for its timeout and
// blaming rank 1.
TEST(Failure, DeathIsPassedOnToRanksThatDoNotTalkToTheDeadRank) {
  auto backend = makeBackend("relay");
  const int rank = backend->getRank(), size = backend->getSize();
  ASSERT_EQ(size, 3);
  backend->barrier()->wait();
  std::vector<float> data(16, 1.0f);
  std::vector<Tensor> t{Tensor{data.data(), data.size(), DataType::Float32}};
  if (rank == 0) {
    std::this_thread::sleep_for(300ms);
    std::fflush(stdout);
    std::_Exit(0);
  }
  auto start = Clock::now();
  auto w = rank == 1 ? backend->recv(t, 0, 7) : backend->recv(t, 1, 8);
  auto [error, took] = outcome(w, start);
  fmt::print("rank {} learned after {} ms: {}\n", rank,
             std::chrono::duration_cast<std::chrono::milliseconds>(took).count(), error);
  EXPECT_NE(error, "");
  EXPECT_NE(error.find("rank 0"), std::string::npos) << error;
  // The relay is immediate; the VM's grace and scheduling take a few hundred ms.
  EXPECT_LT(took, 5s) << "rank " << rank << " waited for its timeout: " << error;
}

// The report travels along the connections: ranks 1..n-1 wait in a chain
// (rank r for rank r - 1) after one message down the chain connected each
// pair, and rank 0 dies. Connecting on first use, rank 1 (which sees the
// death) is connected only to its neighbours, so the ranks further down
// learn it from the rank before them, and every one names rank 0 long
// before its timeout instead of blaming the rank it waits for.
TEST(Failure, DeathIsPassedOnAlongAChainOfConnections) {
  constexpr auto kTimeout = 30s;
  auto backend = test::groupFromEnvironment(
      "chain", {{"RDMACC_SLOT_BYTES", "4096"},
                {"RDMACC_SLOTS_PER_PEER", "4"},
                {"RDMACC_TIMEOUT", fmt::format("{}s", kTimeout.count())},
                {"RDMACC_CONNECT", "lazy"},
                {"RDMACC_SHM_ONE_SHOT_BYTES", "0"}});  // no board: local peers map lazily too
  const int rank = backend->getRank(), size = backend->getSize();
  ASSERT_GE(size, 4);
  std::vector<float> data(16, 1.0f);
  std::vector<Tensor> t{Tensor{data.data(), data.size(), DataType::Float32}};
  // No barrier: it would connect each rank to log2(size) others.
  if (rank > 0) backend->recv(t, rank - 1, 1)->wait();
  if (rank + 1 < size) backend->send(t, rank + 1, 1)->wait();
  if (rank == 0) {
    std::this_thread::sleep_for(300ms);
    std::fflush(stdout);
    std::_Exit(0);
  }
  auto start = Clock::now();
  auto [error, took] = outcome(backend->recv(t, rank - 1, 2), start);
  fmt::print("rank {} learned after {} ms: {}\n", rank,
             std::chrono::duration_cast<std::chrono::milliseconds>(took).count(), error);
  EXPECT_NE(error.find("rank 0"), std::string::npos) << error;
  EXPECT_LT(took, kTimeout / 3) << "rank " << rank << " waited for its timeout: " << error;
}

// A rank that sent and then left (its collectives and sends complete, it
// destroys its backend and exits, as a rank does that finishes first) has
// delivered: the others take its messages after it is gone, as over TCP.
// (ZeroRedundancyOptimizer's last broadcasts came from a rank that had
// already left; the receivers failed with "its backend went away".)
TEST(Failure, WhatALeavingRankSentIsStillDelivered) {
  auto backend = makeBackend("leaving");
  const int rank = backend->getRank(), size = backend->getSize();
  ASSERT_GE(size, 3);
  const int leaver = size - 1;
  backend->barrier()->wait();
  std::vector<float> message(3000), broadcast(64);  // 3 chunks of a 4 KiB slot; 1
  std::vector<Tensor> m{Tensor{message.data(), message.size(), DataType::Float32}};
  std::vector<Tensor> b{Tensor{broadcast.data(), broadcast.size(), DataType::Float32}};
  if (rank == leaver) {
    for (size_t i = 0; i < message.size(); ++i) message[i] = static_cast<float>(i);
    for (size_t i = 0; i < broadcast.size(); ++i) broadcast[i] = static_cast<float>(2 * i);
    auto sent = backend->send(m, 0, 5);
    backend->broadcast(b, BroadcastOptions{.rootRank = leaver, .timeout = 20s})->wait();
    sent->wait();
    backend.reset();
    std::fflush(stdout);
    std::_Exit(0);
  }
  // Well past the departure's grace: the leaver is gone when these start.
  std::this_thread::sleep_for(1500ms);
  auto got = rank == 0 ? outcome(backend->recv(m, leaver, 5), Clock::now())
                       : std::pair<std::string, Clock::duration>{};
  EXPECT_EQ(got.first, "");
  auto [error, took] = outcome(
      backend->broadcast(b, BroadcastOptions{.rootRank = leaver, .timeout = 20s}), Clock::now());
  EXPECT_EQ(error, "");
  for (size_t i = 0; i < broadcast.size(); ++i) ASSERT_EQ(broadcast[i], 2.0f * i) << i;
  if (rank == 0) {
    for (size_t i = 0; i < message.size(); ++i) ASSERT_EQ(message[i], 1.0f * i) << i;
  }
  // What it did not send is not waited for: a receive from it fails at once
  // (on rank 0, once rank 1 surely finished: the failure breaks the group).
  if (rank == 0) {
    std::this_thread::sleep_for(500ms);
    auto [late, lateTook] = outcome(backend->recv(m, leaver, 6), Clock::now());
    EXPECT_NE(late.find(fmt::format("rank {}", leaver)), std::string::npos) << late;
    EXPECT_LT(lateTook, 2s) << late;
  }
}

TEST(Failure, TimeoutNamesTheOpAndTheAwaitedRank) {
  auto backend = makeBackend("timeout");
  const int rank = backend->getRank(), size = backend->getSize();
  ASSERT_GE(size, 3);
  const int absent = 1;  // never calls the allreduce
  std::vector<float> data(1000, 1.0f);
  std::vector<Tensor> t{Tensor{data.data(), data.size(), DataType::Float32}};
  backend->barrier()->wait();
  auto start = Clock::now();
  if (rank == absent) {
    // It calls the next collective late, and learns that the group broke.
    std::this_thread::sleep_for(6s);
    auto [error, took] = outcome(backend->barrier(), start);
    EXPECT_NE(error, "");
    EXPECT_NE(error.find("allreduce #2"), std::string::npos) << error;
    return;
  }
  // The absent rank's right neighbour waits on it directly and times out
  // first; the others learn from its abort message, which names rank 1.
  const bool neighbour = rank == (absent + 1) % size;
  const auto timeout = neighbour ? 3s : 6s;
  // The rank that times out logs what it sees of the path to the awaited
  // rank (troubleshooting.md): nothing arrived from it, its credits.
  std::mutex linesMutex;
  std::vector<std::string> lines;
  setLogSink([&](LogLevel, std::string_view line) {
    std::lock_guard lock(linesMutex);
    lines.emplace_back(line);
  });
  auto [error, took] = outcome(
      backend->allreduce(t, AllreduceOptions{.timeout = timeout, .algorithm = Algorithm::Ring}),
      start);
  setLogSink(nullptr);
  EXPECT_NE(error.find("allreduce #2"), std::string::npos) << error;
  EXPECT_NE(error.find("timed out after 3000 ms, still waiting for rank(s) 1"), std::string::npos)
      << error;
  EXPECT_LT(took, timeout + 5s) << error;
  if (neighbour) {
    std::lock_guard lock(linesMutex);
    const auto diagnosis = std::find_if(lines.begin(), lines.end(), [](const std::string& l) {
      return l.find("allreduce #2 (") != std::string::npos &&
             l.find("step 0 waits for rank 1: ") != std::string::npos;
    });
    ASSERT_NE(diagnosis, lines.end()) << fmt::format("{}", fmt::join(lines, "\n"));
    EXPECT_NE(diagnosis->find("credits "), std::string::npos) << *diagnosis;
    EXPECT_NE(diagnosis->find("0 message(s) waiting"), std::string::npos) << *diagnosis;
  }
}

// A stopped rank (SIGSTOP: the whole process frozen, its engine thread too,
// while the kernel or NIC still acknowledges what it is sent): every
// survivor's collective times out, each waiting for its own ring neighbour,
// and every one names the stopped rank (they publish what they wait for and
// follow the chain), not the neighbour.
TEST(Failure, StoppedRankIsNamedByEverySurvivor) {
  auto backend = makeBackend("stopped");
  const int rank = backend->getRank(), size = backend->getSize();
  ASSERT_GE(size, 3);
  const int stopped = 1;
  std::vector<float> data(1000, 1.0f);
  std::vector<Tensor> t{Tensor{data.data(), data.size(), DataType::Float32}};
  backend->barrier()->wait();
  if (rank == stopped) {
    const pid_t self = ::getpid();
    const pid_t waker = ::fork();
    ASSERT_GE(waker, 0);
    if (waker == 0) {  // only async-signal-safe calls in the child
      timespec pause{8, 0};
      ::nanosleep(&pause, nullptr);
      ::kill(self, SIGCONT);
      ::_exit(0);
    }
    ::kill(self, SIGSTOP);
    ::waitpid(waker, nullptr, 0);
    // Woken late, it learns that the group broke.
    auto [error, took] = outcome(
        backend->allreduce(t, AllreduceOptions{.algorithm = Algorithm::Ring}), Clock::now());
    EXPECT_NE(error, "");
    return;
  }
  const auto start = Clock::now();
  try {
    backend->allreduce(t, AllreduceOptions{.timeout = 3s, .algorithm = Algorithm::Ring})->wait();
    ADD_FAILURE() << "the allreduce completed without rank " << stopped;
  } catch (const Error& e) {
    EXPECT_EQ(e.info().peerRank, stopped) << e.what();
    EXPECT_NE(std::string(e.what()).find(fmt::format("rank(s) {}", stopped)), std::string::npos)
        << e.what();
    EXPECT_LT(Clock::now() - start, 3s + 4s) << e.what();
  }
}

// Rank 0 allreduces `count0` elements, the others `countOthers`: every rank
// fails within the timeout, naming the mismatch or the rank that saw it.
void expectMismatchFails(const char* group, size_t count0, size_t countOthers) {
  auto backend = makeBackend(group);
  const int rank = backend->getRank();
  std::vector<int32_t> data(rank == 0 ? count0 : countOthers, 1);
  std::vector<Tensor> t{Tensor{data.data(), data.size(), DataType::Int32}};
  auto start = Clock::now();
  // A barrier first, so that every rank formed: two ranks may find the
  // mismatch between them and exit before a slower third has mapped their
  // segments, which that rank would report as their exit instead. The
  // barrier itself may fail on a rank still in it when the others' failure
  // arrives: that rank learned of the failure there.
  auto [error, took] = outcome(backend->barrier(), start);
  if (error.empty()) {
    std::tie(error, took) = outcome(backend->allreduce(t, AllreduceOptions{.timeout = 10s}), start);
  }
  EXPECT_NE(error, "") << "ranks with different sizes completed an allreduce";
  EXPECT_LT(took, 10s + 5s) << error;
  bool named = error.find("same sizes") != std::string::npos ||
               error.find("reported a failure") != std::string::npos;
  EXPECT_TRUE(named) << error;
}

TEST(Failure, MismatchedSizesFailEveryRank) {
  expectMismatchFails("mismatch", 100, 150);
}

// Small enough for the one-shot board on every rank (RDMACC_RDMA_ONE_SHOT_BYTES,
// RDMACC_SHM_ONE_SHOT_BYTES): the entries disagree in size.
TEST(Failure, MismatchedSizesOnTheOneShotBoardFailEveryRank) {
  expectMismatchFails("mismatch-board", 2, 3);
}

TEST(Failure, MonitoredBarrierNamesTheMissingRanks) {
  auto backend = makeBackend("monitored");
  const int rank = backend->getRank(), size = backend->getSize();
  ASSERT_GE(size, 3);
  backend->barrier()->wait();
  auto start = Clock::now();
  if (rank == size - 1) {  // never arrives at the monitored barrier
    std::this_thread::sleep_for(5s);
    return;
  }
  try {
    backend->monitoredBarrier(BarrierOptions{.timeout = 2s}, /*waitAllRanks=*/true);
    ADD_FAILURE() << "the monitored barrier passed without rank " << size - 1;
  } catch (const Error& e) {
    std::string w = e.what();
    if (rank == 0) {
      EXPECT_NE(
          w.find(fmt::format("Ranks {} failed to pass monitoredBarrier in 2000 ms", size - 1)),
          std::string::npos)
          << w;
    } else {
      EXPECT_NE(w.find(fmt::format("Rank {} successfully reached monitoredBarrier, but received "
                                   "errors while waiting for send/recv from rank 0",
                                   rank)),
                std::string::npos)
          << w;
    }
    EXPECT_LT(Clock::now() - start, 2s + 5s) << w;
  }
}

TEST(Failure, WorkAbortFailsEveryRank) {
  auto backend = makeBackend("abort");
  const int rank = backend->getRank();
  backend->barrier()->wait();
  std::vector<float> data(100, 1.0f);
  std::vector<Tensor> t{Tensor{data.data(), data.size(), DataType::Float32}};
  auto start = Clock::now();
  std::shared_ptr<Work> w;
  if (rank == 0) {
    // Rank 0 posts a receive nobody will match and aborts it.
    w = backend->recv(t, 1, 4242);
    std::this_thread::sleep_for(200ms);
    w->abort();
  } else {
    w = backend->allreduce(t, AllreduceOptions{.timeout = 30s});
  }
  auto [error, took] = outcome(w, start);
  EXPECT_NE(error, "");
  EXPECT_NE(error.find("aborted"), std::string::npos) << error;
  EXPECT_LT(took, 10s) << error;
}

}  // namespace
}  // namespace rdmacc

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
