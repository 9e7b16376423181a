// Who makes progress, and when: the process's engine thread (ProgressHub,
// shared by every group), or a caller blocked in Work::wait() (a "driver"),
// whoever holds this group's progress lock. Busy-polls while things move or
// for the spin time, then sleeps on the transport's event channels and the
// wake-up eventfd; with pending work it wakes at least every kSleepSlice
// (deadlines). Knows nothing of operations: it drives a Steppable.
#pragma once

#include <atomic>
#include <chrono>
#include <mutex>
#include <optional>

#include "rdmacc/work.hpp"
#include "src/core/owned_mutex.hpp"
#include "src/engine/engine.hpp"
#include "src/store/socket.hpp"
#include "src/transport/transport.hpp"

namespace rdmacc {

// What Progress drives; every call is made under the progress lock.
class Steppable {
 public:
  // One round of progress (failures already turned into a broken group);
  // true when anything moved.
  virtual bool step() = 0;
  // Nothing pending, nothing awaiting a verdict: the engine thread may sleep
  // until an event without a time limit.
  virtual bool idle() const = 0;
  // Once the engine thread no longer steps it (under the progress lock).
  virtual void stopping() = 0;

 protected:
  ~Steppable() = default;
};

class Progress {
 public:
  // A sleeping thread with pending work wakes at least this often.
  static constexpr auto kSleepSlice = std::chrono::microseconds(20000);

  Progress(Transport& transport, Steppable& engine, const EngineOptions& options);
  ~Progress();  // leaves the engine thread
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // The engine thread starts stepping this group.
  void start();
  // No more progress: drivers leave (a sleeping one is woken), and later
  // ones return at once. Then join() takes the group off the engine thread.
  void stopDrivers();
  void join();

  // Submissions, from any thread. A submission marks itself pending (under
  // the submitter's lock), then wakes the threads that sleep or are about to
  // (Dekker pair with sleep(): the eventfd write, a syscall and under
  // emulation a costly one, is saved while they spin).
  // Whether the calling thread is inside a step of this group (the engine
  // thread's or a driver's): where Work callbacks run.
  bool steppedHere() const { return mutex_.heldByThisThread(); }
  void markPending() { pending_.store(true); }
  void wakeSleepers() {
    if (sleepers_.load() > 0) wake();
  }
  bool pending() const { return pending_.load(std::memory_order_acquire); }
  void clearPending() { pending_.store(false, std::memory_order_relaxed); }
  void wake();

  // The kind of the oldest pending work, as of the last step: latency-bound
  // work spins for spinLatencyBound.
  void setLatencyBound(bool value) { latencyBound_.store(value, std::memory_order_relaxed); }

  // A caller that runs an operation itself with the transport (a one-shot
  // collective on a board that posts through the engine's queues, Board::
  // exclusive()): holds the progress lock, and the engine thread stays out
  // of its way as for a driver. Not held (held() false) when progress has
  // stopped or the lock stays taken (the caller then submits as usual).
  class Exclusive {
   public:
    explicit Exclusive(Progress& progress);
    ~Exclusive();
    Exclusive(const Exclusive&) = delete;
    Exclusive& operator=(const Exclusive&) = delete;
    bool held() const { return lock_.owns_lock(); }
    // The operation completed here (the engine thread keeps parked a moment
    // longer: the caller is likely back with the next one).
    void done() { done_ = true; }

   private:
    Progress& progress_;
    std::unique_lock<OwnedMutex> lock_;
    bool done_ = false;
  };

  // A caller waiting for `work` makes progress itself until it completes or
  // `until`. Work::wait() then blocks for what is left, if anything.
  void drive(const Work& work, std::chrono::steady_clock::time_point until);

 private:
  friend class ProgressHub;  // the engine thread's side of the members below

  void sleep(std::chrono::microseconds maxWait);
  void waitForEvents(std::optional<std::chrono::microseconds> limit);
  void driverLeaves(bool completed);
  std::chrono::microseconds spinTime() const;
  std::chrono::microseconds driverSpinTime() const;
  std::chrono::microseconds driverPause() const;

  Transport& transport_;
  Steppable& engine_;
  std::chrono::microseconds spin_;
  std::chrono::microseconds spinLatencyBound_;
  std::chrono::microseconds spinWaitLatencyBound_;
  bool spinYield_;
  net::Fd wakeFd_;
  std::atomic<bool> pending_{false};
  std::atomic<int> sleepers_{0};
  // Progress is made by whoever holds mutex_: the engine thread, or a driver,
  // which saves the two thread hand-offs per operation that dominate
  // small-message latency. A driver that finds nothing to do sleeps on the
  // completion channel itself. While a driver is active, and for a moment
  // after one left with its work done (it is likely back with the next
  // operation), the engine thread parks.
  OwnedMutex mutex_;
  std::atomic<int> drivers_{0};
  std::atomic<bool> latencyBound_{false};
  std::atomic<std::chrono::steady_clock::rep> driverLeft_{
      0};                  // when the last driver left content; 0: none since
  bool stopped_ = false;   // under mutex_: no more progress
  bool attached_ = false;  // start() ran and join() has not
  std::chrono::steady_clock::time_point hubLastProgress_;  // the engine thread's
};

}  // namespace rdmacc
