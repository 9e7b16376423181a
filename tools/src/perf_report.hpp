// rdmacc-perf's arguments and result rows, and what it writes from them:
// the table cell, the CSV it appends to, the plot drawn from that CSV, and
// the --json record (nccl-tests' -J fields).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "rdmacc/options.hpp"
#include "rdmacc/types.hpp"

namespace rdmacc::perf {

struct Args {
  std::string collective = "allreduce";
  size_t minBytes = 8;
  size_t maxBytes = 8u << 20;
  double factor = 2;
  int iterations = 20;
  int warmup = 5;
  std::string mode = "all";  // write: bw, lat, all
  int txDepth = 128;
  DataType dtype = DataType::Float32;
  ReduceOp op = ReduceOp::Sum;
  int root = 0;
  Algorithm algorithm = Algorithm::Auto;
  bool check = false;
  bool registerBuffers = false;  // -R: zero-copy from registered buffers
  int buffers = 1;               // --buffers: iterations rotate over this many buffer sets
  bool blocking = false;         // -z: wait for each operation before the next (OSU-style latency)
  // --second-group: measure a group of the same ranks formed after the
  // job's (as torch's new_group), over its connections unless
  // RDMACC_SHARE_CONNECTIONS=0 (docs/decisions/019).
  bool secondGroup = false;
  bool secondGroupAlone = false;  // the job's group is destroyed once the second formed
  std::string json;
  std::string csv;      // appended to (header when the file is new or empty)
  std::string plot;     // PNG of every series in the CSV (or of this run)
  bool replot = false;  // only draw --plot from --csv
  // Reference lines on the plot (e.g. perftest's ib_write_bw -b per
  // direction and ib_write_lat on the same device); 0: none.
  double refBusbw = 0;
  double refTime = 0;
  bool iterationsGiven = false;
  std::vector<std::string> argv;  // the command line, for --json
  std::string started;            // ISO 8601 UTC, for --json
};

struct Row {
  size_t bytes = 0, count = 0;
  double time = 0, algbw = 0, busbw = 0;
  double minTime = 0, maxTime = 0;  // the fastest and slowest rank's mean
  long wrong = 0;
  bool inPlace = false;
};

// " time algbw busbw wrong" of one row (n/a when the case did not run).
std::string cell(const Row* r);
void appendCsv(const std::string& path, const Args& args, int ranks, const std::vector<Row>& rows);
// Draws every series of the CSV at csvPath into png (gnuplot); throws Error
// for a file that is not an rdmacc-perf CSV.
void plotCsv(const std::string& csvPath, const std::string& png, double refBusbw = 0,
             double refTime = 0);
std::string isoNow();  // ISO 8601 UTC, seconds
// How forming the group went: the slowest rank's time, the largest rank's
// resident memory right after.
struct Formation {
  double milliseconds = 0;
  double residentMiB = 0;
  double threads = 0;                  // of the process (the largest rank's)
  std::vector<std::string> rdmaPorts;  // rank 0's, one per rail; empty: shared memory only
  // After the measured operations (the largest rank's): RDMA queue pairs,
  // memory pinned for the device (VmPin: registrations), resident memory.
  double queuePairsAfter = 0;
  double pinnedMiBAfter = 0;
  double residentMiBAfter = 0;
  double receivesAfter = 0;        // receives posted for the queue pairs
  double fastestMilliseconds = 0;  // the last rank to arrive: formation without waiting
};
void writeJson(const Args& args, int ranks, const Formation& formation,
               const std::vector<Row>& rows, double avgBusbw);

}  // namespace rdmacc::perf
