// The executor's one-shot collectives (Plan::board): every rank posts its
// input to the transport's board and reduces every rank's, in rank order, so
// that every rank computes the same bits. The step's sends and receives are
// kept as counts (one message each) so that what the operation waits for
// (awaited, needs) reads as for any schedule.
#include <cstring>

#include "src/event_trace.hpp"
#include "src/executor.hpp"
#include "src/reduce.hpp"

namespace rdmacc {

bool Executor::advanceBoard(Active& a) {
  Operation& op = *a.op;
  Board& board = *transport_.board();
  const Step& s = op.steps().front();
  const size_t bytes = op.schedule->sendExtent.bytes;
  bool progress = false;
  if (!s.sends.empty() && a.sentMessages.front() == 0) {
    if (!board.writable(op.sequence)) return false;
    board.post(op.sequence, op.checkValue, op.sendBase + op.schedule->sendExtent.offset, bytes);
    for (size_t i = 0; i < s.sends.size(); ++i) {
      a.sent[i] = bytes;
      a.sentMessages[i] = 1;
    }
    progress = true;
  }
  bool all = true;
  for (size_t j = 0; j < s.recvs.size(); ++j) {
    if (a.receivedMessages[j] > 0) continue;
    if (board.peek(s.recvs[j].peer, op.sequence, op.checkValue, bytes) == nullptr) {
      all = false;
      continue;
    }
    a.received[j] = bytes;
    a.receivedMessages[j] = 1;
    progress = true;
  }
  if (!all) return progress;
  // Every contribution is there: rank 0's and rank 1's in one pass, then the
  // others (receives are in rank order, this rank's own among them by rank).
  const size_t count = bytes / elementSize(op.dtype);
  uint8_t* out = op.recvBase + op.schedule->recvExtent.offset;
  const int rank = options_.rank;
  auto part = [&](int r) -> const uint8_t* {
    return r == rank ? board.mine(op.sequence) : board.peek(r, op.sequence, op.checkValue, bytes);
  };
  const int size = static_cast<int>(s.recvs.size()) + 1;
  reduceTo(out, part(0), part(1), count, op.dtype, op.reduceOp);
  for (int r = 2; r < size; ++r) reduceInto(out, part(r), count, op.dtype, op.reduceOp);
  if (op.avgDivisor > 1) divideBy(out, count, op.dtype, op.avgDivisor);
  board.consumed(op.sequence);
  ++a.step;
  if (op.epilogue) op.epilogue();
  a.finished = true;
  traceStage(options_.trace, EventTrace::Stage::Done, false, op.sequence);
  return true;
}

}  // namespace rdmacc
