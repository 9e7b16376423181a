// Receive matching: the messages that arrived from each peer and wait for the
// operation that takes them, matched by (sequence, step, chunk) for
// collectives and (tag, chunk) for point-to-point; mismatch detection (the
// ranks called different collectives); the direct-receive destinations
// peers advertised; and the copies of messages no started operation takes
// (parked), so that their slots go back to the peer. Owns no slot:
// consuming or parking a message releases it to the transport.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
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

// A message waiting for the operation that takes it: in its slot, or parked
// (copied out, its slot given back).
struct Waiting : Incoming {
  std::unique_ptr<uint8_t[]> parked;
};

class Matching {
 public:
  using Inbox = std::vector<Waiting>;
  using It = Inbox::iterator;

  // `parkLimit`: the bytes this group may hold parked, all peers together
  // (RDMACC_UNEXPECTED_BYTES); 0: messages always wait in their slots.
  Matching(Transport& transport, int size, size_t parkLimit);

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
  const uint8_t* payload(int peer, const Waiting& in) const {
    return in.parked ? in.parked.get() : transport_.payload(peer, in.slot);
  }
  // How many messages from peer wait in the inbox for collective `sequence`
  // step `step`, or (kind PointToPoint) for `tag` (sequence), any step: what
  // a departed peer still delivers.
  size_t waiting(int peer, wire::MessageKind kind, uint32_t sequence, uint32_t step) const;
  // The message was used: its slot goes back to the peer.
  void consume(int peer, It in);

  // What the engine's started operations take and wait for.
  class Claims {
   public:
    // Whether a started operation takes the message.
    virtual bool takes(int peer, const wire::Header& h) const = 0;
    // Whether a started receive may take a message from peer.
    virtual bool receivesFrom(int peer) const = 0;
    // Whether a started collective still needs peer.
    virtual bool awaits(int peer) const = 0;

   protected:
    ~Claims() = default;
  };
  // A peer can send only into the slots this rank gave back. Messages of
  // an operation not started here (a receive posted late, tags taken out of
  // order, a collective this rank has not reached) hold theirs, and once a
  // peer's are all held so it cannot send what this rank waits for: both
  // wait until a timeout. So when half of a peer's slots hold messages no
  // started operation takes, and this rank waits for that peer, they are
  // copied out and their slots given back, within the park limit. Later
  // collectives' messages are copied only for a receive: among collectives
  // the credit reserve of the oldest keeps the order (decision 004).
  // On a connection other groups share, once half of its slots are held
  // (Transport::contended), any message no started operation takes goes:
  // this group cannot know what the others wait for.
  // `pointToPointPending`: a send or receive is pending;
  // `operationChanges`: counts the operations that came or went. Returns
  // whether a slot went back. Cheap when no peer's slots are that full,
  // none could go, or nothing changed since the last look.
  bool park(const Claims& claims, bool pointToPointPending, uint64_t operationChanges);
  bool pressured() const noexcept { return pressured_ > 0; }
  // The last park() left a message in its slot for want of the limit.
  bool parkFull() const noexcept { return parkFull_; }
  // What a user does about it (for a timeout's hint and describePeer).
  static constexpr const char* kParkFullAdvice =
      "receive in the order the peers send, or raise RDMACC_UNEXPECTED_BYTES";

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
  void leftSlot(int peer, wire::MessageKind kind);  // a message no longer holds its slot
  [[noreturn]] void mismatch(const Expectation& e, int peer, const wire::Header& got,
                             size_t expectedPayload) const;

  Transport& transport_;
  ByRank<Inbox> inbox_;             // by peer: arrived, not yet consumed
  ByRank<size_t> inSlots_;          // by peer: messages of inbox_ not parked
  size_t pressure_ = 1;             // messages in a peer's slots that start parking
  size_t pressured_ = 0;            // peers with at least pressure_
  size_t pointToPointInSlots_ = 0;  // all peers
  bool parkAgain_ = false;          // a message came (or room) since the last look
  uint64_t operationChanges_ = 0;   // ... and the operations then
  uint64_t contention_ = 0;         // ... and the transport's contention then
  size_t parkLimit_ = 0;
  size_t parkedBytes_ = 0;                // all peers
  bool parkFull_ = false;                 // a message stayed in its slot for want of parkLimit_
  ByRank<std::deque<Advert>> adverts_;    // by peer, oldest first
  std::optional<uint32_t> lastFinished_;  // sequence of the last finished collective
};

}  // namespace rdmacc
