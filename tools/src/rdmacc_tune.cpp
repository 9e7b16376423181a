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
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "rdmacc/backend.hpp"
#include "rdmacc/config.hpp"
#include "rdmacc/error.hpp"
#include "rdmacc/tuning.hpp"
#include "rdmacc/version.hpp"
#include "tools/src/cli.hpp"

using namespace rdmacc;
using Clock = std::chrono::steady_clock;

namespace {

struct Args {
  std::string output = "rdmacc-tune.txt";
  size_t minBytes = 8;
  size_t maxBytes = 16u << 20;
  int iterations = 10;
};

// The command line; nullopt: exit with `status`.
std::optional<Args> parse(int argc, char** argv, int& status) {
  Args a;
  CLI::App app(
      "Times every algorithm rdmacc has for allreduce, broadcast and allgather (ring, tree, "
      "chain, linear, recursive doubling in power-of-two groups, hierarchical; allgather's "
      "size: the gathered output) from MIN to MAX (factor 4) on this "
      "group and writes the fastest per size to FILE: use it with RDMACC_TUNE_FILE=FILE. Start "
      "it like the job it tunes: rdmacc-run -n 4 -- rdmacc-tune -o tune.txt",
      "rdmacc-tune");
  cli::addVersion(app);
  std::string minBytes = "8", maxBytes = "16M";
  app.add_option("-o,--output", a.output, "the table to write")->capture_default_str();
  app.add_option("-b,--minbytes", minBytes, "smallest size (bytes; K, M, G), at least 4")
      ->check(cli::size())
      ->capture_default_str();
  app.add_option("-e,--maxbytes", maxBytes, "largest size")
      ->check(cli::size())
      ->capture_default_str();
  app.add_option("-n,--iters", a.iterations, "timed iterations per size and algorithm")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  if (auto exit = cli::parse(app, argc, argv)) {
    status = *exit;
    return std::nullopt;
  }
  a.minBytes = parseSize(minBytes, "-b");
  a.maxBytes = parseSize(maxBytes, "-e");
  if (a.minBytes < 4 || a.maxBytes < a.minBytes) {
    fmt::print(stderr, "rdmacc-tune: need 4 <= -b <= -e (got {} and {})\n", a.minBytes, a.maxBytes);
    status = cli::kUsage;
    return std::nullopt;
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
      // Every algorithm the collective has (hierarchical too: on one host it
      // is one tree, in layered groups the table may keep it).
      std::vector<Algorithm> candidates;
      for (Algorithm a : algorithmsOf(name)) {
        if (a != Algorithm::RecursiveDoubling || (n > 1 && (n & (n - 1)) == 0)) {
          candidates.push_back(a);
        }
      }
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
  int status = 0;
  auto args = parse(argc, argv, status);
  if (!args) return status;
  try {
    return run(*args);
  } catch (const std::exception& e) {
    fmt::print(stderr, "rdmacc-tune: {}\n", e.what());
    return cli::kFailed;
  }
}
