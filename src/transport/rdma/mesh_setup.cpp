// Forming a mesh: the rdma_cm handshake with every peer this rank connects
// to (the lower ranks' addresses from the store, active connects to them,
// passive accepts from the higher ranks, hellos checked both ways), retries
// of transient failures, and the timeout that names the missing ranks.
#include <algorithm>
#include <map>
#include <thread>

#include <fmt/format.h>

#include "rdmacc/error.hpp"
#include "rdmacc/log.hpp"
#include "src/store/store_util.hpp"
#include "src/transport/rdma/handshake.hpp"
#include "src/transport/rdma/mesh_connection.hpp"
#include "src/transport/rdma/wr_id.hpp"
#include "verbs/device.hpp"
#include "verbs/error.hpp"

namespace rdmacc {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr auto kResolveTimeout = 5000ms;
constexpr auto kRetryDelay = 200ms;
constexpr auto kAddressPoll = 50ms;

constexpr const char* kMissingHint =
    "start every rank (WORLD_SIZE must match the number of processes), check their output for "
    "errors, or raise RDMACC_CONNECT_TIMEOUT";

std::string rankList(const std::vector<int>& ranks) {
  return fmt::format("{}", fmt::join(ranks, ", "));
}

}  // namespace

// The state of the handshake, alive only while the mesh forms.
struct Mesh::Setup {
  enum class Role { Active, Passive };
  struct Attempt {
    Role role;
    int peer;
    int qpIndex;
    verbs::CmIdPtr id;
    verbs::QpPtr qp;
    int pathMtu = 0;
  };

  Mesh& mesh;
  Store& store;
  std::string secret;  // keys the proofs of hellos (src/transport/rdma/handshake.hpp)
  Clock::time_point deadline;
  std::chrono::milliseconds connectTimeout;
  std::vector<std::optional<std::pair<std::string, uint16_t>>> addresses;  // of lower ranks
  std::map<rdma_cm_id*, Attempt> attempts;
  std::vector<std::pair<Clock::time_point, std::pair<int, int>>> retries;  // (when, (peer, qp))
  int connected = 0;

  Connection*& slot(int peer, int q) {
    return connectionView[static_cast<size_t>(peer * mesh.qpsPerPeer_ + q)];
  }
  std::vector<Connection*> connectionView;

  int needed() const { return mesh.connectedPeers() * mesh.qpsPerPeer_; }
  bool skipped(int peer) const { return mesh.skip_[static_cast<size_t>(peer)]; }

  std::array<uint8_t, handshake::kHelloBytes> hello(int peer, int q, handshake::Direction direction,
                                                    const ibv_qp* qp) const {
    handshake::Hello h{.qpIndex = static_cast<uint16_t>(q),
                       .rank = static_cast<uint32_t>(mesh.rank_),
                       .targetRank = static_cast<uint32_t>(peer),
                       .worldSize = static_cast<uint32_t>(mesh.size_),
                       .activeMtu = static_cast<uint32_t>(mesh.endpoint_.activeMtu)};
    handshake::seal(h, secret, direction, qp->qp_num);
    return handshake::encode(h);
  }

  handshake::Expectation expect(handshake::Direction direction, const rdma_cm_event* event,
                                int minPeer, int maxPeer) const {
    return {.myRank = static_cast<uint32_t>(mesh.rank_),
            .worldSize = static_cast<uint32_t>(mesh.size_),
            .secret = secret,
            .direction = direction,
            .senderQpn = event->param.conn.qp_num,
            .qpsPerPeer = static_cast<uint32_t>(mesh.qpsPerPeer_),
            .minPeer = static_cast<uint32_t>(minPeer),
            .maxPeer = static_cast<uint32_t>(maxPeer)};
  }

  verbs::QpParams paramsFor(int remoteMtu) const {
    verbs::QpParams p = mesh.params_;
    int mtu =
        std::min(mesh.endpoint_.activeMtu, remoteMtu > 0 ? remoteMtu : mesh.endpoint_.activeMtu);
    p.pathMtu = verbs::mtuFromBytes(mtu);
    return p;
  }

  verbs::QpPtr makeQp(rdma_cm_id* id, int peer, int q) {
    auto qp = verbs::createRcQp(mesh.pd_.get(), mesh.cq_->get(), mesh.params_);
    verbs::moveToInit(qp.get(), id);
    uint64_t wr = pack(WrId{WrKind::Recv, static_cast<uint8_t>(q), static_cast<uint16_t>(peer), 0});
    if (int rc = verbs::postEmptyRecvs(qp.get(), wr, mesh.params_.recvDepth); rc != 0) {
      throw verbs::verbsError("ibv_post_recv", rc, "cannot post the initial receives");
    }
    return qp;
  }

  void finish(Attempt& a) {
    auto c = std::make_unique<Connection>();
    c->id = std::move(a.id);
    c->qp = std::move(a.qp);
    c->pathMtu = a.pathMtu;
    slot(a.peer, a.qpIndex) = c.get();
    mesh.connections_[static_cast<size_t>(a.peer * mesh.qpsPerPeer_ + a.qpIndex)] = std::move(c);
    ++connected;
    log(LogLevel::Debug, "connected to rank {} qp {} (path MTU {})", a.peer, a.qpIndex, a.pathMtu);
  }

  void startActive(int peer, int q) {
    const auto& [ip, port] = *addresses[static_cast<size_t>(peer)];
    auto id = mesh.events_->createId();
    verbs::resolveAddress(id.get(), mesh.endpoint_.ipv4, ip, port, kResolveTimeout);
    rdma_cm_id* key = id.get();
    attempts.emplace(key, Attempt{Role::Active, peer, q, std::move(id), nullptr});
  }

  // The addresses of the lower ranks, all at once: one check of every key
  // per kAddressPoll (never blocking the event loop, which accepts the higher
  // ranks meanwhile), then one multiGet. Per rank, a handful of requests
  // whatever the group's size, where a check per peer per loop was N x N.
  bool addressesKnown = false;
  Clock::time_point nextAddressPoll{};
  std::vector<std::string> addressKeys;  // of the lower ranks this mesh connects
  void lookUpAddresses() {
    if (addressesKnown) return;
    const auto now = Clock::now();
    if (now < nextAddressPoll) return;
    nextAddressPoll = now + kAddressPoll;
    std::vector<int> peers;
    addressKeys.clear();
    for (int peer = 0; peer < mesh.rank_; ++peer) {
      if (skipped(peer)) continue;
      peers.push_back(peer);
      addressKeys.push_back(fmt::format("addr/{}", peer));
    }
    if (!addressKeys.empty() && !store.check(addressKeys)) return;
    addressesKnown = true;
    const std::vector<Bytes> values = store.multiGet(addressKeys);
    for (size_t i = 0; i < peers.size(); ++i) {
      const int peer = peers[i];
      const std::string& key = addressKeys[i];
      std::string text = toString(values[i]);
      auto colon = text.rfind(':');
      if (colon == std::string::npos) {
        throw Error(ErrorKind::Protocol,
                    fmt::format("rank {} published a malformed address '{}'", peer, text));
      }
      auto port =
          static_cast<uint16_t>(storeNumber(std::string_view(text).substr(colon + 1), 65535, key));
      if (port == 0) {
        throw Error(ErrorKind::Protocol,
                    fmt::format("rank {} published the address '{}' with port 0", peer, text));
      }
      addresses[static_cast<size_t>(peer)].emplace(text.substr(0, colon), port);
      mesh.peerAddresses_[static_cast<size_t>(peer)] = text;
      for (int q = 0; q < mesh.qpsPerPeer_; ++q) startActive(peer, q);
    }
  }

  void onConnectRequest(rdma_cm_event* event, std::vector<verbs::CmIdPtr>& discard) {
    verbs::CmIdPtr id(event->id);  // a new id, ours from now on
    std::string from = verbs::peerAddress(id.get());
    auto theirs = handshake::decodeHello(verbs::privateData(event));
    std::optional<handshake::RejectReason> reason;
    if (!theirs) {
      reason = handshake::RejectReason::Malformed;
    } else {
      reason = handshake::validate(
          *theirs, expect(handshake::Direction::Request, event, mesh.rank_ + 1, mesh.size_ - 1));
      if (!reason && skipped(static_cast<int>(theirs->rank))) {
        reason = handshake::RejectReason::WrongTarget;  // we reach it through shared memory
      } else if (!reason && slot(static_cast<int>(theirs->rank), theirs->qpIndex) != nullptr) {
        reason = handshake::RejectReason::Duplicate;
      }
    }
    if (reason) {
      log(LogLevel::Warn, "rejected a connection from {}{}: {}", from,
          theirs ? fmt::format(" claiming rank {}", theirs->rank) : "",
          handshake::toString(*reason));
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
    a.qp = makeQp(a.id.get(), peer, q);
    auto params = paramsFor(static_cast<int>(theirs->activeMtu));
    a.pathMtu = verbs::mtuBytes(params.pathMtu);
    verbs::moveToRtr(a.qp.get(), a.id.get(), params);
    verbs::moveToRts(a.qp.get(), a.id.get(), params);
    auto mine = hello(peer, q, handshake::Direction::Reply, a.qp.get());
    verbs::accept(a.id.get(), {.privateData = mine,
                               .qpNum = a.qp->qp_num,
                               .retryCount = params.retryCount,
                               .rnrRetry = params.rnrRetry});
    mesh.peerAddresses_[static_cast<size_t>(peer)] = from;
    rdma_cm_id* key = a.id.get();
    attempts.emplace(key, std::move(a));
  }

  void onActiveEvent(Attempt& a, rdma_cm_event* event, bool& drop) {
    switch (event->event) {
      case RDMA_CM_EVENT_ADDR_RESOLVED:
        verbs::resolveRoute(a.id.get(), kResolveTimeout);
        break;
      case RDMA_CM_EVENT_ROUTE_RESOLVED: {
        a.qp = makeQp(a.id.get(), a.peer, a.qpIndex);
        auto mine = hello(a.peer, a.qpIndex, handshake::Direction::Request, a.qp.get());
        verbs::connect(a.id.get(), {.privateData = mine,
                                    .qpNum = a.qp->qp_num,
                                    .retryCount = mesh.params_.retryCount,
                                    .rnrRetry = mesh.params_.rnrRetry});
        break;
      }
      case RDMA_CM_EVENT_CONNECT_RESPONSE: {
        auto theirs = handshake::decodeHello(verbs::privateData(event));
        auto reason = theirs ? handshake::validate(*theirs, expect(handshake::Direction::Reply,
                                                                   event, a.peer, a.peer))
                             : std::optional(handshake::RejectReason::Malformed);
        if (reason) {
          throw Error(ErrorInfo{
              .kind = ErrorKind::Protocol,
              .message = fmt::format("the process at {} answered as something other than rank "
                                     "{} of this group: {}",
                                     mesh.peerAddresses_[static_cast<size_t>(a.peer)], a.peer,
                                     handshake::toString(*reason)),
              .peerRank = a.peer,
              .hint = "another job may be using the same store; give each job its own "
                      "MASTER_PORT"});
        }
        auto params = paramsFor(static_cast<int>(theirs->activeMtu));
        a.pathMtu = verbs::mtuBytes(params.pathMtu);
        verbs::moveToRtr(a.qp.get(), a.id.get(), params);
        verbs::moveToRts(a.qp.get(), a.id.get(), params);
        verbs::establish(a.id.get());
        finish(a);
        drop = true;
        break;
      }
      case RDMA_CM_EVENT_REJECTED: {
        if (auto reason = handshake::decodeReject(verbs::privateData(event))) {
          throw Error(
              ErrorInfo{.kind = ErrorKind::ConnectionManager,
                        .message = fmt::format("rank {} rejected our connection: {}", a.peer,
                                               handshake::toString(*reason)),
                        .call = "rdma_connect",
                        .peerRank = a.peer,
                        .peerAddress = mesh.peerAddresses_[static_cast<size_t>(a.peer)],
                        .hint = "every rank of a group must run the same rdmacc version with the "
                                "same RDMACC_QPS_PER_PEER and store"});
        }
        [[fallthrough]];
      }
      case RDMA_CM_EVENT_ADDR_ERROR:
      case RDMA_CM_EVENT_ROUTE_ERROR:
      case RDMA_CM_EVENT_UNREACHABLE:
      case RDMA_CM_EVENT_CONNECT_ERROR:
        log(LogLevel::Debug, "connection to rank {} qp {}: {} (status {}); retrying", a.peer,
            a.qpIndex, verbs::eventName(event->event), event->status);
        retries.emplace_back(Clock::now() + kRetryDelay, std::pair(a.peer, a.qpIndex));
        drop = true;
        break;
      default:
        log(LogLevel::Debug, "ignoring {} for rank {}", verbs::eventName(event->event), a.peer);
    }
  }

  void onPassiveEvent(Attempt& a, rdma_cm_event* event, bool& drop) {
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

  void onEstablishedEvent(rdma_cm_event* event) {
    for (size_t i = 0; i < connectionView.size(); ++i) {
      Connection* c = connectionView[i];
      if (c == nullptr || c->id.get() != event->id) continue;
      if (event->event == RDMA_CM_EVENT_DISCONNECTED) {
        int peer = static_cast<int>(i) / mesh.qpsPerPeer_;
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
                              .peerAddress = mesh.peerAddresses_[static_cast<size_t>(peer)],
                              .hint = "the peer process probably failed; see its output"});
      }
    }
  }

  void handle(verbs::CmEventPtr event) {
    std::vector<verbs::CmIdPtr> discard;  // destroyed after the event is acked
    if (event->event == RDMA_CM_EVENT_DEVICE_REMOVAL) {
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

  // The ranks not (fully) connected yet: never published an address, or did
  // but did not connect; `what` describes them for an error message.
  struct Missing {
    std::vector<int> absent, ranks;
    std::string what;
  };
  Missing missing() {
    std::vector<int> absent, unconnected;
    for (int peer = 0; peer < mesh.size_; ++peer) {
      if (peer == mesh.rank_ || skipped(peer)) continue;
      bool done = true;
      for (int q = 0; q < mesh.qpsPerPeer_; ++q) done = done && slot(peer, q) != nullptr;
      if (done) continue;
      bool published = false;
      try {
        published = store.check({fmt::format("addr/{}", peer)});
      } catch (const Error&) {
      }
      (published ? unconnected : absent).push_back(peer);
    }
    std::string what;
    if (!absent.empty())
      what = fmt::format("rank(s) {} never arrived (no address in the store)", rankList(absent));
    if (!unconnected.empty()) {
      what += fmt::format("{}rank(s) {} arrived but did not connect", what.empty() ? "" : "; ",
                          rankList(unconnected));
    }
    Missing m{.absent = absent, .ranks = absent, .what = what};
    m.ranks.insert(m.ranks.end(), unconnected.begin(), unconnected.end());
    return m;
  }

  [[noreturn]] void timeout() {
    Missing m = missing();
    throw Error(
        ErrorInfo{.kind = ErrorKind::Timeout,
                  .message = fmt::format("rank {} of {}: the group did not form within {} ms: {}",
                                         mesh.rank_, mesh.size_, connectTimeout.count(), m.what),
                  .peerRank = m.ranks.size() == 1 ? m.ranks.front() : -1,
                  .hint = kMissingHint});
  }

  void checkAbort() {
    if (!store.check({"abort"})) return;
    std::string why = toString(store.get("abort"));
    throw Error(ErrorKind::PeerFailure,
                fmt::format("another rank failed while the group was forming: {}", why));
  }

  void run() {
    auto lastAbortCheck = Clock::now();
    while (connected < needed()) {
      if (Clock::now() > deadline) timeout();
      lookUpAddresses();
      auto now = Clock::now();
      for (auto it = retries.begin(); it != retries.end();) {
        if (it->first <= now) {
          startActive(it->second.first, it->second.second);
          it = retries.erase(it);
        } else {
          ++it;
        }
      }
      if (now - lastAbortCheck > 500ms) {
        checkAbort();
        lastAbortCheck = now;
      }
      while (auto event = mesh.events_->next(20ms)) handle(std::move(event));
    }
  }
};

void Mesh::connectPeers(Store& groupStore, std::string secret,
                        std::chrono::steady_clock::time_point deadline,
                        std::chrono::milliseconds connectTimeout) {
  Setup setup{.mesh = *this,
              .store = groupStore,
              .secret = std::move(secret),
              .deadline = deadline,
              .connectTimeout = connectTimeout,
              .addresses = std::vector<std::optional<std::pair<std::string, uint16_t>>>(
                  static_cast<size_t>(size_))};
  setup.connectionView.assign(connections_.size(), nullptr);
  setup.run();
}

}  // namespace rdmacc
