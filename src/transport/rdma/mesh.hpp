// The connection mesh: one protection domain, one completion queue, and
// RDMACC_QPS_PER_PEER reliable-connected queue pairs to every other rank,
// established through librdmacm with the group token checked on both sides.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "rdmacc/config.hpp"
#include "rdmacc/store.hpp"
#include "rdmacc/topology.hpp"
#include "verbs/cm.hpp"
#include "verbs/qp.hpp"

namespace rdmacc {

struct MeshOptions {
  std::string group = "default";  // store namespace: one mesh per group name
  // Peers this mesh does not connect (reached through shared memory): empty,
  // or one entry per rank. Both sides of a pair must agree (hostNumbers does).
  std::vector<bool> skip;
  // The port to use; none: selectEndpoint (RDMACC_IB_HCA and the local rank).
  std::optional<Endpoint> endpoint;
};

// Built and destroyed by one thread. Afterwards the QPs, PD and CQ may be
// used by one other thread (the progress engine); Mesh itself is immutable.
class Mesh {
 public:
  // Forms the mesh or throws: Error(Timeout) naming the ranks that did not
  // arrive or connect within RDMACC_CONNECT_TIMEOUT; other errors name the call.
  Mesh(Store& store, int rank, int size, const Config& config, MeshOptions options = {});
  ~Mesh();
  Mesh(const Mesh&) = delete;
  Mesh& operator=(const Mesh&) = delete;

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  int qpsPerPeer() const noexcept { return qpsPerPeer_; }
  // Whether this mesh connects to peer (MeshOptions::skip), and to how many.
  bool connects(int peer) const { return peer != rank_ && !skip_.at(static_cast<size_t>(peer)); }
  int connectedPeers() const noexcept { return connectedPeers_; }
  const Endpoint& endpoint() const noexcept { return endpoint_; }
  ibv_context* context() const noexcept { return context_.get(); }
  ibv_pd* pd() const noexcept { return pd_.get(); }
  verbs::CompletionQueue& cq() noexcept { return *cq_; }
  ibv_qp* qp(int peer, int index = 0) const;
  // The path MTU (bytes) negotiated with peer.
  int pathMtu(int peer) const;
  // "ip:port (GID ...)" for error messages.
  const std::string& peerAddress(int peer) const;
  const verbs::QpParams& qpParams() const noexcept { return params_; }

  // After the mesh formed: the rdma_cm event channel (readable when a peer
  // disconnects) and the peers that disconnected since the last call.
  int eventFd() const noexcept;
  std::vector<int> takeDisconnectedPeers();

 private:
  struct Connection;  // src/transport/rdma/mesh_connection.hpp
  struct Setup;       // src/transport/rdma/mesh_setup.cpp

  // The handshake with every peer this rank connects to (transport/rdma/mesh_setup.cpp).
  void connectPeers(Store& groupStore, std::string secret,
                    std::chrono::steady_clock::time_point deadline,
                    std::chrono::milliseconds connectTimeout);

  int rank_;
  int size_;
  int qpsPerPeer_;
  Endpoint endpoint_;
  verbs::QpParams params_;
  verbs::ContextPtr context_;
  verbs::PdPtr pd_;
  std::unique_ptr<verbs::CompletionQueue> cq_;
  std::unique_ptr<verbs::EventChannel> events_;  // before the ids created on it
  verbs::CmIdPtr listenId_;
  std::vector<bool> skip_;  // MeshOptions::skip, one entry per rank
  int connectedPeers_ = 0;  // ranks that are neither this one nor skipped
  std::vector<std::unique_ptr<Connection>> connections_;  // [peer * qpsPerPeer + index]
  std::vector<std::string> peerAddresses_;
};

}  // namespace rdmacc
