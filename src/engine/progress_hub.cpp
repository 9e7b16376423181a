#include "src/engine/progress_hub.hpp"

#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <new>

#include "rdmacc/error.hpp"
#include "rdmacc/log.hpp"
#include "src/engine/progress.hpp"

namespace rdmacc {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::microseconds;

void drainEventFd(int fd) {
  uint64_t v = 0;
  ssize_t ignored = ::read(fd, &v, sizeof v);
  (void)ignored;
}

void writeEventFd(int fd) {
  uint64_t one = 1;
  ssize_t ignored = ::write(fd, &one, sizeof one);
  (void)ignored;
}

std::optional<microseconds> earliest(std::optional<microseconds> a, microseconds b) {
  return a ? std::min(*a, b) : b;
}

}  // namespace

ProgressHub& ProgressHub::instance() {
  static ProgressHub* const hub = [] {
    auto* made = new ProgressHub();  // never destroyed (see the header)
    ::pthread_atfork([] { instance().mutex_.lock(); }, [] { instance().mutex_.unlock(); },
                     [] { instance().forgetThreadInChild(); });
    return made;
  }();
  return *hub;
}

// In a forked child (a DataLoader worker): the engine thread did not come
// along, and the groups it stepped are the parent's. A group the child makes
// starts a thread of its own. Runs with mutex_ held since the fork.
void ProgressHub::forgetThreadInChild() {
  members_.clear();
  active_.clear();
  detachedHere_.clear();
  threadId_ = {};
  // Neither joined nor destroyed: there is no such thread here.
  new (&thread_) std::jthread();  // NOLINT(bugprone-*): the old one leaks
  threadWake_.reset();
  mutex_.unlock();
}

ProgressHub::ProgressHub() = default;

bool ProgressHub::running() const {
  std::lock_guard lock(mutex_);
  return thread_.joinable();
}

void ProgressHub::wakeThread() {
  if (threadWake_) writeEventFd(threadWake_.get());
}

void ProgressHub::attach(Progress& member) {
  std::lock_guard lock(mutex_);
  member.hubLastProgress_ = Clock::now();
  members_.push_back(&member);
  if (!thread_.joinable()) {
    net::Fd wake(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!wake) {
      members_.pop_back();
      throw errnoError(ErrorKind::Internal, "eventfd", errno, "starting the progress engine");
    }
    const int fd = wake.get();
    threadWake_ = std::move(wake);
    thread_ = std::jthread([this, fd](std::stop_token st) { run(st, fd); });
    threadId_ = thread_.get_id();
  }
  wakeThread();  // a sleeping thread polls the newcomer's descriptors too
}

void ProgressHub::detach(Progress& member) {
  std::unique_lock lock(mutex_);
  std::erase(members_, &member);
  if (std::this_thread::get_id() == threadId_) {
    // A Work callback on the engine thread destroyed its group: the round
    // under way skips it from now on. The thread stays (idle if it was the
    // last group): it cannot join itself.
    detachedHere_.push_back(&member);
    return;
  }
  const uint64_t removedAt = roundId_;
  wakeThread();  // out of a sleep that polls the member's descriptors
  roundEnded_.wait(lock, [&] {
    return std::none_of(active_.begin(), active_.end(),
                        [&](uint64_t id) { return id <= removedAt; });
  });
  if (!members_.empty() || !thread_.joinable()) return;
  // The last group: the thread ends with it. A group made meanwhile starts
  // a new thread with its own wake-up descriptor; this one takes no new
  // round (run() checks the stop under mutex_).
  std::jthread ending = std::move(thread_);
  net::Fd endingWake = std::move(threadWake_);
  threadId_ = {};
  ending.request_stop();
  lock.unlock();
  writeEventFd(endingWake.get());
  ending.join();
}

bool ProgressHub::gone(const Progress* member) const {
  std::lock_guard lock(mutex_);
  return std::find(detachedHere_.begin(), detachedHere_.end(), member) != detachedHere_.end();
}

void ProgressHub::run(const std::stop_token& stop, int wakeFd) {
  Round r;
  r.wakeFd = wakeFd;
  while (true) {
    uint64_t id = 0;
    {
      std::lock_guard lock(mutex_);
      if (stop.stop_requested()) break;
      r.members = members_;
      id = ++roundId_;
      active_.push_back(id);
      if (std::this_thread::get_id() == threadId_) detachedHere_.clear();
    }
    try {
      round(r);
    } catch (const std::exception& e) {
      log(LogLevel::Error, "progress engine: {}", e.what());
    }
    {
      std::lock_guard lock(mutex_);
      std::erase(active_, id);
    }
    roundEnded_.notify_all();
  }
}

// A group that a waiting caller drives is left to it (Progress::driverPause);
// the others are stepped. With one group this is the loop each group's own
// thread ran before the hub. Which groups are driven is decided once, here,
// and the sleep that may follow keeps that decision (see sleep()).
void ProgressHub::round(Round& r) {
  const auto now = Clock::now();
  bool spinning = false;
  bool yield = false;
  std::optional<microseconds> pauseLimit;
  r.watched.clear();
  for (Progress* p : r.members) {
    if (gone(p)) continue;
    if (auto pause = p->driverPause(); pause.count() > 0) {
      pauseLimit = earliest(pauseLimit, pause);
      p->hubLastProgress_ = now;
      continue;
    }
    r.watched.push_back(p);
    bool moved = false;
    {
      std::lock_guard lock(p->mutex_);
      moved = p->engine_.step();
    }
    if (moved) {
      p->hubLastProgress_ = Clock::now();
      return;  // round again at once
    }
    if (now - p->hubLastProgress_ < p->spinTime()) {
      spinning = true;
      yield = yield || p->spinYield_;
    }
  }
  if (spinning) {
    if (yield) sched_yield();
    return;
  }
  sleep(r, pauseLimit);
}

// Progress::sleep for every group at once: each is armed and stepped once
// more under its lock (a completion may have landed before the arm), then
// one ppoll waits on the thread's and every group's wake-up descriptor and
// the armed groups' event channels; a group with pending work (or one only
// polling can see) bounds the wait by kSleepSlice, one that a caller drives
// by its pause. A driven group is left to its driver as the group's own
// thread left it before the hub: not counted as a sleeper, so its
// submissions neither write the wake-up descriptor nor wake this thread
// (a syscall and a context switch per operation on a latency-bound path),
// and its pending work is the driver's to take.
// The groups watched are the round's undriven ones, not decided again here:
// a caller that began to drive in between would otherwise leave its group
// neither watched nor bounding the sleep (the round saw no pause), and a
// submission after that caller left would wake nobody. A watched group
// whose caller drives meanwhile is served by both, which is harmless.
void ProgressHub::sleep(Round& r, std::optional<microseconds> pauseLimit) {
  std::vector<Progress*>& watched = r.watched;
  std::erase_if(watched, [&](Progress* p) { return gone(p); });  // a callback's doing
  for (Progress* p : watched) p->sleepers_.fetch_add(1);         // seq_cst: Progress::sleep
  struct Awake {
    const std::vector<Progress*>& watched;
    ~Awake() {
      for (Progress* p : watched) p->sleepers_.fetch_sub(1);
    }
  } awake{watched};
  std::vector<Progress*>& armed = r.armed;
  armed.clear();
  auto disarm = [&] {
    for (Progress* p : armed) {
      std::lock_guard lock(p->mutex_);
      p->transport_.disarm();
    }
  };
  std::optional<microseconds> limit = pauseLimit;
  bool idle = true;
  for (Progress* p : watched) {
    if (p->pending_.load()) {
      disarm();
      return;
    }
    std::unique_lock lock(p->mutex_);
    if (p->stopped_) {
      idle = false;
      continue;
    }
    p->transport_.arm();
    if (p->engine_.step()) {
      p->transport_.disarm();
      p->hubLastProgress_ = Clock::now();
      lock.unlock();
      disarm();
      return;
    }
    armed.push_back(p);
    idle = idle && p->engine_.idle();
    if (auto polling = p->transport_.pollingSleep()) {
      idle = false;
      limit = earliest(limit, *polling);
    }
  }
  if (!idle)
    limit = earliest(limit, std::chrono::duration_cast<microseconds>(Progress::kSleepSlice));

  std::vector<pollfd>& polled = r.polled;
  polled.assign(1, pollfd{r.wakeFd, POLLIN, 0});
  // A driven group's too: a driver that leaves with its work undone wakes
  // this thread through it (Progress::driverLeaves).
  for (Progress* p : r.members) {
    if (!gone(p)) polled.push_back({p->wakeFd_.get(), POLLIN, 0});
  }
  const size_t wakeFds = polled.size();
  for (Progress* p : armed) {
    for (int fd : p->transport_.eventFds()) {
      if (fd >= 0) polled.push_back({fd, POLLIN, 0});
    }
  }
  timespec ts{};
  if (limit) {
    ts.tv_sec = limit->count() / 1000000;
    ts.tv_nsec = limit->count() % 1000000 * 1000;
  }
  if (::ppoll(polled.data(), polled.size(), limit ? &ts : nullptr, nullptr) > 0) {
    for (size_t i = 0; i < wakeFds; ++i) {
      if (polled[i].revents & POLLIN) drainEventFd(polled[i].fd);
    }
  }
  // Whoever consumed the events polls what they announced (Progress::sleep).
  for (Progress* p : armed) {
    if (gone(p)) continue;
    std::lock_guard lock(p->mutex_);
    p->transport_.consumeEvents();
    if (!p->stopped_ && p->engine_.step()) p->hubLastProgress_ = Clock::now();
  }
}

}  // namespace rdmacc
