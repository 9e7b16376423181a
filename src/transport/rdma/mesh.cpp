#include "src/transport/rdma/mesh.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "rdmacc/error.hpp"
#include "rdmacc/log.hpp"
#include "src/core/deadline.hpp"
#include "src/store/auth.hpp"
#include "src/store/store_util.hpp"
#include "src/transport/rdma/handshake.hpp"
#include "src/transport/rdma/mesh_connection.hpp"
#include "verbs/device.hpp"
#include "verbs/error.hpp"

namespace rdmacc {
namespace {

using Clock = std::chrono::steady_clock;

// The group secret or salt rank 0 published (`where`: the store key or
// rank 0's host record): hostile input, like any value in the store.
std::string checkedHex(std::string text, const std::string& where) {
  const bool hex =
      !text.empty() && text.size() <= 128 && std::all_of(text.begin(), text.end(), [](char c) {
        return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
      });
  if (!hex) {
    throw Error(ErrorKind::Protocol,
                fmt::format("{} is not what rank 0 publishes (1-128 lowercase hex digits; {} "
                            "bytes)",
                            where, text.size()),
                "another program or an older rdmacc may share this store; give each job its own "
                "MASTER_PORT");
  }
  return text;
}

std::string publishedHex(Store& store, const std::string& key) {
  return checkedHex(toString(store.get(key)), fmt::format("the store's '{}'", key));
}

}  // namespace

// A peer's published "ip:port" (`where` names the record in an error).
std::pair<std::string, uint16_t> Mesh::parseAddress(int peer, const std::string& text,
                                                    const std::string& where) {
  const auto colon = text.rfind(':');
  const auto port = colon == std::string::npos
                        ? 0
                        : storeNumber(std::string_view(text).substr(colon + 1), 65535, where);
  if (port == 0 || colon > 64) {
    throw Error(ErrorKind::Protocol,
                fmt::format("rank {} published the malformed address '{}' ({})", peer,
                            text.substr(0, 80), where),
                "every rank must run the same rdmacc version");
  }
  peerAddresses_[peer] = text;
  return {text.substr(0, colon), static_cast<uint16_t>(port)};
}

// Lazy: every rank's "ip:port" at once (the launcher's fence, or one record
// per rank in the store, which also waits for every rank to arrive).
std::vector<std::optional<std::pair<std::string, uint16_t>>> Mesh::exchangeAddresses(
    Store& store, const std::string& mine) {
  std::vector<int> everyone, wanted;
  for (int peer = 0; peer < size_; ++peer) {
    everyone.push_back(peer);
    if (connects(peer)) wanted.push_back(peer);
  }
  const std::string prefix = "rdmacc/mesh/" + group_ + "/address";
  const std::vector<Bytes> records =
      exchangeRecords(store, allGather_, prefix, rank_, toBytes(mine), everyone, wanted);
  std::vector<std::optional<std::pair<std::string, uint16_t>>> addresses(
      static_cast<size_t>(size_));
  for (size_t i = 0; i < wanted.size(); ++i) {
    const int peer = wanted[i];
    addresses[static_cast<size_t>(peer)] =
        parseAddress(peer, toString(records[i]), fmt::format("{}/{}", prefix, peer));
  }
  return addresses;
}

Mesh::Mesh(Store& store, int rank, int size, const Config& config, MeshOptions options)
    : rank_(rank),
      size_(size),
      qpsPerPeer_(static_cast<int>(config.getInt("RDMACC_QPS_PER_PEER"))),
      lazy_(options.lazy),
      transportConnects_(options.transportConnects),
      group_(options.group),
      allGather_(options.allGather) {
  if (size < 1 || rank < 0 || rank >= size) {
    throw Error(ErrorKind::InvalidArgument,
                fmt::format("rank {} is not in a group of size {}", rank, size),
                "RANK must be in [0, WORLD_SIZE)");
  }
  setSkip(std::move(options.skip));
  connectTimeout_ = config.getDuration("RDMACC_CONNECT_TIMEOUT");
  connectWindow_ = static_cast<int>(config.getInt("RDMACC_CONNECT_WINDOW"));
  authKey_ = auth::loadKey(config);
  // A failure to open is thrown by start(), where the other ranks learn of
  // it through the store (deferred: after the host exchange).
  try {
    open(config, options);
  } catch (const Error&) {
    openError_ = std::current_exception();
  }
  if (!options.deferStart) start(store, skip_.vector(), {});
}

void Mesh::setSkip(std::vector<bool> skip) {
  skip_ = skip.empty() ? ByRank<bool>(size_, false) : ByRank<bool>(std::move(skip));
  if (skip_.size() != size_) {
    throw Error(
        ErrorKind::Internal,
        fmt::format("MeshOptions::skip has {} entries for a group of {}", skip_.size(), size_));
  }
  connectedPeers_ = 0;
  for (int peer = 0; peer < size_; ++peer) {
    connectedPeers_ += peer != rank_ && !skip_[peer];
  }
}

// The device, its port, protection domain, completion queue and rdma_cm
// listener; rank 0 also draws the group's secret (or, with RDMACC_AUTH_KEY,
// its salt) here, so it can travel in its published record.
void Mesh::open(const Config& config, const MeshOptions& options) {
  endpoint_ = options.endpoint ? *options.endpoint : selectEndpoint(config);
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

  log(LogLevel::Debug, "rank {}: endpoint {}:{} {} GID {}", rank_, endpoint_.device, endpoint_.port,
      endpoint_.ipv4, endpoint_.gidIndex);
  device_ = verbs::SharedDevice::open(endpoint_.device);
  mailbox_ = device_->subscribe();
  pd_ = verbs::allocatePd(context());
  windows_ = config.getBool("RDMACC_MEMORY_WINDOWS") && verbs::supportsBoundWindows(context());
  if (config.getBool("RDMACC_MEMORY_WINDOWS") && !windows_ && rank_ == 0) {
    log(LogLevel::Info,
        "{} binds no memory windows of type 2: a peer that learns the rkey of another peer's "
        "slots can write them (docs/security.md)",
        endpoint_.device);
  }
  // A shared receive queue holds what each queue pair's peer can have in
  // flight (receivesPerQp); its size is fixed at creation (few devices
  // resize one): an eager mesh makes one for every peer, a lazy one for
  // RDMACC_SRQ_PEERS queue pairs and adds more as connections come.
  uint32_t perQp = params_.recvDepth;
  useShared_ = config.getBool("RDMACC_SRQ") && (lazy_ || transportConnects_) && size_ > 1;
  if (useShared_) {
    // The transport's slots (setLocalSlots) come later, from this setting.
    perQp = receivesPerQp(params_.recvDepth,
                          static_cast<uint32_t>(config.getInt("RDMACC_SLOTS_PER_PEER")));
    sharedQueueQps_ = static_cast<int>(config.getInt("RDMACC_SRQ_PEERS"));
    const int all = std::max(connectedPeers(), 1) * qpsPerPeer_;
    addSharedQueue(perQp, lazy_ ? std::min(all, sharedQueueQps_) : all);
  }
  // Lazy: room for a few connections, grown as more come (Connector::makeQp).
  int peers = std::max(lazy_ ? std::min(connectedPeers(), 2) : connectedPeers(), 1) * qpsPerPeer_;
  cq_ = std::make_unique<verbs::CompletionQueue>(
      context(), static_cast<int>(static_cast<uint32_t>(peers) *
                                  (params_.sendDepth + verbs::kBindEntries + perQp)));
  connections_.resize(static_cast<size_t>(size_ * qpsPerPeer_));
  peerAddresses_.resize(size_);
  if (size_ == 1) return;
  if (!lazy_)
    grantedInline_ = verbs::maxInlineData(verbs::createRcQp(pd_.get(), cq_->get(), params_).get());

  log(LogLevel::Debug, "rank {}: device resources ready", rank_);
  events_ = std::make_unique<verbs::EventChannel>();
  listenId_ = events_->createId();
  port_ = verbs::bindAndListen(listenId_.get(), endpoint_.ipv4, 4 * size_ + 16);
  if (listenId_->verbs != nullptr &&
      endpoint_.device != ibv_get_device_name(listenId_->verbs->device)) {
    throw Error(
        ErrorKind::NoDevice,
        fmt::format("address {} belongs to RDMA device {}, not to the selected {}", endpoint_.ipv4,
                    ibv_get_device_name(listenId_->verbs->device), endpoint_.device),
        "make RDMACC_IB_HCA and RDMACC_SOCKET_IFNAME agree");
  }

  log(LogLevel::Debug, "rank {}: rdma_cm listening on port {}", rank_, port_);
  if (rank_ == 0) drawn_ = auth::randomHex();
}

std::string Mesh::record() const {
  if (openError_ || !listenId_) return {};
  std::string text = fmt::format("{}:{}", endpoint_.ipv4, port_);
  if (rank_ == 0) text += "/" + drawn_;
  return text;
}

void Mesh::start(Store& store, std::vector<bool> skip, const std::vector<std::string>& published) {
  setSkip(std::move(skip));
  PrefixStore groupStore("rdmacc/mesh/" + group_, std::shared_ptr<Store>(&store, [](Store*) {}));
  groupStore.setTimeout(connectTimeout_);
  auto deadline = deadlineAfter(connectTimeout_);
  try {
    if (openError_) std::rethrow_exception(openError_);
    if (size_ == 1) return;
    // The secret every hello proves it holds (never sent:
    // src/transport/rdma/handshake.hpp). With a shared key (RDMACC_AUTH_KEY)
    // it is derived from the key and rank 0's salt, so the store holds
    // nothing that lets a stranger in; else it is rank 0's random draw, which
    // the store holds. Either travels in rank 0's record, or under its own
    // key when the records were not published with the host's.
    std::vector<std::optional<std::pair<std::string, uint16_t>>> addresses(
        static_cast<size_t>(size_));
    std::string drawn = drawn_;
    if (!published.empty()) {
      for (int peer = 0; peer < size_; ++peer) {
        if (peer == rank_ || (peer != 0 && !connects(peer))) continue;
        std::string text = published[static_cast<size_t>(peer)];
        const std::string where = fmt::format("rank {}'s host record", peer);
        if (peer == 0) {
          const auto slash = text.find('/');
          if (slash == std::string::npos) {
            throw Error(
                ErrorKind::Protocol,
                fmt::format("rank 0's host record has no group secret ('{}')", text.substr(0, 80)),
                "every rank must run the same rdmacc version");
          }
          drawn = checkedHex(text.substr(slash + 1), where);
          text.resize(slash);
        }
        if (connects(peer)) addresses[static_cast<size_t>(peer)] = parseAddress(peer, text, where);
      }
    } else if (rank_ == 0) {
      groupStore.set(authKey_.empty() ? "token" : "token-salt", toBytes(drawn_));
    } else {
      drawn = publishedHex(groupStore, authKey_.empty() ? "token" : "token-salt");
    }
    secret_ = authKey_.empty() ? drawn : auth::groupSecret(authKey_, group_, drawn);
    const std::string address = fmt::format("{}:{}", endpoint_.ipv4, port_);
    log(LogLevel::Info, "rank {}/{} listening on {} ({} port {}, GID {} {}, MTU {}{})", rank_,
        size_, address, endpoint_.device, endpoint_.port, endpoint_.gidIndex, endpoint_.gid,
        endpoint_.activeMtu, lazy_ ? ", connecting on first use" : "");
    if (lazy_) {
      if (published.empty()) addresses = exchangeAddresses(store, address);
      startConnector(std::move(addresses));
      return;
    }
    if (published.empty()) groupStore.set(fmt::format("addr/{}", rank_), toBytes(address));
    pending_ = Pending{.deadline = deadline,
                       .addresses = published.empty() ? decltype(addresses){} : addresses};
  } catch (const Error& e) {
    tellOthers(groupStore, e);
    throw;
  }
  if (!transportConnects_) connectEveryone(store);
}

void Mesh::connectEveryone(Store& store) {
  if (!pending_) return;  // lazy, a group of one, or connected already
  Pending pending = std::move(*pending_);
  pending_.reset();
  PrefixStore groupStore("rdmacc/mesh/" + group_, std::shared_ptr<Store>(&store, [](Store*) {}));
  groupStore.setTimeout(connectTimeout_);
  try {
    connectPeers(groupStore, pending.deadline, std::move(pending.addresses));
  } catch (const Error& e) {
    tellOthers(groupStore, e);
    throw;
  }
  log(LogLevel::Info, "rank {}: connected to all {} RDMA peers", rank_, connectedPeers());
}

void Mesh::tellOthers(Store& groupStore, const Error& e) const {
  try {
    if (e.kind() != ErrorKind::Timeout && !groupStore.check({"abort"})) {
      groupStore.set("abort", toBytes(fmt::format("rank {}: {}", rank_, e.what())));
    }
  } catch (...) {
  }
}

std::vector<SlotAdvert> Mesh::remoteSlots(int peer) const {
  std::vector<SlotAdvert> lanes;
  for (int q = 0; q < qpsPerPeer_; ++q) {
    const auto& c = connections_.at(static_cast<size_t>(peer * qpsPerPeer_ + q));
    if (c) lanes.push_back(c->remote);
  }
  return lanes;
}

Mesh::~Mesh() {
  if (device_) device_->unsubscribe(mailbox_);
}

ibv_qp* Mesh::qp(int peer, int index) const {
  const auto& c = connections_.at(static_cast<size_t>(peer * qpsPerPeer_ + index));
  if (!c)
    throw Error(ErrorKind::InvalidArgument,
                fmt::format("no queue pair {} to rank {}", index, peer));
  return c->qp.get();
}

bool Mesh::addSharedQueue(uint32_t perQp, int qps) {
  auto srq = verbs::createSrq(
      pd_.get(), static_cast<uint32_t>(std::min<uint64_t>(
                     uint64_t{perQp} * static_cast<uint64_t>(std::max(qps, 1)), UINT32_MAX)));
  if (!srq) return false;
  const uint32_t capacity = verbs::srqCapacity(srq.get());
  shared_.push_back(SharedQueue{.srq = std::move(srq), .capacity = capacity});
  return true;
}

uint32_t Mesh::receivesPerQp() const noexcept {
  if (localSlots_.slotsPerPeer == 0) return params_.recvDepth;
  return receivesPerQp(params_.recvDepth, localSlots_.slotsPerPeer);
}

std::optional<ReceiveOrigin> Mesh::receiveOrigin(const ibv_wc& wc) const {
  const WrId id = unpack(wc.wr_id);
  if (id.qp != kSharedReceive) return ReceiveOrigin{.peer = id.peer, .qp = id.qp, .queue = -1};
  auto it = sharedOwners_.find(wc.qp_num);
  if (it == sharedOwners_.end()) return std::nullopt;
  return it->second;
}

int Mesh::repostReceive(const ReceiveOrigin& origin) {
  if (origin.queue >= 0) {
    return verbs::postEmptyRecvs(shared_[static_cast<size_t>(origin.queue)].srq.get(),
                                 sharedReceiveWrId(), 1);
  }
  return verbs::postEmptyRecvs(qp(origin.peer, origin.qp), ownReceiveWrId(origin.peer, origin.qp),
                               1);
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
  if (connector_) return takeLazilyDisconnected();
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
  return peerAddresses_.at(peer);
}

}  // namespace rdmacc
