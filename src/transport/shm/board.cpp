// The shared-memory transport's one-shot board (transport/transport.hpp, Board): each
// rank's entries live at the end of its own segment; peers read them through
// their mapping of it.
#include <atomic>
#include <cstring>

#include <fmt/format.h>

#include "rdmacc/error.hpp"
#include "src/core/buffer.hpp"
#include "src/transport/peer_errors.hpp"
#include "src/transport/shm/transport_impl.hpp"

namespace rdmacc::shm {

// The entry's previous occupant must have been read by every peer. Their
// consumed marks are read again only when the one seen last is too old:
// their cache lines stay with their owners while the board has room.
bool ShmTransport::writable(uint64_t sequence) {
  const uint64_t previous = posted_[sequence % kBoardEntries];
  if (previous == 0) return true;
  for (Peer& p : peers_) {
    if (!p.carried || p.boardConsumed >= previous) continue;
    p.boardConsumed = p.head->boardConsumed.load(std::memory_order_acquire);
    if (p.boardConsumed < previous) return false;
  }
  return true;
}

void ShmTransport::post(uint64_t sequence, uint64_t check, const uint8_t* data, size_t bytes) {
  auto* entry = reinterpret_cast<BoardEntry*>(boardEntry(board_, sequence));
  posted_[sequence % kBoardEntries] = sequence;
  entry->check = check;
  entry->bytes = bytes;
  copyBytes(reinterpret_cast<uint8_t*>(entry) + kBoardEntryHead, data, bytes);
  entry->sequence.store(sequence, std::memory_order_release);
  wakeSleepingPeers();
}

// The owner writes an entry only after this rank consumed its previous
// occupant, so what this rank reads here stays until it calls consumed().
const uint8_t* ShmTransport::peek(int peer, uint64_t sequence, uint64_t check, size_t bytes) {
  Peer& p = peers_[peer];
  const auto* entry = reinterpret_cast<const BoardEntry*>(boardEntry(p.board, sequence));
  const uint64_t posted = entry->sequence.load(std::memory_order_acquire);
  if (posted < sequence) return nullptr;  // not yet (it holds an earlier collective's)
  if (posted > sequence) {
    throw Error(ErrorInfo{
        .kind = ErrorKind::Protocol,
        .message = fmt::format("rank {} ({}) posted collective #{} to its one-shot board over "
                               "collective #{}, which this rank had not read yet",
                               peer, p.address, posted, sequence),
        .peerRank = peer,
        .hint = "every rank must run the same rdmacc version and issue the same collectives"});
  }
  if (entry->check != check || entry->bytes != bytes) {
    throw boardMismatch(peer, p.address, sequence, sequence, entry->bytes, entry->check, bytes,
                        check);
  }
  return reinterpret_cast<const uint8_t*>(entry) + kBoardEntryHead;
}

void ShmTransport::consumed(uint64_t sequence) {
  head_->boardConsumed.store(sequence, std::memory_order_release);
  // A peer that waits for its entry to become writable again may sleep.
  wakeSleepingPeers();
}

// The peers' rings in our segment (the published head, not inHead: the
// engine thread may be polling) and their departed flags: lines written only
// when something happens.
bool ShmTransport::quiet() const {
  for (const Peer& p : peers_) {
    if (!p.carried) continue;
    if (p.in->tail.load(std::memory_order_acquire) != p.in->head.load(std::memory_order_acquire) ||
        p.head->departed.load(std::memory_order_relaxed) != 0) {
      return false;
    }
  }
  return true;
}

void ShmTransport::wakeSleepingPeers() const {
  publishFence();
  for (const Peer& p : peers_) {
    if (p.carried && p.head->sleeping.load(std::memory_order_acquire) != 0 &&
        p.head->boardWaiting.load(std::memory_order_relaxed) != 0) {
      ringDoorbell(p);
    }
  }
}

}  // namespace rdmacc::shm
