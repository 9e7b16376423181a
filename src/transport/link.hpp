// Connections shared by the groups of a process (decision 019). A Link owns
// the transport of the group that made the connections (its ranks are the
// link's ranks) and carries the traffic of every group whose members all
// belong to it: each such group sends and receives through a channel, a
// Transport of the group's own ranks whose messages name the channel in
// their header. Slots, credits and queue pairs are the link's, so a group
// added to a process pair costs no connection and no registered memory.
//
// What stays per group: matching, operations, failure (an Abort names its
// channel and breaks only that group). What a connection suffers (a failed
// transfer, a departed peer) reaches every group that has the peer.
//
// Threading: the base transport is used under the link's mutex, by whichever
// group's thread polls; arrivals for the other groups wait in their queues
// and wake them through their own eventfd. A channel's own state is used by
// its group's progress thread only.
//
// Polling: a group served by another group's thread (one that polls the
// link or sleeps on its completion channel; a busy group's, unless this
// group is idle too) leaves the link to it and takes what it is handed.
//
// Sleeping: one thread per link waits on the completion channel, a busy
// group's if any. A group that goes to sleep while another group's thread
// polls the link or sleeps on the channel, and is idle or that one is busy
// too, waits on its eventfd only and is handed what arrives for it.
// Otherwise each completion would wake every group's thread, and an idle
// one would poll and hand the busy group its messages: a hand-off between
// threads per message (decision 019).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <vector>

#include "rdmacc/error.hpp"
#include "src/transport/transport.hpp"

namespace rdmacc {

class Link final : public std::enable_shared_from_this<Link>, private TransportSink {
 public:
  // `base`: the founding group's transport, in which this process is `rank`
  // of `size`; `resources` go after it (the meshes it uses); `unexpectedBytes`:
  // what messages of channels not open here yet may hold copied out of their
  // slots (RDMACC_UNEXPECTED_BYTES); past it they keep their slots.
  Link(std::unique_ptr<Transport> base, int rank, int size, size_t unexpectedBytes,
       std::shared_ptr<void> resources = nullptr);
  ~Link();
  Link(const Link&) = delete;
  Link& operator=(const Link&) = delete;

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  // A channel number for a group this process founds on the link (it is
  // the group's rank 0): numbers founded by link rank r are r modulo the
  // link's size, each drawn once, so groups formed at once by any threads
  // of any members never share one (channel 0 is the founding group's).
  // nullopt: this link rank has drawn all of its numbers.
  std::optional<uint32_t> allotChannel();
  // Whether `channel` is a number link rank `founder` of a link of `size`
  // ranks may draw (a check every member makes of rank 0's offer).
  static bool foundedBy(uint32_t channel, int founder, int size);
  // A later group's one-shot board over the link: the region this process
  // registered for it (registerBoard: group rank r writes its entries at
  // r x kBoardEntries x the stride) and every member's, by group rank
  // (address, rkey), as their records published them.
  struct ChannelBoard {
    RemoteWrites::Region mine;
    std::vector<std::pair<uint64_t, uint32_t>> regions;
  };
  // A region for a later group's board of `members` ranks, registered in
  // the link's protection domain; nullopt when the link's connections have
  // no board (then no group over them has one: the same on every rank).
  std::optional<RemoteWrites::Region> registerBoard(int members);
  // A group that chose this link's `channel` (group rank r is link rank
  // toBase[r], its messages tagged `group`) and will not open it here: its
  // formation failed on this rank after the choice, while its peers may
  // have opened the channel and write into `board`, this rank's region of
  // its one-shot board (a write into a freed region would break the
  // connection for every group on it). The channel is closed as if it had
  // been open: its early messages are dropped, its peers are sent a leave
  // message (they learn at once that this rank is gone), and `board` stays
  // registered until every member left. Nothing for a channel opened here.
  void abandon(uint32_t channel, const std::vector<int>& toBase, uint32_t group,
               std::shared_ptr<void> board);
  // A board region offered to a group whose choice this rank never learnt
  // (its formation failed before every record arrived): a peer may have
  // chosen it, so it stays registered while the link lives.
  void retire(std::shared_ptr<void> region);

  // A group's transport over the link: group rank r is link rank toBase[r]
  // (-1: a peer this link does not carry), this process group rank `rank`;
  // its zero-copy sends' registrations come with them (made in the link's
  // protection domain: ZeroCopyWrites::registrations); its messages carry `group`
  // (groupTag of its name), and one that arrives with another fails the
  // group naming the collision. With `board`, a channel other than 0 has a
  // one-shot board of its own (channel 0 has the base's). Throws
  // Error(InvalidArgument) when `channel` was opened here before.
  std::unique_ptr<Transport> open(uint32_t channel, int rank, std::vector<int> toBase,
                                  uint32_t group = 0,
                                  std::optional<ChannelBoard> board = std::nullopt);
  // The tag a group's messages carry over a link: a hash of its name, the
  // same on every member.
  static uint32_t groupTag(std::string_view name);

  // What holds the slots of a link peer now, for tests: messages delivered
  // to channels and not released, and copies of early messages.
  size_t heldSlots(int linkPeer) const;
  size_t earlyCopies() const;
  // Channels closed here whose members have not all said so yet.
  size_t closedChannels() const;

 private:
  class Channel;
  // An arrival on its way to a channel: in a slot, or copied out (`copy`).
  struct Delivery {
    int peer = -1;  // the link's rank
    Incoming in;
    std::vector<uint8_t> copy;
    bool copied = false;
  };
  struct Open {
    uint32_t group = 0;         // its messages' tag (groupTag)
    std::vector<int> fromBase;  // link rank -> group rank, -1
    std::vector<Delivery> queue;
    std::vector<std::pair<int, Error>> failures;  // by link rank
    std::vector<int> disconnected;                // link ranks
    std::vector<bool> left;  // by link rank: its group on this channel is gone (a leave message)
    int wake = -1;           // the channel's eventfd
    bool woken = false;      // written since the channel last took its queue
    bool armed = false;      // its thread sleeps (arm() to consumeEvents())
    bool sent = false;  // tried to send since its last poll: credits and completions matter to it
    // Armed, leaving the completion channel to another channel's thread:
    // waits on its eventfd only.
    bool lent = false;
    std::chrono::steady_clock::time_point polled;  // its last poll of the base
    std::chrono::steady_clock::time_point sentAt;  // its last message
    // Its zero-copy writes' records, until their writes are
    // done: another channel's poll may complete them.
    std::vector<std::weak_ptr<ZeroCopyWrites>> zeroCopies;
    // Whether completions matter to it (it sent since its last poll, or had
    // zero-copy writes in flight); drops the records of finished writes.
    bool awaitsCompletions();
  };

  // What an early message counts against RDMACC_UNEXPECTED_BYTES: at least
  // a header's worth, so that a peer's stream of empty messages for a
  // channel never opened here stays bounded too.
  static size_t earlyCost(size_t payload);
  // An early message leaves early_: its copy stops counting against the
  // budget, and one dropped (not kept) hands its slot back to the peer.
  void takeEarly(const Delivery& d, bool dropped);

  // Under mutex_: the base's poll delivers here.
  void arrived(int peer, const Incoming& in) override;
  void failed(int peer, Error error) override;
  // Under mutex_: hands queued work to `o` and wakes it unless it is polling.
  void notify(Open& o);
  // Under mutex_: link rank `peer` left `o`'s group (its leave message):
  // a departure for that group only.
  void left(Open& o, int peer);
  // A message on a channel whose group its sender is not in (a peer that
  // names a channel it does not share with this rank) was dropped.
  static void droppedFromStranger(int peer, const wire::Header& h);
  // Under mutex_: link rank `peer` sent `o`'s channel a message of another
  // group (its process took the number twice, which allotChannel rules out
  // for this rdmacc): `o` fails rather than take it as its own.
  void collided(Open& o, int peer, const wire::Header& h);
  void takeDepartures();
  // Under mutex_: `self`'s poll of the base found something: the other
  // channels that sent since their own last poll, or wait for zero-copy
  // writes, are woken to look (credits or finished writes of theirs may be
  // among it).
  void completionsFor(const Open& self);
  // Under mutex_: whether another channel's thread that polls the base
  // without sleeping, or sleeps on the completion channel, serves `self`
  // (one of a busy group, or `self`'s group is idle too). Such a thread
  // delivers `self`'s arrivals and completions: `self` need not poll the
  // base or sleep on the completion channel.
  bool servedByAnother(const Open& self, std::chrono::steady_clock::time_point now) const;
  // Under mutex_, when `self`'s thread goes to sleep: whether it leaves the
  // completion channel to another (servedByAnother). If not, `self` takes
  // it, and idle groups' threads that sleep on it are woken to leave it.
  bool leaveToAnother(const Open& self);
  static bool busy(const Open& o, std::chrono::steady_clock::time_point now);
  static bool holds(const Open& o) { return o.armed && !o.lent; }
  // Under mutex_: a link peer's slots held by channels change by `delta`;
  // at half of them the connection is contended (Transport::contended).
  void hold(int peer, int delta);
  bool contended(int peer) const;
  // The channel's group is gone: the slots it held, (link rank, slot), go
  // back, and each connected peer of the group is sent a leave message.
  // `board` (its board's region) stays registered until every peer left.
  void close(uint32_t channel, const std::vector<std::pair<int, int>>& held,
             std::shared_ptr<void> board);
  // Under mutex_: the group on `channel` is gone here (close, abandon).
  // Each of its `members` (by link rank) still connected is sent a leave
  // message; those that have not `left` are awaited (closed_).
  void leave(uint32_t channel, uint32_t group, const std::vector<bool>& members,
             const std::vector<bool>& left, std::shared_ptr<void> board);
  // Under mutex_: the leave messages that found no slot free, tried again
  // (after a poll of the base, which may have brought credits back).
  void sendLeaves();

  mutable std::mutex mutex_;
  const int rank_;
  const int size_;
  const size_t unexpectedBytes_;
  std::shared_ptr<void> resources_;  // declared before base_: outlives it
  std::unique_ptr<Transport> base_;
  std::map<uint32_t, Open*> open_;
  // Closed here: the link ranks of the group that have not sent their leave
  // message yet, whose late messages are dropped, and the region of its
  // board, which they may still write. RC delivers in order, so once all
  // have, nothing more can come for it and the record goes.
  struct Closed {
    std::vector<int> awaited;
    std::shared_ptr<void> board;
  };
  std::map<uint32_t, Closed> closed_;
  std::vector<std::shared_ptr<void>> retired_;  // board regions (retire)
  // Leave messages to send when a slot at their peer is free: a group that
  // goes while its peers' slots are full still tells them at once (a few
  // slots come back with any of their traffic), not at their timeout.
  struct PendingLeave {
    int peer = -1;  // the link's rank
    wire::Header header;
  };
  std::vector<PendingLeave> leaves_;
  Open* polling_ = nullptr;  // the channel whose poll runs the base's
  // Messages for channels not open here yet (a peer formed the group first).
  std::vector<std::pair<uint32_t, Delivery>> early_;
  size_t earlyBytes_ = 0;
  std::vector<size_t> held_;               // by link rank: slots delivered, not released
  const size_t half_;                      // held slots that make a connection contended
  std::atomic<size_t> channels_{0};        // open
  std::atomic<size_t> contendedPeers_{0};  // link peers with half of their slots held
  std::atomic<uint64_t> contention_{0};    // times a peer's connection became contended
  uint64_t drawn_;  // channels this link rank allotted, channel 0 counted by link rank 0
  std::vector<bool> departed_;              // by link rank
  std::vector<std::optional<Error>> dead_;  // by link rank: a failed connection
};

}  // namespace rdmacc
