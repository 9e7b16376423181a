// The rdma_cm handshake, both roles: an active side resolves, connects with
// a hello and checks the reply; a passive side checks the request and
// accepts with its own hello. Hellos carry the group token's proof, rank and
// queue-pair index, and (lazy) each side's slots for the other. Transient
// failures are retried every kRetryDelay; the callers in mesh_eager.cpp and
// mesh_lazy.cpp decide when to give up.
#include <algorithm>
#include <iterator>
#include <utility>

#include <fmt/format.h>

#include "rdmacc/error.hpp"
#include "rdmacc/log.hpp"
#include "src/transport/rdma/mesh_connector.hpp"
#include "src/transport/rdma/wr_id.hpp"
#include "verbs/device.hpp"
#include "verbs/error.hpp"

namespace rdmacc {
namespace {

using namespace std::chrono_literals;

constexpr auto kResolveTimeout = 5000ms;
constexpr auto kRetryDelay = 200ms;

SlotAdvert advertOf(const handshake::Hello& h) {
  return {.slots = h.slotsPerPeer,
          .slotBytes = h.slotBytes,
          .base = h.slotBase,
          .rkey = h.slotRkey,
          .boardBytes = h.boardBytes};
}

}  // namespace

std::array<uint8_t, handshake::kHelloBytes> Mesh::Connector::hello(Attempt& a,
                                                                   handshake::Direction direction) {
  handshake::Hello h{.qpIndex = static_cast<uint8_t>(a.qpIndex),
                     .rank = static_cast<uint32_t>(mesh.rank_),
                     .targetRank = static_cast<uint32_t>(a.peer),
                     .worldSize = static_cast<uint32_t>(mesh.size_),
                     .activeMtu = static_cast<uint16_t>(mesh.endpoint_.activeMtu)};
  h.lazy = mesh.lazy_;
  if (const LocalSlots& local = mesh.localSlots_; local.region) {
    a.mine = local.region(a.peer);
    h.boardBytes = local.boardBytes;
    h.slotsPerPeer = a.mine.advert.slots;
    h.slotBytes = a.mine.advert.slotBytes;
    h.slotBase = a.mine.advert.base;
    h.slotRkey = a.mine.advert.rkey;
    if (mesh.windows_) {
      a.window = verbs::allocateWindow(mesh.pd_.get());
      h.slotRkey = a.window.rkey;
    }
  }
  handshake::seal(h, mesh.secret_, direction, a.qp->qp_num);
  return handshake::encode(h);
}

void Mesh::Connector::expose(Attempt& a) {
  if (!a.window.mw) return;
  const uint64_t wr =
      pack(WrId{WrKind::Bind, static_cast<uint8_t>(a.qpIndex), static_cast<uint16_t>(a.peer), 0});
  verbs::bindWindow(a.qp.get(), a.window, a.mine.mr, a.mine.addr, a.mine.bytes, wr,
                    fmt::format("rank {}", a.peer));
}

handshake::Expectation Mesh::Connector::expect(handshake::Direction direction,
                                               const rdma_cm_event* event, int minPeer,
                                               int maxPeer) const {
  handshake::Expectation e{.myRank = static_cast<uint32_t>(mesh.rank_),
                           .worldSize = static_cast<uint32_t>(mesh.size_),
                           .secret = mesh.secret_,
                           .direction = direction,
                           .senderQpn = event->param.conn.qp_num,
                           .qpsPerPeer = static_cast<uint32_t>(mesh.qpsPerPeer_),
                           .minPeer = static_cast<uint32_t>(minPeer),
                           .maxPeer = static_cast<uint32_t>(maxPeer)};
  e.lazy = mesh.lazy_;
  e.slotsPerPeer = mesh.localSlots_.slotsPerPeer;
  e.slotBytes = mesh.localSlots_.slotBytes;
  return e;
}

verbs::QpParams Mesh::Connector::paramsFor(int remoteMtu) const {
  verbs::QpParams p = mesh.params_;
  int mtu =
      std::min(mesh.endpoint_.activeMtu, remoteMtu > 0 ? remoteMtu : mesh.endpoint_.activeMtu);
  p.pathMtu = verbs::mtuFromBytes(mtu);
  return p;
}

void Mesh::Connector::makeQp(Attempt& a) {
  const int peer = a.peer, q = a.qpIndex;
  // Its receives: from the first shared queue with room for one more
  // queue pair's share (a lazy mesh adds a queue when none has), else a
  // receive queue of its own.
  const uint32_t perQp = mesh.receivesPerQp();
  auto fits = [&](const SharedQueue& sq) {
    return uint64_t{perQp} * static_cast<uint64_t>(sq.qps + 1) <= sq.capacity;
  };
  auto room = std::find_if(mesh.shared_.begin(), mesh.shared_.end(), fits);
  if (room == mesh.shared_.end() && mesh.useShared_ && mesh.lazy_ &&
      mesh.addSharedQueue(perQp, mesh.sharedQueueQps_) && fits(mesh.shared_.back())) {
    room = std::prev(mesh.shared_.end());
  }
  const bool shared = room != mesh.shared_.end();
  const int queue = shared ? static_cast<int>(room - mesh.shared_.begin()) : -1;
  uint32_t adding = mesh.params_.recvDepth;
  if (shared) {
    const uint64_t after = uint64_t{perQp} * static_cast<uint64_t>(room->qps + 1);
    adding = static_cast<uint32_t>(after - std::min<uint64_t>(after, room->posted));
  }
  // Room in the completion queue for every queue pair's sends and every
  // receive posted (connections on first use grow it as they come).
  const size_t qps = 1 + attempts.size() + static_cast<size_t>(mesh.queuePairs());
  mesh.cq_->reserve(static_cast<int>(std::min<size_t>(
      qps * (mesh.params_.sendDepth + verbs::kBindEntries) + mesh.receivesPosted() + adding,
      INT32_MAX)));
  SharedQueue* sq = shared ? &mesh.shared_[static_cast<size_t>(queue)] : nullptr;
  auto qp = verbs::createRcQp(mesh.pd_.get(), mesh.cq_->get(), mesh.params_,
                              sq ? sq->srq.get() : nullptr);
  verbs::moveToInit(qp.get(), a.id.get());
  const int rc = sq ? verbs::postEmptyRecvs(sq->srq.get(), sharedReceiveWrId(), adding)
                    : verbs::postEmptyRecvs(qp.get(), ownReceiveWrId(peer, q), adding);
  if (rc != 0) throw verbs::verbsError("ibv_post_recv", rc, "cannot post the initial receives");
  if (sq) {
    sq->posted += adding;
    ++sq->qps;
    mesh.sharedPosted_.fetch_add(adding, std::memory_order_relaxed);
    mesh.sharedOwners_[qp->qp_num] = ReceiveOrigin{.peer = peer, .qp = q, .queue = queue};
  } else {
    mesh.ownPosted_.fetch_add(adding, std::memory_order_relaxed);
  }
  a.receives = ReceiveShare(mesh, queue, adding);
  a.qp = std::move(qp);
}

Mesh::ReceiveShare& Mesh::ReceiveShare::operator=(ReceiveShare&& other) noexcept {
  if (this != &other) {
    this->~ReceiveShare();
    mesh_ = std::exchange(other.mesh_, nullptr);
    queue_ = other.queue_;
    count_ = other.count_;
  }
  return *this;
}

Mesh::ReceiveShare::~ReceiveShare() {
  if (mesh_ == nullptr) return;
  if (queue_ >= 0) {
    --mesh_->shared_[static_cast<size_t>(queue_)].qps;
  } else {
    mesh_->ownPosted_.fetch_sub(count_, std::memory_order_relaxed);
  }
  mesh_ = nullptr;
}

void Mesh::Connector::finish(Attempt& a) {
  auto c = std::make_unique<Connection>();
  c->id = std::move(a.id);
  c->qp = std::move(a.qp);
  c->receives = std::move(a.receives);
  c->window = std::move(a.window);
  c->pathMtu = a.pathMtu;
  c->remote = a.remote;
  slot(a.peer, a.qpIndex) = c.get();
  mesh.connections_[static_cast<size_t>(a.peer * mesh.qpsPerPeer_ + a.qpIndex)] = std::move(c);
  ++connected;
  mesh.queuePairs_.fetch_add(1, std::memory_order_relaxed);
  log(LogLevel::Debug, "connected to rank {} qp {} (path MTU {})", a.peer, a.qpIndex, a.pathMtu);
  if (!mesh.lazy_) return;
  if (++lanesUp[static_cast<size_t>(a.peer)] == mesh.qpsPerPeer_) {
    giveUpAt[static_cast<size_t>(a.peer)] = {};
    std::vector<SlotAdvert> lanes;
    for (int q = 0; q < mesh.qpsPerPeer_; ++q) lanes.push_back(slot(a.peer, q)->remote);
    out.connected.emplace_back(a.peer, std::move(lanes));
  }
}

void Mesh::Connector::startActive(int peer, int q) {
  const auto& [ip, port] = *addresses[static_cast<size_t>(peer)];
  auto id = mesh.events_->createId();
  try {
    verbs::resolveAddress(id.get(), mesh.endpoint_.ipv4, ip, port, kResolveTimeout);
  } catch (const Error& e) {
    if (!mesh.lazy_) throw;
    fail(peer, e);
    return;
  }
  rdma_cm_id* key = id.get();
  attempts.emplace(key, Attempt{Role::Active, peer, q, std::move(id), nullptr});
}

void Mesh::Connector::onConnectRequest(rdma_cm_event* event, std::vector<verbs::CmIdPtr>& discard) {
  verbs::CmIdPtr id(event->id);  // a new id, ours from now on
  std::string from = verbs::peerAddress(id.get());
  auto theirs = handshake::decodeHello(verbs::privateData(event));
  std::optional<handshake::RejectReason> reason;
  if (!theirs) {
    reason = handshake::RejectReason::Malformed;
  } else {
    const int lowest = mesh.lazy_ ? 0 : mesh.rank_ + 1;
    reason = handshake::validate(
        *theirs, expect(handshake::Direction::Request, event, lowest, mesh.size_ - 1));
    if (!reason && skipped(static_cast<int>(theirs->rank))) {
      reason = handshake::RejectReason::WrongTarget;  // we reach it through shared memory
    } else if (!reason && slot(static_cast<int>(theirs->rank), theirs->qpIndex) != nullptr) {
      reason = handshake::RejectReason::Duplicate;
    } else if (!reason && mesh.lazy_) {
      reason = crossed(static_cast<int>(theirs->rank), theirs->qpIndex, discard);
    }
  }
  if (reason) {
    // Crossed attempts are part of connecting on first use, not a problem.
    log(reason == handshake::RejectReason::Crossed ? LogLevel::Debug : LogLevel::Warn,
        "rejected a connection from {}{}: {}", from,
        theirs ? fmt::format(" claiming rank {}", theirs->rank) : "", handshake::toString(*reason));
    auto data = handshake::encodeReject(*reason);
    verbs::reject(id.get(), data);
    discard.push_back(std::move(id));
    return;
  }
  int peer = static_cast<int>(theirs->rank);
  int q = theirs->qpIndex;
  // A retry of a connection still in progress replaces it.
  for (auto it = attempts.begin(); it != attempts.end(); ++it) {
    if (it->second.role == Role::Passive && it->second.peer == peer && it->second.qpIndex == q) {
      discard.push_back(std::move(it->second.id));
      attempts.erase(it);
      break;
    }
  }
  Attempt a{Role::Passive, peer, q, std::move(id), nullptr};
  a.remote = advertOf(*theirs);
  makeQp(a);
  auto params = paramsFor(static_cast<int>(theirs->activeMtu));
  a.pathMtu = verbs::mtuBytes(params.pathMtu);
  verbs::moveToRtr(a.qp.get(), a.id.get(), params);
  verbs::moveToRts(a.qp.get(), a.id.get(), params);
  auto mine = hello(a, handshake::Direction::Reply);
  expose(a);  // writable before the reply leaves: the peer may write once it has it
  verbs::accept(a.id.get(), {.privateData = mine,
                             .qpNum = a.qp->qp_num,
                             .retryCount = params.retryCount,
                             .rnrRetry = params.rnrRetry});
  mesh.peerAddresses_[peer] = from;
  rdma_cm_id* key = a.id.get();
  attempts.emplace(key, std::move(a));
}

// The passive side accepted: its hello must be the peer's, then the queue
// pair goes to RTS and the connection is up.
void Mesh::Connector::onConnectResponse(Attempt& a, rdma_cm_event* event) {
  auto theirs = handshake::decodeHello(verbs::privateData(event));
  auto reason = theirs ? handshake::validate(
                             *theirs, expect(handshake::Direction::Reply, event, a.peer, a.peer))
                       : std::optional(handshake::RejectReason::Malformed);
  if (reason) {
    throw Error(ErrorInfo{
        .kind = ErrorKind::Protocol,
        .message = fmt::format("the process at {} answered as something other than rank "
                               "{} of this group: {}",
                               mesh.peerAddresses_[a.peer], a.peer, handshake::toString(*reason)),
        .peerRank = a.peer,
        .hint = "another job may be using the same store; give each job its own "
                "MASTER_PORT"});
  }
  a.remote = advertOf(*theirs);
  auto params = paramsFor(static_cast<int>(theirs->activeMtu));
  a.pathMtu = verbs::mtuBytes(params.pathMtu);
  verbs::moveToRtr(a.qp.get(), a.id.get(), params);
  verbs::moveToRts(a.qp.get(), a.id.get(), params);
  // The bind is posted before the RTU, and the passive side writes only
  // after the RTU (or a message of ours) reached it.
  expose(a);
  verbs::establish(a.id.get());
  finish(a);
}

// A rejected connect: true when the attempt is simply dropped (the peer's
// crossing connection is kept); throws for a reason that ends the peer;
// false for a transient failure (retried).
bool Mesh::Connector::onRejected(Attempt& a, rdma_cm_event* event) {
  auto reason = handshake::decodeReject(verbs::privateData(event));
  if (reason == handshake::RejectReason::Crossed) {
    // The peer's connection to us is the one kept: it arrives as a request.
    log(LogLevel::Debug, "rank {} connects to us at the same time; accepting its connection",
        a.peer);
    return true;
  }
  // IB CM reason 8, invalid service ID: nothing listens on the peer's
  // port any more. Lazy, it listened when it published the address, so
  // its mesh (its process, or its backend) is gone.
  constexpr int kInvalidServiceId = 8;
  if (!reason && mesh.lazy_ && event->status == kInvalidServiceId) {
    throw Error(ErrorInfo{
        .kind = ErrorKind::PeerFailure,
        .message = fmt::format("rank {} no longer accepts connections at {} (nothing "
                               "listens there)",
                               a.peer, mesh.peerAddresses_[a.peer]),
        .call = "rdma_connect",
        .peerRank = a.peer,
        .peerAddress = mesh.peerAddresses_[a.peer],
        .hint = "its process exited or crashed, or destroyed its backend; see its output"});
  }
  if (reason) {
    throw Error(ErrorInfo{.kind = ErrorKind::ConnectionManager,
                          .message = fmt::format("rank {} rejected our connection: {}", a.peer,
                                                 handshake::toString(*reason)),
                          .call = "rdma_connect",
                          .peerRank = a.peer,
                          .peerAddress = mesh.peerAddresses_[a.peer],
                          .hint = "every rank of a group must run the same rdmacc version with the "
                                  "same RDMACC_QPS_PER_PEER and store"});
  }
  return false;
}

void Mesh::Connector::onActiveEvent(Attempt& a, rdma_cm_event* event, bool& drop) {
  switch (event->event) {
    case RDMA_CM_EVENT_ADDR_RESOLVED:
      verbs::resolveRoute(a.id.get(), kResolveTimeout);
      break;
    case RDMA_CM_EVENT_ROUTE_RESOLVED: {
      makeQp(a);
      auto mine = hello(a, handshake::Direction::Request);
      verbs::connect(a.id.get(), {.privateData = mine,
                                  .qpNum = a.qp->qp_num,
                                  .retryCount = mesh.params_.retryCount,
                                  .rnrRetry = mesh.params_.rnrRetry});
      break;
    }
    case RDMA_CM_EVENT_CONNECT_RESPONSE:
      onConnectResponse(a, event);
      drop = true;
      break;
    case RDMA_CM_EVENT_REJECTED:
      if (onRejected(a, event)) {
        drop = true;
        break;
      }
      [[fallthrough]];
    case RDMA_CM_EVENT_ADDR_ERROR:
    case RDMA_CM_EVENT_ROUTE_ERROR:
    case RDMA_CM_EVENT_UNREACHABLE:
    case RDMA_CM_EVENT_CONNECT_ERROR:
      log(LogLevel::Debug, "connection to rank {} qp {}: {} (status {}); retrying", a.peer,
          a.qpIndex, verbs::eventName(event->event), event->status);
      if (mesh.lazy_) {
        lastProblem[static_cast<size_t>(a.peer)] =
            fmt::format("{} (status {})", verbs::eventName(event->event), event->status);
      }
      retries.emplace_back(Clock::now() + kRetryDelay, std::pair(a.peer, a.qpIndex));
      drop = true;
      break;
    default:
      log(LogLevel::Debug, "ignoring {} for rank {}", verbs::eventName(event->event), a.peer);
  }
}

void Mesh::Connector::onPassiveEvent(Attempt& a, rdma_cm_event* event, bool& drop) {
  switch (event->event) {
    case RDMA_CM_EVENT_ESTABLISHED:
      finish(a);
      drop = true;
      break;
    case RDMA_CM_EVENT_REJECTED:
    case RDMA_CM_EVENT_CONNECT_ERROR:
    case RDMA_CM_EVENT_UNREACHABLE:
    case RDMA_CM_EVENT_DISCONNECTED:
      log(LogLevel::Debug, "incoming connection from rank {} failed: {}; waiting for a retry",
          a.peer, verbs::eventName(event->event));
      drop = true;
      break;
    default:
      log(LogLevel::Debug, "ignoring {} for rank {}", verbs::eventName(event->event), a.peer);
  }
}

void Mesh::Connector::onEstablishedEvent(rdma_cm_event* event) {
  for (size_t i = 0; i < connectionView.size(); ++i) {
    Connection* c = connectionView[i];
    if (c == nullptr || c->id.get() != event->id) continue;
    if (event->event == RDMA_CM_EVENT_DISCONNECTED) {
      int peer = static_cast<int>(i) / mesh.qpsPerPeer_;
      if (mesh.lazy_) {
        if (std::find(disconnected.begin(), disconnected.end(), peer) == disconnected.end())
          disconnected.push_back(peer);
        return;
      }
      // A peer that gave up waiting for ranks that never came (its own
      // connect timeout ran out first) leaves: the absent ranks are the
      // cause worth naming, as that peer does.
      if (Missing m = missing(); !m.absent.empty()) {
        throw Error(ErrorInfo{
            .kind = ErrorKind::Timeout,
            .message = fmt::format("rank {} of {}: the group did not form: rank {} gave up "
                                   "(disconnected) while {}",
                                   mesh.rank_, mesh.size_, peer, m.what),
            .peerRank = m.ranks.size() == 1 ? m.ranks.front() : -1,
            .hint = kMissingHint});
      }
      throw Error(ErrorInfo{.kind = ErrorKind::PeerFailure,
                            .message = "a peer disconnected while the group was forming",
                            .peerRank = peer,
                            .peerAddress = mesh.peerAddresses_[peer],
                            .hint = "the peer process probably failed; see its output"});
    }
  }
}

void Mesh::Connector::handle(verbs::CmEventPtr event) {
  std::vector<verbs::CmIdPtr> discard;  // destroyed after the event is acked
  if (event->event == RDMA_CM_EVENT_DEVICE_REMOVAL) {
    if (mesh.lazy_) {  // every connection ends with the device (the async events say why)
      for (int peer = 0; peer < mesh.size_; ++peer) {
        if (lanesUp[static_cast<size_t>(peer)] > 0) disconnected.push_back(peer);
      }
      return;
    }
    throw Error(ErrorKind::NoDevice,
                fmt::format("RDMA device {} was removed", mesh.endpoint_.device));
  }
  if (event->event == RDMA_CM_EVENT_CONNECT_REQUEST) {
    onConnectRequest(event.get(), discard);
  } else if (auto it = attempts.find(event->id); it != attempts.end()) {
    bool drop = false;
    if (it->second.role == Role::Active) {
      onActiveEvent(it->second, event.get(), drop);
    } else {
      onPassiveEvent(it->second, event.get(), drop);
    }
    if (drop) {
      if (it->second.id) discard.push_back(std::move(it->second.id));
      attempts.erase(it);
    }
  } else {
    onEstablishedEvent(event.get());
  }
  event.reset();
  discard.clear();
}

}  // namespace rdmacc
