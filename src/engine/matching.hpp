// Receive matching: the messages that arrived from each peer and wait for the
// operation that takes them, matched by (sequence, step, chunk) for
// collectives and (tag, chunk) for point-to-point; mismatch detection (the
// ranks called different collectives); and the direct-receive destinations
// peers advertised. Owns no slot: consuming a message releases it to the
// transport.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "rdmacc/work.hpp"
#include "src/core/by_rank.hpp"
#include "src/transport/transport.hpp"

namespace rdmacc {

// What a collective's current step expects of a message.
struct Expectation {
  OpType type = OpType::Barrier;
  uint64_t sequence = 0;
  size_t step = 0;
  uint64_t check = 0;
  // The oldest collective in flight: a message of an earlier one is late.
  uint32_t oldestSequence = 0;
};

class Matching {
 public:
  using Inbox = std::vector<Incoming>;
  using It = Inbox::iterator;

  Matching(Transport& transport, int size);

  // A message of any kind but Abort: adverts go to the advert table (their
  // slot is released at once), the rest wait in the peer's inbox.
  void arrived(int peer, const Incoming& in);

  // The message with chunk `index` of the expected step from peer, if it
  // arrived. Chunks may overtake each other across lanes and a peer may be a
  // step or an operation ahead, so the inbox is searched by key; a message of
  // this operation that disagrees on what the operation is (or one of an
  // earlier operation) throws Error(Protocol): a mismatch.
  std::optional<It> findCollective(const Expectation& e, int peer, uint32_t index, size_t payload);
  // Point to point: chunk `index` of `tag` from `source`, or from any peer
  // (source -1: the one that arrived first).
  struct Found {
    int peer = -1;
    It it;
  };
  std::optional<Found> findPointToPoint(int source, uint32_t tag, uint32_t index);
  const uint8_t* payload(int peer, const Incoming& in) const {
    return transport_.payload(peer, in.slot);
  }
  // How many messages from peer wait in the inbox for collective `sequence`
  // step `step`, or (kind PointToPoint) for `tag` (sequence), any step: what
  // a departed peer still delivers.
  size_t waiting(int peer, wire::MessageKind kind, uint32_t sequence, uint32_t step) const;
  // The message was used: its slot goes back to the peer.
  void consume(int peer, It in);

  // Where the chunk at `offset` of the expected step's send to peer goes
  // when the peer advertised the receive; nullopt: through its slots.
  std::optional<DirectTarget> directTarget(const Expectation& e, int peer, size_t offset,
                                           size_t payload) const;
  // The collective `sequence` finished here: adverts for it and earlier ones
  // are of no use any more.
  void finished(uint32_t sequence);

  // What waits from peer, for a diagnosis of a stall: "2 message(s) waiting
  // (...), 1 advert(s)".
  std::string describePeer(int peer) const;

 private:
  // Where a peer lets this rank write a receive of its directly.
  struct Advert {
    uint32_t sequence = 0;
    uint32_t step = 0;
    uint8_t opType = 0;
    uint64_t check = 0;
    uint64_t addr = 0;
    uint32_t rkey = 0;
    uint32_t length = 0;
  };
  [[noreturn]] void mismatch(const Expectation& e, int peer, const wire::Header& got,
                             size_t expectedPayload) const;

  Transport& transport_;
  ByRank<Inbox> inbox_;                   // by peer: arrived, not yet consumed
  ByRank<std::deque<Advert>> adverts_;    // by peer, oldest first
  std::optional<uint32_t> lastFinished_;  // sequence of the last finished collective
};

}  // namespace rdmacc
