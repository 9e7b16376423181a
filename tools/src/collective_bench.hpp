// rdmacc-perf's collective measurement: per size, buffers whose values are
// exact in every dtype, one iteration of the collective, the check of every
// element (--check), and the nccl-tests timing (mean time over the ranks,
// the fastest and slowest rank's, algbw and busbw).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "rdmacc/backend.hpp"
#include "tools/src/perf_report.hpp"

namespace rdmacc::perf {

// What a collective's table has: nccl-tests' bus factor and which of the
// out-of-place and in-place columns exist.
struct Case {
  std::string name;
  double busFactor = 1;
  bool hasOutOfPlace = true;
  bool hasInPlace = true;
};

class CollectiveBench {
 public:
  // args outlives this object.
  CollectiveBench(const Args& args, std::shared_ptr<VerbsBackend> backend);
  ~CollectiveBench();
  CollectiveBench(const CollectiveBench&) = delete;
  CollectiveBench& operator=(const CollectiveBench&) = delete;

  Case describe() const;
  // Runs args' warm-up and iterations at this size (bytes as nccl-tests
  // count them); collective over the ranks: every rank calls it.
  Row measure(size_t bytes, bool inPlace);

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace rdmacc::perf
