// One trial of the failure matrix (tools/failure-matrix runs it for every
// case): every rank of a group runs a collective in a loop; the victim dies
// (SIGKILL) or freezes (SIGSTOP) in the middle, and every survivor reports
// what it learned, and when.
//
//   rdmacc_failure_trial COLLECTIVE VICTIM kill|stop AFTER DIR
//
// Launched like any rank (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; rank 0
// hosts the store unless the launcher does). COLLECTIVE: allreduce,
// broadcast (root 0), allgather, reduce_scatter, alltoall, barrier, or pairs
// (rank r exchanges with r^1 by send/recv: one pair never talks to the
// victim). The victim submits its AFTER-th operation, writes the time
// (CLOCK_MONOTONIC, ns) into DIR/death and raises the signal. A survivor
// prints one line
//   RESULT rank=R named=N ms=T error=TEXT
// (N: Error::peerRank, T: from the death to the error) and exits 0; it
// exits 1 if an operation succeeded wrongly or never failed (60 s).
#include <time.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "rdmacc/backend.hpp"
#include "rdmacc/environment.hpp"
#include "rdmacc/error.hpp"

namespace {

using namespace rdmacc;

int64_t monotonicNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

struct Buffers {
  static constexpr size_t kElements = 16 * 1024;  // 64 KiB of float per rank
  std::vector<float> in, out;
  std::vector<std::vector<float>> parts;
  std::vector<Tensor> inT, outT, partT;
  std::vector<std::vector<Tensor>> partLists;

  explicit Buffers(int size)
      : in(kElements, 1.0f),
        out(kElements * static_cast<size_t>(size)),
        parts(static_cast<size_t>(size), std::vector<float>(kElements)) {
    inT = {Tensor{in.data(), in.size(), DataType::Float32}};
    outT = {Tensor{out.data(), kElements, DataType::Float32}};
    for (auto& p : parts) partT.push_back(Tensor{p.data(), p.size(), DataType::Float32});
    partLists = {partT};
  }
};

std::shared_ptr<Work> submit(VerbsBackend& b, const std::string& what, Buffers& x) {
  const int rank = b.getRank();
  if (what == "allreduce") return b.allreduce(x.inT);
  if (what == "broadcast") return b.broadcast(x.inT, BroadcastOptions{.rootRank = 0});
  if (what == "allgather") return b.allgather(x.partLists, x.inT);
  if (what == "reduce_scatter") return b.reduce_scatter(x.outT, x.partLists);
  if (what == "alltoall") return b.alltoall(x.partT, x.partT);
  if (what == "barrier") return b.barrier();
  if (what == "pairs") {
    const int peer = rank ^ 1;
    // One of the pair sends while the other receives (the higher rank
    // first), alternating; each op is one send or one receive.
    static bool sending = rank < peer;
    sending = !sending;
    return sending ? b.send(x.inT, peer, 1) : b.recv(x.outT, peer, 1);
  }
  throw Error(ErrorKind::InvalidArgument, fmt::format("unknown collective '{}'", what));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s COLLECTIVE VICTIM kill|stop AFTER DIR\n", argv[0]);
    return 2;
  }
  const std::string what = argv[1], how = argv[3], dir = argv[5];
  const int victim = std::atoi(argv[2]), after = std::atoi(argv[4]);
  try {
    VerbsBackend::Options options;
    options.groupName = "trial";
    auto backend = initFromEnvironment(options);
    const int rank = backend->getRank();
    if (what == "pairs" && backend->getSize() % 2 != 0) {
      std::fprintf(stderr, "pairs needs an even world size\n");
      return 2;
    }
    Buffers x(backend->getSize());
    backend->barrier()->wait();
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0;; ++i) {
      auto work = submit(*backend, what, x);
      if (rank == victim && i == after) {
        std::ofstream(dir + "/death") << monotonicNs() << "\n";
        std::fflush(stdout);
        std::raise(how == "stop" ? SIGSTOP : SIGKILL);
        // Continued (SIGCONT) or not killed: a stopped victim is killed by
        // the harness once the survivors reported.
        std::this_thread::sleep_for(std::chrono::hours(1));
      }
      try {
        work->wait();
      } catch (const Error& e) {
        int64_t died = 0;
        std::ifstream(dir + "/death") >> died;
        const double ms = died > 0 ? (monotonicNs() - died) / 1e6 : -1;
        std::string text = e.what();
        for (char& c : text)
          if (c == '\n') c = ' ';
        std::printf("RESULT rank=%d named=%d ms=%.0f error=%s\n", rank, e.peerRank(), ms,
                    text.c_str());
        std::fflush(stdout);
        std::_Exit(0);  // the group is broken; what it does on teardown is not this trial's
      }
      if (rank != victim && i > after + 1 &&
          std::chrono::steady_clock::now() - start > std::chrono::seconds(60)) {
        std::printf("RESULT rank=%d named=-1 ms=-1 error=(none within 60 s)\n", rank);
        return 1;
      }
    }
  } catch (const std::exception& e) {
    std::printf("RESULT rank=%s named=-1 ms=-1 error=(setup) %s\n", std::getenv("RANK"), e.what());
    return 1;
  }
}
