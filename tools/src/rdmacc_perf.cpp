// rdmacc-perf: benchmarks, started by rdmacc-run, torchrun, mpirun or srun.
//   -c allreduce|broadcast|reduce|allgather|reduce_scatter|alltoall|gather|scatter|sendrecv|barrier
//      the nccl-tests table and definitions (algbw = size / time; busbw = algbw x factor);
//   -c write  point-to-point RDMA WRITE bandwidth and latency between two ranks,
//      printed like ib_write_bw / ib_write_lat.
#include <sys/resource.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "rdmacc/backend.hpp"
#include "rdmacc/config.hpp"
#include "rdmacc/environment.hpp"
#include "rdmacc/error.hpp"
#include "rdmacc/log.hpp"
#include "rdmacc/version.hpp"
#include "tools/src/cli.hpp"
#include "tools/src/collective_bench.hpp"
#include "tools/src/perf_report.hpp"
#include "tools/src/write_bench.hpp"

#include <nlohmann/json.hpp>

namespace {

using namespace rdmacc::perf;

using namespace rdmacc;
using Clock = std::chrono::steady_clock;

DataType parseType(const std::string& s) {
  if (s == "float" || s == "float32") return DataType::Float32;
  if (s == "double" || s == "float64") return DataType::Float64;
  if (s == "half" || s == "float16") return DataType::Float16;
  if (s == "bfloat16") return DataType::BFloat16;
  if (s == "int8") return DataType::Int8;
  if (s == "uint8") return DataType::UInt8;
  if (s == "int32" || s == "int") return DataType::Int32;
  if (s == "int64") return DataType::Int64;
  throw Error(ErrorKind::InvalidArgument, fmt::format("-d {} is not a dtype", s),
              "use float, double, half, bfloat16, int8, uint8, int32 or int64");
}

ReduceOp parseOp(const std::string& s) {
  if (s == "sum") return ReduceOp::Sum;
  if (s == "prod") return ReduceOp::Product;
  if (s == "min") return ReduceOp::Min;
  if (s == "max") return ReduceOp::Max;
  if (s == "avg") return ReduceOp::Avg;
  throw Error(ErrorKind::InvalidArgument, fmt::format("-o {} is not a reduce op", s),
              "use sum, prod, min, max or avg");
}

const std::vector<std::string> kCollectives = {"allreduce",      "broadcast", "reduce", "allgather",
                                               "reduce_scatter", "alltoall",  "gather", "scatter",
                                               "sendrecv",       "barrier",   "write",  "idle"};

// What the command line gives as text, turned into Args by finishArgs.
struct RawOptions {
  std::string minBytes = "8", maxBytes = "8M", dtype = "float", op = "sum", algorithm = "auto";
  std::string device;
  int gidIndex = -1;
  int registerLevel = 0;
  CLI::Option* iterations = nullptr;
};

// What to time and how: the collective, the size sweep, iterations, type,
// reduction, root, algorithm, checking and buffers.
void addRunOptions(CLI::App& app, Args& a, RawOptions& raw) {
  app.add_option("-c,--collective", a.collective,
                 "what to time; write: RDMA WRITE between 2 ranks (like ib_write_bw/lat); idle: "
                 "form the group, then stay idle -n seconds (CPU time per rank)")
      ->check(CLI::IsMember(kCollectives))
      ->capture_default_str();
  app.add_option("-b,--minbytes", raw.minBytes, "smallest size in bytes (suffixes K, M, G)")
      ->check(cli::size())
      ->capture_default_str();
  app.add_option("-e,--maxbytes", raw.maxBytes, "largest size")
      ->check(cli::size())
      ->capture_default_str();
  app.add_option("-f,--stepfactor", a.factor, "size multiplication factor (> 1)")
      ->check(CLI::Range(1.0001, 1e6))
      ->capture_default_str();
  raw.iterations =
      app.add_option("-n,--iters", a.iterations,
                     "iterations per size (write: default 1000; idle: seconds, default 10)")
          ->check(CLI::Range(1, 1000000000))
          ->capture_default_str();
  app.add_flag("-z,--blocking", a.blocking,
               "wait for each operation before starting the next (as nccl-tests' -z 1 and OSU's "
               "blocking calls: latency); default: up to 16 in flight");
  app.add_option("-w,--warmup_iters", a.warmup, "warm-up iterations")
      ->check(CLI::Range(0, 1000000000))
      ->capture_default_str();
  app.add_option("-d,--datatype", raw.dtype,
                 "float, double, half, bfloat16, int8, uint8, int32, int64 (with -c write: the "
                 "RDMA device, as perftest's -d)")
      ->capture_default_str();
  app.add_option("-o,--op", raw.op, "sum, prod, min, max, avg")
      ->check(CLI::IsMember({"sum", "prod", "min", "max", "avg"}))
      ->capture_default_str();
  app.add_option("-r,--root", a.root, "root rank")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  app.add_option("-a,--algorithm", raw.algorithm,
                 "auto, ring, tree, recursive_doubling (allreduce, power-of-two groups), "
                 "hierarchical (allreduce, broadcast, reduce, barrier), linear (allgather, "
                 "reduce_scatter, alltoall), pairwise (alltoall), dissemination (barrier)")
      ->check(
          [](const std::string& s) {
            return algorithmNamed(s) ? std::string() : s + " is not an algorithm (see --help)";
          },
          "ALGORITHM")
      ->capture_default_str();
  app.add_flag("--check", a.check, "verify every element of every size (#wrong column)");
  app.add_option("-R,--register", raw.registerLevel,
                 "register the buffers with the backend: zero-copy sends and direct receives "
                 "(as nccl-tests -R; -R alone is -R 1)")
      ->expected(0, 1)
      ->default_str("1")  // what -R alone means; the help says the real default
      ->check(CLI::Range(0, 2))
      ->option_text("INT in [0 - 2] (default 0: off; -R alone: 1)");
  app.add_flag("--second-group", a.secondGroup,
               "measure a second group of the same ranks, formed after the job's group and used "
               "after it (as torch's new_group): it sends over the first group's RDMA connections "
               "unless RDMACC_SHARE_CONNECTIONS=0");
  app.add_flag("--second-group-alone", a.secondGroupAlone,
               "as --second-group, then destroy the job's group before the sweep: what the second "
               "group costs without another group beside it (a diagnostic for shared connections)");
  app.add_option("--buffers", a.buffers,
                 "rotate the timed iterations over K buffer sets (1: every iteration on the "
                 "result of the one before, as nccl-tests; > 1: independent collectives overlap, "
                 "as DDP's buckets do)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
}

// Where results go: JSON, CSV, a plot and its reference lines.
void addOutputOptions(CLI::App& app, Args& a) {
  app.add_option("-J,--json", a.json, "write the results as JSON");
  app.add_option("--csv", a.csv,
                 "append the results to a CSV file (header written when it is new), so that runs "
                 "of several collectives or world sizes can share one file");
  app.add_option("--plot", a.plot,
                 "plot busbw and time against size with gnuplot (PNG), one line per collective, "
                 "world size and algorithm: every row of --csv FILE, else this run");
  app.add_flag("--replot", a.replot,
               "only draw --plot FILE.png from --csv FILE (no launcher, no device)");
  app.add_option("--ref-busbw", a.refBusbw,
                 "draw a reference line at this busbw (GB/s) in the plot, e.g. ib_write_bw -b "
                 "per direction on the same device")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--ref-time", a.refTime,
                 "draw a reference line at this time (us) in the plot, e.g. ib_write_lat")
      ->check(CLI::NonNegativeNumber);
}

// -c write's own options (perftest's).
void addWriteOptions(CLI::App& app, Args& a, RawOptions& raw) {
  app.add_option("-m,--mode", a.mode,
                 "write only: bw, lat, all (both), or exchange: the message path's floor "
                 "(WRITE_WITH_IMM arrivals polled from the CQ, ping-pong and both at once)")
      ->check(CLI::IsMember({"bw", "lat", "all", "exchange"}))
      ->capture_default_str();
  app.add_option("-t,--tx-depth", a.txDepth, "write only: writes in flight")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--device", raw.device, "write only: the RDMA device (RDMACC_IB_HCA)");
  app.add_option("-x,--gid-index", raw.gidIndex, "write only: the GID index (RDMACC_IB_GID_INDEX)")
      ->check(CLI::Range(0, 65535));
}

// Args from the parsed text, with the defaults that depend on -c; the
// usage error when the options do not go together.
std::optional<std::string> finishArgs(Args& a, RawOptions& raw, const CLI::App& app, int argc,
                                      char** argv) {
  a.iterationsGiven = raw.iterations->count() > 0;
  a.argv.assign(argv, argv + argc);
  a.registerBuffers = raw.registerLevel > 0;
  a.minBytes = parseSize(raw.minBytes, "-b");
  a.maxBytes = parseSize(raw.maxBytes, "-e");
  if (a.collective == "write") {
    // perftest's spelling: -d names the device.
    if (app.get_option("-d")->count() > 0) raw.device = raw.dtype;
    if (!raw.device.empty()) ::setenv("RDMACC_IB_HCA", raw.device.c_str(), 1);
    if (raw.gidIndex >= 0) {
      ::setenv("RDMACC_IB_GID_INDEX", std::to_string(raw.gidIndex).c_str(), 1);
    }
  } else {
    if (!raw.device.empty() || raw.gidIndex >= 0) return "--device and -x are for -c write";
    try {
      a.dtype = parseType(raw.dtype);
    } catch (const std::exception& e) {
      return e.what();
    }
  }
  a.op = parseOp(raw.op);
  a.secondGroup = a.secondGroup || a.secondGroupAlone;
  a.algorithm = *algorithmNamed(raw.algorithm);  // checked by the option
  if (a.replot && (a.csv.empty() || a.plot.empty())) {
    return "--replot needs --csv FILE and --plot FILE.png";
  }
  if (a.collective == "write" && !a.iterationsGiven) a.iterations = 1000;
  if (a.collective == "idle" && !a.iterationsGiven) a.iterations = 10;  // seconds
  if (a.collective == "write" && a.minBytes < 1) a.minBytes = 1;
  if (a.maxBytes < a.minBytes) {
    return fmt::format("-b {} is larger than -e {}", a.minBytes, a.maxBytes);
  }
  return std::nullopt;
}

// The command line; nullopt: exit with `status`.
std::optional<Args> parse(int argc, char** argv, int& status) {
  Args a;
  CLI::App app(
      "nccl-tests-style timing of one collective over a size sweep. Start it with a launcher: "
      "rdmacc-run -n 4 -- rdmacc-perf -c allreduce -b 8 -e 16M. Sizes and definitions follow "
      "nccl-tests: size is the bytes of the per-rank buffer for allreduce/broadcast/reduce, of "
      "the gathered buffer for allgather/gather, of the input for reduce_scatter/scatter, of "
      "each rank's buffer for alltoall; algbw = size / time; busbw = algbw x 2(n-1)/n "
      "(allreduce), (n-1)/n (allgather, reduce_scatter, alltoall, gather, scatter), 1 "
      "(broadcast, reduce, sendrecv); time: mean per iteration, averaged over ranks. Exit "
      "status 1 when --check found wrong elements or the run failed, 2 for a wrong command "
      "line.",
      "rdmacc-perf");
  cli::addVersion(app);
  RawOptions raw;
  addRunOptions(app, a, raw);
  addOutputOptions(app, a);
  addWriteOptions(app, a, raw);
  if (auto exit = cli::parse(app, argc, argv)) {
    status = *exit;
    return std::nullopt;
  }
  if (auto wrong = finishArgs(a, raw, app, argc, argv)) {
    fmt::print(stderr, "rdmacc-perf: {}\nRun with --help for more information.\n", *wrong);
    status = cli::kUsage;
    return std::nullopt;
  }
  return a;
}

std::vector<size_t> sizes(const Args& a) {
  std::vector<size_t> out;
  for (double s = static_cast<double>(std::max<size_t>(a.minBytes, 1));
       s <= static_cast<double>(a.maxBytes) + 0.5; s *= a.factor) {
    size_t v = static_cast<size_t>(s + 0.5);
    if (out.empty() || v != out.back()) out.push_back(v);
  }
  if (a.minBytes == 0) out.insert(out.begin(), 0);
  return out;
}

// ------------------------------------------------------------ p2p write --

// The latency columns of ib_write_lat / ib_send_lat, one row per size.
void latencyHeader() {
  fmt::print(" {:>10} {:>12} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}\n", "#bytes",
             "#iterations", "t_min", "t_max", "t_typical", "t_avg", "t_stdev", "99%", "99.9%");
}
void latencyRow(const LatencyResult& r) {
  fmt::print(
      " {:>10} {:>12} {:>10.2f} {:>10.2f} {:>10.2f} {:>10.2f} {:>10.2f} {:>10.2f} {:>10.2f}\n",
      r.bytes, r.iterations, r.minUs, r.maxUs, r.typicalUs, r.averageUs, r.stdevUs, r.p99Us,
      r.p999Us);
  std::fflush(stdout);
}

// -m exchange: the floor under a 2-rank small allreduce (docs/performance.md).
void runExchange(const Args& args, WriteBench& bench, bool lead) {
  for (bool pingPong : {true, false}) {
    if (lead) {
      fmt::print("{}", pingPong ? "# message path floor, ping-pong: RDMA WRITE_WITH_IMM (inline), "
                                  "arrival polled from the CQ (half round trip, usec)\n"
                                : "# message path floor, both ranks at once: each sends one "
                                  "WRITE_WITH_IMM and polls its CQ for the other's (usec per "
                                  "exchange)\n");
      latencyHeader();
    }
    for (size_t s : sizes(args)) {
      auto r = bench.exchange(s, args.iterations, args.warmup, pingPong);
      if (lead) latencyRow(r);
    }
  }
}

int runWrite(const Args& args, GroupEnvironment& group, const Config& config) {
  WriteBench bench(group.store, group.rank, group.size, config,
                   WriteBenchOptions{.maxBytes = args.maxBytes, .txDepth = args.txDepth});
  bool lead = group.rank == 0;
  if (lead) fmt::print("# rdmacc-perf -c write: {}\n", bench.describe());
  bool intact = true;
  if (args.mode == "exchange") {
    runExchange(args, bench, lead);
    return 0;
  }
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
      latencyHeader();
    }
    for (size_t s : sizes(args)) {
      auto r = bench.latency(s, args.iterations, args.warmup);
      if (lead) latencyRow(r);
    }
  }
  if (!intact) {
    fmt::print(stderr, "rdmacc-perf: data written by rank 0 arrived corrupted at rank 1\n");
    return 1;
  }
  return 0;
}

// ----------------------------------------------------------- collectives --

// A number of this process's /proc/self/status ("VmRSS:" in KiB,
// "Threads:"), 0 when unknown.
double processStatus(const char* field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  const size_t length = std::strlen(field);
  while (std::getline(status, line)) {
    if (line.compare(0, length, field) == 0) return std::strtod(line.c_str() + length, nullptr);
  }
  return 0;
}

// How long forming the group took (since `start`) and what a rank holds
// after it: the slowest and largest rank's (a MAX over the ranks), and the
// fastest rank's time: the last to arrive, which waited for nobody (the
// slowest includes the launcher's start-up spread).
Formation measureFormation(VerbsBackend& backend, Clock::time_point start) {
  std::array<double, 3> formed{
      std::chrono::duration<double, std::milli>(Clock::now() - start).count(),
      processStatus("VmRSS:"), processStatus("Threads:")};
  double fastest = formed[0];
  std::vector<Tensor> t{Tensor{formed.data(), formed.size(), DataType::Float64}};
  backend.allreduce(t, AllreduceOptions{.reduceOp = ReduceOp::Max})->wait();
  std::vector<Tensor> f{Tensor{&fastest, 1, DataType::Float64}};
  backend.allreduce(f, AllreduceOptions{.reduceOp = ReduceOp::Min})->wait();
  return Formation{.milliseconds = formed[0],
                   .residentMiB = formed[1] / 1024,
                   .threads = formed[2],
                   .rdmaPorts = backend.rdmaPorts(),
                   .fastestMilliseconds = fastest};
}

// What a rank holds after the operations (connections on first use grow
// with what they needed): the largest rank's.
void measureAfter(VerbsBackend& backend, Formation& formation) {
  std::array<double, 4> after{static_cast<double>(backend.queuePairs()), processStatus("VmPin:"),
                              processStatus("VmRSS:"),
                              static_cast<double>(backend.receivesPosted())};
  std::vector<Tensor> t{Tensor{after.data(), after.size(), DataType::Float64}};
  backend.allreduce(t, AllreduceOptions{.reduceOp = ReduceOp::Max})->wait();
  formation.queuePairsAfter = after[0];
  formation.pinnedMiBAfter = after[1] / 1024;
  formation.residentMiBAfter = after[2] / 1024;
  formation.receivesAfter = after[3];
}

// What nccl-tests users read first (the build, the host, the transport and
// the device, the group's formation), then the column heads.
void printHeader(const Args& args, const VerbsBackend& backend, const Formation& formed) {
  const auto& ports = formed.rdmaPorts;
  fmt::print("# rdmacc {} on {}, RDMACC_TRANSPORT={}, {}\n", rdmacc::version(), hostName(),
             Config::load().getString("RDMACC_TRANSPORT"),
             ports.empty() ? std::string("no RDMA port (shared memory)")
                           : fmt::format("RDMA port {}", fmt::join(ports, ", ")));
  fmt::print(
      "# {}group of {} ranks formed in {:.0f} ms (slowest rank; {:.0f} ms the fastest), {:.1f} MiB "
      "resident, {:.0f} threads (largest rank)\n",
      args.secondGroup ? "second " : "", backend.getSize(), formed.milliseconds,
      formed.fastestMilliseconds, formed.residentMiB, formed.threads);
  fmt::print(
      "# rdmacc-perf -c {}: {} ranks, dtype {}, op {}, root {}, algorithm {}, {} iterations, {} "
      "warm-up{}\n",
      args.collective, backend.getSize(), toString(args.dtype), toString(args.op), args.root,
      toString(args.algorithm), args.iterations, args.warmup,
      args.registerBuffers ? ", registered buffers (zero-copy)" : "");
  fmt::print("# {:>60} {:>31}\n", "out-of-place", "in-place");
  fmt::print("# {:>10} {:>12} {:>9} {:>6} {:>5} {:>8} {:>7} {:>7} {:>6} {:>8} {:>7} {:>7} {:>6}\n",
             "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time",
             "algbw", "busbw", "#wrong");
  fmt::print("# {:>10} {:>12} {:>9} {:>6} {:>5} {:>8} {:>7} {:>7} {:>6} {:>8} {:>7} {:>7} {:>6}\n",
             "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)",
             "(GB/s)", "");
}

struct Sweep {
  std::vector<Row> rows;
  double busSum = 0;
  int busCount = 0;
  long wrongTotal = 0;
  double averageBusbw() const { return busCount ? busSum / busCount : 0.0; }
};

// Every size out of place and in place (where the collective has each), a
// row per size printed by the lead rank as it goes.
Sweep runSweep(const Args& args, CollectiveBench& bench, bool lead) {
  const Case c = bench.describe();
  const bool reduces = args.collective == "allreduce" || args.collective == "reduce" ||
                       args.collective == "reduce_scatter";
  const bool rooted = args.collective == "broadcast" || args.collective == "reduce" ||
                      args.collective == "gather" || args.collective == "scatter";
  Sweep sweep;
  std::vector<size_t> list = args.collective == "barrier" ? std::vector<size_t>{0} : sizes(args);
  size_t step = 0;
  // The progress line only on a terminal: under a launcher or in a log it
  // would arrive at the end as one \r-joined line.
  const bool progressLine = lead && ::isatty(STDERR_FILENO) != 0;
  for (size_t s : list) {
    ++step;
    if (progressLine) fmt::print(stderr, "\rrdmacc-perf: size {} ({}/{})   ", s, step, list.size());
    std::optional<Row> out, in;
    if (c.hasOutOfPlace) out = bench.measure(s, false);
    if (c.hasInPlace) in = bench.measure(s, true);
    const Row& any = out ? *out : *in;
    for (const Row* r : {out ? &*out : nullptr, in ? &*in : nullptr}) {
      if (r == nullptr) continue;
      sweep.rows.push_back(*r);
      sweep.busSum += r->busbw;
      ++sweep.busCount;
      sweep.wrongTotal += r->wrong;
    }
    if (lead) {
      fmt::print("  {:>10} {:>12} {:>9} {:>6} {:>5}{}{}\n", any.bytes, any.count,
                 toString(args.dtype), reduces ? toString(args.op) : "none",
                 rooted ? std::to_string(args.root) : "-1", cell(out ? &*out : nullptr),
                 cell(in ? &*in : nullptr));
      std::fflush(stdout);
    }
  }
  if (progressLine) fmt::print(stderr, "\r{:60}\r", "");
  return sweep;
}

// The lead rank's summary lines and the files asked for.
void report(const Args& args, int ranks, const Formation& formation, const Sweep& sweep) {
  fmt::print("# Out of bounds values : {} {}\n", sweep.wrongTotal,
             args.check ? (sweep.wrongTotal == 0 ? "OK" : "FAILED") : "(not checked; add --check)");
  fmt::print("# Avg bus bandwidth    : {:.4f} GB/s\n", sweep.averageBusbw());
  if (!args.csv.empty() || !args.plot.empty()) {
    // Without --csv the plot reads this run from a scratch file.
    std::string csv = args.csv.empty() ? args.plot + ".csv" : args.csv;
    appendCsv(csv, args, ranks, sweep.rows);
    if (!args.plot.empty()) plotCsv(csv, args.plot, args.refBusbw, args.refTime);
    if (args.csv.empty()) std::remove(csv.c_str());
  }
  if (!args.json.empty()) writeJson(args, ranks, formation, sweep.rows, sweep.averageBusbw());
}

// The group the sweep runs on: the job's, or with --second-group one formed
// after it over the same store (`first` then holds the job's group, used
// once so that its connections exist, as a torch job's world group).
std::shared_ptr<VerbsBackend> measuredGroup(const Args& args, std::shared_ptr<VerbsBackend>& first,
                                            Clock::time_point& formStart) {
  if (!args.secondGroup) return initFromEnvironment();
  const GroupEnvironment env = groupFromEnvironment(Config::load());
  setLogPrefix(fmt::format("rank {}", env.rank));
  VerbsBackend::Options options;
  options.allGather = env.allGather;
  options.groupName = "perf-first";
  first = std::make_shared<VerbsBackend>(env.store, env.rank, env.size, options);
  std::vector<float> one(1, 1.0f);
  std::vector<Tensor> t{Tensor{one.data(), one.size(), DataType::Float32}};
  first->allreduce(t)->wait();
  options.groupName = "perf-second";
  formStart = Clock::now();
  return std::make_shared<VerbsBackend>(env.store, env.rank, env.size, options);
}

int runCollective(const Args& args) {
  auto formStart = Clock::now();
  std::shared_ptr<VerbsBackend> first;
  auto backend = measuredGroup(args, first, formStart);
  Formation formation = measureFormation(*backend, formStart);
  if (args.secondGroupAlone) first.reset();
  CollectiveBench bench(args, backend);
  const bool lead = backend->getRank() == 0;
  if (lead) printHeader(args, *backend, formation);
  const Sweep sweep = runSweep(args, bench, lead);
  measureAfter(*backend, formation);
  if (lead) report(args, backend->getSize(), formation, sweep);
  backend->barrier()->wait();
  return sweep.wrongTotal == 0 ? 0 : 1;
}

}  // namespace

// What an idle backend costs: after one barrier every rank sleeps -n seconds
// while its backend waits for work, and reports the CPU time its process
// used meanwhile (getrusage: every thread, user and system).
int runIdle(const Args& args) {
  auto backend = initFromEnvironment();
  backend->barrier()->wait();
  auto cpuSeconds = [] {
    rusage u{};
    ::getrusage(RUSAGE_SELF, &u);
    auto s = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec / 1e6; };
    return s(u.ru_utime) + s(u.ru_stime);
  };
  double cpu0 = cpuSeconds();
  auto start = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::chrono::seconds(args.iterations));
  double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  double percent = 100 * (cpuSeconds() - cpu0) / wall;
  fmt::print("# idle: rank {} used {:.3f}% of a core over {:.1f} s\n", backend->getRank(), percent,
             wall);
  std::array<double, 2> stats{percent, percent};  // max, sum
  std::vector<Tensor> maxT{Tensor{&stats[0], 1, DataType::Float64}};
  std::vector<Tensor> sumT{Tensor{&stats[1], 1, DataType::Float64}};
  backend->allreduce(maxT, AllreduceOptions{.reduceOp = ReduceOp::Max})->wait();
  backend->allreduce(sumT, AllreduceOptions{.reduceOp = ReduceOp::Sum})->wait();
  if (backend->getRank() == 0) {
    fmt::print("# idle: {} ranks, {} s: max {:.3f}% of a core per rank, mean {:.3f}%\n",
               backend->getSize(), args.iterations, stats[0], stats[1] / backend->getSize());
  }
  backend->barrier()->wait();
  return 0;
}

int main(int argc, char** argv) {
  int status = 0;
  auto parsed = parse(argc, argv, status);
  if (!parsed) return status;
  parsed->started = isoNow();
  try {
    const Args& args = *parsed;
    if (args.replot) {
      plotCsv(args.csv, args.plot, args.refBusbw, args.refTime);
      return 0;
    }
    if (args.collective == "idle") return runIdle(args);
    if (args.collective != "write") return runCollective(args);
    Config config = Config::load();
    GroupEnvironment group = groupFromEnvironment(config);
    setLogPrefix(fmt::format("rank {}", group.rank));
    return runWrite(args, group, config);
  } catch (const std::exception& e) {
    fmt::print(stderr, "rdmacc-perf: {}\n", e.what());
    return 1;
  }
}
