#include <algorithm>
#include <chrono>
#include <string>

#include <fmt/format.h>

#include "rdmacc/error.hpp"
#include "rdmacc/log.hpp"
#include "src/store/store_util.hpp"
#include "src/transport/rdma/board_words.hpp"
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

RdmaTransport::RdmaTransport(Mesh& mesh, Store& store, const TransportOptions& options)
    : mesh_(mesh),
      registrations_(options.registrations),
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
  if (mesh.lazy()) {
    // Slots come with connections (the hellos carry them); no board, which
    // would need every peer connected.
    if (slotsPerPeer_ > UINT16_MAX || slotBytes_ > UINT32_MAX) {
      throw Error(ErrorKind::InvalidArgument,
                  fmt::format("{} slots of {} bytes do not fit a connection's hello", slotsPerPeer_,
                              slotBytes_),
                  "lower RDMACC_SLOTS_PER_PEER or RDMACC_SLOT_BYTES, or set RDMACC_CONNECT=eager");
    }
    mesh.setLocalSlots({.slotsPerPeer = static_cast<uint16_t>(slotsPerPeer_),
                        .slotBytes = static_cast<uint32_t>(slotBytes_),
                        .region = [this](int rank) { return localSlots(rank); }});
    return;
  }
  // A group of one has no peers; its regions are a token slot.
  size_t region =
      size_ == 1 ? slotBytes_
                 : static_cast<size_t>(size_ - 1) * static_cast<size_t>(slotsPerPeer_) * slotBytes_;
  recvRegion_ = PageBuffer(region);
  stagingRegion_ = PageBuffer(region);
  stagingMr_ =
      verbs::registerMemory(mesh.pd(), stagingRegion_.data(), region, IBV_ACCESS_LOCAL_WRITE);
  for (int rank = 0; rank < size_; ++rank) {
    if (rank == rank_) continue;
    peer(rank).recvBase = recvRegion_.data() + slotOffset(rank, 0);
    peer(rank).stagingBase = stagingRegion_.data() + slotOffset(rank, 0);
    peer(rank).stagingLkey = stagingMr_->lkey;
  }
  connect(store, options.allGather, options.group, options.rdmaOneShotBytes);
}

// The access mesh_ gives peers to this rank's memory: through windows, or
// each peer's own registration.
static int remoteAccess(const Mesh& mesh) {
  return mesh.windows() ? verbs::kWindowedAccess : verbs::kRemoteWriteAccess;
}

uint32_t RdmaTransport::exposeTo(int rank, ibv_qp* qp, ibv_mr* mr, const uint8_t* addr,
                                 size_t bytes) {
  if (!mesh_.windows()) return mr->rkey;
  windows_.push_back(verbs::allocateWindow(mesh_.pd()));
  const uint64_t wrId = pack(WrId{WrKind::Bind, 0, static_cast<uint16_t>(rank), 0});
  verbs::bindWindow(qp, windows_.back(), mr, addr, bytes, wrId, fmt::format("rank {}", rank));
  return windows_.back().rkey;
}

SlotRegion RdmaTransport::localSlots(int rank) {
  PeerState& p = peer(rank);
  const size_t bytes = static_cast<size_t>(slotsPerPeer_) * slotBytes_;
  if (!p.recvMr) {
    p.recv = PageBuffer(bytes);
    p.staging = PageBuffer(bytes);
    // Its own registration: the rkey (or its windows') lets this peer write
    // its slots, nothing else.
    p.recvMr = verbs::registerMemory(mesh_.pd(), p.recv.data(), bytes, remoteAccess(mesh_));
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
          .bytes = bytes};
}

void RdmaTransport::takeConnectionEvents() {
  if (!mesh_.lazy()) return;
  MeshEvents events = mesh_.progressConnections();
  for (const auto& [rank, lanes] : events.connected) {
    // The handshake checked the geometry; the base is the peer's to choose,
    // one for all queue pairs.
    std::vector<uint32_t> rkeys;
    for (const SlotAdvert& lane : lanes) {
      if (lane.base != lanes.front().base) {
        asyncFailures_.emplace_back(
            rank, Error(ErrorInfo{.kind = ErrorKind::Protocol,
                                  .message = fmt::format("rank {} gave its queue pairs different "
                                                         "slot regions ({:#x} and {:#x})",
                                                         rank, lanes.front().base, lane.base),
                                  .peerRank = rank}));
        break;
      }
      rkeys.push_back(lane.rkey);
    }
    if (rkeys.size() != lanes.size()) continue;
    attach(rank, lanes.front().base, rkeys);
    log(LogLevel::Debug, "rank {}: connected to rank {} on first use", rank_, rank);
  }
  for (auto& [rank, error] : events.failed) asyncFailures_.emplace_back(rank, std::move(error));
}

void RdmaTransport::attach(int rank, uint64_t remoteBase, const std::vector<uint32_t>& laneRkeys) {
  PeerState& p = peer(rank);
  p.lanes.resize(static_cast<size_t>(mesh_.qpsPerPeer()));
  for (size_t i = 0; i < p.lanes.size(); ++i) {
    p.lanes[i].qp = mesh_.qp(rank, static_cast<int>(i));
    p.lanes[i].maxInline = verbs::maxInlineData(p.lanes[i].qp);
    p.lanes[i].rkey = laneRkeys.at(i);
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
}

// The one-shot board this rank offers: RDMACC_RDMA_ONE_SHOT_BYTES, as far as
// one inline write carries an entry to every peer; none when a peer is not
// on this rail's mesh (shared memory) or with a single rank.
static size_t boardBytesOffered(const Mesh& mesh, size_t wanted) {
  if (wanted == 0 || mesh.size() < 2) return 0;
  uint32_t inlineBytes = UINT32_MAX;
  for (int rank = 0; rank < mesh.size(); ++rank) {
    if (rank == mesh.rank()) continue;
    if (!mesh.connects(rank)) return 0;
    inlineBytes = std::min(inlineBytes, verbs::maxInlineData(mesh.qp(rank, 0)));
  }
  return std::min(wanted, board_words::maxPayload(inlineBytes));
}

// Publishes "base:slots:slotBytes:rkeys,...:boardBytes:boardBase:boardStride:rkey,..."
// (per peer, in rank order without this rank: its slots' rkey for each of
// its queue pairs, "/"-separated, and its board entries' rkey for the
// first) and sets up every peer from what it published. The board exists
// when every rank offers one (its size: the smallest offered).
void RdmaTransport::connect(Store& store, const AllGather& allGather, const std::string& groupName,
                            size_t boardBytes) {
  const size_t perPeer = static_cast<size_t>(slotsPerPeer_) * slotBytes_;
  std::string rkeys;
  // A peer reached through shared memory has no queue pair: rkey 0.
  auto exposed = [&](int p, int lane, ibv_mr* mr, const uint8_t* addr, size_t bytes) {
    return mesh_.connects(p) ? exposeTo(p, mesh_.qp(p, lane), mr, addr, bytes) : 0u;
  };
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    uint8_t* slots = recvRegion_.data() + slotOffset(p, 0);
    recvMrs_.push_back(verbs::registerMemory(mesh_.pd(), slots, perPeer, remoteAccess(mesh_)));
    rkeys += rkeys.empty() ? "" : ",";
    for (int lane = 0; lane < mesh_.qpsPerPeer(); ++lane) {
      rkeys += fmt::format("{}{}", lane == 0 ? "" : "/",
                           exposed(p, lane, recvMrs_.back().get(), slots, perPeer));
    }
  }
  boardBytes = boardBytesOffered(mesh_, boardBytes);
  std::string boardRkeys;
  if (boardBytes > 0) {
    boardStride_ = roundUp(8 * board_words::entryWords(boardBytes), 64);
    const size_t perSource = kBoardEntries * boardStride_;
    boardRegion_ = PageBuffer(static_cast<size_t>(size_) * perSource);
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      uint8_t* entries = boardRegion_.data() + static_cast<size_t>(p) * perSource;
      boardMrs_.push_back(
          verbs::registerMemory(mesh_.pd(), entries, perSource, remoteAccess(mesh_)));
      boardRkeys += fmt::format("{}{}", boardRkeys.empty() ? "" : ",",
                                exposed(p, 0, boardMrs_.back().get(), entries, perSource));
    }
  }
  size_t groupBoard = boardBytes;
  // Every peer's slot record at once (O(N) requests per group). Every rank
  // of the group has this transport (a group on several hosts gives each
  // rank a peer over RDMA), so every rank takes part.
  std::vector<int> everyone, others;
  std::vector<std::string> keys;
  for (int rank = 0; rank < size_; ++rank) {
    everyone.push_back(rank);
    if (rank == rank_) continue;
    others.push_back(rank);
    keys.push_back(fmt::format("slots/{}", rank));
  }
  const std::vector<Bytes> records = exchangeRecords(
      store, allGather, "rdmacc/engine/" + groupName + "/slots", rank_,
      toBytes(
          fmt::format("{}:{}:{}:{}:{}:{}:{}:{}", reinterpret_cast<uintptr_t>(recvRegion_.data()),
                      slotsPerPeer_, slotBytes_, rkeys, boardBytes,
                      reinterpret_cast<uintptr_t>(boardRegion_.data()), boardStride_, boardRkeys)),
      everyone, others);
  for (int rank = 0; rank < size_; ++rank) {
    if (rank == rank_) continue;
    const std::string& key = keys[peerIndex(rank_, rank)];
    const std::string text = toString(records[peerIndex(rank_, rank)]);
    const auto fields = splitFields(text, ':');
    if (fields.size() != 8) {
      throw Error(ErrorKind::Protocol,
                  fmt::format("rank {} published malformed slot information '{}'", rank, text));
    }
    const uint64_t base = storeNumber(fields[0], UINT64_MAX, key);
    const auto slots = static_cast<int>(storeNumber(fields[1], INT32_MAX, key));
    const size_t slotBytes = storeNumber(fields[2], SIZE_MAX, key);
    // Our rkey in the peer's list: its peers in rank order, without itself.
    const size_t mine = peerIndex(rank, rank_);
    const auto peerRkeys = splitFields(fields[3], ',');
    if (peerRkeys.size() != static_cast<size_t>(size_ - 1)) {
      throw Error(ErrorKind::Protocol, fmt::format("rank {} published {} rkeys for a group of {}",
                                                   rank, peerRkeys.size(), size_));
    }
    std::vector<uint32_t> laneRkeys;
    for (const auto& lane : splitFields(peerRkeys[mine], '/'))
      laneRkeys.push_back(static_cast<uint32_t>(storeNumber(lane, UINT32_MAX, key)));
    if (laneRkeys.size() != static_cast<size_t>(mesh_.qpsPerPeer())) {
      throw Error(ErrorInfo{
          .kind = ErrorKind::Protocol,
          .message = fmt::format("rank {} published {} rkeys for this rank's {} queue pairs", rank,
                                 laneRkeys.size(), mesh_.qpsPerPeer()),
          .peerRank = rank,
          .hint = "set RDMACC_QPS_PER_PEER the same on every rank"});
    }
    // The peer's board: our entries there, if it has one.
    const size_t peerBoard = storeNumber(fields[4], 1u << 20, key);
    groupBoard = std::min(groupBoard, peerBoard);
    if (peerBoard > 0) {
      const uint64_t boardBase = storeNumber(fields[5], UINT64_MAX, key);
      const size_t stride = storeNumber(fields[6], 1u << 24, key);
      const auto boardKeys = splitFields(fields[7], ',');
      if (stride < 8 * board_words::entryWords(peerBoard) ||
          boardKeys.size() != static_cast<size_t>(size_ - 1)) {
        throw Error(ErrorKind::Protocol,
                    fmt::format("rank {} published a malformed one-shot board '{}'", rank, text));
      }
      peer(rank).boardRemote =
          boardBase + static_cast<uint64_t>(rank_) * kBoardEntries * static_cast<uint64_t>(stride);
      peer(rank).boardRkey = static_cast<uint32_t>(storeNumber(boardKeys[mine], UINT32_MAX, key));
    }
    if (slots != slotsPerPeer_ || slotBytes != slotBytes_) {
      throw Error(ErrorInfo{
          .kind = ErrorKind::InvalidArgument,
          .message = fmt::format("rank {} uses {} slots of {} bytes, this rank {} of {}", rank,
                                 slots, slotBytes, slotsPerPeer_, slotBytes_),
          .peerRank = rank,
          .hint = "set RDMACC_SLOTS_PER_PEER and RDMACC_SLOT_BYTES the same on every rank"});
    }
    // Peers reached through shared memory have no queue pairs (no lanes).
    if (mesh_.connects(rank))
      attach(rank, base + mine * static_cast<uint64_t>(slots) * slotBytes, laneRkeys);
  }
  setUpBoard(groupBoard);
}

}  // namespace rdmacc::rdma
