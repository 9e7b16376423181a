// RDMA connections made on first use (RDMACC_CONNECT=lazy, src/transport/rdma/mesh.hpp):
// what a rank holds grows with the peers its operations talk to, first
// contacts in any order connect every pair once, groups come and go without
// leaking, and a peer that died before anyone contacted it is named. Run
// under `rdmacc-run -n 4` (or more) with RDMACC_TRANSPORT=rdma.
#include <gtest/gtest.h>

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "rdmacc/backend.hpp"
#include "rdmacc/config.hpp"
#include "rdmacc/error.hpp"
#include "rdmacc/log.hpp"
#include "tests/device/group.hpp"

namespace rdmacc {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

std::shared_ptr<VerbsBackend> lazyGroup(const std::string& name) {
  return test::groupFromEnvironment(name, {{"RDMACC_CONNECT", "lazy"}});
}

// Entries of a /proc/self directory, or lines of a /proc/self file.
size_t countEntries(const char* dir) {
  size_t n = 0;
  if (DIR* d = ::opendir(dir)) {
    while (::readdir(d) != nullptr) ++n;
    ::closedir(d);
  }
  return n;
}
size_t countLines(const char* path) {
  std::ifstream in(path);
  return static_cast<size_t>(
      std::count(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>(), '\n'));
}
long statusKiB(const std::string& field) {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(field, 0) == 0) return std::stol(line.substr(field.size()));
  }
  return -1;
}

// Receives a queue pair adds to the shared receive queue: what its peer can
// have in flight (src/transport/rdma/mesh.hpp).
size_t receivesPerQueuePair() {
  const Config config = Config::load();
  return std::min(static_cast<size_t>(config.getInt("RDMACC_QP_RECV_DEPTH")),
                  2 * static_cast<size_t>(config.getInt("RDMACC_SLOTS_PER_PEER")) + 4);
}

// Receive queues of their own hold RDMACC_QP_RECV_DEPTH each, exactly; the
// shared ones at least each live queue pair's share, and more only by the
// shares of queue pairs a crossed attempt made and dropped (they stay posted
// for the next).
void expectReceives(const VerbsBackend& g, int queuePairs) {
  const Config config = Config::load();
  const size_t depth = static_cast<size_t>(config.getInt("RDMACC_QP_RECV_DEPTH"));
  const size_t n = static_cast<size_t>(queuePairs);
  if (!config.getBool("RDMACC_SRQ")) {
    EXPECT_EQ(g.receivesPosted(), n * depth) << "rank " << g.getRank();
    return;
  }
  EXPECT_GE(g.receivesPosted(), n * receivesPerQueuePair()) << "rank " << g.getRank();
  // Up to two shares of dropped attempts; one ring of its own would exceed it.
  EXPECT_LE(g.receivesPosted(), (n + 2) * receivesPerQueuePair()) << "rank " << g.getRank();
}

TEST(Lazy, QueuePairsGrowWithThePeersOperationsUse) {
  auto g = lazyGroup("lazy-growth");
  const int rank = g->getRank(), size = g->getSize();
  ASSERT_GE(size, 4);
  EXPECT_EQ(g->queuePairs(), 0) << "formation connected nobody";
  EXPECT_EQ(g->receivesPosted(), 0u);
  // A ring allreduce talks to the two neighbours only.
  std::vector<float> data(1 << 18, 1.0f);
  std::vector<Tensor> t{Tensor{data.data(), data.size(), DataType::Float32}};
  g->allreduce(t, AllreduceOptions{.algorithm = Algorithm::Ring})->wait();
  for (float x : data) ASSERT_EQ(x, static_cast<float>(size));
  EXPECT_EQ(g->queuePairs(), 2) << "rank " << rank << " after a ring allreduce";
  expectReceives(*g, 2);
  // A ring allreduce fences a count made before it from the alltoall
  // below: no rank leaves it before every rank entered it, so no peer's
  // alltoall starts connecting to this rank (posting receives for a queue
  // pair not yet counted) while it counts. A count right after the last
  // ring has no such fence (a faster peer may be in its alltoall), so the
  // second ring's count is fenced by a third.
  g->allreduce(t, AllreduceOptions{.algorithm = Algorithm::Ring})->wait();
  EXPECT_EQ(g->queuePairs(), 2) << "rank " << rank << " after a second ring allreduce";
  g->allreduce(t, AllreduceOptions{.algorithm = Algorithm::Ring})->wait();
  // An alltoall talks to everyone.
  std::vector<int32_t> in(static_cast<size_t>(size)), out(static_cast<size_t>(size), -1);
  for (int p = 0; p < size; ++p) in[static_cast<size_t>(p)] = rank * 1000 + p;
  Tensor ti{in.data(), in.size(), DataType::Int32}, to{out.data(), out.size(), DataType::Int32};
  std::vector<int64_t> even;
  g->alltoall_base(to, ti, even, even)->wait();
  for (int p = 0; p < size; ++p) ASSERT_EQ(out[static_cast<size_t>(p)], p * 1000 + rank);
  EXPECT_EQ(g->queuePairs(), size - 1);
  expectReceives(*g, size - 1);
  g->barrier()->wait();
}

// Descriptors of this process open on an RDMA device (one per device
// context: librdmacm's own and the groups').
size_t deviceFiles() {
  size_t n = 0;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (dirent* e = ::readdir(d)) {
      std::array<char, 256> target{};
      std::string path = std::string("/proc/self/fd/") + e->d_name;
      ssize_t len = ::readlink(path.c_str(), target.data(), target.size() - 1);
      if (len > 0 &&
          std::string(target.data(), static_cast<size_t>(len)).rfind("/dev/infiniband/uverbs", 0) ==
              0) {
        ++n;
      }
    }
    ::closedir(d);
  }
  return n;
}

// The groups of a process share one context of the device (a DeviceMesh's
// groups open it once): more groups, lazy and eager, open no more files on it.
TEST(Lazy, GroupsOfAProcessOpenTheDeviceOnce) {
  auto first = lazyGroup("device-once-a");
  first->barrier()->wait();
  const size_t opened = deviceFiles();
  EXPECT_GE(opened, 1u);
  auto second = lazyGroup("device-once-b");
  auto third = test::groupFromEnvironment("device-once-c", {{"RDMACC_CONNECT", "eager"}});
  second->barrier()->wait();
  third->barrier()->wait();
  EXPECT_EQ(deviceFiles(), opened) << "rank " << first->getRank();
  EXPECT_GT(third->queuePairs(), 0);
}

// Every rank sends to every other in its own random order while receiving
// in another: pairs meet from one side, the other or both at once (the
// higher rank's connection wins), and each pair ends with one connection.
TEST(Lazy, FirstContactsInAnyOrderConnectEveryPairOnce) {
  auto g = lazyGroup("lazy-order");
  const int rank = g->getRank(), size = g->getSize();
  const unsigned seed = static_cast<unsigned>(Clock::now().time_since_epoch().count()) + rank;
  std::mt19937 random(seed);
  std::vector<int> peers;
  for (int p = 0; p < size; ++p) {
    if (p != rank) peers.push_back(p);
  }
  for (int round = 0; round < 3; ++round) {
    std::vector<int> sendOrder = peers, recvOrder = peers;
    std::shuffle(sendOrder.begin(), sendOrder.end(), random);
    std::shuffle(recvOrder.begin(), recvOrder.end(), random);
    std::vector<std::vector<int64_t>> outgoing(static_cast<size_t>(size)),
        incoming(static_cast<size_t>(size));
    std::vector<std::shared_ptr<Work>> works;
    for (size_t i = 0; i < peers.size(); ++i) {
      const int to = sendOrder[i], from = recvOrder[i];
      auto& o = outgoing[static_cast<size_t>(to)];
      o.assign(4096, rank * 100 + to + round * 10000);
      std::vector<Tensor> ts{Tensor{o.data(), o.size(), DataType::Int64}};
      works.push_back(g->send(ts, to, round));
      auto& r = incoming[static_cast<size_t>(from)];
      r.assign(4096, -1);
      std::vector<Tensor> tr{Tensor{r.data(), r.size(), DataType::Int64}};
      works.push_back(g->recv(tr, from, round));
    }
    for (auto& w : works) w->wait();
    for (int from : peers) {
      for (int64_t x : incoming[static_cast<size_t>(from)]) {
        ASSERT_EQ(x, from * 100 + rank + round * 10000) << "seed " << seed << " from " << from;
      }
    }
  }
  EXPECT_EQ(g->queuePairs(), size - 1) << "seed " << seed;
  g->barrier()->wait();
}

// Groups formed, used by every pair and destroyed in a loop: descriptors,
// threads, mappings and pinned memory come back to where they were after
// the first round (which may warm caches).
TEST(Lazy, GroupsComeAndGoWithoutLeaking) {
  auto measure = [] {
    return std::array<long, 4>{static_cast<long>(countEntries("/proc/self/fd")),
                               static_cast<long>(countEntries("/proc/self/task")),
                               static_cast<long>(countLines("/proc/self/maps")),
                               statusKiB("VmPin:")};
  };
  std::array<long, 4> first{};
  for (int round = 0; round < 6; ++round) {
    {
      auto g = lazyGroup(fmt::format("lazy-loop-{}", round));
      const int size = g->getSize();
      std::vector<int32_t> in(static_cast<size_t>(size) * 64, g->getRank()), out(in.size(), -1);
      Tensor ti{in.data(), in.size(), DataType::Int32}, to{out.data(), out.size(), DataType::Int32};
      std::vector<int64_t> even;
      g->alltoall_base(to, ti, even, even)->wait();
      ASSERT_EQ(g->queuePairs(), size - 1);
      g->barrier()->wait();
    }
    auto now = measure();
    if (round == 0) {
      first = now;
      continue;
    }
    // A joined thread leaves /proc/self/task a moment after pthread_join
    // returns (the kernel wakes the joiner before it reaps the thread):
    // the count settles, a leaked thread does not.
    for (auto until = Clock::now() + 5s; now[1] > first[1] && Clock::now() < until;) {
      std::this_thread::sleep_for(10ms);
      now = measure();
    }
    EXPECT_EQ(now[0], first[0]) << "descriptors after round " << round;
    EXPECT_EQ(now[1], first[1]) << "threads after round " << round;
    EXPECT_LE(now[2], first[2] + 2) << "mappings after round " << round;
    EXPECT_EQ(now[3], first[3]) << "pinned KiB after round " << round;
  }
}

// The last rank leaves right after formation, before anyone contacted it:
// a rank that sends to it and one that waits to receive from it both learn
// of it within the operation's timeout, naming it.
TEST(Lazy, APeerGoneBeforeFirstContactIsNamed) {
  auto g = lazyGroup("lazy-gone");
  const int rank = g->getRank(), size = g->getSize();
  const int victim = size - 1;
  if (rank == victim) {
    std::fflush(stdout);
    std::_Exit(0);
  }
  std::this_thread::sleep_for(300ms);
  std::vector<float> data(1024, 1.0f);
  std::vector<Tensor> t{Tensor{data.data(), data.size(), DataType::Float32}};
  const auto start = Clock::now();
  auto w = rank == 0 ? g->send(t, victim, 1) : g->recv(t, victim, 1);
  std::string error;
  try {
    w->wait(20s);
  } catch (const Error& e) {
    error = e.what();
  }
  const auto took = Clock::now() - start;
  EXPECT_NE(error.find(fmt::format("rank {}", victim)), std::string::npos) << error;
  EXPECT_LT(took, 15s) << error;
}

// Ranks that die while their first connection is being made: each victim
// starts connecting to rank 0 (a send) and exits after a delay of its own
// (none, a few milliseconds, tens: before its request leaves, mid-handshake,
// around its end), while rank 0 waits for a message they never send. Rank 0
// learns of every death within the operation's timeout, naming the rank;
// no half-made connection leaves it waiting.
TEST(Lazy, PeersGoneDuringTheirConnectionAreNamed) {
  auto g = lazyGroup("lazy-dying");
  const int rank = g->getRank(), size = g->getSize();
  ASSERT_GE(size, 2);
  std::vector<float> data(256, 1.0f);
  std::vector<Tensor> t{Tensor{data.data(), data.size(), DataType::Float32}};
  if (rank != 0) {
    static constexpr std::array<std::chrono::milliseconds, 4> kDelays{0ms, 3ms, 15ms, 40ms};
    auto w = g->send(t, 0, /*tag=*/1);
    std::this_thread::sleep_for(kDelays[static_cast<size_t>(rank - 1) % kDelays.size()]);
    std::fflush(stdout);
    std::_Exit(0);
  }
  const auto start = Clock::now();
  std::vector<std::shared_ptr<Work>> waits;
  std::vector<std::vector<float>> in(static_cast<size_t>(size), std::vector<float>(256));
  for (int victim = 1; victim < size; ++victim) {
    std::vector<Tensor> ti{Tensor{in[static_cast<size_t>(victim)].data(), 256, DataType::Float32}};
    waits.push_back(g->recv(ti, victim, /*tag=*/2));  // never sent
  }
  for (int victim = 1; victim < size; ++victim) {
    std::string error;
    try {
      waits[static_cast<size_t>(victim - 1)]->wait(30s);
    } catch (const Error& e) {
      error = e.what();
    }
    EXPECT_NE(error.find(fmt::format("rank {}", victim)), std::string::npos)
        << "victim " << victim << ": " << error;
  }
  EXPECT_LT(Clock::now() - start, 25s);
}

// The groups of a process share the device, and so its events: rank 0 takes
// the device's netdev down for half a second while three idle groups live
// in every process, and each process reports the port going down (and
// coming back) once, by whichever group read the event, not once per group.
// Run on its own (ip link, as root in the VM): the flap may break the
// groups' connections.
TEST(Lazy, PortFlapIsReportedOncePerProcess) {
  std::atomic<int> down{0}, active{0};
  setLogSink([&](LogLevel, std::string_view line) {
    if (line.find("went down") != std::string_view::npos) ++down;
    if (line.find("is active again") != std::string_view::npos) ++active;
    std::fprintf(stderr, "%.*s\n", static_cast<int>(line.size()), line.data());
  });
  auto a = lazyGroup("flap-a");
  auto b = lazyGroup("flap-b");
  auto c = test::groupFromEnvironment("flap-c", {{"RDMACC_CONNECT", "eager"}});
  for (const auto& g : {a, b, c}) g->barrier()->wait();
  if (a->getRank() == 0) {
    const char* flap =
        "set -e; n=$(rdma link show | sed -n 's/.*netdev \\([^ ]*\\).*/\\1/p' | head -1); "
        "ip link set \"$n\" down; sleep 0.5; ip link set \"$n\" up";
    EXPECT_EQ(std::system(flap), 0) << flap;
  }
  // Idle groups read the events when the device's descriptor wakes them.
  const auto deadline = Clock::now() + 10s;
  while (down.load() == 0 && Clock::now() < deadline) {
    std::this_thread::sleep_for(50ms);
  }
  std::this_thread::sleep_for(2s);  // the other groups' copies, had they been reported
  setLogSink(nullptr);
  EXPECT_EQ(down.load(), 1) << "rank " << a->getRank();
  // (Soft-RoCE's port may come back after the groups stopped looking.)
  EXPECT_LE(active.load(), 1) << "rank " << a->getRank();
}

}  // namespace
}  // namespace rdmacc
