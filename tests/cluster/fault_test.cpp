// What a rank sees of a network fault, run on the cluster bed
// (tests/cluster/faults.sh starts it on every host and makes the fault).
//
//   rdmacc_cluster_fault survive|fail|fail-final|idle SIGNAL_DIR
//
// Every rank forms a group and runs checked 256 KiB allreduces in a loop;
// rank 0 creates SIGNAL_DIR/ready once they run, and the scenario then makes
// its fault and, when it is over, creates SIGNAL_DIR/restored.
//   survive     every allreduce succeeds with the right result through the
//               fault; ends 10 allreduces after `restored`; prints the
//               longest one (the stall the fault caused)
//   fail        an allreduce fails within its timeout (RDMACC_TEST_OP_TIMEOUT
//               seconds, default 20) naming a rank; after `restored` the
//               process forms a new group with the same ranks and its
//               allreduce is right (the next step after an elastic restart)
//   fail-final  as fail, without the new group (a host is gone for good)
//   idle        every rank waits in a receive nobody sends (nothing in flight):
//               it fails within 10 s naming a rank (the keep-alive probes),
//               not at its timeout
// Exit status 0 when the rank saw what its mode expects.
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "rdmacc/backend.hpp"
#include "rdmacc/environment.hpp"
#include "rdmacc/error.hpp"

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

long long ms(Clock::duration d) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
}

std::shared_ptr<rdmacc::VerbsBackend> makeBackend(const std::string& group) {
  rdmacc::VerbsBackend::Options options;
  options.groupName = group;
  return rdmacc::initFromEnvironment(options);
}

// One checked allreduce of (rank + 1 + i) over every rank: the expected sum is
// size * (size + 1) / 2 + size * i. Throws what the allreduce throws; returns
// false on a wrong element.
bool allreduceOnce(rdmacc::VerbsBackend& backend, std::vector<float>& data, int iteration,
                   std::chrono::milliseconds timeout) {
  const int rank = backend.getRank(), size = backend.getSize();
  const float base = static_cast<float>(iteration % 1000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(rank + 1) + base;
  std::vector<rdmacc::Tensor> t{
      rdmacc::Tensor{data.data(), data.size(), rdmacc::DataType::Float32}};
  backend.allreduce(t, rdmacc::AllreduceOptions{.timeout = timeout})->wait();
  const float want = static_cast<float>(size * (size + 1) / 2) + static_cast<float>(size) * base;
  for (float v : data) {
    if (v != want) {
      fmt::print("rank {}: allreduce {} gave {} instead of {}\n", rank, iteration, v, want);
      return false;
    }
  }
  return true;
}

// Whether any rank has seen SIGNAL_DIR/restored: the same answer on every
// rank, so that all stop after the same allreduce.
bool sawRestored(rdmacc::VerbsBackend& backend, const std::string& dir,
                 std::chrono::milliseconds timeout) {
  int32_t seen = exists(dir + "/restored") ? 1 : 0;
  std::vector<rdmacc::Tensor> t{rdmacc::Tensor{&seen, 1, rdmacc::DataType::Int32}};
  backend
      .allreduce(t, rdmacc::AllreduceOptions{.reduceOp = rdmacc::ReduceOp::Max, .timeout = timeout})
      ->wait();
  return seen != 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    fmt::print(stderr, "usage: rdmacc_cluster_fault survive|fail|fail-final|idle SIGNAL_DIR\n");
    return 2;
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // lines reach the launcher as they are written
  const std::string_view mode = argv[1];
  const std::string dir = argv[2];
  const char* timeoutText = std::getenv("RDMACC_TEST_OP_TIMEOUT");
  const auto timeout = std::chrono::milliseconds(
      1000 * (timeoutText != nullptr ? std::strtol(timeoutText, nullptr, 10) : 20));
  std::vector<float> data(64 * 1024);
  auto backend = makeBackend("fault");
  const int rank = backend->getRank();
  const std::string host = rdmacc::hostName();
  int i = 0;
  try {
    for (; i < 5; ++i) {
      if (!allreduceOnce(*backend, data, i, timeout)) return 1;
    }
  } catch (const std::exception& e) {
    fmt::print("rank {} on {}: failed before the fault: {}\n", rank, host, e.what());
    return 1;
  }
  backend->barrier()->wait();
  if (rank == 0) {
    FILE* f = std::fopen((dir + "/ready").c_str(), "w");
    if (f == nullptr) {
      fmt::print("rank 0: cannot create {}/ready: {}\n", dir, std::strerror(errno));
      return 1;
    }
    std::fclose(f);
  }
  fmt::print("rank {} on {}: {} allreduces right, waiting for the fault\n", rank, host, i);
  const auto deadline = Clock::now() + 10min;
  if (mode == "survive") {
    Clock::duration longest{};
    int after = -1;  // allreduces since `restored`
    try {
      while (after < 10 && Clock::now() < deadline) {
        auto start = Clock::now();
        if (!allreduceOnce(*backend, data, i++, timeout)) return 1;
        longest = std::max(longest, Clock::now() - start);
        if (after >= 0) {
          ++after;
        } else if (sawRestored(*backend, dir, timeout)) {
          after = 0;  // every rank agrees on when (a MAX over the ranks' views)
        }
      }
      backend->barrier()->wait();
    } catch (const std::exception& e) {
      fmt::print("rank {} on {}: allreduce {} failed through the fault: {}\n", rank, host, i,
                 e.what());
      return 1;
    }
    fmt::print("rank {} on {}: {} allreduces right through the fault, longest {} ms\n", rank, host,
               i, ms(longest));
    return after >= 10 ? 0 : 1;
  }
  if (mode == "idle") {
    // A receive from the same local rank of the next host, which nobody
    // sends: nothing is in flight, only the keep-alive probes can notice
    // the cut before the receive's timeout (RDMACC_TIMEOUT).
    const char* local = std::getenv("LOCAL_WORLD_SIZE");
    const int perHost = local != nullptr ? std::max(1, std::atoi(local)) : 1;
    const int from = (rank + perHost) % backend->getSize();
    int32_t word = 0;
    std::vector<rdmacc::Tensor> t{rdmacc::Tensor{&word, 1, rdmacc::DataType::Int32}};
    auto start = Clock::now();
    std::string error;
    try {
      backend->recv(t, from, 99)->wait();
    } catch (const std::exception& e) {
      error = e.what();
    }
    auto took = Clock::now() - start;
    fmt::print("rank {} on {}: idle receive from rank {} failed after {} ms: {}\n", rank, host,
               from, ms(took), error);
    const bool ok = !error.empty() && error.find("rank ") != std::string::npos && took < 10s;
    if (!ok) fmt::print("rank {} on {}: expected an error naming a rank within 10 s\n", rank, host);
    return ok ? 0 : 1;
  }
  if (mode != "fail" && mode != "fail-final") {
    fmt::print(stderr, "unknown mode '{}'\n", mode);
    return 2;
  }
  std::string error;
  Clock::duration took{};
  while (error.empty() && Clock::now() < deadline) {
    auto start = Clock::now();
    try {
      if (!allreduceOnce(*backend, data, i++, timeout)) return 1;
    } catch (const std::exception& e) {
      error = e.what();
    }
    took = Clock::now() - start;
  }
  fmt::print("rank {} on {}: allreduce {} failed after {} ms: {}\n", rank, host, i, ms(took),
             error);
  bool ok = !error.empty() && error.find("rank ") != std::string::npos && took < timeout + 10s;
  if (!ok)
    fmt::print("rank {} on {}: expected an error naming a rank within {} s\n", rank, host,
               timeout.count() / 1000 + 10);
  backend.reset();
  if (mode == "fail-final") return ok ? 0 : 1;
  while (!exists(dir + "/restored") && Clock::now() < deadline) std::this_thread::sleep_for(100ms);
  try {
    auto start = Clock::now();
    auto again = makeBackend("after-fault");
    bool right = allreduceOnce(*again, data, 7, timeout);
    fmt::print("rank {} on {}: a new group after the fault: formed and {} in {} ms\n", rank, host,
               right ? "right" : "WRONG", ms(Clock::now() - start));
    again->barrier()->wait();
    ok = ok && right;
  } catch (const std::exception& e) {
    fmt::print("rank {} on {}: no new group after the fault: {}\n", rank, host, e.what());
    ok = false;
  }
  return ok ? 0 : 1;
}
