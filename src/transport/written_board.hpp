// A one-shot board (transport.hpp, Board) that the peers write into: a
// contribution is one inline write per peer into memory that peer
// registered for this rank, and a poll of this process's own memory for
// the peers' writes; no receive completion, slot or credit. Entries are
// flagged word by word (board_words.hpp) and alternate between
// kBoardEntries per source, indexed by the board operations this rank
// posted (collectives in between that went through messages do not count).
// The RDMA transport's own board and a later group's board over a link
// (Link::Channel) are both this, over their own memory.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "src/transport/transport.hpp"

namespace rdmacc {

// Entries per source: two, used alternately. A rank posts board operation
// b+2 only after it read every peer's b+1, which each peer posted only
// after it had read b: the entry b+2 overwrites is free, no consumed marks
// travel.
inline constexpr size_t kBoardEntries = 2;

// Where this rank's entries lie in a peer's memory: `via` is the peer's
// rank in the RemoteWrites that reaches it; entry e at addr + e x stride.
struct BoardTarget {
  int via = -1;
  uint64_t addr = 0;
  size_t stride = 0;
  uint32_t rkey = 0;
};

class WrittenBoard {
 public:
  // Rank `rank` of `size`; entries hold `maxBytes` of payload; targets by
  // rank (this rank's unused); incoming(from, entry): where rank `from`
  // writes entry `entry` for this rank, entryWords(maxBytes) words.
  WrittenBoard(int rank, int size, size_t maxBytes, RemoteWrites& writes,
               std::vector<BoardTarget> targets,
               std::function<const uint64_t*(int from, size_t entry)> incoming);

  // The bytes between a source's entries, for entries of `maxBytes`: a
  // cache line multiple.
  static size_t stride(size_t maxBytes);

  size_t maxBytes() const noexcept { return max_; }
  // One board operation at a time: the next is posted once every peer's
  // part of the previous one was read (which is what lets two entries
  // suffice), and the write must fit every peer's send queue now.
  bool writable() const;
  void post(uint64_t sequence, uint64_t check, const uint8_t* data, size_t bytes);
  const uint8_t* mine() const { return mine_.data(); }
  // Throws Error(Protocol) naming rank `from` (at `address`) for a corrupt
  // entry or another operation's.
  const uint8_t* peek(int from, uint64_t sequence, uint64_t check, size_t bytes,
                      const std::string& address);
  void consumed(uint64_t sequence);
  void engineWaits(bool waits);
  // A late peer's write raises no event: while the engine waits, a thread
  // looks again after 20 us, then twice as long each time, up to a
  // millisecond (a peer late by more costs up to that much on top).
  std::optional<std::chrono::microseconds> pollingSleep();

 private:
  const int rank_;
  const int size_;
  const size_t max_;
  RemoteWrites& writes_;
  const std::vector<BoardTarget> targets_;
  const std::function<const uint64_t*(int, size_t)> incoming_;
  uint64_t posted_ = 0;    // board operations posted so far
  uint64_t sequence_ = 0;  // the collective of the open one
  size_t bytes_ = 0;
  bool open_ = false;  // posted, not yet consumed
  std::vector<uint64_t> words_;
  std::vector<uint8_t> mine_;
  std::vector<uint8_t> in_;    // [rank][max_]: peers' decoded payloads
  std::vector<uint8_t> have_;  // by rank: decoded for the open operation
  bool waits_ = false;
  std::chrono::microseconds sleep_{0};
};

}  // namespace rdmacc
