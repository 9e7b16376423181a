// Work: the handle every Backend call returns (c10d's Work contract).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace rdmacc {

enum class OpType {
  Broadcast,
  Allreduce,
  AllreduceCoalesced,
  Reduce,
  Allgather,
  AllgatherBase,
  AllgatherCoalesced,
  Gather,
  Scatter,
  ReduceScatter,
  ReduceScatterBase,
  AlltoallBase,
  Alltoall,
  Send,
  Recv,
  RecvAnysource,
  Barrier,
  MonitoredBarrier,
};
const char* toString(OpType type) noexcept;

// Threading: any thread may query, wait or abort; the backend's progress
// thread, or a caller blocked in wait() that drives progress, completes it.
// Callbacks run on the completing thread in registration order (one
// registered after completion runs at once), holding only the engine's
// progress lock: a callback may submit new operations (submission takes other
// locks) but must not wait() for rdmacc work, which needs that progress, nor
// destroy the backend that runs it (the process aborts with an error that
// says so: the alternative is a deadlock).
class Work : public std::enable_shared_from_this<Work> {
 public:
  // wait() first lets the driver make progress on the caller's thread; it
  // returns when the work completed or at `until` (the wait's timeout). One
  // driver is shared by all of a backend's work (no allocation per operation).
  using ProgressDriver =
      std::function<void(const Work&, std::chrono::steady_clock::time_point until)>;
  // `abortHandler` runs on abort() instead of failing the work alone. Both
  // are fixed for the work's life: wait() and abort() read them without a
  // lock (a small operation's wait takes none).
  Work(OpType type, uint64_t sequence, std::function<void(const Work&)> abortHandler = nullptr,
       std::shared_ptr<const ProgressDriver> driver = nullptr);
  // Work that completed successfully before it was returned (an operation
  // finished on the caller's thread): no lock taken, nobody to notify.
  struct Completed {};
  Work(OpType type, uint64_t sequence, Completed);
  virtual ~Work();
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;

  OpType opType() const noexcept { return type_; }
  uint64_t sequenceNumber() const noexcept { return sequence_; }
  bool isCompleted() const;
  bool isSuccess() const;  // completed without error
  std::exception_ptr exception() const;
  // The source of a recvAnysource (the peer for send/recv); -1 before it is known.
  int sourceRank() const;
  // Waits for completion (and for the callbacks registered before it) and rethrows its failure.
  // With a timeout, throws Error(Timeout) when it passes first (the operation itself keeps its own
  // timeout). Returns true on success.
  bool wait(std::chrono::milliseconds timeout = std::chrono::milliseconds::max());
  // Fails the operation with Error(Aborted) and breaks the group: every rank's
  // pending work fails (c10d abort semantics).
  void abort();
  // The c10d future's role: fn runs once the work completes (successfully or not).
  void then(std::function<void(Work&)> fn);

  // For the backend: completes the work (ok when error is null). Idempotent.
  void finish(std::exception_ptr error, int sourceRank = -1);

 private:
  void runCallbacks(std::vector<std::function<void(Work&)>>& callbacks);

  const OpType type_;
  const uint64_t sequence_;
  mutable std::mutex mutex_;
  std::condition_variable done_;
  // Both written under mutex_ and read without it (acquire): error_ and
  // sourceRank_ are written before completed_ and never after.
  std::atomic<bool> completed_{false};
  std::atomic<bool> settled_{false};  // completed and its callbacks have run
  std::exception_ptr error_;
  int sourceRank_ = -1;
  std::vector<std::function<void(Work&)>> callbacks_;
  const std::function<void(const Work&)> abortHandler_;
  const std::shared_ptr<const ProgressDriver> driver_;
};

}  // namespace rdmacc
