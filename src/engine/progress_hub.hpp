// One engine thread per process, shared by every group's Progress (as UCC
// shares one progress context across teams): a job that builds a DeviceMesh
// or dozens of groups keeps one thread polling, not one per group. Each
// group keeps its own progress lock, drivers, transports and failure domain;
// the hub only decides when each group is stepped and sleeps on all of their
// event descriptors at once. The thread starts with the first group and ends
// with the last.
#pragma once

#include <poll.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <stop_token>
#include <thread>
#include <vector>

#include "src/store/socket.hpp"

namespace rdmacc {

class Progress;

class ProgressHub {
 public:
  // The process's hub (never destroyed: a group may outlive static
  // destruction order).
  static ProgressHub& instance();

  // From attach() on, the engine thread steps `member`; after detach()
  // returns it never touches `member` again (safe to destroy).
  void attach(Progress& member);
  void detach(Progress& member);

  // The engine thread is running (for tests and tools).
  bool running() const;

 private:
  ProgressHub();

  // A thread's round state, its storage reused from round to round (an
  // operation's path allocates only its Work and Operation).
  struct Round {
    std::vector<Progress*> members;  // the snapshot
    std::vector<Progress*> watched;  // not driven by a caller: slept for here
    std::vector<Progress*> armed;
    std::vector<pollfd> polled;
    int wakeFd = -1;
  };

  void run(const std::stop_token& stop, int wakeFd);
  // One round over the snapshot: steps each group that no waiting caller is
  // driving, and sleeps when none moved and none is within its spin time.
  void round(Round& r);
  void sleep(Round& r, std::optional<std::chrono::microseconds> pauseLimit);
  // Detached from the engine thread itself (a Work callback) during this
  // round: the round's snapshot no longer holds it.
  bool gone(const Progress* member) const;
  void wakeThread();  // under mutex_
  void forgetThreadInChild();

  mutable std::mutex mutex_;  // everything below but detachedHere_
  std::condition_variable roundEnded_;
  std::vector<Progress*> members_;
  uint64_t roundId_ = 0;          // rounds started so far
  std::vector<uint64_t> active_;  // rounds in progress (a stopping thread's too)
  std::thread::id threadId_;
  std::jthread thread_;
  net::Fd threadWake_;                         // the running thread's wake-up eventfd
  std::vector<const Progress*> detachedHere_;  // the engine thread's own
};

}  // namespace rdmacc
