// Engine::tryOneShot: a small allreduce on a board (Plan::board) run on the
// caller's thread, without an Operation, the intake or the engine's loop,
// while nothing else is pending.
#include <sched.h>

#include <chrono>
#include <mutex>

#include "rdmacc/error.hpp"
#include "src/engine_impl.hpp"

namespace rdmacc {

std::shared_ptr<Work> Engine::tryOneShot(const OneShotCall& call, OperationFactory& factory) {
  Impl& e = *impl_;
  Board* board = e.transport->board();
  if (board == nullptr || e.options.trace != nullptr) return nullptr;  // traced: every stage
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
    board->post(sequence, call.checkValue, call.data, call.bytes);
    // Peers in rank order; the clock only every 64 polls, the first time to
    // start the spin (most calls end before: no clock read at all).
    int next = 0;
    std::chrono::steady_clock::time_point until{};
    for (unsigned polls = 1;; ++polls) {
      try {
        while (next < e.size && (next == e.rank || board->peek(next, sequence, call.checkValue,
                                                               call.bytes) != nullptr)) {
          ++next;
        }
      } catch (const Error&) {
        break;  // a mismatch: the engine fails the operation (and the group) naming the peer
      }
      if (next == e.size) {
        reduceBoard(*board, call, e.rank, e.size, sequence);
        return std::make_shared<Work>(OpType::Allreduce, sequence, Work::Completed{});
      }
      if (polls % 64 == 0) {
        const auto now = std::chrono::steady_clock::now();
        if (polls == 64) {
          until = now + e.options.spinLatencyBound;
        } else if (now >= until) {
          break;
        }
      }
      if (e.options.spinYield) sched_yield();
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
