#include "src/transport/written_board.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "rdmacc/error.hpp"
#include "src/core/buffer.hpp"
#include "src/transport/board_words.hpp"
#include "src/transport/peer_errors.hpp"

namespace rdmacc {

namespace {

uint32_t flagOf(uint64_t boardOp) {
  // Never 0 (what a fresh region holds) for the first 2^32 - 1 operations;
  // later ones wrap past it, long after every entry was written.
  return static_cast<uint32_t>(boardOp + 1);
}

}  // namespace

WrittenBoard::WrittenBoard(int rank, int size, size_t maxBytes, RemoteWrites& writes,
                           std::vector<BoardTarget> targets,
                           std::function<const uint64_t*(int, size_t)> incoming)
    : rank_(rank),
      size_(size),
      max_(maxBytes),
      writes_(writes),
      targets_(std::move(targets)),
      incoming_(std::move(incoming)),
      words_(board_words::entryWords(maxBytes), 0),
      mine_(maxBytes, 0),
      in_(static_cast<size_t>(size) * maxBytes, 0),
      have_(static_cast<size_t>(size), 0) {
  if (targets_.size() != static_cast<size_t>(size)) {
    throw Error(ErrorKind::Internal,
                fmt::format("a board of {} ranks given {} targets", size, targets_.size()));
  }
}

size_t WrittenBoard::stride(size_t maxBytes) {
  return roundUp(8 * board_words::entryWords(maxBytes), 64);
}

bool WrittenBoard::writable() const {
  if (open_) return false;
  for (int rank = 0; rank < size_; ++rank) {
    if (rank != rank_ && !writes_.room(targets_[static_cast<size_t>(rank)].via)) return false;
  }
  return true;
}

void WrittenBoard::post(uint64_t sequence, uint64_t check, const uint8_t* data, size_t bytes) {
  const uint64_t op = posted_++;
  board_words::encode(words_.data(), flagOf(op), sequence, check, data, bytes);
  const auto length = static_cast<uint32_t>(8 * board_words::entryWords(bytes));
  for (int rank = 0; rank < size_; ++rank) {
    if (rank == rank_) continue;
    const BoardTarget& t = targets_[static_cast<size_t>(rank)];
    writes_.write(t.via, t.addr + (op % kBoardEntries) * t.stride, t.rkey, words_.data(), length);
  }
  copyBytes(mine_.data(), data, bytes);
  std::fill(have_.begin(), have_.end(), 0);
  sequence_ = sequence;
  bytes_ = bytes;
  open_ = true;
}

const uint8_t* WrittenBoard::peek(int from, uint64_t sequence, uint64_t check, size_t bytes,
                                  const std::string& address) {
  if (!open_ || sequence != sequence_ || bytes != bytes_) return nullptr;
  uint8_t* payload = in_.data() + static_cast<size_t>(from) * max_;
  if (have_[static_cast<size_t>(from)] != 0) return payload;
  const uint64_t op = posted_ - 1;
  const uint64_t* words = incoming_(from, op % kBoardEntries);
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
        .peerAddress = address,
        .hint = "every rank must run the same rdmacc version and issue the same collectives"});
  }
  if (r.head.sequence != sequence || r.head.check != check || r.head.bytes != bytes) {
    throw boardMismatch(from, address, sequence, r.head.sequence, r.head.bytes, r.head.check, bytes,
                        check);
  }
  have_[static_cast<size_t>(from)] = 1;
  return payload;
}

void WrittenBoard::consumed(uint64_t sequence) {
  if (open_ && sequence == sequence_) open_ = false;
}

void WrittenBoard::engineWaits(bool waits) {
  if (waits && !waits_) sleep_ = std::chrono::microseconds(20);
  waits_ = waits;
}

std::optional<std::chrono::microseconds> WrittenBoard::pollingSleep() {
  if (!waits_) return std::nullopt;
  const auto sleep = sleep_;
  sleep_ = std::min(sleep_ * 2, std::chrono::microseconds(1000));
  return sleep;
}

}  // namespace rdmacc
