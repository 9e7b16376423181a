// Engine::tryOneShot: a small allreduce on a board (Plan::board) run on the
// caller's thread, without an Operation, the intake or the engine's loop,
// while nothing else is pending.
#include <sched.h>

#include <chrono>
#include <mutex>
#include <optional>

#include "rdmacc/error.hpp"
#include "src/engine/engine_impl.hpp"

namespace rdmacc {

// A board that posts through the engine's queues: earlier one-shot calls
// the engine still runs (a peer was late, and later calls queued behind)
// must end before this one can post (one board operation at a time), so
// the caller drives them to the end, for up to the spin a waiting caller
// would, and then takes the fast path again instead of queueing behind them
// for good. False (submit as usual) when other work is pending or the spin
// ran out.
bool Engine::Impl::finishEarlierOneShots() {
  const auto until = std::chrono::steady_clock::now() + options.spinWaitLatencyBound;
  while (!drained.load(std::memory_order_acquire)) {
    if (!onlyBoardWork() || std::chrono::steady_clock::now() >= until) return false;
    if (!step()) sched_yield();
  }
  return true;
}

// Polls the board for the peers' posts of `sequence` in rank order, the
// clock only every 64 polls (most calls end before: no clock read at all).
// True when every peer's post arrived; false when they are late or one
// mismatched (the engine then fails the operation, and the group, naming
// the peer).
bool Engine::Impl::awaitBoardPeers(Board& board, const OneShotCall& call, uint64_t sequence,
                                   bool exclusive) {
  EventTrace* trace = options.trace;
  int next = 0;
  std::chrono::steady_clock::time_point until{}, yieldFrom{};
  bool yielding = false;
  for (unsigned polls = 1;; ++polls) {
    try {
      while (next < size &&
             (next == rank || board.peek(next, sequence, call.checkValue, call.bytes) != nullptr)) {
        if (next != rank) traceStage(trace, EventTrace::Stage::Arrival, false, sequence, next);
        ++next;
      }
    } catch (const Error&) {
      return false;
    }
    if (next == size) return true;
    if (polls % 64 == 0) {
      const auto now = std::chrono::steady_clock::now();
      if (polls == 64) {
        // RDMA (exclusive): a peer is late by a whole post of its own (tens
        // of microseconds under emulation); this thread spins as long as a
        // caller blocked in wait() would, yielding past the engine's spin.
        until = now + (exclusive ? options.spinWaitLatencyBound : options.spinLatencyBound);
        yieldFrom = now + options.spinLatencyBound;
      } else if (now >= until) {
        return false;
      } else if (exclusive && now >= yieldFrom) {
        yielding = true;
      }
    }
    if (options.spinYield || yielding) sched_yield();
  }
}

std::shared_ptr<Work> Engine::tryOneShot(const OneShotCall& call, OperationFactory& factory) {
  Impl& e = *impl_;
  Board* board = e.transport->board();
  if (board == nullptr) return nullptr;
  EventTrace* trace = e.options.trace;
  // A board that posts through the engine's queues: this thread makes
  // progress itself meanwhile (a round first: what arrived is seen before
  // this call runs without the engine).
  std::optional<Progress::Exclusive> exclusive;
  if (board->exclusive()) {
    exclusive.emplace(e.loop);
    if (!exclusive->held()) return nullptr;
    e.step();
    if (!e.finishEarlierOneShots()) return nullptr;
  }
  std::shared_ptr<Work> work;
  {
    // Held while waiting for the peers (spinLatencyBound): an operation submitted
    // meanwhile must be numbered and started after this one.
    std::lock_guard lock(e.intakeMutex);
    if (e.brokenShared || !e.intake.empty() || !e.drained.load()) return nullptr;
    const uint64_t sequence = e.collectiveCount + 1;
    // Nothing arrived that the engine has not seen (a peer's abort must fail
    // this call, not be read after it).
    if (!board->quiet() || !board->writable(sequence)) return nullptr;
    e.collectiveCount = sequence;
    // Traced as the engine's stages (a late call's are recorded again from
    // its submission on).
    traceStage(trace, EventTrace::Stage::Submit, false, sequence);
    traceStage(trace, EventTrace::Stage::Start, false, sequence);
    const int64_t posting = traceClock(trace);
    board->post(sequence, call.checkValue, call.data, call.bytes);
    tracePost(trace, false, sequence, e.rank == 0 ? 1 : 0, posting);
    if (e.awaitBoardPeers(*board, call, sequence, exclusive.has_value())) {
      reduceBoard(*board, call, e.rank, e.size, sequence);
      traceStage(trace, EventTrace::Stage::Done, false, sequence);
      traceStage(trace, EventTrace::Stage::Finish, false, sequence);
      if (exclusive) exclusive->done();
      return std::make_shared<Work>(OpType::Allreduce, sequence, Work::Completed{});
    }
    // The peers are late: the engine waits for them (and times out, or sees
    // them leave) as for any operation.
    std::unique_ptr<Operation> op = factory.make();
    op->sequence = sequence;
    op->boardPosted = true;
    work = e.enqueue(std::move(op));
  }
  e.loop.wakeSleepers();
  return work;
}

}  // namespace rdmacc
