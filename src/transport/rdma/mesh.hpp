// The connection mesh: one protection domain, one completion queue, shared
// receive queues (RDMACC_SRQ) and RDMACC_QPS_PER_PEER
// reliable-connected queue pairs to other ranks,
// established through librdmacm with the group token checked on both sides:
// to every rank at formation (eager), or to a rank when a transfer first
// names it (lazy, RDMACC_CONNECT; docs/decisions/010).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "rdmacc/config.hpp"
#include "rdmacc/error.hpp"
#include "rdmacc/store.hpp"
#include "rdmacc/topology.hpp"
#include "src/core/by_rank.hpp"
#include "src/transport/rdma/wr_id.hpp"
#include "verbs/cm.hpp"
#include "verbs/device.hpp"
#include "verbs/qp.hpp"

namespace rdmacc {

struct MeshOptions {
  std::string group = "default";  // store namespace: one mesh per group name
  // Peers this mesh does not connect (reached through shared memory): empty,
  // or one entry per rank. Both sides of a pair must agree (hostNumbers does).
  std::vector<bool> skip;
  // The port to use; none: selectEndpoint (RDMACC_IB_HCA and the local rank).
  std::optional<Endpoint> endpoint;
  // Connect to a peer on first use (connect()) instead of to all at formation.
  bool lazy = false;
  // Lazy: the launcher's exchange for the addresses (empty: the store).
  AllGather allGather;
  // Open the device and listen, then wait for start(): the caller publishes
  // record() with its own (the host record) and passes every rank's.
  bool deferStart = false;
  // Eager: start() leaves connecting to the transport, which sets the
  // slots the hellos carry first (setLocalSlots, then connectEveryone).
  // Without, start() connects and the hellos carry no slots (a mesh used
  // on its own: tests, rdmacc-perf -c write).
  bool transportConnects = false;
};

// Where a rank's slots for one peer are, as its hellos carry them
// (src/transport/rdma/handshake.hpp): `slots` of `slotBytes` from `base`,
// then (eager) the one-shot board entries of `boardBytes` payload, if any,
// all written with `rkey`.
struct SlotAdvert {
  uint16_t slots = 0;
  uint32_t slotBytes = 0;
  uint64_t base = 0;
  uint32_t rkey = 0;
  uint8_t boardBytes = 0;
};

// This rank's slots for one peer: the advert its hellos carry (rkey: the
// registration's) and the registration, which a memory window per queue
// pair covers (Mesh::windows).
struct SlotRegion {
  SlotAdvert advert;
  ibv_mr* mr = nullptr;
  const uint8_t* addr = nullptr;
  size_t bytes = 0;
};
struct LocalSlots {
  uint16_t slotsPerPeer = 0;
  uint32_t slotBytes = 0;
  uint8_t boardBytes = 0;                      // eager: the board this rank offers
  std::function<SlotRegion(int peer)> region;  // registered on the first call
};

// Where a receive completion came from: the peer, its queue pair, and which
// of the mesh's shared receive queues it drew from (-1: the queue pair's own).
struct ReceiveOrigin {
  int peer = -1;
  int qp = 0;
  int queue = -1;
};

// What connecting on first use produced since the last look.
struct MeshEvents {
  // Every queue pair up; the peer's slots as each queue pair's hello gave them.
  std::vector<std::pair<int, std::vector<SlotAdvert>>> connected;
  std::vector<std::pair<int, Error>> failed;  // could not connect
  bool any() const { return !connected.empty() || !failed.empty(); }
};

// Built and destroyed by one thread. Afterwards the QPs, PD and CQ may be
// used by one other thread (the progress engine); Mesh itself is immutable.
class Mesh {
 public:
  // Forms the mesh or throws: Error(Timeout) naming the ranks that did not
  // arrive or connect within RDMACC_CONNECT_TIMEOUT; other errors name the call.
  // With options.deferStart, only opens the device and listens (start() does
  // the rest, and throws what opening threw).
  Mesh(Store& store, int rank, int size, const Config& config, MeshOptions options = {});
  // Deferred: what the other ranks need to connect to this one ("ip:port";
  // rank 0 adds "/" and the group's secret or salt); empty if opening failed.
  std::string record() const;
  // Deferred: forms the mesh as the constructor does, with `skip` as
  // MeshOptions::skip and `published` every rank's record() by rank (the
  // ranks this one connects to and rank 0 must have one), or empty: the
  // addresses and secret go through the store (or the launcher) instead.
  void start(Store& store, std::vector<bool> skip, const std::vector<std::string>& published);
  // Eager with MeshOptions::transportConnects: the handshake with every
  // peer, after setLocalSlots; throws as the constructor does.
  void connectEveryone(Store& store);
  // Eager with MeshOptions::transportConnects, between start() and
  // connectEveryone(): the transport may still set the hellos' slots.
  bool awaitingConnect() const noexcept { return pending_.has_value(); }
  ~Mesh();
  Mesh(const Mesh&) = delete;
  Mesh& operator=(const Mesh&) = delete;

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  int qpsPerPeer() const noexcept { return qpsPerPeer_; }
  // Whether this mesh connects to peer (MeshOptions::skip), and to how many.
  bool connects(int peer) const { return peer != rank_ && !skip_.at(peer); }
  int connectedPeers() const noexcept { return connectedPeers_; }
  // Queue pairs up now (lazy: read by another thread, a count only).
  int queuePairs() const noexcept { return queuePairs_.load(std::memory_order_relaxed); }
  const Endpoint& endpoint() const noexcept { return endpoint_; }
  // The process's context of the device, shared with its other groups.
  ibv_context* context() const noexcept { return device_->context(); }
  // The device's asynchronous events since the last look (verbs::SharedDevice).
  std::vector<verbs::AsyncEvent> takeAsyncEvents() { return device_->takeAsyncEvents(mailbox_); }
  ibv_pd* pd() const noexcept { return pd_.get(); }
  // Whether peers' access to this rank's memory goes through memory windows
  // bound to their own queue pairs (RDMACC_MEMORY_WINDOWS and the device).
  bool windows() const noexcept { return windows_; }
  verbs::CompletionQueue& cq() noexcept { return *cq_; }
  // Whether a device event's queue is this group's: the device, and so its
  // events, are shared by the groups of the process.
  bool owns(const verbs::AsyncEvent& e) const noexcept {
    if (e.cq != nullptr) return e.cq == cq_->get();
    return std::any_of(shared_.begin(), shared_.end(),
                       [&](const SharedQueue& q) { return q.srq.get() == e.srq; });
  }
  ibv_qp* qp(int peer, int index = 0) const;
  // Receives (for the peers' writes with immediate data) come from shared
  // receive queues while they have room: each queue pair adds the receives
  // its peer can have in flight (2 x slots + 4, the bound the transport
  // checks), not a ring of RDMACC_QP_RECV_DEPTH of its own.
  // A receive completion of cq() names its queue pair through its wr_id or,
  // from a shared queue, its qp_num: which peer it came from, or nullopt
  // when no queue pair of this mesh had that number.
  std::optional<ReceiveOrigin> receiveOrigin(const ibv_wc& wc) const;
  // Posts again the receive a successful completion used (to the shared
  // queue, or to the connected queue pair's own); ibv_post_recv's errno.
  int repostReceive(const ReceiveOrigin& origin);
  // Receives posted for this mesh's queue pairs (shared and their own): what
  // the receive side holds, for tests and tools.
  size_t receivesPosted() const noexcept {
    return sharedPosted_.load(std::memory_order_relaxed) +
           ownPosted_.load(std::memory_order_relaxed);
  }
  // The path MTU (bytes) negotiated with peer.
  int pathMtu(int peer) const;
  // "ip:port (GID ...)" for error messages.
  const std::string& peerAddress(int peer) const;
  const verbs::QpParams& qpParams() const noexcept { return params_; }
  // Eager: the inline data the device grants a queue pair of qpParams()
  // (a probe at opening: the one-shot board offered in the hellos fits it).
  uint32_t grantedInline() const noexcept { return grantedInline_; }
  // Eager, once connected: the peer's slots for this rank, by queue pair,
  // as its hellos gave them.
  std::vector<SlotAdvert> remoteSlots(int peer) const;

  // After the mesh formed: the rdma_cm event channel (readable when a peer
  // disconnects or, lazy, connects) and the peers that disconnected since
  // the last call.
  int eventFd() const noexcept;
  std::vector<int> takeDisconnectedPeers();

  // Connecting on first use (MeshOptions::lazy).
  bool lazy() const noexcept { return lazy_; }
  // The hellos carry this rank's slots (LocalSlots); every peer's are
  // slotsPerPeer of slotBytes (a peer with others is refused). Set once,
  // before connectEveryone() (eager) or the first connect() or progress().
  void setLocalSlots(LocalSlots localSlots);
  // Deallocates the windows over the slots (before their registrations go:
  // rxe refuses to deregister memory a window is bound to). Lazy: each
  // queue pair owns its window, deallocated before the queue pair (a window
  // holds its queue pair, which rxe then takes a minute to destroy).
  void dropWindows();
  // Starts connecting to peer unless connected, connecting or failed.
  void connect(int peer);
  // Whether every queue pair to peer is up.
  bool connected(int peer) const;
  // Takes the rdma_cm events waiting (never blocks): requests from peers are
  // accepted, attempts move on, retries and deadlines fire.
  MeshEvents progressConnections();
  // A message from peer arrived on a queue pair this rank accepted before
  // rdma_cm said it is established (the peer's side was; the RTU is on its
  // way): the accepted queue pairs count as up now.
  void establishEarly(int peer);
  // Whether connections are being made (progressConnections has work).
  bool connecting() const noexcept { return connecting_; }
  // Whether an attempt of this rank waits for a retry (progressConnections
  // must run again within kRetryDelay although no event may come).
  bool retrying() const;

 private:
  // A queue pair's part of the receives posted (Connector::makeQp), given
  // back when the queue pair goes: its own ring goes with it; its share of
  // the shared queue stays posted, for the next queue pair to draw on.
  class ReceiveShare {
   public:
    ReceiveShare() = default;
    ReceiveShare(Mesh& mesh, int queue, uint32_t count)
        : mesh_(&mesh), queue_(queue), count_(count) {}
    ReceiveShare(ReceiveShare&& other) noexcept { *this = std::move(other); }
    ReceiveShare& operator=(ReceiveShare&& other) noexcept;
    ~ReceiveShare();

   private:
    Mesh* mesh_ = nullptr;
    int queue_ = -1;  // in Mesh::shared_, or -1: a ring of its own
    uint32_t count_ = 0;
  };
  struct Connection;  // src/transport/rdma/mesh_connection.hpp
  struct Connector;   // src/transport/rdma/mesh_connector.hpp

  void open(const Config& config, const MeshOptions& options);
  // Receives a queue pair adds: its peer's writes with immediate data in
  // flight at most (2 x slots + 4, RdmaTransport checks the depth against
  // it), or RDMACC_QP_RECV_DEPTH before the slots are known.
  uint32_t receivesPerQp() const noexcept;
  static uint32_t receivesPerQp(uint32_t recvDepth, uint32_t slotsPerPeer) noexcept {
    return std::min(recvDepth, 2 * slotsPerPeer + 4);
  }
  // Adds a shared queue for `qps` queue pairs of receivesPerQp (false: the
  // device has none or refused).
  bool addSharedQueue(uint32_t perQp, int qps);
  // A shared receive's wr_id: its queue pair field says "look up qp_num".
  static constexpr uint8_t kSharedReceive = 0xff;  // above RDMACC_QPS_PER_PEER's 16
  static uint64_t sharedReceiveWrId() noexcept {
    return pack(WrId{.kind = WrKind::Recv, .qp = kSharedReceive});
  }
  // A receive of a queue pair's own ring names its peer and lane.
  static uint64_t ownReceiveWrId(int peer, int qp) noexcept {
    return pack(WrId{
        .kind = WrKind::Recv, .qp = static_cast<uint8_t>(qp), .peer = static_cast<uint16_t>(peer)});
  }
  void setSkip(std::vector<bool> skip);
  std::pair<std::string, uint16_t> parseAddress(int peer, const std::string& text,
                                                const std::string& where);
  // Eager: the handshake with every peer this rank connects to; `known`:
  // every rank's address when published with the host records (else each
  // lower rank's is read from the store as it appears).
  void connectPeers(Store& groupStore, std::chrono::steady_clock::time_point deadline,
                    std::vector<std::optional<std::pair<std::string, uint16_t>>> known);
  // A formation error goes to the other ranks through the store's "abort"
  // key rather than leave them to their timeout.
  void tellOthers(Store& groupStore, const Error& e) const;
  // Lazy: every peer's (ip, port) through the store or the launcher.
  std::vector<std::optional<std::pair<std::string, uint16_t>>> exchangeAddresses(
      Store& store, const std::string& mine);
  std::vector<int> takeLazilyDisconnected();
  void startConnector(std::vector<std::optional<std::pair<std::string, uint16_t>>> addresses);

  int rank_;
  int size_;
  int qpsPerPeer_;
  Endpoint endpoint_;
  verbs::QpParams params_;
  std::shared_ptr<verbs::SharedDevice> device_;  // first: outlives what is made on it
  int mailbox_ = -1;                             // for the device's asynchronous events
  verbs::PdPtr pd_;
  std::unique_ptr<verbs::CompletionQueue> cq_;
  // Shared receive queues: one made at opening for every peer (eager) or
  // for RDMACC_SRQ_PEERS queue pairs (lazy), another when a lazy mesh's
  // queue pairs outgrow those, so that what is posted grows with them.
  struct SharedQueue {
    verbs::SrqPtr srq;
    uint32_t capacity = 0;  // receives it holds
    uint32_t posted = 0;    // receives posted to it (reposts replace used ones)
    int qps = 0;            // queue pairs alive that draw from it
  };
  int sharedQueueQps_ = 64;              // lazy: RDMACC_SRQ_PEERS
  bool useShared_ = false;               // RDMACC_SRQ, and a mesh a transport uses
  std::vector<SharedQueue> shared_;      // after cq_, before every queue pair attached to one
  std::atomic<size_t> sharedPosted_{0};  // their posted receives, for other threads
  std::atomic<size_t> ownPosted_{0};     // in the rings of queue pairs alive without it
  // qp_num -> (peer, index, queue) of every queue pair made on a shared queue (a
  // destroyed one's number stays until reused: a completion it left in the
  // queue still names its peer).
  std::unordered_map<uint32_t, ReceiveOrigin> sharedOwners_;
  std::unique_ptr<verbs::EventChannel> events_;  // before the ids created on it
  verbs::CmIdPtr listenId_;
  ByRank<bool> skip_;       // MeshOptions::skip, one entry per rank
  int connectedPeers_ = 0;  // ranks that are neither this one nor skipped
  std::atomic<int> queuePairs_{0};
  std::vector<std::unique_ptr<Connection>> connections_;  // [peer * qpsPerPeer + index]
  ByRank<std::string> peerAddresses_;
  std::string secret_;  // keys the hellos' proofs (src/transport/rdma/handshake.hpp)
  std::chrono::milliseconds connectTimeout_{};
  int connectWindow_ = 8;  // lazy: peers this rank connects to at once (RDMACC_CONNECT_WINDOW)
  bool lazy_ = false;
  bool transportConnects_ = false;
  bool windows_ = false;
  uint32_t grantedInline_ = 0;
  LocalSlots localSlots_;
  // Eager, between start() and connectEveryone(): when formation gives up,
  // and every rank's address if the host records carried them.
  struct Pending {
    std::chrono::steady_clock::time_point deadline;
    std::vector<std::optional<std::pair<std::string, uint16_t>>> addresses;
  };
  std::optional<Pending> pending_;
  bool connecting_ = false;  // lazy: attempts or retries under way
  std::string group_;
  AllGather allGather_;
  std::string authKey_;           // RDMACC_AUTH_KEY
  std::string drawn_;             // rank 0: the group's secret, or with a key its salt
  uint16_t port_ = 0;             // rdma_cm listens here
  std::exception_ptr openError_;  // thrown by start()
  struct DropConnector {          // defined where Connector is
    void operator()(Connector* connector) const;
  };
  std::unique_ptr<Connector, DropConnector> connector_;  // lazy: alive as long as the mesh
};

}  // namespace rdmacc
