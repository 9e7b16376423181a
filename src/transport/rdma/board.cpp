// The RDMA transport's one-shot board (src/transport/written_board.hpp): a
// small allreduce is one inline RDMA WRITE per peer into the entries after
// this rank's slots in that peer's region. The same writes serve the boards
// of later groups over a link (RemoteWrites), into memory they register.
#include <fmt/format.h>

#include "rdmacc/error.hpp"
#include "src/core/buffer.hpp"
#include "src/transport/rdma/transport_impl.hpp"
#include "src/transport/rdma/wr_id.hpp"
#include "verbs/error.hpp"

namespace rdmacc::rdma {

// `maxBytes`: the group's (the smallest any rank published), 0 for none.
void RdmaTransport::setUpBoard(size_t maxBytes) {
  if (maxBytes == 0) return;
  std::vector<BoardTarget> targets(static_cast<size_t>(size_));
  for (int rank = 0; rank < size_; ++rank) {
    if (rank == rank_) continue;
    const PeerState& p = peer(rank);
    targets[static_cast<size_t>(rank)] = {
        .via = rank, .addr = p.boardRemote, .stride = p.boardRemoteStride, .rkey = p.boardRkey};
  }
  RemoteWrites& writes = *this;
  board_.emplace(
      rank_, size_, maxBytes, writes, std::move(targets), [this](int from, size_t entry) {
        return reinterpret_cast<const uint64_t*>(peer(from).recvBase +
                                                 static_cast<size_t>(slotsPerPeer_) * slotBytes_ +
                                                 entry * boardStride_);
      });
}

RemoteWrites::Region RdmaTransport::registerRegion(size_t bytes) {
  struct Held {
    PageBuffer memory;
    verbs::MrPtr mr;
  };
  auto held = std::make_shared<Held>();
  held->memory = PageBuffer(bytes);
  held->mr =
      verbs::registerMemory(mesh_.pd(), held->memory.data(), bytes, verbs::kRemoteWriteAccess);
  return Region{.data = held->memory.data(),
                .addr = reinterpret_cast<uintptr_t>(held->memory.data()),
                .rkey = held->mr->rkey,
                .keep = held};
}

void RdmaTransport::write(int rank, uint64_t addr, uint32_t rkey, const void* data,
                          uint32_t length) {
  Lane& lane = peer(rank).lanes[0];
  // Signaled only once half the send queue holds unsignaled writes: a
  // completion wakes a sleeping engine thread, and nothing waits for these.
  const bool signaled =
      lane.sendQueueUsed() + 2 >= static_cast<int>(mesh_.qpParams().sendDepth / 2);
  verbs::WriteRequest w{.wrId = pack(WrId{WrKind::Control, 0, static_cast<uint16_t>(rank),
                                          static_cast<uint32_t>(ControlTag::Board)}),
                        .local = data,
                        .length = length,
                        .remoteAddr = addr,
                        .rkey = rkey,
                        .signaled = signaled,
                        .inlineData = true};
  if (int rc = verbs::postWrite(lane.qp, w); rc != 0) {
    throw verbs::verbsError("ibv_post_send", rc,
                            fmt::format("posting a one-shot contribution to rank {}", rank));
  }
  posted(lane, -1, signaled);
}

std::optional<std::chrono::microseconds> RdmaTransport::pollingSleep() {
  // A connection attempt waiting to be retried raises no event.
  if (mesh_.retrying()) return std::chrono::microseconds(50'000);
  return board_ ? board_->pollingSleep() : std::nullopt;
}

}  // namespace rdmacc::rdma
