// rdmacc-tune: measures every algorithm of allreduce, broadcast and allgather at sizes
// from -b to -e on this machine and group, and writes the fastest per size as
// a tuning table (RDMACC_TUNE_FILE). Start it with a launcher:
//   rdmacc-run -n 4 -- rdmacc-tune -o rdmacc-tune.txt
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "rdmacc/backend.hpp"
#include "rdmacc/config.hpp"
#include "rdmacc/error.hpp"
#include "rdmacc/tuning.hpp"
#include "rdmacc/version.hpp"

using namespace rdmacc;
using Clock = std::chrono::steady_clock;

namespace {

struct Args {
  std::string output = "rdmacc-tune.txt";
  size_t minBytes = 8;
  size_t maxBytes = 16u << 20;
  int iterations = 10;
};

void usage(FILE* out) {
  fmt::print(
      out,
      "usage: rdmacc-tune [-o FILE] [-b MIN] [-e MAX] [-n ITERS]\n"
      "Times ring, tree (and recursive doubling) allreduce, chain and tree broadcast and ring and\n"
      "linear allgather (size: the gathered output), MIN..MAX\n"
      "(factor 4; default 8 B .. 16M) on this group and writes the fastest per size to FILE\n"
      "(default rdmacc-tune.txt): use it with RDMACC_TUNE_FILE=FILE. Start it like the\n"
      "job it tunes: rdmacc-run -n 4 -- rdmacc-tune -o tune.txt\n");
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    if (k == "-h" || k == "--help") {
      usage(stdout);
      std::exit(0);
    }
    if (i + 1 >= argc) throw Error(ErrorKind::InvalidArgument, k + " needs a value", "see --help");
    std::string v = argv[++i];
    if (k == "-o")
      a.output = v;
    else if (k == "-b")
      a.minBytes = parseSize(v, "-b");
    else if (k == "-e")
      a.maxBytes = parseSize(v, "-e");
    else if (k == "-n")
      a.iterations = static_cast<int>(parseInt(v, "-n"));
    else
      throw Error(ErrorKind::InvalidArgument, "unknown option " + k, "see rdmacc-tune --help");
  }
  if (a.minBytes < 4 || a.maxBytes < a.minBytes || a.iterations < 1) {
    throw Error(ErrorKind::InvalidArgument, "need 4 <= -b <= -e and -n >= 1");
  }
  return a;
}

// Mean time per call in microseconds, the slowest rank's (every rank agrees).
double timeIt(VerbsBackend& backend, int iterations,
              const std::function<std::shared_ptr<Work>()>& op) {
  op()->wait();  // warm-up
  backend.barrier()->wait();
  auto start = Clock::now();
  for (int i = 0; i < iterations; ++i) op()->wait();
  double us = std::chrono::duration<double, std::micro>(Clock::now() - start).count() / iterations;
  std::vector<Tensor> t{Tensor{&us, 1, DataType::Float64}};
  backend.allreduce(t, AllreduceOptions{.reduceOp = ReduceOp::Max, .algorithm = Algorithm::Tree})
      ->wait();
  return us;
}

int run(const Args& args) {
  auto backend = initFromEnvironment();
  const int n = backend->getSize();
  const bool lead = backend->getRank() == 0;
  TuningTable table;
  std::vector<float> buffer(args.maxBytes / sizeof(float) + 1, 1.0f);
  for (const char* collective : {"allreduce", "broadcast", "allgather"}) {
    const std::string name = collective;
    Algorithm last = Algorithm::Auto;
    size_t lastSize = 0;
    for (size_t bytes = args.minBytes; bytes <= args.maxBytes; bytes *= 4) {
      std::vector<Tensor> t{Tensor{buffer.data(), bytes / sizeof(float), DataType::Float32}};
      // allgather: `bytes` is the gathered output; each rank's block is in it (in place).
      size_t block = bytes / sizeof(float) / static_cast<size_t>(n);
      Tensor gathered{buffer.data(), block * static_cast<size_t>(n), DataType::Float32};
      Tensor mine{buffer.data() + block * static_cast<size_t>(backend->getRank()), block,
                  DataType::Float32};
      std::map<Algorithm, double> times;
      std::vector<Algorithm> candidates{Algorithm::Tree, Algorithm::Ring};
      if (name == "allreduce" && n > 1 && (n & (n - 1)) == 0) {
        candidates.push_back(Algorithm::RecursiveDoubling);
      }
      if (name == "allgather") candidates = {Algorithm::Linear, Algorithm::Ring};
      for (Algorithm algorithm : candidates) {
        double us = timeIt(*backend, args.iterations, [&]() {
          if (name == "allreduce")
            return backend->allreduce(t, AllreduceOptions{.algorithm = algorithm});
          if (name == "allgather")
            return backend->_allgather_base(gathered, mine,
                                            AllgatherOptions{.algorithm = algorithm});
          return backend->broadcast(t, BroadcastOptions{.algorithm = algorithm});
        });
        if (lead) {
          fmt::print(stderr, "rdmacc-tune: {} {} B {}: {:.1f} us\n", collective, bytes,
                     toString(algorithm), us);
        }
        times[algorithm] = us;
      }
      // Measurements on shared machines are noisy: switch algorithms only for
      // a clear (10%) win, so that noise does not fragment the table.
      Algorithm winner = candidates.front();
      for (Algorithm a : candidates) {
        if (times[a] < times[winner]) winner = a;
      }
      if (last != Algorithm::Auto && winner != last && times[winner] > 0.9 * times[last]) {
        winner = last;
      }
      if (last != Algorithm::Auto && winner != last) {
        table.add({.collective = collective, .ranks = n, .upTo = lastSize, .algorithm = last});
      }
      last = winner;
      lastSize = bytes;
    }
    table.add({.collective = collective,
               .ranks = n,
               .upTo = std::numeric_limits<size_t>::max(),
               .algorithm = last});
  }
  if (lead) {
    std::ofstream out(args.output);
    out << table.format(fmt::format("{} ranks, sizes {}..{} B, {} iterations per point", n,
                                    args.minBytes, args.maxBytes, args.iterations));
    if (!out) throw Error(ErrorKind::InvalidArgument, "cannot write " + args.output);
    fmt::print("rdmacc-tune: wrote {} (use RDMACC_TUNE_FILE={})\n", args.output, args.output);
  }
  backend->barrier()->wait();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::string_view(argv[1]) == "--version") {
    std::printf("rdmacc-tune %s\n", rdmacc::version());
    return 0;
  }
  try {
    return run(parse(argc, argv));
  } catch (const std::exception& e) {
    fmt::print(stderr, "rdmacc-tune: {}\n", e.what());
    return 1;
  }
}
