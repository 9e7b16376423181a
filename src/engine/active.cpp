#include "src/engine/active.hpp"
#include "src/engine/matching.hpp"

#include "src/transport/registration_cache.hpp"

namespace rdmacc {

void Active::reset() {
  op.reset();
  if (zeroCopy.use_count() == 1) {
    zeroCopy->clear();
  } else {  // a write's record still holds it (failure paths): leave it to that
    zeroCopy = std::make_shared<ZeroCopyWrites>(zeroCopy->registrations());
  }
  advertsToSend.clear();
  advertsSent = 0;
  advertised.clear();
  exposed.clear();
  started = finished = false;
  opaque = true;
  latencyBound = false;
  footprint = {};
  step = 0;
  sent.clear();
  sentMessages.clear();
  received.clear();
  receivedMessages.clear();
  deadline = {};
  source = -1;
  done = 0;
  chunks = 0;
}

std::unique_ptr<Active> ActivePool::take(std::unique_ptr<Operation> op) {
  std::unique_ptr<Active> a;
  if (spare_.empty()) {
    a = std::make_unique<Active>();
    a->zeroCopy = std::make_shared<ZeroCopyWrites>(registrations_);
  } else {
    a = std::move(spare_.back());
    spare_.pop_back();
  }
  a->op = std::move(op);
  return a;
}

void ActivePool::give(std::unique_ptr<Active> a) {
  if (spare_.size() >= 64) return;
  a->reset();
  spare_.push_back(std::move(a));
}

void computeFootprint(Active& a, size_t chunk) {
  const Operation& op = *a.op;
  // A barrier is a fence: it starts after every earlier collective finished
  // here and nothing starts before it completes, so that a completed barrier
  // still means every rank is done with what came before it.
  // A one-shot collective is one too: board entries are consumed in
  // sequence order (Board::consumed).
  a.opaque = static_cast<bool>(op.prologue) || static_cast<bool>(op.epilogue) ||
             op.type == OpType::Barrier || (op.schedule && op.schedule->board);
  a.footprint = {};
  a.latencyBound = true;
  if (const Plan* plan = op.schedule.get()) {  // its extents, worked out once per plan
    a.latencyBound = plan->largestSend <= chunk;
    a.footprint[0].cover(op.sendBase, plan->sendExtent.offset, plan->sendExtent.bytes);
    a.footprint[1].cover(op.recvBase, plan->recvExtent.offset, plan->recvExtent.bytes);
    if (plan->outExtent.bytes > 0 && plan->outExtent.offset >= op.outOrigin) {
      a.footprint[3].cover(op.outBase, plan->outExtent.offset - op.outOrigin,
                           plan->outExtent.bytes);
    }
  }
  a.footprint[1].cover(op.copyIn.to, 0, op.copyIn.bytes);
  a.footprint[2].cover(op.copyIn.from, 0, op.copyIn.bytes);
}

bool mayStartAhead(const std::deque<std::unique_ptr<Active>>& collectives, size_t i) {
  const Active& a = *collectives[i];
  if (a.opaque) return false;
  for (size_t j = 0; j < i; ++j) {
    const Active& b = *collectives[j];
    if (b.finished) continue;
    if (b.opaque) return false;
    for (const Span& x : a.footprint) {
      for (const Span& y : b.footprint) {
        if (x.overlaps(y)) return false;
      }
    }
  }
  return true;
}

bool needs(const Active& a, int peer, size_t chunk, const Matching& matching) {
  const Operation& op = *a.op;
  if (op.pointToPoint) {
    if (op.peer < 0) return a.source == peer;
    if (op.peer != peer) return false;
    if (op.isSend) return true;
    return a.chunks + matching.waiting(peer, wire::MessageKind::PointToPoint, op.tag, 0) <
           messageCount(op.bytes, chunk);
  }
  const auto sequence = static_cast<uint32_t>(op.sequence);
  for (size_t k = a.started ? a.step : 0; k < op.steps().size(); ++k) {
    const Step& s = op.steps()[k];
    const bool current = a.started && k == a.step;
    for (size_t i = 0; i < s.sends.size(); ++i) {
      bool done = current && a.sentMessages[i] == messageCount(s.sends[i].range.bytes, chunk);
      if (s.sends[i].peer == peer && !done) return true;
    }
    size_t missing = 0;
    for (size_t j = 0; j < s.recvs.size(); ++j) {
      if (s.recvs[j].peer != peer) continue;
      const size_t got = current ? a.receivedMessages[j] : 0;
      missing += messageCount(s.recvs[j].range.bytes, chunk) - got;
    }
    if (missing > 0 && matching.waiting(peer, wire::MessageKind::Collective, sequence,
                                        static_cast<uint32_t>(k)) < missing) {
      return true;
    }
  }
  return false;
}

std::vector<int> awaited(const Active& a, size_t chunk) {
  std::vector<int> out;
  awaitedInto(a, chunk, out);
  return out;
}

void awaitedInto(const Active& a, size_t chunk, std::vector<int>& out) {
  out.clear();
  const Operation& op = *a.op;
  if (op.pointToPoint) {
    if (a.source >= 0) out.push_back(a.source);
    return;
  }
  if (!a.started || a.step >= op.steps().size()) return;
  const Step& s = op.steps()[a.step];
  for (size_t j = 0; j < s.recvs.size(); ++j) {
    if (a.receivedMessages[j] < messageCount(s.recvs[j].range.bytes, chunk)) {
      out.push_back(s.recvs[j].peer);
    }
  }
  for (size_t i = 0; i < s.sends.size(); ++i) {
    if (a.sentMessages[i] < messageCount(s.sends[i].range.bytes, chunk) &&
        std::find(out.begin(), out.end(), s.sends[i].peer) == out.end()) {
      out.push_back(s.sends[i].peer);
    }
  }
}

}  // namespace rdmacc
