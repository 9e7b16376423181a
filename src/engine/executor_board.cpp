// The executor's one-shot collectives (Plan::board): every rank posts its
// input to the transport's board and reduces every rank's, in rank order, so
// that every rank computes the same bits. The step's sends and receives are
// kept as counts (one message each) so that what the operation waits for
// (awaited, needs) reads as for any schedule.
#include <cstring>

#include "src/engine/event_trace.hpp"
#include "src/engine/executor.hpp"
#include "src/reduce/reduce.hpp"

namespace rdmacc {

// Rank 0's and rank 1's contributions in one pass, then the others'.
void reduceBoard(Board& board, const OneShotCall& call, int rank, int size, uint64_t sequence) {
  const size_t count = call.bytes / elementSize(call.dtype);
  auto part = [&](int r) -> const uint8_t* {
    return r == rank ? board.mine(sequence) : board.peek(r, sequence, call.checkValue, call.bytes);
  };
  reduceTo(call.data, part(0), part(1), count, call.dtype, call.reduceOp);
  for (int r = 2; r < size; ++r) reduceInto(call.data, part(r), count, call.dtype, call.reduceOp);
  if (call.avgDivisor > 1) divideBy(call.data, count, call.dtype, call.avgDivisor);
  board.consumed(sequence);
}

bool Executor::advanceBoard(Active& a) {
  Operation& op = *a.op;
  Board& board = *transport_.board();
  const Step& s = op.steps().front();
  const size_t bytes = op.schedule->sendExtent.bytes;
  bool progress = false;
  if (!s.sends.empty() && a.sentMessages.front() == 0) {
    board.engineWaits(true);
    if (!op.boardPosted) {  // else the caller posted it (Engine::tryOneShot)
      if (!board.writable(op.sequence)) return false;
      const int64_t posting = traceClock(options_.trace);
      board.post(op.sequence, op.checkValue, op.sendBase + op.schedule->sendExtent.offset, bytes);
      tracePost(options_.trace, false, op.sequence, s.sends.front().peer, posting);
    }
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
    traceStage(options_.trace, EventTrace::Stage::Arrival, false, op.sequence, s.recvs[j].peer);
    a.received[j] = bytes;
    a.receivedMessages[j] = 1;
    progress = true;
  }
  if (!all) return progress;
  reduceBoard(board,
              OneShotCall{.data = op.recvBase + op.schedule->recvExtent.offset,
                          .bytes = bytes,
                          .dtype = op.dtype,
                          .reduceOp = op.reduceOp,
                          .avgDivisor = op.avgDivisor,
                          .checkValue = op.checkValue},
              options_.rank, static_cast<int>(s.recvs.size()) + 1, op.sequence);
  board.engineWaits(false);
  ++a.step;
  if (op.epilogue) op.epilogue();
  a.finished = true;
  traceStage(options_.trace, EventTrace::Stage::Done, false, op.sequence);
  return true;
}

}  // namespace rdmacc
