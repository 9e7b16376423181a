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

// Lazy: every rank's "ip:port" at once (the launcher's fence, or one record
// per rank in the store, which also waits for every rank to arrive).
std::vector<std::optional<std::pair<std::string, uint16_t>>> Mesh::exchangeAddresses(
    Store& store, const MeshOptions& options, const std::string& mine) {
  std::vector<int> everyone, wanted;
  for (int peer = 0; peer < size_; ++peer) {
    everyone.push_back(peer);
    if (connects(peer)) wanted.push_back(peer);
  }
  const std::string prefix = "rdmacc/mesh/" + options.group + "/address";
  const std::vector<Bytes> records =
      exchangeRecords(store, options.allGather, prefix, rank_, toBytes(mine), everyone, wanted);
  std::vector<std::optional<std::pair<std::string, uint16_t>>> addresses(
      static_cast<size_t>(size_));
  for (size_t i = 0; i < wanted.size(); ++i) {
    const int peer = wanted[i];
    const std::string text = toString(records[i]);
    const auto colon = text.rfind(':');
    const std::string key = fmt::format("{}/{}", prefix, peer);
    const auto port = colon == std::string::npos
                          ? 0
                          : storeNumber(std::string_view(text).substr(colon + 1), 65535, key);
    if (port == 0 || colon > 64) {
      throw Error(ErrorKind::Protocol,
                  fmt::format("rank {} published the malformed address '{}' ({})", peer,
                              text.substr(0, 80), key),
                  "every rank must run the same rdmacc version");
    }
    addresses[static_cast<size_t>(peer)].emplace(text.substr(0, colon),
                                                 static_cast<uint16_t>(port));
    peerAddresses_[static_cast<size_t>(peer)] = text;
  }
  return addresses;
}

Mesh::Mesh(Store& store, int rank, int size, const Config& config, MeshOptions options)
    : rank_(rank),
      size_(size),
      qpsPerPeer_(static_cast<int>(config.getInt("RDMACC_QPS_PER_PEER"))),
      lazy_(options.lazy) {
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
  connectTimeout_ = config.getDuration("RDMACC_CONNECT_TIMEOUT");
  groupStore.setTimeout(connectTimeout_);
  auto deadline = deadlineAfter(connectTimeout_);
  try {
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

    log(LogLevel::Debug, "rank {}: endpoint {}:{} {} GID {}", rank, endpoint_.device,
        endpoint_.port, endpoint_.ipv4, endpoint_.gidIndex);
    context_ = verbs::openDevice(endpoint_.device);
    verbs::makeAsyncNonBlocking(context_.get());  // read by the transport, never blocking
    pd_ = verbs::allocatePd(context_.get());
    // Lazy: room for a few connections, grown as more come (Connector::makeQp).
    int peers = std::max(lazy_ ? std::min(connectedPeers(), 2) : connectedPeers(), 1) * qpsPerPeer_;
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
    // The secret every hello proves it holds (never sent: src/transport/rdma/handshake.hpp).
    // With a shared key (RDMACC_AUTH_KEY) it is derived from the key and a
    // salt, so the store holds nothing that lets a stranger in; else rank 0
    // draws it and the store holds it.
    if (const std::string key = auth::loadKey(config); !key.empty()) {
      if (rank == 0) groupStore.set("token-salt", toBytes(auth::randomHex()));
      secret_ = auth::groupSecret(key, options.group, publishedHex(groupStore, "token-salt"));
    } else if (rank == 0) {
      secret_ = auth::randomHex();
      groupStore.set("token", toBytes(secret_));
    } else {
      secret_ = publishedHex(groupStore, "token");
    }
    const std::string address = fmt::format("{}:{}", endpoint_.ipv4, port);
    log(LogLevel::Info, "rank {}/{} listening on {} ({} port {}, GID {} {}, MTU {}{})", rank, size,
        address, endpoint_.device, endpoint_.port, endpoint_.gidIndex, endpoint_.gid,
        endpoint_.activeMtu, lazy_ ? ", connecting on first use" : "");
    if (lazy_) {
      startConnector(exchangeAddresses(store, options, address));
      return;
    }
    groupStore.set(fmt::format("addr/{}", rank), toBytes(address));
    connectPeers(groupStore, deadline);
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
  return peerAddresses_.at(static_cast<size_t>(peer));
}

}  // namespace rdmacc
