#include "src/engine/executor.hpp"
#include "src/core/buffer.hpp"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "rdmacc/error.hpp"
#include "rdmacc/log.hpp"
#include "src/core/deadline.hpp"
#include "src/engine/event_trace.hpp"
#include "src/reduce/reduce.hpp"
#include "src/transport/peer_errors.hpp"
#include "src/transport/registration_cache.hpp"

namespace rdmacc {

using wire::describe;
using wire::Header;
using wire::kDirect;
using wire::MessageKind;

namespace {

// Where receive `recv` of `op` writes its range's first byte.
uint8_t* destination(const Operation& op, const RecvSpec& recv) {
  return recv.toOutput ? op.outBase + (recv.range.offset - op.outOrigin)
                       : op.recvBase + recv.range.offset;
}

// One send's messages in this round, against the transport's burst for
// its peer (Transport::sendBurst; 0: as many as credits allow).
class Burst {
 public:
  explicit Burst(size_t limit) : limit_(limit) {}
  // One more message went: true when the round's share is spent (the
  // receives and the next round's poll go first).
  bool spent() { return limit_ != 0 && ++sent_ == limit_; }

 private:
  size_t limit_;
  size_t sent_ = 0;
};

}  // namespace

Executor::Executor(Transport& transport, Matching& matching, const EngineOptions& options,
                   const ByRank<bool>& gone)
    : transport_(transport),
      matching_(matching),
      options_(options),
      gone_(gone),
      chunk_(transport.chunkBytes()) {
  for (int peer = 0; peer < gone.size(); ++peer) {
    anyMemoryPeers_ |=
        peer != options.rank && transport.directWrites(peer) == DirectWrites::AnyMemory;
  }
}

// --------------------------------------------------------- collectives --

void Executor::enterStep(Active& a) {
  const Operation& op = *a.op;
  const Step& s = op.steps()[a.step];
  a.sent.assign(s.sends.size(), 0);
  a.sentMessages.assign(s.sends.size(), 0);
  a.received.assign(s.recvs.size(), 0);
  a.receivedMessages.assign(s.recvs.size(), 0);
  if (op.avgDivisor <= 1) return;
  for (const Range& r : s.finalize) {
    divideBy(op.recvBase + r.offset, r.bytes / elementSize(op.dtype), op.dtype, op.avgDivisor);
  }
}

// Copy receives of at least zeroCopyMinBytes that the sending peer may write
// straight into place: into memory the user registered (RDMA), or any memory
// (shared memory with single-copy writes). Every schedule keeps what makes
// this safe at any time after the start (schedule/schedule.hpp): a Copy receive's
// destination is not read or written by this rank before the receive, except
// by accesses the sender's data depends on.
void Executor::prepareAdverts(Active& a) {
  const Operation& op = *a.op;
  const RegistrationCache* registrations = options_.registrations;
  const bool registered = registrations != nullptr && registrations->entries() > 0;
  // Nothing registered and no peer that writes anywhere (the common case):
  // no bookkeeping per operation.
  if (op.recvBase == nullptr || (!registered && !anyMemoryPeers_)) return;
  for (size_t k = 0; k < op.steps().size(); ++k) {
    const auto& recvs = op.steps()[k].recvs;
    for (size_t j = 0; j < recvs.size(); ++j) {
      const RecvSpec& r = recvs[j];
      if (r.combine != Combine::Copy || r.range.bytes == 0 ||
          r.range.bytes < options_.zeroCopyMinBytes || r.range.bytes > UINT32_MAX) {
        continue;
      }
      const DirectWrites kind = transport_.directWrites(r.peer);
      if (kind == DirectWrites::None || (kind == DirectWrites::Registered && !registered)) continue;
      // Shared memory: a single-copy write moves the receiver's copy to the
      // sender, with the kernel's copy (slower than memcpy). That pays where
      // ranks both send and receive (allgather, allreduce's ring) and not
      // where the root's sends are the pipeline's bottleneck (broadcast,
      // scatter): docs/performance.md, the shared-memory single-copy table.
      if (kind == DirectWrites::AnyMemory &&
          (op.type == OpType::Broadcast || op.type == OpType::Scatter)) {
        continue;
      }
      const uint8_t* dst = destination(op, r);
      std::shared_ptr<const Registration> registration;
      if (kind == DirectWrites::Registered) {
        registration = registrations->find(dst, r.range.bytes);
        if (!registration) continue;
      }
      if (a.advertised.empty()) {  // the first: the table for every step and receive
        a.advertised.resize(op.steps().size());
        for (size_t i = 0; i < op.steps().size(); ++i) {
          a.advertised[i].assign(op.steps()[i].recvs.size(), 0);
        }
      }
      a.advertised[k][j] = 1;
      a.advertsToSend.emplace_back(r.peer, Header{.kind = MessageKind::Advert,
                                                  .opType = static_cast<uint8_t>(op.type),
                                                  .sequence = static_cast<uint32_t>(op.sequence),
                                                  .step = static_cast<uint32_t>(k),
                                                  .check = op.checkValue,
                                                  .addr = reinterpret_cast<uintptr_t>(dst),
                                                  .rkey = registration ? registration->rkey : 0,
                                                  .length = static_cast<uint32_t>(r.range.bytes)});
      if (registration) a.exposed.push_back(std::move(registration));
    }
  }
}

// The first call: a peer the schedule needs must not have gone; then the
// copy-in, the prologue, the first step and the adverts of direct receives.
void Executor::startCollective(Active& a) {
  Operation& op = *a.op;
  for (int peer = 0; peer < gone_.size(); ++peer) {
    if (gone_[peer] && needs(a, peer, chunk_, matching_)) {
      throw peerGone(peer, transport_.peerAddress(peer), transport_.departure(peer));
    }
  }
  a.started = true;
  if (op.schedule) {
    for (int peer : op.schedule->peers) transport_.prepare(peer);
  }
  traceStage(options_.trace, EventTrace::Stage::Start, false, op.sequence);
  a.deadline = deadlineAfter(op.timeout);
  if (logEnabled(LogLevel::Trace))
    log(LogLevel::Trace, "start {} ({} steps)", op.description(), op.steps().size());
  if (op.copyIn.bytes > 0 && op.copyIn.to != op.copyIn.from) {
    std::memmove(op.copyIn.to, op.copyIn.from, op.copyIn.bytes);
  }
  if (op.prologue) op.prologue();
  if (!op.steps().empty()) enterStep(a);
  prepareAdverts(a);
}

// Posts the chunks of send i of the current step that its gates (the
// receives it forwards from) have made available, while the peer's slots
// and the burst allow. True when any went.
bool Executor::sendChunks(Active& a, const Step& s, size_t i, const Expectation& expected) {
  Operation& op = *a.op;
  const SendSpec& send = s.sends[i];
  const size_t bytes = send.range.bytes;
  bool progress = false;
  Burst burst(transport_.sendBurst(send.peer));
  while (a.sentMessages[i] < messages(bytes)) {
    size_t available = bytes;
    bool gatesDone = true;
    for (int g : send.gates) {
      available = std::min(available, a.received[static_cast<size_t>(g)]);
      gatesDone = gatesDone && a.receivedMessages[static_cast<size_t>(g)] ==
                                   messages(s.recvs[static_cast<size_t>(g)].range.bytes);
    }
    size_t payload = std::min(chunk_, bytes - a.sent[i]);
    if (a.sent[i] + payload > available || (payload == 0 && !gatesDone)) break;
    Header h{.kind = MessageKind::Collective,
             .opType = static_cast<uint8_t>(op.type),
             .sequence = static_cast<uint32_t>(op.sequence),
             .step = static_cast<uint32_t>(a.step),
             .payload = static_cast<uint32_t>(payload),
             .chunk = static_cast<uint32_t>(a.sentMessages[i]),
             .check = op.checkValue};
    const uint8_t* base = send.fromRecv ? op.recvBase : op.sendBase;
    const int64_t posting = traceClock(options_.trace);
    if (!transport_.trySend(send.peer, h, base + send.range.offset + a.sent[i], a.zeroCopy,
                            matching_.directTarget(expected, send.peer, a.sent[i], payload))) {
      break;
    }
    tracePost(options_.trace, false, op.sequence, send.peer, posting);
    a.sent[i] += payload;
    ++a.sentMessages[i];
    progress = true;
    if (burst.spent()) break;
  }
  return progress;
}

// The next step may begin once no zero-copy send still reads what it
// finalizes (writes into the receive buffer).
bool Executor::nextStepMayBegin(const Active& a) const {
  const Operation& op = *a.op;
  if (a.step + 1 >= op.steps().size()) return true;
  for (const Range& r : op.steps()[a.step + 1].finalize) {
    if (a.zeroCopy->overlaps(op.recvBase + r.offset, r.bytes)) return false;
  }
  return true;
}

bool Executor::advanceCollective(Active& a, uint32_t oldestSequence) {
  Operation& op = *a.op;
  bool progress = false;
  if (!a.started) {
    startCollective(a);
    progress = true;
  }
  if (op.schedule && op.schedule->board) return advanceBoard(a) || progress;
  while (a.advertsSent < a.advertsToSend.size()) {
    auto& [peer, header] = a.advertsToSend[a.advertsSent];
    if (!transport_.trySend(peer, header, nullptr)) break;
    ++a.advertsSent;
    progress = true;
  }
  while (a.step < op.steps().size()) {
    const Step& s = op.steps()[a.step];
    const Expectation expected{.type = op.type,
                               .sequence = op.sequence,
                               .step = a.step,
                               .check = op.checkValue,
                               .oldestSequence = oldestSequence};
    bool complete = true;
    for (size_t i = 0; i < s.sends.size(); ++i) {
      progress |= sendChunks(a, s, i, expected);
      complete = complete && a.sentMessages[i] == messages(s.sends[i].range.bytes);
    }
    for (size_t j = 0; j < s.recvs.size(); ++j) {
      progress |= receive(a, expected, j);
      complete = complete && a.receivedMessages[j] == messages(s.recvs[j].range.bytes);
    }
    if (!complete || !nextStepMayBegin(a)) return progress;
    ++a.step;
    if (a.step < op.steps().size()) enterStep(a);
    progress = true;
  }
  // The epilogue may write the buffers, and the caller may reuse them once
  // the work completes.
  if (!a.zeroCopy->empty()) return progress;
  if (op.epilogue) op.epilogue();
  a.finished = true;
  traceStage(options_.trace, EventTrace::Stage::Done, false, op.sequence);
  return true;
}

// The current step's receive j: the chunks that arrived, in order, copied or
// reduced into place (or already there: direct).
bool Executor::receive(Active& a, const Expectation& expected, size_t j) {
  const Operation& op = *a.op;
  const RecvSpec& recv = op.steps()[a.step].recvs[j];
  const size_t bytes = recv.range.bytes;
  bool progress = false;
  while (a.receivedMessages[j] < messages(bytes)) {
    if (recv.afterSend >= 0 &&
        a.sentMessages[static_cast<size_t>(recv.afterSend)] <= a.receivedMessages[j]) {
      break;  // that chunk is still to be sent from the bytes we would overwrite
    }
    size_t payload = std::min(chunk_, bytes - a.received[j]);
    auto found = matching_.findCollective(expected, recv.peer,
                                          static_cast<uint32_t>(a.receivedMessages[j]), payload);
    if (!found) break;
    Matching::It in = *found;
    uint8_t* dst = destination(op, recv) + a.received[j];
    if (in->header.flags & kDirect) {  // the payload is already in place
      if (a.advertised.empty() || !a.advertised[a.step][j]) {
        throw Error(ErrorInfo{.kind = ErrorKind::Protocol,
                              .message = fmt::format("rank {} wrote {} directly, but this rank did "
                                                     "not advertise that receive",
                                                     recv.peer, describe(in->header)),
                              .peerRank = recv.peer,
                              .hint = "every rank must run the same rdmacc version"});
      }
    } else {
      if (a.zeroCopy->overlaps(dst, payload)) break;  // a write still reads these bytes
      const uint8_t* src = matching_.payload(recv.peer, *in);
      const size_t count = payload / elementSize(op.dtype);
      if (recv.combine == Combine::Copy) {
        copyBytes(dst, src, payload);
      } else if (recv.combine == Combine::ReduceWithSend) {
        // This rank's contribution combined with the incoming one in one
        // pass (no copy of it into place first).
        reduceTo(dst, op.sendBase + recv.range.offset + a.received[j], src, count, op.dtype,
                 op.reduceOp);
      } else {
        reduceInto(dst, src, count, op.dtype, op.reduceOp);
      }
    }
    matching_.consume(recv.peer, in);
    a.received[j] += payload;
    ++a.receivedMessages[j];
    progress = true;
  }
  return progress;
}

// ------------------------------------------------------ point to point --

bool Executor::advanceSend(Active& a) {
  Operation& op = *a.op;
  bool progress = false;
  Burst burst(transport_.sendBurst(op.peer));
  while (a.chunks < messages(op.bytes)) {
    size_t payload = std::min(chunk_, op.bytes - a.done);
    Header h{.kind = MessageKind::PointToPoint,
             .sequence = op.tag,
             .step = a.chunks,
             .payload = static_cast<uint32_t>(payload),
             .check = op.bytes};
    const int64_t posting = traceClock(options_.trace);
    if (!transport_.trySend(op.peer, h, op.buffer + a.done, a.zeroCopy)) break;
    tracePost(options_.trace, true, op.tag, op.peer, posting);
    a.done += payload;
    ++a.chunks;
    progress = true;
    if (burst.spent()) break;
  }
  return progress;
}

bool Executor::advanceRecv(Active& a) {
  Operation& op = *a.op;
  bool progress = false;
  while (a.chunks < messages(op.bytes)) {
    auto match = matching_.findPointToPoint(a.source, op.tag, a.chunks);
    if (!match) break;
    const int from = match->peer;
    const Header& h = match->it->header;
    if (h.check != op.bytes) {
      throw Error(ErrorInfo{
          .kind = ErrorKind::InvalidArgument,
          .message =
              fmt::format("rank {} sent {} bytes with tag {}, but the receive expects {} bytes",
                          from, h.check, op.tag, op.bytes),
          .peerRank = from,
          .hint = "the tensors of a send and its matching recv must have the same size and dtype"});
    }
    if (auto bad = wire::checkPointToPointChunk(h, op.bytes, a.done, chunk_)) {
      throw protocolViolation(from, transport_.peerAddress(from), *bad);
    }
    size_t payload = h.payload;
    copyBytes(op.buffer + a.done, matching_.payload(from, *match->it), payload);
    matching_.consume(from, match->it);
    a.source = from;
    a.done += payload;
    ++a.chunks;
    progress = true;
  }
  return progress;
}

bool Executor::advancePointToPoint(std::vector<std::unique_ptr<Active>>& ops, ActivePool& pool) {
  if (ops.empty()) return false;
  bool progress = false;
  streaming_.assign(gone_.size(), 0);  // one send per peer at a time
  for (auto it = ops.begin(); it != ops.end();) {
    Active& a = **it;
    Operation& op = *a.op;
    if (!a.started) {
      if (op.peer >= 0 && gone_[op.peer] && needs(a, op.peer, chunk_, matching_)) {
        throw peerGone(op.peer, transport_.peerAddress(op.peer), transport_.departure(op.peer));
      }
      a.started = true;
      traceStage(options_.trace, EventTrace::Stage::Start, true, op.tag, op.peer);
      a.deadline = deadlineAfter(op.timeout);
      if (op.peer >= 0) a.source = op.peer;
    }
    if (op.isSend) {
      if (streaming_[op.peer]) {
        ++it;
        continue;
      }
      streaming_[op.peer] = true;
      progress |= advanceSend(a);
    } else {
      progress |= advanceRecv(a);
    }
    if (a.chunks == messages(op.bytes) && a.zeroCopy->empty()) {
      traceStage(options_.trace, EventTrace::Stage::Finish, true, op.tag, a.source);
      op.work->finish(nullptr, a.source);
      pool.give(std::move(*it));
      it = ops.erase(it);
      progress = true;
    } else {
      ++it;
    }
  }
  return progress;
}

}  // namespace rdmacc
