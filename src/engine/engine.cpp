#include "src/engine/engine.hpp"

#include <cstdlib>
#include <mutex>
#include <string>

#include <fmt/format.h>

#include "rdmacc/error.hpp"
#include "rdmacc/log.hpp"
#include "src/engine/engine_impl.hpp"
#include "src/engine/event_trace.hpp"

namespace rdmacc {

bool Engine::Impl::takeIntake() {
  if (!loop.pending()) return false;
  std::vector<std::unique_ptr<Operation>>& ops = intakeTaken;  // empty, with capacity
  std::optional<std::string> abortReason;
  {
    std::lock_guard lock(intakeMutex);
    loop.clearPending();
    if (!intake.empty()) drained.store(false);
    ops.swap(intake);
    abortReason.swap(abortRequest);
  }
  if (abortReason) breakGroup(Error(ErrorKind::Aborted, *abortReason));
  const bool any = !ops.empty();
  operationChanges += ops.size();
  for (auto& op : ops) {
    std::unique_ptr<Active> a = pool.take(std::move(op));
    if (a->op->pointToPoint) {
      a->latencyBound = a->op->bytes <= chunk;
      pointToPoint.push_back(std::move(a));
    } else {
      computeFootprint(*a, chunk);
      collectives.push_back(std::move(a));
    }
  }
  ops.clear();
  if (broken) failAll(*broken);
  return any || abortReason.has_value();
}

bool Engine::Impl::advance() {
  bool progress = takeIntake();
  progress |= transport->poll(*this);
  // One clock read per round (under emulation, or with a clock source that
  // is not the TSC, each is costly) for what is timed below.
  const auto now = Clock::now();
  // Two syscalls (rdma_get_cm_event on a non-blocking channel): every 10 ms
  // is plenty next to the departure grace.
  if (now - lastConnectionCheck > std::chrono::milliseconds(10)) {
    lastConnectionCheck = now;
    progress |= pollConnectionEvents(now);
  }
  // The oldest collective runs, and up to collectivesInFlight - 1 later
  // ones that may start ahead (in submission order); they complete in
  // submission order. While later ones send, half of every peer's slots
  // stay for the oldest, so messages that run ahead never take the window
  // the oldest one needs.
  const size_t window = std::min(collectives.size(), options.collectivesInFlight);
  for (size_t i = 0; i < window && !broken; ++i) {
    Active& a = *collectives[i];
    if (a.finished) continue;
    if (!a.started && i > 0 && !mayStartAhead(collectives, i)) break;
    struct Reserve {  // reset even when advancing throws (aborts must still go out)
      Transport& t;
      ~Reserve() { t.reserveCredits(0); }
    } reserve{*transport};
    transport->reserveCredits(i == 0 ? 0 : static_cast<size_t>(transport->slotsPerPeer() + 1) / 2);
    bool before = a.started;
    bool moved =
        executor.advanceCollective(a, static_cast<uint32_t>(collectives.front()->op->sequence));
    progress |= moved || !before;
  }
  while (!broken && !collectives.empty() && collectives.front()->finished) {
    Active& a = *collectives.front();
    matching.finished(static_cast<uint32_t>(a.op->sequence));
    traceStage(options.trace, EventTrace::Stage::Finish, false, a.op->sequence);
    // Before the caller learns of it: its next call may take the fast path.
    if (collectives.size() == 1 && pointToPoint.empty()) drained.store(true);
    a.op->work->finish(nullptr);
    pool.give(std::move(collectives.front()));
    collectives.pop_front();
    ++operationChanges;
    progress = true;
  }
  if (!broken) {
    const size_t before = pointToPoint.size();
    progress |= executor.advancePointToPoint(pointToPoint, pool);
    operationChanges += before - pointToPoint.size();
  }
  if (!broken && (matching.pressured() || transport->anyContended())) {
    progress |= matching.park(*this, !pointToPoint.empty(), operationChanges);
  }
  // Deadlines to the millisecond: the scan of every pending operation is
  // not repeated on every round of a spinning loop.
  if (!broken && now >= nextDeadlineCheck) {
    nextDeadlineCheck = now + std::chrono::milliseconds(1);
    checkDeadlines(now);
  }
  if (!broken) probeAwaitedPeers(now);
  if (broken && !reportUnsent.empty()) progress |= sendReports();
  if (collectives.empty() && pointToPoint.empty() && !drained.load(std::memory_order_relaxed)) {
    drained.store(true);
  }
  // How long to spin next: the oldest work's kind.
  loop.setLatencyBound(!collectives.empty()    ? collectives.front()->latencyBound
                       : !pointToPoint.empty() ? pointToPoint.front()->latencyBound
                                               : false);
  // Credits that found no message to ride on go now, before the engine
  // spins or sleeps, to a peer that may be waiting for them.
  if (!progress) progress |= transport->flushCredits();
  return progress;
}

Engine::Engine(std::unique_ptr<Transport> transport, EngineOptions options)
    : impl_(std::make_unique<Impl>(std::move(transport), std::move(options))) {
  gate_ = std::make_shared<DriverGate>();
  gate_->impl = impl_.get();
  impl_->workDriver = driver();
  impl_->loop.start();
}

Engine::~Engine() {
  if (impl_->loop.steppedHere()) {
    // A Work callback of this group's own operation destroyed the group: the
    // step that runs the callback would go on with what is destroyed here,
    // and stopping waits for that step, so it would wait for itself.
    log(LogLevel::Error,
        "group {}: destroyed by a Work callback of its own operation, which runs inside the "
        "group's progress; destroy the group after the callback returns (after wait(), or "
        "from another thread). Aborting instead of deadlocking.",
        impl_->options.group);
    std::abort();
  }
  impl_->loop.stopDrivers();
  {
    std::unique_lock lock(gate_->mutex);  // waits for the drivers inside
    gate_->impl = nullptr;
  }
  impl_->loop.join();
  impl_->takeIntake();
  impl_->failAll(
      Error(ErrorKind::Aborted, "the backend was destroyed before the operation completed"));
}

std::string Operation::description() const {
  if (detailFormat.empty()) return fmt::format("{} #{}", toString(type), sequence);
  fmt::dynamic_format_arg_store<fmt::format_context> args;
  for (size_t i = 0; i < detailArgCount; ++i) {
    std::visit([&](auto v) { args.push_back(v); }, detailArgs[i]);
  }
  return fmt::format("{} #{} ({})", toString(type), sequence, fmt::vformat(detailFormat, args));
}

std::shared_ptr<Work> Engine::submit(std::unique_ptr<Operation> op) {
  std::shared_ptr<Work> work;
  {
    std::lock_guard lock(impl_->intakeMutex);
    op->sequence = op->pointToPoint ? ++impl_->pointToPointCount : ++impl_->collectiveCount;
    work = impl_->enqueue(std::move(op));
  }
  impl_->loop.wakeSleepers();
  return work;
}

std::shared_ptr<Work> Engine::Impl::enqueue(std::unique_ptr<Operation> op) {
  auto work = std::make_shared<Work>(
      op->type, op->sequence,
      [this](const Work& w) {
        requestAbort(fmt::format("{} #{} was aborted by the user", toString(w.opType()),
                                 w.sequenceNumber()));
      },
      workDriver);
  op->work = work;
  if (brokenShared) {
    ErrorInfo info = brokenCopy->info();
    info.message = fmt::format("{} cannot start: the group is broken by an earlier failure: {}",
                               op->description(), info.message);
    work->finish(std::make_exception_ptr(Error(std::move(info))));
    return work;
  }
  traceStage(options.trace, EventTrace::Stage::Submit, op->pointToPoint,
             op->pointToPoint ? op->tag : op->sequence);
  intake.push_back(std::move(op));
  loop.markPending();
  return work;
}

uint64_t Engine::sequence() const {
  std::lock_guard lock(impl_->intakeMutex);
  return impl_->collectiveCount;
}

void Engine::setSequence(uint64_t value) {
  std::lock_guard lock(impl_->intakeMutex);
  impl_->collectiveCount = value;
}

void Engine::abort(const std::string& reason) {
  impl_->requestAbort(reason);
}

void Engine::Impl::requestAbort(const std::string& reason) {
  {
    std::lock_guard lock(intakeMutex);
    abortRequest = reason;
    loop.markPending();
  }
  loop.wake();
}

std::shared_ptr<const Work::ProgressDriver> Engine::driver() {
  return std::make_shared<const Work::ProgressDriver>(
      [gate = gate_](const Work& work, std::chrono::steady_clock::time_point until) {
        std::shared_lock lock(gate->mutex);
        if (gate->impl != nullptr) gate->impl->loop.drive(work, until);
      });
}

size_t Engine::chunkBytes() const noexcept {
  return impl_->chunk;
}

size_t Engine::oneShotBytes() const noexcept {
  const Board* board = impl_->transport->board();
  return board != nullptr ? board->maxBytes() : 0;
}

}  // namespace rdmacc
