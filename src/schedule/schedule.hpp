// A collective as data: steps of sends and receives over byte ranges of the
// operation's buffers. Algorithms (src/schedule/algorithms/) build schedules with pure
// index arithmetic that the host tests check without a device; the engine
// executes them. Within a step every transfer progresses at once, chunk by
// chunk; a send may be gated on receives of the same step (it forwards what
// they have delivered: pipelined trees and chains); steps run in order.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "rdmacc/options.hpp"

namespace rdmacc {

// Memory an operation touches (its buffers), as address intervals (empty:
// lo == hi).
struct Span {
  uintptr_t lo = 0;
  uintptr_t hi = 0;
  bool overlaps(const Span& o) const { return lo < o.hi && o.lo < hi; }
  void cover(const uint8_t* base, size_t offset, size_t bytes) {
    if (base == nullptr || bytes == 0) return;
    uintptr_t from = reinterpret_cast<uintptr_t>(base) + offset, to = from + bytes;
    if (lo == hi) {
      lo = from, hi = to;
    } else {
      lo = std::min(lo, from), hi = std::max(hi, to);
    }
  }
};

struct Range {
  size_t offset = 0;
  size_t bytes = 0;
  friend bool operator==(const Range&, const Range&) = default;
};

// Reduce: the receive range's bytes combined with the incoming ones.
// ReduceWithSend: the send buffer's bytes at the same range combined with
// the incoming ones, into the receive range (whose old bytes are not read):
// a reduction out of place, without copying the input into the receive
// buffer first (ring reduce-scatter reads the caller's input as it is).
enum class Combine : uint8_t { Copy, Reduce, ReduceWithSend };

struct SendSpec {
  int peer = 0;
  Range range;             // in the operation's send buffer (or receive buffer: fromRecv)
  std::vector<int> gates;  // indices into Step::recvs this send forwards from
  // The range is in the receive buffer: bytes an earlier step received (and
  // reduced) there, forwarded.
  bool fromRecv = false;
};

struct RecvSpec {
  int peer = 0;
  // In the operation's receive buffer. A Copy receive into registered memory
  // may be written by the peer directly at any time after the operation
  // starts (the engine advertises it then), so a schedule must not read or
  // write a Copy receive's range in an earlier step unless the data the peer
  // sends depends on that access (ring allreduce's gather half receives
  // blocks this rank sent during the reduce-scatter half: the peer's reduced
  // block cannot exist before that send arrived).
  Range range;
  Combine combine = Combine::Copy;
  // Index into Step::sends of a send that reads the bytes this receive
  // overwrites (recursive doubling exchanges one range both ways): each chunk
  // is combined only after that send has taken the same chunk. -1: none.
  int afterSend = -1;
  // The result goes to the operation's output buffer instead of the receive
  // buffer: Operation::outBase holds the bytes that start at
  // Operation::outOrigin of the receive buffer's layout (a reduce-scatter's
  // last receive writes the caller's output directly, no copy out
  // afterwards). The range, and a ReduceWithSend's read of the send buffer,
  // stay in the receive buffer's coordinates.
  bool toOutput = false;
};

struct Step {
  std::vector<SendSpec> sends;
  std::vector<RecvSpec> recvs;  // at most one per peer
  std::vector<Range> finalize;  // ranges to finish (Avg's division) when the step starts
};

using Schedule = std::vector<Step>;

// A schedule as operations carry it: its steps, the algorithm chosen for it,
// and what the engine asks of it before running it (the memory it touches,
// whether its messages fit one slot), worked out once when it is built
// instead of for every operation (plans are cached and shared by the
// operations that repeat them, as a training loop does).
struct Plan {
  explicit Plan(Schedule s, Algorithm a = Algorithm::Auto);
  Schedule steps;
  Algorithm algorithm;
  // The bytes its steps touch, as one interval each (bytes 0: none):
  // relative to the send buffer (sends from it, and the input side of
  // ReduceWithSend receives) and to the receive buffer (forwarding sends,
  // receives, finalize ranges), and the receives into the output buffer.
  Range sendExtent;
  Range recvExtent;
  Range outExtent;         // receives toOutput (in the receive buffer's coordinates)
  size_t largestSend = 0;  // bytes of its largest send
  // Every rank the steps send to or receive from, each once, in the order
  // the steps first name them: a transport that connects on first use
  // starts all of them when the operation starts (Transport::prepare).
  std::vector<int> peers;
  // One-shot through the transport's board (transport/transport.hpp, Board) instead of
  // messages: one step whose sends and receives name every peer (whom the
  // operation waits for); every rank posts its send range and reduces all
  // contributions in rank order.
  bool board = false;
};

// A one-shot allreduce of `bytes` through the transport's board
// (Plan::board): its one step names every peer, in rank order, as sent to
// and received from.
std::shared_ptr<Plan> boardPlan(int rank, int size, size_t bytes);

// count elements split into `parts` contiguous blocks whose sizes differ by at
// most one element (the first count % parts blocks are one larger); in bytes.
std::vector<Range> evenBlocks(size_t count, int parts, size_t elementSize);
// `parts` blocks of `bytes` each, laid end to end.
std::vector<Range> uniformBlocks(size_t bytes, int parts);
// Blocks of the given element counts laid end to end; in bytes.
std::vector<Range> blocksOf(const std::vector<size_t>& counts, size_t elementSize);

}  // namespace rdmacc
