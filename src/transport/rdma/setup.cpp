#include <algorithm>
#include <chrono>
#include <string>

#include <fmt/format.h>

#include "rdmacc/error.hpp"
#include "rdmacc/log.hpp"
#include "src/transport/board_words.hpp"
#include "src/transport/rdma/handshake.hpp"
#include "src/transport/rdma/transport.hpp"
#include "src/transport/rdma/transport_impl.hpp"
#include "verbs/error.hpp"
#include "verbs/qp.hpp"

namespace rdmacc {

size_t autoSlotBytes(int worldSize, int slotsPerPeer) {
  constexpr size_t kBudget = size_t{32} << 20;  // both regions together
  constexpr size_t kMin = size_t{16} << 10;
  size_t bytes = size_t{256} << 10;
  size_t perSlotOfEveryPeer = 2 * static_cast<size_t>(std::max(worldSize - 1, 1)) *
                              static_cast<size_t>(std::max(slotsPerPeer, 1));
  while (bytes > kMin && bytes * perSlotOfEveryPeer > kBudget) bytes /= 2;
  return bytes;
}

std::unique_ptr<Transport> makeRdmaTransport(Mesh& mesh, Store& store,
                                             const TransportOptions& options) {
  return std::make_unique<rdma::RdmaTransport>(mesh, store, options);
}

RegistrationCache::Registrar userMemoryRegistrar(ibv_pd* pd) {
  return [pd](uintptr_t begin, size_t length) {
    if (pd == nullptr) return Registration{.begin = begin, .end = begin + length};
    std::shared_ptr<ibv_mr> mr = verbs::registerMemory(pd, reinterpret_cast<void*>(begin), length,
                                                       verbs::kRemoteWriteAccess);
    return Registration{.begin = begin,
                        .end = begin + length,
                        .lkey = mr->lkey,
                        .rkey = mr->rkey,
                        .owner = std::move(mr)};
  };
}

}  // namespace rdmacc

namespace rdmacc::rdma {

using wire::kHeaderBytes;

namespace {

// The one-shot board this rank offers: RDMACC_RDMA_ONE_SHOT_BYTES, as far as
// one inline write carries an entry (and a hello the size); none when a
// peer is not on this rail's mesh (shared memory) or with a single rank.
size_t boardBytesOffered(const Mesh& mesh, size_t wanted) {
  if (wanted == 0 || mesh.size() < 2) return 0;
  for (int rank = 0; rank < mesh.size(); ++rank) {
    if (rank != mesh.rank() && !mesh.connects(rank)) return 0;
  }
  return std::min(
      {wanted, board_words::maxPayload(mesh.grantedInline()), size_t{handshake::kMaxBoardBytes}});
}

}  // namespace

RdmaTransport::RdmaTransport(Mesh& mesh, Store& store, const TransportOptions& options)
    : mesh_(mesh),
      zeroCopy_(options.zeroCopy),
      zeroCopyMinBytes_(options.zeroCopyMinBytes),
      rank_(mesh.rank()),
      size_(mesh.size()),
      slotsPerPeer_(options.slotsPerPeer),
      slotBytes_(options.slotBytes == 0 ? autoSlotBytes(size_, slotsPerPeer_) : options.slotBytes) {
  const auto recvDepth = mesh.qpParams().recvDepth;
  const auto sendDepth = mesh.qpParams().sendDepth;
  if (static_cast<uint32_t>(2 * slotsPerPeer_ + 4) > std::min(recvDepth, sendDepth)) {
    throw Error(
        ErrorKind::InvalidArgument,
        fmt::format("{} slots per peer need queue depths of at least {} (send {}, receive {})",
                    slotsPerPeer_, 2 * slotsPerPeer_ + 4, sendDepth, recvDepth),
        "raise RDMACC_QP_SEND_DEPTH/RDMACC_QP_RECV_DEPTH or lower RDMACC_SLOTS_PER_PEER");
  }
  chunk_ = slotBytes_ - kHeaderBytes;
  const verbs::QpParams& qp = mesh.qpParams();
  retryBudget_ = 4.096e-6 * static_cast<double>(uint64_t{1} << qp.ackTimeout) * (qp.retryCount + 1);
  stallLimit_ =
      std::max(std::chrono::duration<double>(2 * retryBudget_), std::chrono::duration<double>(5.0));
  peers_.resize(size_);
  // Each connected peer gets slots of its own, carried by the hellos (no
  // slot table goes through the store); eager, the one-shot board's entries
  // follow them.
  if (slotsPerPeer_ > UINT16_MAX || slotBytes_ > UINT32_MAX) {
    throw Error(ErrorKind::InvalidArgument,
                fmt::format("{} slots of {} bytes do not fit a connection's hello", slotsPerPeer_,
                            slotBytes_),
                "lower RDMACC_SLOTS_PER_PEER or RDMACC_SLOT_BYTES");
  }
  const size_t boardOffer = mesh.lazy() ? 0 : boardBytesOffered(mesh, options.rdmaOneShotBytes);
  if (boardOffer > 0) boardStride_ = WrittenBoard::stride(boardOffer);
  mesh.setLocalSlots({.slotsPerPeer = static_cast<uint16_t>(slotsPerPeer_),
                      .slotBytes = static_cast<uint32_t>(slotBytes_),
                      .boardBytes = static_cast<uint8_t>(boardOffer),
                      .region = [this](int rank) { return localSlots(rank); }});
  if (mesh.lazy()) return;  // no board, which would need every peer connected
  if (size_ > 1 && !mesh.awaitingConnect()) {
    throw Error(ErrorKind::Internal,
                "the RDMA mesh connected before the transport gave it the slots its hellos carry",
                "construct the Mesh with MeshOptions::transportConnects");
  }
  mesh.connectEveryone(store);
  size_t groupBoard = boardOffer;
  for (int rank = 0; rank < size_; ++rank) {
    if (!mesh_.connects(rank)) continue;
    const std::vector<SlotAdvert> lanes = mesh_.remoteSlots(rank);
    if (auto error = attach(rank, lanes)) throw *error;
    // The board exists when every rank offers one (its size: the smallest
    // offered); a rank with a peer through shared memory offers none, and
    // every rank connects to it or is it.
    groupBoard = std::min<size_t>(groupBoard, lanes.front().boardBytes);
    if (lanes.front().boardBytes > 0) {
      peer(rank).boardRemote =
          lanes.front().base + static_cast<uint64_t>(slotsPerPeer_) * slotBytes_;
      peer(rank).boardRemoteStride = WrittenBoard::stride(lanes.front().boardBytes);
      peer(rank).boardRkey = lanes.front().rkey;
    }
  }
  setUpBoard(groupBoard);
}

// The access mesh_ gives peers to this rank's memory: through windows, or
// each peer's own registration.
static int remoteAccess(const Mesh& mesh) {
  return mesh.windows() ? verbs::kWindowedAccess : verbs::kRemoteWriteAccess;
}

SlotRegion RdmaTransport::localSlots(int rank) {
  PeerState& p = peer(rank);
  const size_t bytes = static_cast<size_t>(slotsPerPeer_) * slotBytes_;
  const size_t region = bytes + (boardStride_ > 0 ? kBoardEntries * boardStride_ : 0);
  if (!p.recvMr) {
    p.recv = PageBuffer(region);
    p.staging = PageBuffer(bytes);
    // Its own registration: the rkey (or its windows') lets this peer write
    // its slots and board entries, nothing else.
    p.recvMr = verbs::registerMemory(mesh_.pd(), p.recv.data(), region, remoteAccess(mesh_));
    p.stagingMr =
        verbs::registerMemory(mesh_.pd(), p.staging.data(), bytes, IBV_ACCESS_LOCAL_WRITE);
    p.recvBase = p.recv.data();
    p.stagingBase = p.staging.data();
    p.stagingLkey = p.stagingMr->lkey;
  }
  return {.advert = {.slots = static_cast<uint16_t>(slotsPerPeer_),
                     .slotBytes = static_cast<uint32_t>(slotBytes_),
                     .base = reinterpret_cast<uintptr_t>(p.recv.data()),
                     .rkey = p.recvMr->rkey},
          .mr = p.recvMr.get(),
          .addr = p.recv.data(),
          .bytes = region};
}

void RdmaTransport::takeConnectionEvents() {
  if (!mesh_.lazy()) return;
  MeshEvents events = mesh_.progressConnections();
  for (const auto& [rank, lanes] : events.connected) {
    if (auto error = attach(rank, lanes)) {
      asyncFailures_.emplace_back(rank, std::move(*error));
      continue;
    }
    log(LogLevel::Debug, "rank {}: connected to rank {} on first use", rank_, rank);
  }
  for (auto& [rank, error] : events.failed) asyncFailures_.emplace_back(rank, std::move(error));
}

std::optional<Error> RdmaTransport::attach(int rank, const std::vector<SlotAdvert>& lanes) {
  // The handshake checked the geometry; the base is the peer's to choose,
  // one for all queue pairs.
  for (const SlotAdvert& lane : lanes) {
    if (lane.base != lanes.front().base || lane.boardBytes != lanes.front().boardBytes) {
      return Error(ErrorInfo{.kind = ErrorKind::Protocol,
                             .message = fmt::format("rank {} gave its queue pairs different "
                                                    "slot regions ({:#x} and {:#x}, boards of {} "
                                                    "and {} bytes)",
                                                    rank, lanes.front().base, lane.base,
                                                    lanes.front().boardBytes, lane.boardBytes),
                             .peerRank = rank});
    }
  }
  if (lanes.size() != static_cast<size_t>(mesh_.qpsPerPeer())) {
    return Error(ErrorInfo{.kind = ErrorKind::Internal,
                           .message = fmt::format("{} of rank {}'s {} queue pairs are up",
                                                  lanes.size(), rank, mesh_.qpsPerPeer()),
                           .peerRank = rank});
  }
  const uint64_t remoteBase = lanes.front().base;
  PeerState& p = peer(rank);
  p.lanes.resize(static_cast<size_t>(mesh_.qpsPerPeer()));
  for (size_t i = 0; i < p.lanes.size(); ++i) {
    p.lanes[i].qp = mesh_.qp(rank, static_cast<int>(i));
    p.lanes[i].maxInline = verbs::maxInlineData(p.lanes[i].qp);
    p.lanes[i].rkey = lanes[i].rkey;
  }
  p.remoteBase = remoteBase;
  p.window = SlotWindow(slotsPerPeer_);
  p.freeStaging.clear();
  for (int i = 0; i < slotsPerPeer_; ++i) p.freeStaging.push_back(slotsPerPeer_ - 1 - i);
  p.slotWrites.resize(static_cast<size_t>(slotsPerPeer_));
  for (Lane& lane : p.lanes) {
    lane.posted.reserve(mesh_.qpParams().sendDepth);
    lane.mark = std::chrono::steady_clock::now();  // the stall watch starts now (checkStalls)
  }
  return std::nullopt;
}

}  // namespace rdmacc::rdma
