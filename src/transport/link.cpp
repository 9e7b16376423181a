#include "src/transport/link.hpp"

#include <algorithm>
#include <cstring>
#include <utility>

#include <fmt/format.h>

#include "rdmacc/log.hpp"
#include "src/transport/written_board.hpp"

namespace rdmacc {
namespace {

using Clock = std::chrono::steady_clock;

// A channel whose thread polled the link this recently and is not asleep is
// taken to poll on (a thread in a collective polls far more often). One
// that stops without sleeping (a caller whose work completed) leaves the
// sleepers that relied on it to their own time limits: the engine thread's
// is the caller's linger (Progress), a caller's the sleep slice.
constexpr auto kPollerGap = std::chrono::microseconds(1000);
// A group that sent this recently is busy: its thread, not an idle group's,
// should sleep on the completion channel, or each of its messages would
// cost a hand-off between two threads.
constexpr auto kBusy = std::chrono::milliseconds(20);

}  // namespace

size_t Link::earlyCost(size_t payload) {
  return std::max(payload, wire::kHeaderBytes);
}

Link::Link(std::unique_ptr<Transport> base, int rank, int size, size_t unexpectedBytes,
           std::shared_ptr<void> resources)
    : rank_(rank),
      size_(size),
      unexpectedBytes_(unexpectedBytes),
      resources_(std::move(resources)),
      base_(std::move(base)),
      held_(static_cast<size_t>(size), 0),
      half_(std::max<size_t>(1, static_cast<size_t>(base_->slotsPerPeer()) / 2)),
      drawn_(rank == 0 ? 1 : 0),
      departed_(static_cast<size_t>(size), false),
      dead_(static_cast<size_t>(size)) {}

Link::~Link() {
  for (auto& [channel, early] : early_) {
    if (!early.copied) base_->release(early.peer, early.in.slot);
  }
  base_->drain(departed_);
}

std::optional<uint32_t> Link::allotChannel() {
  std::lock_guard lock(mutex_);
  const uint64_t channel = static_cast<uint64_t>(rank_) + drawn_ * static_cast<uint64_t>(size_);
  if (channel > UINT32_MAX) return std::nullopt;
  ++drawn_;
  return static_cast<uint32_t>(channel);
}

bool Link::foundedBy(uint32_t channel, int founder, int size) {
  return size > 0 && founder >= 0 && founder < size && channel != 0 &&
         channel % static_cast<uint32_t>(size) == static_cast<uint32_t>(founder);
}

std::optional<RemoteWrites::Region> Link::registerBoard(int members) {
  std::lock_guard lock(mutex_);
  RemoteWrites* writes = base_->remoteWrites();
  const size_t bytes = writes != nullptr ? writes->boardBytes() : 0;
  if (bytes == 0 || members < 2) return std::nullopt;
  return writes->registerRegion(static_cast<size_t>(members) * kBoardEntries *
                                WrittenBoard::stride(bytes));
}

size_t Link::closedChannels() const {
  std::lock_guard lock(mutex_);
  return closed_.size();
}

size_t Link::heldSlots(int linkPeer) const {
  std::lock_guard lock(mutex_);
  size_t n = held_.at(static_cast<size_t>(linkPeer));
  for (const auto& [channel, early] : early_) n += early.peer == linkPeer && !early.copied;
  return n;
}

size_t Link::earlyCopies() const {
  std::lock_guard lock(mutex_);
  return static_cast<size_t>(
      std::count_if(early_.begin(), early_.end(), [](const auto& e) { return e.second.copied; }));
}

void Link::arrived(int peer, const Incoming& in) {
  const uint32_t channel = in.header.channel;
  if (auto it = open_.find(channel); it != open_.end()) {
    Open& o = *it->second;
    if (o.fromBase[peer] < 0) {
      // A rank of the link that is not in the group: a peer that names a
      // channel it does not share with this rank.
      base_->release(peer, in.slot);
      droppedFromStranger(peer, in.header);
      return;
    }
    if (in.header.group != o.group) {
      base_->release(peer, in.slot);
      collided(o, peer, in.header);
      return;
    }
    if (in.header.kind == wire::MessageKind::Leave) {
      base_->release(peer, in.slot);
      left(o, peer);
      return;
    }
    hold(peer, 1);
    o.queue.push_back(Delivery{.peer = peer, .in = in});
    notify(o);
    return;
  }
  if (auto it = closed_.find(channel); it != closed_.end()) {
    // A group closed here: what its peers still send has no taker.
    base_->release(peer, in.slot);
    if (in.header.kind == wire::MessageKind::Leave) {
      std::erase(it->second.awaited, peer);
      if (it->second.awaited.empty()) closed_.erase(it);
    }
    return;
  }
  Delivery d{.peer = peer, .in = in};
  if (earlyBytes_ + earlyCost(in.header.payload) <= unexpectedBytes_) {
    const uint8_t* p = base_->payload(peer, in.slot);
    d.copy.assign(p, p + in.header.payload);
    d.copied = true;
    earlyBytes_ += earlyCost(in.header.payload);
    base_->release(peer, in.slot);
  }
  early_.emplace_back(channel, std::move(d));
}

void Link::takeEarly(const Delivery& d, bool dropped) {
  if (d.copied) {
    earlyBytes_ -= earlyCost(d.in.header.payload);
  } else if (dropped) {
    base_->release(d.peer, d.in.slot);
  }
}

void Link::droppedFromStranger(int peer, const wire::Header& h) {
  log(LogLevel::Warn, "link rank {} sent {} on channel {}, whose group it is not in; dropped", peer,
      wire::describe(h), h.channel);
}

void Link::collided(Open& o, int peer, const wire::Header& h) {
  o.failures.emplace_back(
      peer,
      Error(ErrorInfo{.kind = ErrorKind::Protocol,
                      .message = fmt::format(
                          "link rank {} sent {} on channel {} for another group (tag {:#x}, this "
                          "group's {:#x}): its process took the channel for another group",
                          peer, wire::describe(h), h.channel, h.group, o.group),
                      .hint = "every rank must run the same rdmacc (channels are drawn by the "
                              "group's rank 0 and never taken twice); or set "
                              "RDMACC_SHARE_CONNECTIONS=0"}));
  notify(o);
}

uint32_t Link::groupTag(std::string_view name) {
  uint32_t h = 2166136261u;  // FNV-1a
  for (const char c : name) h = (h ^ static_cast<uint8_t>(c)) * 16777619u;
  return h;
}

void Link::left(Open& o, int peer) {
  if (o.left[peer]) return;
  o.left[peer] = true;
  o.disconnected.push_back(peer);
  notify(o);
}

void Link::failed(int peer, Error error) {
  if (!dead_[peer]) dead_[peer] = error;
  for (auto& [channel, o] : open_) {
    if (o->fromBase[peer] < 0) continue;
    o->failures.emplace_back(peer, error);
    notify(*o);
  }
}

void Link::hold(int peer, int delta) {
  size_t& held = held_[peer];
  const bool before = held >= half_;
  held = delta > 0 ? held + 1 : held - 1;
  const bool now = held >= half_;
  if (before == now) return;
  if (now) {
    ++contendedPeers_;
    ++contention_;
  } else {
    --contendedPeers_;
  }
}

bool Link::contended(int peer) const {
  return channels_.load(std::memory_order_relaxed) > 1 && held_[peer] >= half_;
}

void Link::notify(Open& o) {
  if (&o == polling_ || o.woken) return;
  o.woken = true;
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(o.wake, &one, sizeof one);
}

bool Link::busy(const Open& o, Clock::time_point now) {
  return now - o.sentAt < kBusy;
}

bool Link::servedByAnother(const Open& self, Clock::time_point now) const {
  for (const auto& [channel, o] : open_) {
    if (o == &self) continue;
    const bool serves = holds(*o) || (!o->armed && now - o->polled < kPollerGap);
    if (serves && (busy(*o, now) || !busy(self, now))) return true;
  }
  return false;
}

bool Link::leaveToAnother(const Open& self) {
  const auto now = Clock::now();
  if (servedByAnother(self, now)) return true;
  // `self` takes the channel: idle groups' sleepers on it leave it.
  for (auto& [channel, o] : open_) {
    if (o != &self && holds(*o) && !busy(*o, now)) notify(*o);
  }
  return false;
}

bool Link::Open::awaitsCompletions() {
  // Writes that completed in the poll just made count once, then go.
  const bool awaits = sent || !zeroCopies.empty();
  std::erase_if(zeroCopies, [](const auto& w) {
    auto writes = w.lock();
    return !writes || writes->empty();
  });
  return awaits;
}

void Link::completionsFor(const Open& self) {
  for (auto& [channel, o] : open_) {
    if (o != &self && o->awaitsCompletions()) notify(*o);
  }
}

void Link::takeDepartures() {
  for (int peer : base_->takeDisconnected()) {
    if (departed_[peer]) continue;
    departed_[peer] = true;
    for (auto it = closed_.begin(); it != closed_.end();) {
      std::erase(it->second.awaited, peer);
      it = it->second.awaited.empty() ? closed_.erase(it) : std::next(it);
    }
    for (auto& [channel, o] : open_) {
      if (o->fromBase[peer] < 0) continue;
      o->disconnected.push_back(peer);
      notify(*o);
    }
  }
}

void Link::close(uint32_t channel, const std::vector<std::pair<int, int>>& held,
                 std::shared_ptr<void> board) {
  std::lock_guard lock(mutex_);
  Open& o = *open_.at(channel);
  // Slots the group still held go back to their senders, or the other
  // groups would lose them.
  for (auto [peer, slot] : held) {
    hold(peer, -1);
    base_->release(peer, slot);
  }
  for (Delivery& d : o.queue) {
    if (d.copied) continue;
    hold(d.peer, -1);
    base_->release(d.peer, d.in.slot);
  }
  std::vector<bool> members(static_cast<size_t>(size_));
  for (int b = 0; b < size_; ++b) members[b] = b != rank_ && o.fromBase[b] >= 0;
  leave(channel, o.group, members, o.left, std::move(board));
  open_.erase(channel);
  --channels_;
  // Sleepers may have relied on the group's thread.
  for (auto& [other, p] : open_) {
    if (p->lent) notify(*p);
  }
}

void Link::abandon(uint32_t channel, const std::vector<int>& toBase, uint32_t group,
                   std::shared_ptr<void> board) {
  std::lock_guard lock(mutex_);
  if (open_.contains(channel) || closed_.contains(channel)) return;
  std::vector<bool> members(static_cast<size_t>(size_)), left(static_cast<size_t>(size_));
  for (int b : toBase) {
    if (b >= 0 && b < size_ && b != rank_) members[b] = true;
  }
  // What its peers sent it already has no taker; a leave among it is one
  // member less to wait for.
  std::erase_if(early_, [&](auto& early) {
    if (early.first != channel) return false;
    Delivery& d = early.second;
    takeEarly(d, true);
    if (members[d.peer] && d.in.header.kind == wire::MessageKind::Leave) left[d.peer] = true;
    return true;
  });
  leave(channel, group, members, left, std::move(board));
}

void Link::retire(std::shared_ptr<void> region) {
  if (!region) return;
  std::lock_guard lock(mutex_);
  retired_.push_back(std::move(region));
}

void Link::leave(uint32_t channel, uint32_t group, const std::vector<bool>& members,
                 const std::vector<bool>& left, std::shared_ptr<void> board) {
  // The group's peers learn that it is gone here at once, as from a group's
  // own connections closing, not at their timeout. Not through a new
  // connection: a peer never connected learns it at its timeout, as when a
  // group's own lazy connections close (it had none to lose). Also to a
  // peer that left first: its record of the closed channel (and its
  // board's region) waits for this rank's leave message.
  const wire::Header message{.kind = wire::MessageKind::Leave, .channel = channel, .group = group};
  for (int b = 0; b < size_; ++b) {
    if (members[b] && base_->connected(b)) leaves_.push_back({b, message});
  }
  sendLeaves();
  // Members still to say that they left: their late messages are dropped
  // until then (the record keeps the number from being taken as early).
  std::vector<int> awaited;
  for (int b = 0; b < size_; ++b) {
    if (members[b] && !left[b] && !departed_[b] && !dead_[b]) awaited.push_back(b);
  }
  if (!awaited.empty()) closed_[channel] = Closed{std::move(awaited), std::move(board)};
}

void Link::sendLeaves() {
  std::erase_if(leaves_, [this](const PendingLeave& l) {
    if (departed_[l.peer] || dead_[l.peer]) return true;  // it learns that instead
    try {
      if (base_->trySend(l.peer, l.header, nullptr)) return true;
      log(LogLevel::Debug, "channel {}: no slot free at link rank {} for the leave message yet",
          l.header.channel, l.peer);
      return false;
    } catch (const std::exception& e) {  // its connection failed: it learns that instead
      log(LogLevel::Debug, "channel {}: leave message to link rank {}: {}", l.header.channel,
          l.peer, e.what());
      return true;
    }
  });
}

}  // namespace rdmacc
