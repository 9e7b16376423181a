// Point-to-point RDMA WRITE benchmark between ranks 0 and 1 of a group,
// through rdmacc's own rdma_cm mesh, with perftest's definitions so that the
// numbers compare with ib_write_bw / ib_write_lat on the same device.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "rdmacc/config.hpp"
#include "rdmacc/store.hpp"

namespace rdmacc {

// ib_write_bw: rank 0 streams `iterations` writes of `bytes` with up to
// txDepth outstanding; MB/sec uses perftest's MB = 2^20 bytes.
struct BandwidthResult {
  size_t bytes = 0;
  int iterations = 0;
  double peakMBps = 0;     // best window of 1/16 of the iterations
  double averageMBps = 0;  // bytes * iterations / total time
  double messageRateMpps = 0;
  bool dataIntact = false;  // rank 1 verified the pattern
};

// ib_write_lat: ping-pong of writes, each side polling memory; half round trip.
struct LatencyResult {
  size_t bytes = 0;
  int iterations = 0;
  double minUs = 0, maxUs = 0, typicalUs = 0, averageUs = 0, stdevUs = 0, p99Us = 0, p999Us = 0;
};

struct WriteBenchOptions {
  size_t maxBytes = 8u << 20;  // the largest size that will be run (buffer size)
  int txDepth = 128;
  std::string group = "write-bench";
};

// Threading: one thread. Both ranks 0 and 1 must call the same methods in the
// same order with the same arguments; other ranks may not construct it.
class WriteBench {
 public:
  WriteBench(std::shared_ptr<Store> store, int rank, int size, const Config& config,
             WriteBenchOptions options = {});
  ~WriteBench();
  WriteBench(const WriteBench&) = delete;
  WriteBench& operator=(const WriteBench&) = delete;

  // Results are meaningful on rank 0 (rank 1 only takes part).
  BandwidthResult bandwidth(size_t bytes, int iterations, int warmup);
  LatencyResult latency(size_t bytes, int iterations, int warmup);
  // The message path's floor: what a 2-rank small allreduce needs at the
  // verbs level with rdmacc's queue pairs and no engine. Each message is one
  // RDMA WRITE_WITH_IMM (inline when it fits) whose arrival is a receive
  // completion polled from the CQ (ib_send_lat's kind of arrival, not
  // ib_write_lat's memory polling). pingPong: rank 0 sends, rank 1 answers
  // (half round trip, as ib_*_lat); else both send at once and each waits
  // for the other's (the time of one whole exchange).
  LatencyResult exchange(size_t bytes, int iterations, int warmup, bool pingPong);
  // "rxe0:1, GID 1 (::ffff:192.168.77.1, RoCE v2), path MTU 4096, inline <= N"
  std::string describe() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace rdmacc
