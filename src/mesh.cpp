#include "src/mesh.hpp"

#include <algorithm>
#include <map>
#include <thread>

#include <fmt/format.h>

#include "rdmacc/error.hpp"
#include "rdmacc/log.hpp"
#include "src/auth.hpp"
#include "src/handshake.hpp"
#include "src/store_util.hpp"
#include "src/wr_id.hpp"
#include "verbs/device.hpp"
#include "verbs/error.hpp"

namespace rdmacc {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr auto kResolveTimeout = 5000ms;
constexpr auto kRetryDelay = 200ms;

constexpr const char* kMissingHint =
    "start every rank (WORLD_SIZE must match the number of processes), check their output for "
    "errors, or raise RDMACC_CONNECT_TIMEOUT";

std::string rankList(const std::vector<int>& ranks) {
  return fmt::format("{}", fmt::join(ranks, ", "));
}

// The group secret or salt rank 0 published: hostile input, like any value
// in the store.
std::string publishedHex(Store& store, const std::string& key) {
  std::string text = toString(store.get(key));
  const bool hex =
      !text.empty() && text.size() <= 128 && std::all_of(text.begin(), text.end(), [](char c) {
        return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
      });
  if (!hex) {
    throw Error(ErrorKind::Protocol,
                fmt::format("the store's '{}' is not what rank 0 publishes (1-128 lowercase hex "
                            "digits; {} bytes)",
                            key, text.size()),
                "another program or an older rdmacc may share this store; give each job its own "
                "MASTER_PORT");
  }
  return text;
}

}  // namespace

struct Mesh::Connection {
  verbs::CmIdPtr id;  // the QP below is destroyed first
  verbs::QpPtr qp;
  int pathMtu = 0;
};

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
  std::string secret;  // keys the proofs of hellos (src/handshake.hpp)
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

  // Polls the store for the addresses of lower ranks (never blocks the event loop).
  void lookUpAddresses() {
    for (int peer = 0; peer < mesh.rank_; ++peer) {
      auto& a = addresses[static_cast<size_t>(peer)];
      if (a || skipped(peer)) continue;
      std::string key = fmt::format("addr/{}", peer);
      if (!store.check({key})) continue;
      std::string text = toString(store.get(key));
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
      a.emplace(text.substr(0, colon), port);
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

Mesh::Mesh(Store& store, int rank, int size, const Config& config, MeshOptions options)
    : rank_(rank),
      size_(size),
      qpsPerPeer_(static_cast<int>(config.getInt("RDMACC_QPS_PER_PEER"))) {
  if (size < 1 || rank < 0 || rank >= size) {
    throw Error(ErrorKind::InvalidArgument,
                fmt::format("rank {} is not in a group of size {}", rank, size),
                "RANK must be in [0, WORLD_SIZE)");
  }
  skip_ = options.skip.empty() ? std::vector<bool>(static_cast<size_t>(size), false)
                               : std::move(options.skip);
  if (skip_.size() != static_cast<size_t>(size)) {
    throw Error(ErrorKind::Internal, fmt::format("MeshOptions::skip has {} entries for a group "
                                                 "of {}",
                                                 skip_.size(), size));
  }
  for (int peer = 0; peer < size; ++peer) {
    connectedPeers_ += peer != rank && !skip_[static_cast<size_t>(peer)];
  }
  PrefixStore groupStore("rdmacc/mesh/" + options.group,
                         std::shared_ptr<Store>(&store, [](Store*) {}));
  auto connectTimeout = config.getDuration("RDMACC_CONNECT_TIMEOUT");
  groupStore.setTimeout(connectTimeout);
  auto deadline = Clock::now() + connectTimeout;
  try {
    endpoint_ = selectEndpoint(config);
    if (const ForkSafety fork = forkSafety(); fork.atRisk) {
      log(LogLevel::Warn, "fork safety {}", fork.text);
    }
    params_.ackTimeout = static_cast<uint8_t>(config.getInt("RDMACC_IB_TIMEOUT"));
    params_.retryCount = static_cast<uint8_t>(config.getInt("RDMACC_IB_RETRY_CNT"));
    params_.rnrRetry = static_cast<uint8_t>(config.getInt("RDMACC_IB_RNR_RETRY"));
    params_.minRnrTimer = static_cast<uint8_t>(config.getInt("RDMACC_IB_MIN_RNR_TIMER"));
    params_.trafficClass = static_cast<uint8_t>(config.getInt("RDMACC_IB_TC"));
    params_.serviceLevel = static_cast<uint8_t>(config.getInt("RDMACC_IB_SL"));
    params_.sendDepth = static_cast<uint32_t>(config.getInt("RDMACC_QP_SEND_DEPTH"));
    params_.recvDepth = static_cast<uint32_t>(config.getInt("RDMACC_QP_RECV_DEPTH"));
    params_.gidIndex = endpoint_.gidIndex;
    if (int cap = static_cast<int>(config.getInt("RDMACC_IB_MTU")); cap > 0) {
      endpoint_.activeMtu = std::min(endpoint_.activeMtu, cap);
    }
    params_.pathMtu = verbs::mtuFromBytes(endpoint_.activeMtu);

    log(LogLevel::Debug, "rank {}: endpoint {}:{} {} GID {}", rank, endpoint_.device,
        endpoint_.port, endpoint_.ipv4, endpoint_.gidIndex);
    context_ = verbs::openDevice(endpoint_.device);
    verbs::makeAsyncNonBlocking(context_.get());  // read by the transport, never blocking
    pd_ = verbs::allocatePd(context_.get());
    int peers = std::max(connectedPeers(), 1) * qpsPerPeer_;
    cq_ = std::make_unique<verbs::CompletionQueue>(
        context_.get(),
        static_cast<int>(static_cast<uint32_t>(peers) * (params_.sendDepth + params_.recvDepth)));
    connections_.resize(static_cast<size_t>(size * qpsPerPeer_));
    peerAddresses_.resize(static_cast<size_t>(size));
    if (size == 1) return;

    log(LogLevel::Debug, "rank {}: device resources ready", rank);
    events_ = std::make_unique<verbs::EventChannel>();
    listenId_ = events_->createId();
    uint16_t port = verbs::bindAndListen(listenId_.get(), endpoint_.ipv4, 4 * size + 16);
    if (listenId_->verbs != nullptr &&
        endpoint_.device != ibv_get_device_name(listenId_->verbs->device)) {
      throw Error(ErrorKind::NoDevice,
                  fmt::format("address {} belongs to RDMA device {}, not to the selected {}",
                              endpoint_.ipv4, ibv_get_device_name(listenId_->verbs->device),
                              endpoint_.device),
                  "make RDMACC_IB_HCA and RDMACC_SOCKET_IFNAME agree");
    }

    log(LogLevel::Debug, "rank {}: rdma_cm listening on port {}", rank, port);
    // The secret every hello proves it holds (never sent: src/handshake.hpp).
    // With a shared key (RDMACC_AUTH_KEY) it is derived from the key and a
    // salt, so the store holds nothing that lets a stranger in; else rank 0
    // draws it and the store holds it.
    std::string secret;
    if (const std::string key = auth::loadKey(config); !key.empty()) {
      if (rank == 0) groupStore.set("token-salt", toBytes(auth::randomHex()));
      secret = auth::groupSecret(key, options.group, publishedHex(groupStore, "token-salt"));
    } else if (rank == 0) {
      secret = auth::randomHex();
      groupStore.set("token", toBytes(secret));
    } else {
      secret = publishedHex(groupStore, "token");
    }
    groupStore.set(fmt::format("addr/{}", rank),
                   toBytes(fmt::format("{}:{}", endpoint_.ipv4, port)));
    log(LogLevel::Info, "rank {}/{} listening on {}:{} ({} port {}, GID {} {}, MTU {})", rank, size,
        endpoint_.ipv4, port, endpoint_.device, endpoint_.port, endpoint_.gidIndex, endpoint_.gid,
        endpoint_.activeMtu);

    Setup setup{.mesh = *this,
                .store = groupStore,
                .secret = std::move(secret),
                .deadline = deadline,
                .connectTimeout = connectTimeout,
                .addresses = std::vector<std::optional<std::pair<std::string, uint16_t>>>(
                    static_cast<size_t>(size))};
    setup.connectionView.assign(connections_.size(), nullptr);
    setup.run();
    log(LogLevel::Info, "rank {}: connected to all {} RDMA peers", rank, connectedPeers());
  } catch (const Error& e) {
    // Tell the others now rather than let them wait for their timeout.
    try {
      if (e.kind() != ErrorKind::Timeout && !groupStore.check({"abort"})) {
        groupStore.set("abort", toBytes(fmt::format("rank {}: {}", rank, e.what())));
      }
    } catch (...) {
    }
    throw;
  }
}

Mesh::~Mesh() = default;

ibv_qp* Mesh::qp(int peer, int index) const {
  const auto& c = connections_.at(static_cast<size_t>(peer * qpsPerPeer_ + index));
  if (!c)
    throw Error(ErrorKind::InvalidArgument,
                fmt::format("no queue pair {} to rank {}", index, peer));
  return c->qp.get();
}

int Mesh::pathMtu(int peer) const {
  const auto& c = connections_.at(static_cast<size_t>(peer * qpsPerPeer_));
  return c ? c->pathMtu : endpoint_.activeMtu;
}

int Mesh::eventFd() const noexcept {
  return events_ ? events_->get()->fd : -1;
}

std::vector<int> Mesh::takeDisconnectedPeers() {
  std::vector<int> peers;
  if (!events_) return peers;
  while (auto event = events_->next(std::chrono::milliseconds(0))) {
    if (event->event == RDMA_CM_EVENT_CONNECT_REQUEST) {
      // Late or stranger: rejected (the sender learns why at once instead of
      // hanging) and its id destroyed once the event is acknowledged.
      verbs::CmIdPtr id(event->id);
      log(LogLevel::Warn, "rank {}: rejected a connection from {}: {}", rank_,
          verbs::peerAddress(id.get()), handshake::toString(handshake::RejectReason::GroupFormed));
      verbs::reject(id.get(), handshake::encodeReject(handshake::RejectReason::GroupFormed));
      event.reset();
      continue;
    }
    if (event->event != RDMA_CM_EVENT_DISCONNECTED && event->event != RDMA_CM_EVENT_DEVICE_REMOVAL)
      continue;
    for (size_t i = 0; i < connections_.size(); ++i) {
      const auto& c = connections_[i];
      if (c && (c->id.get() == event->id || event->event == RDMA_CM_EVENT_DEVICE_REMOVAL)) {
        int peer = static_cast<int>(i) / qpsPerPeer_;
        if (std::find(peers.begin(), peers.end(), peer) == peers.end()) peers.push_back(peer);
      }
    }
  }
  return peers;
}

const std::string& Mesh::peerAddress(int peer) const {
  return peerAddresses_.at(static_cast<size_t>(peer));
}

}  // namespace rdmacc
