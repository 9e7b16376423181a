// The rdma_cm handshake: active connects and passive accepts, hellos checked
// both ways, retries of transient failures. Eager (at formation): higher
// ranks connect to the lower ranks' addresses from the store, and a timeout
// names the missing ranks. Lazy (RDMACC_CONNECT): whoever needs a peer first
// connects to it; when both do at once, the higher rank's connection wins
// (the lower rank's is refused as Crossed), so the pair agrees without a
// global step; a peer that cannot be reached in RDMACC_CONNECT_TIMEOUT is
// reported failed, the hellos carry each side's slots for the other.
#include <algorithm>
#include <map>
#include <thread>
#include <utility>

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

// The state of the handshake: alive while the mesh forms (eager) or as long
// as the mesh (lazy).
struct Mesh::Connector {
  enum class Role { Active, Passive };
  struct Attempt {
    Role role;
    int peer;
    int qpIndex;
    verbs::CmIdPtr id;
    verbs::QpPtr qp;
    int pathMtu = 0;
    SlotAdvert remote;
  };

  Mesh& mesh;
  Store* store = nullptr;  // eager formation only: the progress thread never uses it
  Clock::time_point deadline{};
  std::vector<std::optional<std::pair<std::string, uint16_t>>> addresses;  // eager: lower ranks
  std::map<rdma_cm_id*, Attempt> attempts;
  std::vector<std::pair<Clock::time_point, std::pair<int, int>>> retries;  // (when, (peer, qp))
  int connected = 0;
  // Lazy, by peer: when connecting gives up (time_point{}: not trying),
  // queue pairs up, reported failed; what happened since the last look.
  std::vector<Clock::time_point> giveUpAt;
  std::vector<int> lanesUp;
  std::vector<bool> failed;
  std::vector<std::string> lastProblem;
  std::function<SlotAdvert(int)> localSlots;
  uint16_t slotsPerPeer = 0;  // lazy: every peer's slots are alike
  uint32_t slotBytes = 0;
  MeshEvents out;
  std::vector<int> disconnected;

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
                       .activeMtu = static_cast<uint16_t>(mesh.endpoint_.activeMtu)};
    if (mesh.lazy_) {
      const SlotAdvert mine = localSlots(peer);
      h.slotsPerPeer = mine.slots;
      h.slotBytes = mine.slotBytes;
      h.slotBase = mine.base;
      h.slotRkey = mine.rkey;
    }
    handshake::seal(h, mesh.secret_, direction, qp->qp_num);
    return handshake::encode(h);
  }

  static SlotAdvert advertOf(const handshake::Hello& h) {
    return {
        .slots = h.slotsPerPeer, .slotBytes = h.slotBytes, .base = h.slotBase, .rkey = h.slotRkey};
  }

  handshake::Expectation expect(handshake::Direction direction, const rdma_cm_event* event,
                                int minPeer, int maxPeer) const {
    handshake::Expectation e{.myRank = static_cast<uint32_t>(mesh.rank_),
                             .worldSize = static_cast<uint32_t>(mesh.size_),
                             .secret = mesh.secret_,
                             .direction = direction,
                             .senderQpn = event->param.conn.qp_num,
                             .qpsPerPeer = static_cast<uint32_t>(mesh.qpsPerPeer_),
                             .minPeer = static_cast<uint32_t>(minPeer),
                             .maxPeer = static_cast<uint32_t>(maxPeer)};
    e.slotsPerPeer = slotsPerPeer;
    e.slotBytes = slotBytes;
    return e;
  }

  verbs::QpParams paramsFor(int remoteMtu) const {
    verbs::QpParams p = mesh.params_;
    int mtu =
        std::min(mesh.endpoint_.activeMtu, remoteMtu > 0 ? remoteMtu : mesh.endpoint_.activeMtu);
    p.pathMtu = verbs::mtuFromBytes(mtu);
    return p;
  }

  verbs::QpPtr makeQp(rdma_cm_id* id, int peer, int q) {
    if (mesh.lazy_) {  // room in the completion queue for this queue pair's completions
      size_t qps = 1 + attempts.size();
      for (int up : lanesUp) qps += static_cast<size_t>(up);
      mesh.cq_->reserve(static_cast<int>(
          std::min<size_t>(qps * (mesh.params_.sendDepth + mesh.params_.recvDepth), INT32_MAX)));
    }
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
    c->remote = a.remote;
    slot(a.peer, a.qpIndex) = c.get();
    mesh.connections_[static_cast<size_t>(a.peer * mesh.qpsPerPeer_ + a.qpIndex)] = std::move(c);
    ++connected;
    mesh.queuePairs_.fetch_add(1, std::memory_order_relaxed);
    log(LogLevel::Debug, "connected to rank {} qp {} (path MTU {})", a.peer, a.qpIndex, a.pathMtu);
    if (!mesh.lazy_) return;
    if (++lanesUp[static_cast<size_t>(a.peer)] == mesh.qpsPerPeer_) {
      giveUpAt[static_cast<size_t>(a.peer)] = {};
      out.connected.emplace_back(a.peer, slot(a.peer, 0)->remote);
    }
  }

  // Lazy: connecting to peer failed for good (its operations fail with this).
  void fail(int peer, Error error) {
    const auto p = static_cast<size_t>(peer);
    if (failed[p]) return;
    failed[p] = true;
    giveUpAt[p] = {};
    std::erase_if(retries, [&](const auto& r) { return r.second.first == peer; });
    log(LogLevel::Debug, "connecting to rank {} failed: {}", peer, error.what());
    out.failed.emplace_back(peer, std::move(error));
  }

  // Whether (peer, q) is connected or an attempt or retry for it is under way.
  bool busy(int peer, int q) {
    if (slot(peer, q) != nullptr) return true;
    for (const auto& [id, a] : attempts) {
      if (a.peer == peer && a.qpIndex == q) return true;
    }
    return std::any_of(retries.begin(), retries.end(),
                       [&](const auto& r) { return r.second == std::pair(peer, q); });
  }

  void connect(int peer) {
    const auto p = static_cast<size_t>(peer);
    struct Flag {  // whatever happens below, connecting_ tells the truth after it
      Connector& c;
      ~Flag() { c.mesh.connecting_ = !c.attempts.empty() || !c.retries.empty(); }
    } flag{*this};
    if (failed[p] || lanesUp[p] == mesh.qpsPerPeer_) return;
    bool started = false;
    for (int q = 0; q < mesh.qpsPerPeer_; ++q) {
      if (busy(peer, q)) continue;
      if (giveUpAt[p] == Clock::time_point{}) giveUpAt[p] = Clock::now() + mesh.connectTimeout_;
      startActive(peer, q);
      started = true;
    }
    if (started) log(LogLevel::Debug, "connecting to rank {} on first use", peer);
  }

  void startActive(int peer, int q) {
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
    if (!addressKeys.empty() && !store->check(addressKeys)) return;
    addressesKnown = true;
    const std::vector<Bytes> values = store->multiGet(addressKeys);
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
    a.remote = advertOf(*theirs);
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

  // Lazy, a request from peer for queue pair q while this rank connects to
  // it too: the higher rank's connection wins. Ours dropped (nullopt: accept
  // theirs) or theirs refused.
  std::optional<handshake::RejectReason> crossed(int peer, int q,
                                                 std::vector<verbs::CmIdPtr>& discard) {
    // Only an attempt of ours counts: a request repeated while we accept an
    // earlier one of the peer's replaces that (below, in onConnectRequest).
    bool ours = std::any_of(retries.begin(), retries.end(),
                            [&](const auto& r) { return r.second == std::pair(peer, q); });
    for (const auto& [id, a] : attempts) {
      ours = ours || (a.role == Role::Active && a.peer == peer && a.qpIndex == q);
    }
    if (!ours) return std::nullopt;
    if (peer < mesh.rank_) return handshake::RejectReason::Crossed;
    std::erase_if(retries, [&](const auto& r) { return r.second == std::pair(peer, q); });
    for (auto it = attempts.begin(); it != attempts.end(); ++it) {
      if (it->second.role == Role::Active && it->second.peer == peer && it->second.qpIndex == q) {
        discard.push_back(std::move(it->second.id));
        attempts.erase(it);
        break;
      }
    }
    return std::nullopt;
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
        a.remote = advertOf(*theirs);
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
        auto reason = handshake::decodeReject(verbs::privateData(event));
        if (reason == handshake::RejectReason::Crossed) {
          // The peer's connection to us is the one kept: it arrives as a request.
          log(LogLevel::Debug, "rank {} connects to us at the same time; accepting its connection",
              a.peer);
          drop = true;
          break;
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
                                     a.peer, mesh.peerAddresses_[static_cast<size_t>(a.peer)]),
              .call = "rdma_connect",
              .peerRank = a.peer,
              .peerAddress = mesh.peerAddresses_[static_cast<size_t>(a.peer)],
              .hint = "its process exited or crashed, or destroyed its backend; see its output"});
        }
        if (reason) {
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
                              .peerAddress = mesh.peerAddresses_[static_cast<size_t>(peer)],
                              .hint = "the peer process probably failed; see its output"});
      }
    }
  }

  void handle(verbs::CmEventPtr event) {
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

  // Lazy: an error while handling an event fails the peer it concerns (a
  // request that cannot be answered is dropped: its sender retries).
  void handleLazily(verbs::CmEventPtr event) {
    int peer = -1;
    if (auto it = attempts.find(event->id); it != attempts.end()) peer = it->second.peer;
    try {
      handle(std::move(event));
    } catch (const Error& e) {
      if (peer < 0) {
        log(LogLevel::Warn, "rank {}: a connection request failed: {}", mesh.rank_, e.what());
        return;
      }
      for (auto it = attempts.begin(); it != attempts.end();) {
        it = it->second.peer == peer ? attempts.erase(it) : std::next(it);
      }
      fail(peer, e);
    }
  }

  MeshEvents progress() {
    const auto now = Clock::now();
    for (auto it = retries.begin(); it != retries.end();) {
      if (it->first > now) {
        ++it;
        continue;
      }
      auto [peer, q] = it->second;
      it = retries.erase(it);
      if (!failed[static_cast<size_t>(peer)] && !busy(peer, q)) startActive(peer, q);
    }
    for (int peer = 0; peer < mesh.size_; ++peer) {
      const auto p = static_cast<size_t>(peer);
      if (giveUpAt[p] == Clock::time_point{} || now < giveUpAt[p]) continue;
      bool active = std::any_of(retries.begin(), retries.end(),
                                [&](const auto& r) { return r.second.first == peer; });
      for (const auto& [id, a] : attempts)
        active = active || (a.peer == peer && a.role == Role::Active);
      if (!active) continue;  // its own connection to us is under way
      for (auto it = attempts.begin(); it != attempts.end();) {
        it = it->second.peer == peer ? attempts.erase(it) : std::next(it);
      }
      fail(peer, Error(ErrorInfo{
                     .kind = ErrorKind::Timeout,
                     .message = fmt::format(
                         "rank {}: could not connect to rank {} within {} ms{}", mesh.rank_, peer,
                         mesh.connectTimeout_.count(),
                         lastProblem[p].empty() ? "" : "; last attempt: " + lastProblem[p]),
                     .peerRank = peer,
                     .peerAddress = mesh.peerAddresses_[p],
                     .hint = "the peer process may have failed (see its output), or the network "
                             "between the ranks drops rdma_cm traffic"}));
    }
    while (auto event = mesh.events_->next(std::chrono::milliseconds(0))) {
      handleLazily(std::move(event));
    }
    mesh.connecting_ = !attempts.empty() || !retries.empty();
    return std::exchange(out, {});
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
        published = store->check({fmt::format("addr/{}", peer)});
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
    throw Error(ErrorInfo{
        .kind = ErrorKind::Timeout,
        .message = fmt::format("rank {} of {}: the group did not form within {} ms: {}", mesh.rank_,
                               mesh.size_, mesh.connectTimeout_.count(), m.what),
        .peerRank = m.ranks.size() == 1 ? m.ranks.front() : -1,
        .hint = kMissingHint});
  }

  void checkAbort() {
    if (!store->check({"abort"})) return;
    std::string why = toString(store->get("abort"));
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

void Mesh::connectPeers(Store& groupStore, std::chrono::steady_clock::time_point deadline) {
  Connector setup{.mesh = *this,
                  .store = &groupStore,
                  .deadline = deadline,
                  .addresses = std::vector<std::optional<std::pair<std::string, uint16_t>>>(
                      static_cast<size_t>(size_))};
  setup.connectionView.assign(connections_.size(), nullptr);
  setup.run();
}

// Lazy: every rank's address, from the launcher's fence or the store (one
// record per rank); the connector lives as long as the mesh.
void Mesh::startConnector(std::vector<std::optional<std::pair<std::string, uint16_t>>> addresses) {
  connector_.reset(new Connector{.mesh = *this, .addresses = std::move(addresses)});
  const auto n = static_cast<size_t>(size_);
  connector_->connectionView.assign(connections_.size(), nullptr);
  connector_->giveUpAt.assign(n, Clock::time_point{});
  connector_->lanesUp.assign(n, 0);
  connector_->failed.assign(n, false);
  connector_->lastProblem.assign(n, std::string());
}

void Mesh::setLocalSlots(uint16_t slotsPerPeer, uint32_t slotBytes,
                         std::function<SlotAdvert(int)> localSlots) {
  if (!connector_) return;
  connector_->slotsPerPeer = slotsPerPeer;
  connector_->slotBytes = slotBytes;
  connector_->localSlots = std::move(localSlots);
}

void Mesh::connect(int peer) {
  if (connector_ && connects(peer)) connector_->connect(peer);
}

bool Mesh::connected(int peer) const {
  if (!connector_) return connects(peer);
  return connector_->lanesUp[static_cast<size_t>(peer)] == qpsPerPeer_;
}

MeshEvents Mesh::progressConnections() {
  if (!connector_) return {};
  return connector_->progress();
}

std::vector<int> Mesh::takeLazilyDisconnected() {
  return std::exchange(connector_->disconnected, {});
}

void Mesh::establishEarly(int peer) {
  if (!connector_) return;
  auto& attempts = connector_->attempts;
  for (auto it = attempts.begin(); it != attempts.end();) {
    if (it->second.role == Connector::Role::Passive && it->second.peer == peer && it->second.qp) {
      connector_->finish(it->second);
      it = attempts.erase(it);
    } else {
      ++it;
    }
  }
  connecting_ = !attempts.empty() || !connector_->retries.empty();
}

bool Mesh::retrying() const {
  return connector_ && !connector_->retries.empty();
}

void Mesh::DropConnector::operator()(Connector* connector) const {
  delete connector;
}

}  // namespace rdmacc
