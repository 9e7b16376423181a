// The transport interface: how the engine moves one message to a peer and
// learns what arrived, whatever carries the bytes (RDMA between hosts,
// shared memory inside one, both behind a composite). A message is a
// wire::Header and up to chunkBytes() of payload in one of the receiver's
// staging slots; the slot stays the receiver's until it releases it, and
// credits (how many slots of a peer this rank may write) are the
// transport's own business.
//
// Nothing here names a verbs type: the executor, matching and the engine core
// see only this.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "rdmacc/error.hpp"
#include "src/transport/peer_errors.hpp"
#include "src/transport/wire.hpp"

namespace rdmacc {

class RegistrationCache;

// An operation's zero-copy writes still in flight: the hardware may still be
// reading those bytes, so the operation does not write over them (receives,
// Avg's division, its epilogue) and does not complete until they are done.
// Locked: on connections that groups share (src/transport/link.hpp) a write
// completes in whichever group's thread polls, not the operation's.
class ZeroCopyWrites {
 public:
  // `registrations`: the operation's group's registered memory (made in the
  // protection domain of the transport that sends it, or of a shared link's),
  // where a zero-copy payload's registration is found; null: none.
  explicit ZeroCopyWrites(const RegistrationCache* registrations = nullptr)
      : registrations_(registrations) {}
  const RegistrationCache* registrations() const noexcept { return registrations_; }

  void add(const uint8_t* p, size_t n) {
    std::lock_guard lock(mutex_);
    ranges_.emplace_back(p, n);
  }
  void done(const uint8_t* p, size_t n) {
    std::lock_guard lock(mutex_);
    auto it = std::find(ranges_.begin(), ranges_.end(), std::make_pair(p, n));
    if (it != ranges_.end()) ranges_.erase(it);
  }
  bool overlaps(const uint8_t* p, size_t n) const {
    std::lock_guard lock(mutex_);
    for (const auto& [q, m] : ranges_) {
      if (p < q + m && q < p + n) return true;
    }
    return false;
  }
  bool empty() const {
    std::lock_guard lock(mutex_);
    return ranges_.empty();
  }
  void clear() {
    std::lock_guard lock(mutex_);
    ranges_.clear();
  }

 private:
  const RegistrationCache* const registrations_;
  mutable std::mutex mutex_;
  std::vector<std::pair<const uint8_t*, size_t>> ranges_;
};

// How a peer can write payloads straight into this rank's destinations.
enum class DirectWrites {
  None,        // never: every payload goes through a slot
  Registered,  // into memory the user registered (RDMA: the NIC checks the rkey)
  AnyMemory,   // into any of this process's memory (shared memory: the kernel copies)
};

// A remote write straight into a peer's advertised destination.
struct DirectTarget {
  uint64_t addr = 0;
  uint32_t rkey = 0;
};

// The descriptors a sleeping thread polls for a transport's events; -1 for
// none. Sixteen: four RDMA rails (completion channel, rdma_cm channel, async
// events each) and shared memory's doorbell fit.
using EventFds = std::array<int, 16>;

// A message that arrived and passed wire validation. It holds its slot until
// Transport::release(); `arrival` orders messages of all peers (any-source
// receives take the oldest).
struct Incoming {
  int slot = 0;
  wire::Header header;
  uint64_t arrival = 0;
};

// What the transport reports while it polls.
class TransportSink {
 public:
  // A validated message of any kind but credits (those the transport keeps).
  virtual void arrived(int peer, const Incoming& in) = 0;
  // A transfer to or from peer failed; the error names the call and status.
  virtual void failed(int peer, Error error) = 0;

 protected:
  ~TransportSink() = default;
};

// Used by one thread at a time (whoever holds the engine's progress lock).
// One-shot collectives among ranks that all share memory (the shared-memory
// transport when it carries every peer): each rank posts its whole
// contribution to an entry of its own, and every other rank reads it there
// in place; no message, slot or credit. Entries are reused round-robin once
// every peer has read the previous occupant. Sequences are the collectives'
// (unique per group, growing).
class Board {
 public:
  // The largest contribution an entry holds (RDMACC_SHM_ONE_SHOT_BYTES).
  virtual size_t maxBytes() const noexcept = 0;
  // Whether this rank may post for `sequence` now: every peer has read what
  // its entry held before.
  virtual bool writable(uint64_t sequence) = 0;
  // Posts `bytes` (<= maxBytes) from data for `sequence`, with the value
  // every rank of the operation presents (Operation::checkValue), and wakes
  // the peers that sleep. Only when writable().
  virtual void post(uint64_t sequence, uint64_t check, const uint8_t* data, size_t bytes) = 0;
  // This rank's posted contribution for `sequence`.
  virtual const uint8_t* mine(uint64_t sequence) const = 0;
  // Peer's contribution for `sequence`, or null while it has not posted it.
  // Throws Error(Protocol) naming the peer when it posted a different
  // operation there (check value or size) or overwrote the entry before this
  // rank read it.
  virtual const uint8_t* peek(int peer, uint64_t sequence, uint64_t check, size_t bytes) = 0;
  // This rank has read every peer's contribution for `sequence`: their
  // entries may be reused. In sequence order.
  virtual void consumed(uint64_t sequence) = 0;
  // This rank's engine runs a one-shot collective (and may sleep waiting for
  // posts and reads): only then do the peers' posts and reads wake it. The
  // caller's own fast path (Engine::tryOneShot) spins instead.
  virtual void engineWaits(bool waits) = 0;
  // No message from a peer waits to be polled and no peer left: what a
  // peer sent (an abort, a departure) is seen by the engine before a
  // one-shot collective runs without it.
  virtual bool quiet() const = 0;
  // Posting goes through the transport's queues, which the engine owns:
  // the caller's fast path runs under the progress lock, after a round of
  // progress (which polls what arrived: quiet() then tells whether that
  // round saw everything). Shared memory posts into its own segment and
  // needs neither.
  virtual bool exclusive() const noexcept { return false; }

 protected:
  ~Board() = default;
};

// Writes into peers' memory registered for them, and memory of this
// process's own that peers may write: what a later group's one-shot board
// over a link needs from the link's transport (Link::Channel).
class RemoteWrites {
 public:
  // `bytes` of zeroed memory, registered for remote writes in this
  // transport's protection domain: its rkey is usable through any queue
  // pair of it (docs/security.md). `keep` holds it registered.
  struct Region {
    uint8_t* data = nullptr;
    uint64_t addr = 0;
    uint32_t rkey = 0;
    std::shared_ptr<void> keep;
  };
  virtual Region registerRegion(size_t bytes) = 0;
  // The one-shot board's payload limit on these connections, the same on
  // every rank (0: they have no board, and neither does a later group).
  virtual size_t boardBytes() const noexcept = 0;
  // Whether one more write to `peer` fits its send queue now.
  virtual bool room(int peer) const = 0;
  // Writes `length` bytes from `data` (inline: the buffer may be reused at
  // once) to `addr` of `peer`'s memory under `rkey`. Throws Error when the
  // write cannot be posted.
  virtual void write(int peer, uint64_t addr, uint32_t rkey, const void* data, uint32_t length) = 0;

 protected:
  ~RemoteWrites() = default;
};

class Transport {
 public:
  virtual ~Transport() = default;

  // Payload bytes per message.
  virtual size_t chunkBytes() const noexcept = 0;
  virtual int slotsPerPeer() const noexcept = 0;
  // "ip:port (GID ...)", for errors.
  virtual const std::string& peerAddress(int peer) const = 0;
  // Whether messages to peer can carry direct writes (trySend's `direct`),
  // and into which memory: worth advertising receives to it. Without,
  // `direct` is ignored and the payload goes through the slot (the receiver
  // accepts both).
  virtual DirectWrites directWrites(int peer) const = 0;
  // How many messages of one send the executor posts to `peer` in a round
  // before it turns to the step's receives and the next round's poll; 0: as
  // many as credits allow.
  virtual size_t sendBurst(int peer) const {
    (void)peer;
    return 0;
  }

  // Sends one message: header.payload bytes from `data`. With `zeroCopy`, a
  // payload in memory its registrations hold may be sent from there
  // (recorded in it until the write completed); with `direct`, the payload goes to the
  // peer's advertised destination and the header after it. False: no slot,
  // credit or queue entry free now (nothing was sent). Throws Error when the
  // transfer cannot be posted.
  virtual bool trySend(int peer, const wire::Header& header, const uint8_t* data,
                       const std::shared_ptr<ZeroCopyWrites>& zeroCopy = nullptr,
                       std::optional<DirectTarget> direct = std::nullopt) = 0;
  // Credits trySend leaves untouched from now on (0: none).
  virtual void reserveCredits(size_t slots) = 0;

  // The payload of a message that arrived in peer's `slot`.
  virtual const uint8_t* payload(int peer, int slot) const = 0;
  // The message in peer's `slot` is consumed: the slot goes back to the peer.
  virtual void release(int peer, int slot) = 0;

  // Delivers arrivals and failures to `sink`; true when anything happened.
  virtual bool poll(TransportSink& sink) = 0;
  // Credits that found no message to ride on go to peers that may be short
  // of slots; true when any went.
  virtual bool flushCredits() = 0;
  // Peers whose connection ended since the last call, and how that showed.
  virtual std::vector<int> takeDisconnected() = 0;
  virtual Departure departure(int peer) const = 0;

  // Sleeping: arm() asks for an event on the next arrival; eventFds(), asked
  // after each arm() (a shared link's may differ from one to the next), are
  // readable on one (or on a disconnect), -1 for none; consumeEvents()
  // acknowledges them after a wake-up, and disarm() withdraws arm() when the
  // thread did not sleep after all.
  virtual void arm() = 0;
  virtual void disarm() = 0;
  virtual EventFds eventFds() const = 0;
  virtual void consumeEvents() = 0;

  // Before the connections go away: lets transfers already posted to the
  // peers still alive land (bounded wait).
  virtual void drain(const std::vector<bool>& dead) = 0;

  // Keep-alive for a peer an operation waits for: proves the path to it
  // still carries packets. RDMA: a signaled zero-byte write (unless one is in
  // flight), which poll() reports as a failure naming the peer and
  // IBV_WC_RETRY_EXC_ERR once the retry budget is spent on a dead link or
  // host. Shared memory: nothing (a dead process shows otherwise).
  virtual void probe(int peer) { (void)peer; }

  // Whether this rank has a connection to `peer` now (false only before a
  // transport that connects on first use made it).
  virtual bool connected(int peer) const {
    (void)peer;
    return true;
  }

  // An operation that starts will talk to `peer`: a transport that connects
  // on first use starts connecting now, so that the connections of all its
  // steps are made at once rather than one step after another. Nothing
  // when connected; errors show as for a send (poll reports them).
  virtual void prepare(int peer) { (void)peer; }

  // Connections shared by several groups (src/transport/link.hpp): whether
  // half of the slots of the connection to `peer` are held, by any of the
  // groups, so that a group's messages no started operation takes must
  // leave their slots (Matching::park) whatever the group itself waits for:
  // another group may wait for that peer. anyContended(): for some peer;
  // contention(): grows each time a connection becomes contended.
  virtual bool contended(int peer) const {
    (void)peer;
    return false;
  }
  virtual bool anyContended() const { return false; }
  virtual uint64_t contention() const { return 0; }

  // The state of the path to `peer` (credits, queues), for a diagnosis when
  // an operation waiting for it times out.
  virtual std::string describePeer(int peer) const = 0;

  // While a one-shot collective waits for posts that raise no event (RDMA:
  // plain writes into memory), how long a thread may sleep before it looks
  // again; nullopt: events wake it.
  virtual std::optional<std::chrono::microseconds> pollingSleep() { return std::nullopt; }

  // The one-shot board, when every peer shares this rank's memory and
  // RDMACC_SHM_ONE_SHOT_BYTES is not 0, or one RDMA rail carries every peer
  // and RDMACC_RDMA_ONE_SHOT_BYTES is not 0 on every rank; null otherwise.
  virtual Board* board() noexcept { return nullptr; }
  // Writes into peers' registered memory (RDMA), for boards of groups that
  // share these connections; null where there are none.
  virtual RemoteWrites* remoteWrites() noexcept { return nullptr; }
};

}  // namespace rdmacc
