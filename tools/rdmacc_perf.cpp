// rdmacc-perf: benchmarks. `-c write` measures RDMA WRITE bandwidth and latency
// between two ranks through rdmacc's mesh, printed like ib_write_bw/ib_write_lat.
#include <cstdio>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "rdmacc/bench.hpp"
#include "rdmacc/config.hpp"
#include "rdmacc/environment.hpp"
#include "rdmacc/error.hpp"
#include "rdmacc/log.hpp"

namespace {

using namespace rdmacc;

struct Args {
  std::string collective = "write";
  size_t minBytes = 2;
  size_t maxBytes = 8u << 20;
  double factor = 2;
  int iterations = 1000;
  int warmup = 50;
  std::string mode = "all";  // bw, lat, all
  int txDepth = 128;
};

void usage(FILE* out) {
  fmt::print(
      out,
      "usage: rdmacc-perf -c write [-b MIN] [-e MAX] [-f FACTOR] [-n ITERS] [-w WARMUP]\n"
      "                   [-m bw|lat|all] [-t TXDEPTH]\n"
      "Run under a launcher with 2 ranks: rdmacc-run -n 2 -- rdmacc-perf -c write\n"
      "  -c  what to measure: write (RDMA WRITE, point to point; compare with ib_write_bw/lat)\n"
      "  -b  smallest size (default 2; suffixes K, M, G)      -e  largest size (default 8M)\n"
      "  -f  size multiplication factor (default 2)           -n  iterations per size (default "
      "1000)\n"
      "  -w  warm-up iterations (default 50)                  -m  bw, lat or all (default all)\n"
      "  -t  writes in flight for bandwidth (default 128, as ib_write_bw)\n"
      "MB/sec is perftest's: 2^20 bytes per second. Latency is half the round trip, in us.\n");
}

size_t parseSize(const std::string& text, const char* flag) {
  size_t mult = 1;
  std::string digits = text;
  if (!text.empty()) {
    switch (text.back()) {
      case 'K':
      case 'k':
        mult = 1ull << 10;
        break;
      case 'M':
      case 'm':
        mult = 1ull << 20;
        break;
      case 'G':
      case 'g':
        mult = 1ull << 30;
        break;
      default:
        break;
    }
    if (mult != 1) digits.pop_back();
  }
  int64_t v = parseInt(digits, flag);
  if (v < 0) throw Error(ErrorKind::InvalidArgument, fmt::format("{} {} is negative", flag, text));
  return static_cast<size_t>(v) * mult;
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    if (k == "-h" || k == "--help") {
      usage(stdout);
      std::exit(0);
    }
    if (i + 1 >= argc)
      throw Error(ErrorKind::InvalidArgument, fmt::format("{} needs a value", k),
                  "see rdmacc-perf --help");
    std::string v = argv[++i];
    if (k == "-c")
      a.collective = v;
    else if (k == "-b")
      a.minBytes = parseSize(v, "-b");
    else if (k == "-e")
      a.maxBytes = parseSize(v, "-e");
    else if (k == "-f")
      a.factor = std::stod(v);
    else if (k == "-n")
      a.iterations = static_cast<int>(parseInt(v, "-n"));
    else if (k == "-w")
      a.warmup = static_cast<int>(parseInt(v, "-w"));
    else if (k == "-m")
      a.mode = v;
    else if (k == "-t")
      a.txDepth = static_cast<int>(parseInt(v, "-t"));
    else
      throw Error(ErrorKind::InvalidArgument, fmt::format("unknown option {}", k),
                  "see rdmacc-perf --help");
  }
  if (a.collective != "write") {
    throw Error(ErrorKind::InvalidArgument,
                fmt::format("-c {} is not available in this version", a.collective),
                "this version measures point-to-point RDMA writes: -c write");
  }
  if (a.mode != "bw" && a.mode != "lat" && a.mode != "all") {
    throw Error(ErrorKind::InvalidArgument, fmt::format("-m {} is not bw, lat or all", a.mode));
  }
  if (a.minBytes < 1 || a.maxBytes < a.minBytes || a.factor <= 1 || a.iterations < 1 ||
      a.warmup < 0 || a.txDepth < 1) {
    throw Error(ErrorKind::InvalidArgument,
                "need 1 <= -b <= -e, -f > 1, -n >= 1, -w >= 0, -t >= 1");
  }
  return a;
}

std::vector<size_t> sizes(const Args& a) {
  std::vector<size_t> out;
  for (double s = static_cast<double>(a.minBytes); s <= static_cast<double>(a.maxBytes) + 0.5;
       s *= a.factor) {
    size_t v = static_cast<size_t>(s + 0.5);
    if (out.empty() || v != out.back()) out.push_back(v);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Args args = parse(argc, argv);
    Config config = Config::load();
    GroupEnvironment group = groupFromEnvironment(config);
    setLogPrefix(fmt::format("rank {}", group.rank));
    WriteBench bench(group.store, group.rank, group.size, config,
                     WriteBenchOptions{.maxBytes = args.maxBytes, .txDepth = args.txDepth});
    bool lead = group.rank == 0;
    if (lead) fmt::print("# rdmacc-perf -c write: {}\n", bench.describe());
    bool intact = true;
    if (args.mode != "lat") {
      if (lead) {
        fmt::print("# RDMA WRITE bandwidth (ib_write_bw definitions)\n");
        fmt::print(" {:>10} {:>12} {:>16} {:>19} {:>14} {:>6}\n", "#bytes", "#iterations",
                   "BW peak[MB/sec]", "BW average[MB/sec]", "MsgRate[Mpps]", "data");
      }
      for (size_t s : sizes(args)) {
        auto r = bench.bandwidth(s, args.iterations, args.warmup);
        intact = intact && r.dataIntact;
        if (lead) {
          fmt::print(" {:>10} {:>12} {:>16.2f} {:>19.2f} {:>14.6f} {:>6}\n", r.bytes, r.iterations,
                     r.peakMBps, r.averageMBps, r.messageRateMpps, r.dataIntact ? "ok" : "BAD");
          std::fflush(stdout);
        }
      }
    }
    if (args.mode != "bw") {
      if (lead) {
        fmt::print("# RDMA WRITE latency (ib_write_lat definitions: half round trip, usec)\n");
        fmt::print(" {:>10} {:>12} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}\n", "#bytes",
                   "#iterations", "t_min", "t_max", "t_typical", "t_avg", "t_stdev", "99%",
                   "99.9%");
      }
      for (size_t s : sizes(args)) {
        auto r = bench.latency(s, args.iterations, args.warmup);
        if (lead) {
          fmt::print(
              " {:>10} {:>12} {:>10.2f} {:>10.2f} {:>10.2f} {:>10.2f} {:>10.2f} {:>10.2f} "
              "{:>10.2f}\n",
              r.bytes, r.iterations, r.minUs, r.maxUs, r.typicalUs, r.averageUs, r.stdevUs, r.p99Us,
              r.p999Us);
          std::fflush(stdout);
        }
      }
    }
    if (!intact) {
      fmt::print(stderr, "rdmacc-perf: data written by rank 0 arrived corrupted at rank 1\n");
      return 1;
    }
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "rdmacc-perf: {}\n", e.what());
    return 1;
  }
}
