// The RDMA transport's one-shot board (transport/transport.hpp, Board): a small
// allreduce is one inline RDMA WRITE per peer into that peer's board, and
// a poll of this rank's own memory for the peers' writes; no receive
// completion, slot or credit. Entries are flagged word by word
// (transport/rdma/board_words.hpp) and alternate between kBoardEntries per source, indexed
// by the board operations this rank posted (not the collective sequence:
// collectives in between that went through messages do not count).
#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "rdmacc/error.hpp"
#include "src/core/buffer.hpp"
#include "src/transport/peer_errors.hpp"
#include "src/transport/rdma/board_words.hpp"
#include "src/transport/rdma/transport_impl.hpp"
#include "src/transport/rdma/wr_id.hpp"
#include "verbs/error.hpp"

namespace rdmacc::rdma {

namespace {

uint32_t flagOf(uint64_t boardOp) {
  // Never 0 (what a fresh region holds) for the first 2^32 - 1 operations;
  // later ones wrap past it, long after every entry was written.
  return static_cast<uint32_t>(boardOp + 1);
}

}  // namespace

// `maxBytes`: the group's (the smallest any rank published), 0 for none.
void RdmaTransport::setUpBoard(size_t maxBytes) {
  boardMax_ = maxBytes;
  if (boardMax_ == 0) return;
  boardWords_.assign(board_words::entryWords(boardMax_), 0);
  boardMine_.assign(boardMax_, 0);
  boardIn_.assign(static_cast<size_t>(size_) * boardMax_, 0);
  boardHave_.assign(size_, 0);
}

// One board operation at a time: the next is posted once every peer's part
// of the previous one was read (which is what lets two entries suffice), and
// the write must fit every peer's send queue now.
bool RdmaTransport::writable(uint64_t) {
  if (boardOpen_) return false;
  for (int rank = 0; rank < size_; ++rank) {
    if (rank != rank_ && sendQueueFull(peer(rank).lanes[0])) return false;
  }
  return true;
}

void RdmaTransport::post(uint64_t sequence, uint64_t check, const uint8_t* data, size_t bytes) {
  const uint64_t op = boardPosted_++;
  board_words::encode(boardWords_.data(), flagOf(op), sequence, check, data, bytes);
  const auto length = static_cast<uint32_t>(8 * board_words::entryWords(bytes));
  for (int rank = 0; rank < size_; ++rank) {
    if (rank == rank_) continue;
    PeerState& p = peer(rank);
    const uint64_t offset = (op % kBoardEntries) * p.boardRemoteStride;
    Lane& lane = p.lanes[0];
    // Signaled only once half the send queue holds unsignaled writes: a
    // completion wakes a sleeping engine thread, and nothing waits for these.
    const bool signaled =
        lane.sendQueueUsed() + 2 >= static_cast<int>(mesh_.qpParams().sendDepth / 2);
    verbs::WriteRequest w{.wrId = pack(WrId{WrKind::Control, 0, static_cast<uint16_t>(rank),
                                            static_cast<uint32_t>(ControlTag::Board)}),
                          .local = boardWords_.data(),
                          .length = length,
                          .remoteAddr = p.boardRemote + offset,
                          .rkey = p.boardRkey,
                          .signaled = signaled,
                          .inlineData = true};
    if (int rc = verbs::postWrite(lane.qp, w); rc != 0) {
      throw verbs::verbsError("ibv_post_send", rc,
                              fmt::format("posting a one-shot contribution to rank {}", rank));
    }
    posted(lane, -1, signaled);
  }
  copyBytes(boardMine_.data(), data, bytes);
  std::fill(boardHave_.begin(), boardHave_.end(), 0);
  boardSequence_ = sequence;
  boardBytes_ = bytes;
  boardOpen_ = true;
}

const uint8_t* RdmaTransport::peek(int from, uint64_t sequence, uint64_t check, size_t bytes) {
  if (!boardOpen_ || sequence != boardSequence_ || bytes != boardBytes_) return nullptr;
  uint8_t* payload = boardIn_.data() + static_cast<size_t>(from) * boardMax_;
  if (boardHave_[from] != 0) return payload;
  const uint64_t op = boardPosted_ - 1;
  const auto* words = reinterpret_cast<const uint64_t*>(
      peer(from).recvBase + static_cast<size_t>(slotsPerPeer_) * slotBytes_ +
      (op % kBoardEntries) * boardStride_);
  const uint32_t previous = op >= kBoardEntries ? flagOf(op - kBoardEntries) : 0;
  const board_words::Result r = board_words::decode(words, bytes, flagOf(op), previous, payload);
  if (r.state == board_words::State::Pending) return nullptr;
  if (r.state == board_words::State::Corrupt) {
    throw Error(ErrorInfo{
        .kind = ErrorKind::Protocol,
        .message =
            fmt::format("rank {} wrote a corrupt one-shot board entry for collective #{}: {}", from,
                        sequence, r.problem),
        .peerRank = from,
        .peerAddress = peerAddress(from),
        .hint = "every rank must run the same rdmacc version and issue the same collectives"});
  }
  if (r.head.sequence != sequence || r.head.check != check || r.head.bytes != bytes) {
    throw boardMismatch(from, peerAddress(from), sequence, r.head.sequence, r.head.bytes,
                        r.head.check, bytes, check);
  }
  boardHave_[from] = 1;
  return payload;
}

void RdmaTransport::consumed(uint64_t sequence) {
  if (boardOpen_ && sequence == boardSequence_) boardOpen_ = false;
}

void RdmaTransport::engineWaits(bool waits) {
  if (waits && !boardWaits_) boardSleep_ = std::chrono::microseconds(20);
  boardWaits_ = waits;
}

// A late peer's write raises no event here: a waiting thread looks again
// after 20 us, then twice as long each time, up to a millisecond (a peer
// late by more costs up to that much on top).
std::optional<std::chrono::microseconds> RdmaTransport::pollingSleep() {
  // A connection attempt waiting to be retried raises no event.
  if (mesh_.retrying()) return std::chrono::microseconds(50'000);
  if (!boardWaits_) return std::nullopt;
  const auto sleep = boardSleep_;
  boardSleep_ = std::min(boardSleep_ * 2, std::chrono::microseconds(1000));
  return sleep;
}

}  // namespace rdmacc::rdma
