#include "rdmacc/work.hpp"

#include <fmt/format.h>

#include "rdmacc/error.hpp"
#include "rdmacc/log.hpp"
#include "src/core/deadline.hpp"

namespace rdmacc {
namespace {

// Completion callbacks run on the thread that completed the operation (the
// progress engine, or a caller driving it): waiting there for an operation
// that is not over would wait for progress only that same thread can make.
thread_local int callbackDepth = 0;

}  // namespace

Work::Work(OpType type, uint64_t sequence, std::function<void(const Work&)> abortHandler,
           std::shared_ptr<const ProgressDriver> driver)
    : type_(type),
      sequence_(sequence),
      abortHandler_(std::move(abortHandler)),
      driver_(std::move(driver)) {}
Work::Work(OpType type, uint64_t sequence, Completed) : type_(type), sequence_(sequence) {
  completed_.store(true, std::memory_order_relaxed);
  settled_.store(true, std::memory_order_relaxed);
}
Work::~Work() = default;

// Lock-free: a caller driving progress asks after every round.
bool Work::isCompleted() const {
  return completed_.load(std::memory_order_acquire);
}

bool Work::isSuccess() const {
  std::lock_guard lock(mutex_);
  return completed_ && !error_;
}

std::exception_ptr Work::exception() const {
  std::lock_guard lock(mutex_);
  return error_;
}

int Work::sourceRank() const {
  std::lock_guard lock(mutex_);
  return sourceRank_;
}

// Without a lock when the work completes while the caller drives it (the
// common case for small operations): completed_ and settled_ are atomics,
// and error_ is final once settled_ is set.
bool Work::wait(std::chrono::milliseconds timeout) {
  using Clock = std::chrono::steady_clock;
  bool forever = timeout == std::chrono::milliseconds::max();
  auto until = forever ? Clock::time_point::max() : deadlineAfter(timeout);
  if (callbackDepth > 0 && !settled_.load(std::memory_order_acquire)) {
    throw Error(ErrorKind::InvalidArgument,
                fmt::format("Work::wait on {} #{} inside a completion callback: it would never "
                            "return (callbacks run on the thread that makes progress)",
                            toString(type_), sequence_),
                "in a callback, issue operations and chain callbacks (then) instead of "
                "waiting; wait from the caller's thread");
  }
  if (driver_ && !completed_.load(std::memory_order_acquire)) (*driver_)(*this, until);
  if (!settled_.load(std::memory_order_acquire)) {
    std::unique_lock lock(mutex_);
    if (forever) {
      done_.wait(lock, [&] { return settled_.load(std::memory_order_relaxed); });
    } else if (!done_.wait_until(lock, until,
                                 [&] { return settled_.load(std::memory_order_relaxed); })) {
      throw Error(
          ErrorKind::Timeout,
          fmt::format("Work::wait timed out after {} ms on {} #{} (the operation continues)",
                      timeout.count(), toString(type_), sequence_),
          "wait longer, or pass a timeout in the operation's options to fail the operation "
          "itself");
    }
  }
  if (error_) std::rethrow_exception(error_);
  return true;
}

void Work::abort() {
  if (completed_.load(std::memory_order_acquire)) return;
  if (abortHandler_) {
    abortHandler_(*this);
  } else {
    finish(std::make_exception_ptr(
        Error(ErrorKind::Aborted, fmt::format("{} #{} was aborted", toString(type_), sequence_))));
  }
}

void Work::then(std::function<void(Work&)> fn) {
  {
    std::lock_guard lock(mutex_);
    if (!completed_) {
      callbacks_.push_back(std::move(fn));
      return;
    }
  }
  fn(*this);
}

void Work::finish(std::exception_ptr error, int sourceRank) {
  std::vector<std::function<void(Work&)>> callbacks;
  {
    std::lock_guard lock(mutex_);
    if (completed_.load(std::memory_order_relaxed)) return;
    error_ = std::move(error);
    if (sourceRank >= 0) sourceRank_ = sourceRank;
    completed_.store(true, std::memory_order_release);
    callbacks.swap(callbacks_);
    // No callback (the common case): settled at once, one lock in all.
    if (callbacks.empty()) settled_.store(true, std::memory_order_release);
  }
  if (!callbacks.empty()) {
    runCallbacks(callbacks);
    std::lock_guard lock(mutex_);
    settled_.store(true, std::memory_order_release);
  }
  done_.notify_all();
}

void Work::runCallbacks(std::vector<std::function<void(Work&)>>& callbacks) {
  struct Inside {
    Inside() { ++callbackDepth; }
    ~Inside() { --callbackDepth; }
    Inside(const Inside&) = delete;
    Inside& operator=(const Inside&) = delete;
  } inside;
  for (auto& fn : callbacks) {
    try {
      fn(*this);
    } catch (const std::exception& e) {
      log(LogLevel::Error, "a completion callback of {} #{} threw: {}", toString(type_), sequence_,
          e.what());
    } catch (...) {
      log(LogLevel::Error, "a completion callback of {} #{} threw", toString(type_), sequence_);
    }
  }
}

}  // namespace rdmacc
