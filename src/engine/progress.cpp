#include "src/engine/progress.hpp"

#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>

#include "rdmacc/error.hpp"
#include "rdmacc/log.hpp"
#include "src/engine/progress_hub.hpp"

namespace rdmacc {
namespace {

using Clock = std::chrono::steady_clock;

// After a waiting caller got its work done, the engine thread stays parked
// this long: a caller waiting on operations back to back keeps driving them
// alone, without the engine thread competing for the lock and the CPU.
constexpr auto kDriverLinger = std::chrono::microseconds(1000);

}  // namespace

Progress::Progress(Transport& transport, Steppable& engine, const EngineOptions& options)
    : transport_(transport),
      engine_(engine),
      spin_(options.spin),
      spinLatencyBound_(options.spinLatencyBound),
      spinWaitLatencyBound_(options.spinWaitLatencyBound),
      spinYield_(options.spinYield),
      wakeFd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
  if (!wakeFd_) {
    throw errnoError(ErrorKind::Internal, "eventfd", errno, "starting the progress engine");
  }
}

Progress::~Progress() {
  join();
}

void Progress::start() {
  ProgressHub::instance().attach(*this);
  attached_ = true;
}

void Progress::stopDrivers() {
  {
    std::lock_guard lock(mutex_);
    stopped_ = true;
  }
  wake();  // a sleeping one too
}

void Progress::join() {
  if (!attached_) return;
  attached_ = false;
  ProgressHub::instance().detach(*this);
  std::lock_guard lock(mutex_);
  engine_.stopping();
}

void Progress::wake() {
  uint64_t one = 1;
  ssize_t ignored = ::write(wakeFd_.get(), &one, sizeof one);
  (void)ignored;
}

// A driver that found nothing to do blocks until a transport event, a
// submission or maxWait.
void Progress::sleep(std::chrono::microseconds maxWait) {
  sleepers_.fetch_add(1);  // seq_cst: pairs with the submitter's store and load
  struct Awake {
    std::atomic<int>& count;
    ~Awake() { count.fetch_sub(1); }
  } awake{sleepers_};
  if (pending_.load()) return;
  {
    std::lock_guard lock(mutex_);
    if (stopped_) return;
    transport_.arm();
    if (engine_.step()) {  // a completion may have landed before the arm
      transport_.disarm();
      return;
    }
    // Posts that raise no event (the RDMA board's) are polled for instead.
    if (auto limit = transport_.pollingSleep()) maxWait = std::min(maxWait, *limit);
  }
  waitForEvents(maxWait);
  std::lock_guard lock(mutex_);
  transport_.consumeEvents();
  // Whoever consumed the events polls what they announced: the engine
  // thread and a driver may sleep on the same channel, and the one that
  // woke first takes the event from the other (which would then sleep a
  // whole slice over an unpolled completion, and the engine thread, parked
  // for the driver, would not poll it either).
  if (!stopped_) engine_.step();
}

// Blocks until a wake-up (eventfd), a transport event or `limit`; consumes
// the wake-up.
void Progress::waitForEvents(std::optional<std::chrono::microseconds> limit) {
  const auto fds = transport_.eventFds();
  std::array<pollfd, std::tuple_size_v<EventFds> + 1> polled{{{wakeFd_.get(), POLLIN, 0}}};
  nfds_t count = 1;
  for (int fd : fds) {
    if (fd >= 0) polled[count++] = pollfd{fd, POLLIN, 0};
  }
  timespec ts{};
  if (limit) {
    ts.tv_sec = limit->count() / 1000000;
    ts.tv_nsec = limit->count() % 1000000 * 1000;
  }
  if (::ppoll(polled.data(), count, limit ? &ts : nullptr, nullptr) > 0 &&
      (polled[0].revents & POLLIN)) {
    uint64_t v = 0;
    ssize_t ignored = ::read(wakeFd_.get(), &v, sizeof v);
    (void)ignored;
  }
}

// Polling while things move or for the spin time, then sleeping on the
// completion channel (with pending work, deadlines are checked at least every
// kSleepSlice). The caller's longer spin (driverSpinTime) covers a peer that
// is a little late; past the engine thread's spin it yields the CPU between
// polls, so a rank that shares this CPU without RDMACC_SPIN_YIELD knowing
// (a CPU quota, pretend hosts) still runs (docs/performance.md, "Numbers
// behind code comments"). Once a wait outlasted it and
// slept, the peer is slow (a straggler), and until something moves again the
// engine thread's spin applies between sleeps, so a long wait costs little
// CPU.
void Progress::drive(const Work& work, Clock::time_point until) {
  drivers_.fetch_add(1);
  auto lastProgress = Clock::now();
  bool slept = false;
  bool completed = false;
  while (!(completed = work.isCompleted())) {
    bool progress = false;
    {
      std::unique_lock lock(mutex_, std::try_to_lock);
      if (lock.owns_lock()) {
        if (stopped_) break;
        progress = engine_.step();
      }
    }
    auto now = Clock::now();
    if (now >= until) break;
    const auto idle = now - lastProgress;
    if (progress) {
      lastProgress = now;
      slept = false;
    } else if (idle > (slept ? spinTime() : driverSpinTime())) {
      sleep(std::chrono::duration_cast<std::chrono::microseconds>(
          std::min<Clock::duration>(until - now, kSleepSlice)));
      lastProgress = Clock::now();
      slept = true;
    } else if (spinYield_ || idle > spinTime()) {
      sched_yield();
    }
  }
  driverLeaves(completed);
}

void Progress::driverLeaves(bool completed) {
  driverLeft_.store(completed ? Clock::now().time_since_epoch().count() : 0);
  drivers_.fetch_sub(1);
  if (!completed) wake();  // the engine thread takes over at once
}

// Tries for the lock instead of blocking on it: a Work callback that runs on
// the thread holding it (Work::finish under a step) and calls a collective
// must fall back to submitting, not deadlock (it knows it holds the lock:
// OwnedMutex). The engine thread parks at its next round once drivers_
// counts this caller, so a few tries suffice.
Progress::Exclusive::Exclusive(Progress& progress) : progress_(progress) {
  progress_.drivers_.fetch_add(1);
  if (progress_.mutex_.heldByThisThread()) return;  // a callback under the lock
  lock_ = std::unique_lock(progress_.mutex_, std::try_to_lock);
  for (int tries = 0; !lock_.owns_lock() && tries < 64; ++tries) {
    sched_yield();
    lock_.try_lock();
  }
  if (lock_.owns_lock() && progress_.stopped_) lock_.unlock();
}

Progress::Exclusive::~Exclusive() {
  if (lock_.owns_lock()) lock_.unlock();
  progress_.driverLeaves(done_);
}

std::chrono::microseconds Progress::spinTime() const {
  return latencyBound_.load(std::memory_order_relaxed) ? spinLatencyBound_ : spin_;
}

std::chrono::microseconds Progress::driverSpinTime() const {
  return latencyBound_.load(std::memory_order_relaxed) ? spinWaitLatencyBound_ : spin_;
}

// How long the engine thread stays out of the way of drivers.
std::chrono::microseconds Progress::driverPause() const {
  using std::chrono::microseconds;
  // A driver that leaves without its work done wakes the engine thread.
  if (drivers_.load() > 0) return std::chrono::duration_cast<microseconds>(kSleepSlice);
  Clock::rep left = driverLeft_.load();
  if (left == 0) return microseconds(0);
  auto since = Clock::now() - Clock::time_point(Clock::duration(left));
  if (since >= kDriverLinger) return microseconds(0);
  return std::chrono::duration_cast<microseconds>(kDriverLinger - since) + microseconds(1);
}

}  // namespace rdmacc
