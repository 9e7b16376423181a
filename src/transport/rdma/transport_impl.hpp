// The RDMA transport's state, shared by its data path (transport/rdma/transport.cpp)
// and its setup (transport/rdma/setup.cpp). Private to those two files.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "src/core/buffer.hpp"
#include "src/core/by_rank.hpp"
#include "src/core/ring.hpp"
#include "src/transport/options.hpp"
#include "src/transport/rdma/mesh.hpp"
#include "src/transport/rdma/wr_id.hpp"
#include "src/transport/slot_window.hpp"
#include "src/transport/transport.hpp"
#include "src/transport/wire.hpp"
#include "src/transport/written_board.hpp"
#include "verbs/qp.hpp"

namespace rdmacc {

struct Registration;
class RegistrationCache;

}  // namespace rdmacc

namespace rdmacc::rdma {

// What a staging slot's write reads besides the slot (its zero-copy payload).
struct SlotWrite {
  std::shared_ptr<const Registration> registration;  // keeps the region registered
  std::shared_ptr<ZeroCopyWrites> owner;
  const uint8_t* data = nullptr;
  size_t bytes = 0;
};

// One queue pair to a peer. Writes posted and not yet known complete, in
// posting order: most go unsignaled, and a signaled completion means every
// write posted before it on the queue pair is complete too (RC order), so it
// releases them all.
struct Lane {
  ibv_qp* qp = nullptr;
  uint32_t maxInline = 0;  // what the device granted: messages this small go inline
  uint32_t rkey = 0;       // the peer's slots for this rank, as this queue pair writes them
  struct Posted {
    int staging = -1;  // -1: no staging slot (credits, fences)
    bool signaled = false;
  };
  Ring<Posted> posted;
  int unsignaledRun = 0;         // unsignaled writes at the back of `posted`
  uint64_t completions = 0;      // signaled completions so far
  uint64_t completionsSeen = 0;  // ... at the previous keep-alive probe
  // Stall watch (checkStalls): completions when last looked at, and since
  // when writes have been outstanding without one completing.
  uint64_t completionsAtMark = 0;
  std::chrono::steady_clock::time_point mark{};
  bool stallReported = false;
  int sendQueueUsed() const { return static_cast<int>(posted.size()); }
};

struct PeerState {
  // RDMACC_QPS_PER_PEER lanes: collective chunks go round-robin over all of
  // them (receivers match chunks by index, so they may overtake each other);
  // point-to-point messages, credits and aborts keep to lane 0 and its order.
  std::vector<Lane> lanes;
  size_t nextLane = 0;
  uint64_t remoteBase = 0;            // where this rank's slots start in the peer's region
  SlotWindow window;                  // credits, held slots, arrival checks
  std::vector<int> freeStaging;       // our staging slots for this peer
  std::vector<SlotWrite> slotWrites;  // by staging slot: zero-copy payloads in flight
  // This rank's entries in the peer's one-shot board (transport/rdma/board.cpp):
  // after its slots, the peer's stride apart.
  uint64_t boardRemote = 0;
  size_t boardRemoteStride = 0;
  uint32_t boardRkey = 0;
  // Where the peer's slots sit in this process: what it writes into (then
  // its board entries, eager), what we write from. Its own buffers and
  // registrations, made when the connection starts (Mesh::setLocalSlots).
  uint8_t* recvBase = nullptr;
  uint8_t* stagingBase = nullptr;
  uint32_t stagingLkey = 0;
  PageBuffer recv, staging;
  verbs::MrPtr recvMr, stagingMr;
};

class RdmaTransport final : public Transport, public Board, private RemoteWrites {
 public:
  RdmaTransport(Mesh& mesh, Store& store, const TransportOptions& options);
  ~RdmaTransport() override { mesh_.dropWindows(); }
  RdmaTransport(const RdmaTransport&) = delete;
  RdmaTransport& operator=(const RdmaTransport&) = delete;

  size_t chunkBytes() const noexcept override { return chunk_; }
  int slotsPerPeer() const noexcept override { return slotsPerPeer_; }
  const std::string& peerAddress(int peer) const override { return mesh_.peerAddress(peer); }
  bool trySend(int peer, const wire::Header& header, const uint8_t* data,
               const std::shared_ptr<ZeroCopyWrites>& owner,
               std::optional<DirectTarget> direct) override;
  void reserveCredits(size_t slots) override { creditReserve_ = slots; }
  std::string describePeer(int peer) const override;
  const uint8_t* payload(int peer, int slot) const override {
    return this->peer(peer).recvBase + static_cast<size_t>(slot) * slotBytes_ + wire::kHeaderBytes;
  }
  void release(int peer, int slot) override;
  bool poll(TransportSink& sink) override;
  bool flushCredits() override;
  std::vector<int> takeDisconnected() override {
    takeConnectionEvents();  // lazy: requests, established and ended connections
    return mesh_.takeDisconnectedPeers();
  }
  Departure departure(int) const override {
    return {"rdma_get_cm_event", "RDMA_CM_EVENT_DISCONNECTED"};
  }
  DirectWrites directWrites(int) const override { return DirectWrites::Registered; }
  // One: a post may carry its whole transfer before it returns (soft-RoCE
  // runs requester and responder inside ibv_post_send), and a rank that
  // posted a window's worth in one round consumed nothing and returned no
  // credits meanwhile, so both sides of a two-way transfer took turns
  // waiting for credits. On a NIC the round between two posts is short next
  // to a slot's time on the wire (docs/performance.md, "Two-way transfers").
  size_t sendBurst(int) const override { return 1; }
  void arm() override { mesh_.cq().arm(); }
  void disarm() override {}
  EventFds eventFds() const override {
    EventFds fds;
    fds.fill(-1);
    fds[0] = mesh_.cq().fd();
    fds[1] = mesh_.eventFd();
    fds[2] = mesh_.context()->async_fd;
    return fds;
  }
  void consumeEvents() override {
    mesh_.cq().drainEvents();
    takeAsyncEvents();
    takeConnectionEvents();
  }
  void drain(const std::vector<bool>& dead) override;
  void probe(int peer) override;
  bool connected(int to) const override { return !peer(to).lanes.empty(); }
  void prepare(int peer) override;
  // Both ranks of a pair prepare it when the collective that names it
  // starts; if both connected, their attempts would cross and one would be
  // refused (a request, a queue pair and a rejection wasted per pair). The
  // higher rank starts, as at eager formation; the lower one accepts (its
  // collective messages wait). Should the higher rank be slow to get there,
  // the lower one's keep-alive probe connects (a crossing is resolved as
  // ever).
  bool startsPreparedPair(int peer) const noexcept { return peer < rank_; }
  Board* board() noexcept override { return board_ ? this : nullptr; }
  RemoteWrites* remoteWrites() noexcept override { return this; }
  std::optional<std::chrono::microseconds> pollingSleep() override;

  // Board (src/transport/written_board.hpp): one inline RDMA WRITE per peer
  // and operation into the board entries after this rank's slots in that
  // peer's region; posted through lane 0's queue like any write, so only
  // with the progress lock (exclusive()).
  size_t maxBytes() const noexcept override { return board_->maxBytes(); }
  bool writable(uint64_t) override { return board_->writable(); }
  void post(uint64_t sequence, uint64_t check, const uint8_t* data, size_t bytes) override {
    board_->post(sequence, check, data, bytes);
  }
  const uint8_t* mine(uint64_t) const override { return board_->mine(); }
  const uint8_t* peek(int peer, uint64_t sequence, uint64_t check, size_t bytes) override {
    return board_->peek(peer, sequence, check, bytes, peerAddress(peer));
  }
  void consumed(uint64_t sequence) override { board_->consumed(sequence); }
  void engineWaits(bool waits) override { board_->engineWaits(waits); }
  bool quiet() const override { return !pollSaturated_; }
  bool exclusive() const noexcept override { return true; }

 private:
  uint8_t* stagingSlot(int peer, int slot) {
    return this->peer(peer).stagingBase + static_cast<size_t>(slot) * slotBytes_;
  }
  PeerState& peer(int rank) { return peers_[rank]; }
  const PeerState& peer(int rank) const { return peers_[rank]; }

  // A peer's lanes, credits and staging once its queue pairs are up, from
  // the slots their hellos gave (one region for all); an error naming the
  // peer when they disagree.
  std::optional<Error> attach(int rank, const std::vector<SlotAdvert>& lanes);
  // This rank's slots (and eager, board entries) for a peer, registered on
  // the first call (the mesh binds a window per queue pair over them).
  SlotRegion localSlots(int rank);
  void takeConnectionEvents();
  int signalRun() const { return std::max(1, slotsPerPeer_ / 4); }
  bool mustSignal(const PeerState& p, const Lane& lane, bool usesStaging) const;
  static void posted(Lane& lane, int staging, bool signaled) {
    lane.posted.push_back({staging, signaled});
    lane.unsignaledRun = signaled ? 0 : lane.unsignaledRun + 1;
  }
  // Whether `entries` more work requests would leave less than one for a fence.
  bool sendQueueFull(const Lane& lane, int entries = 1) const {
    return lane.sendQueueUsed() + entries + 1 > static_cast<int>(mesh_.qpParams().sendDepth);
  }
  bool flushCredits(int peer);
  // A zero-byte write of no message to a peer's first slot: credits (with
  // their immediate), or a probe or flush behind unsignaled writes (no
  // immediate, so it consumes no receive). Throws, naming the peer and
  // `why`, when the post fails.
  void postControl(int peer, size_t laneIndex, ControlTag tag, std::optional<uint32_t> imm,
                   bool signaled, const char* why);
  static void writesCompleted(PeerState& p, Lane& lane);
  void onReceive(TransportSink& sink, const ReceiveOrigin& origin,
                 const wire::Completion& completion);
  // The device's asynchronous events (transport/rdma/async.cpp): a queue pair, the CQ
  // or the device in error fails the peers it serves (delivered by poll());
  // port down/up is logged (transfers retry meanwhile). Read after a sleep
  // and every kAsyncPollEvery polls, so spinning costs no system call.
  void takeAsyncEvents();
  // A lane whose writes completed none for twice the retry budget, without
  // an error, was stalled by the device: fails the peer (with the async
  // failures), instead of leaving it to the operation's timeout.
  void checkStalls();
  std::chrono::steady_clock::time_point lastStallCheck_{};
  // Fixed by the queue pairs' parameters (set in the constructor): ACK
  // timeout x (retry count + 1), and the stall limit, twice that, at least 5 s.
  double retryBudget_ = 0;
  std::chrono::duration<double> stallLimit_{};
  void deliverAsyncFailures(TransportSink& sink);
  static constexpr uint32_t kAsyncPollEvery = 4096;
  uint32_t pollsSinceAsync_ = 0;
  std::vector<std::pair<int, Error>> asyncFailures_;

  Mesh& mesh_;
  bool zeroCopy_;
  size_t zeroCopyMinBytes_;
  int rank_;
  int size_;
  int slotsPerPeer_;
  size_t slotBytes_;
  size_t chunk_;
  ByRank<PeerState> peers_;
  size_t creditReserve_ = 0;
  uint64_t arrivals_ = 0;
  bool pollSaturated_ = false;  // the last poll() took as many completions as it could

  // RemoteWrites (transport/rdma/board.cpp): this group's board entries
  // and, over a link, a later group's.
  Region registerRegion(size_t bytes) override;
  size_t boardBytes() const noexcept override { return board_ ? board_->maxBytes() : 0; }
  bool room(int peer) const override {
    const auto& lanes = this->peer(peer).lanes;
    return !lanes.empty() && !sendQueueFull(lanes[0]);
  }
  void write(int peer, uint64_t addr, uint32_t rkey, const void* data, uint32_t length) override;

  // The one-shot board: kBoardEntries entries of boardStride_ bytes per
  // source rank, after the slots of that source's region (its rkey lets
  // that peer write its own entries and nothing else).
  void setUpBoard(size_t maxBytes);
  size_t boardStride_ = 0;
  std::optional<WrittenBoard> board_;  // the group's; none when 0 bytes
};

}  // namespace rdmacc::rdma
