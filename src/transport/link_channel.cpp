// Link::Channel: a group's Transport over a Link (src/transport/link.hpp).
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include <fmt/format.h>

#include "rdmacc/log.hpp"
#include "src/transport/link.hpp"
#include "src/transport/written_board.hpp"

namespace rdmacc {
namespace {

using Clock = std::chrono::steady_clock;

// A channel's wake-up descriptor, closed with it.
class EventFd {
 public:
  EventFd() : fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}
  ~EventFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  EventFd(const EventFd&) = delete;
  EventFd& operator=(const EventFd&) = delete;
  int get() const noexcept { return fd_; }
  explicit operator bool() const noexcept { return fd_ >= 0; }

 private:
  int fd_;
};

}  // namespace

// A group's transport over the link. Slot numbers from the base's
// slotsPerPeer() up name copies this channel holds (early messages copied
// out of their slots before the channel opened).
class Link::Channel final : public Transport, private Board {
 public:
  Channel(std::shared_ptr<Link> link, uint32_t id, int rank, std::vector<int> toBase,
          uint32_t group, std::optional<ChannelBoard> board)
      : link_(std::move(link)),
        base_(*link_->base_),
        id_(id),
        rank_(rank),
        toBase_(std::move(toBase)),
        slots_(base_.slotsPerPeer()),
        held_(toBase_.size()),
        copies_(toBase_.size()) {
    if (!wake_) {
      throw errnoError(ErrorKind::Internal, "eventfd", errno, "a channel's wake-up descriptor");
    }
    state_.wake = wake_.get();
    state_.group = group;
    state_.fromBase.assign(static_cast<size_t>(link_->size_), -1);
    state_.left.assign(static_cast<size_t>(link_->size_), false);
    for (size_t r = 0; r < toBase_.size(); ++r) {
      const int b = toBase_[r];
      if (b < -1 || b >= link_->size_ || (b >= 0 && state_.fromBase[b] >= 0)) {
        throw Error(ErrorKind::Internal,
                    fmt::format("group rank {} maps to link rank {} of {}", r, b, link_->size_));
      }
      if (b >= 0) state_.fromBase[b] = static_cast<int>(r);
    }
    if (rank_ < 0 || rank_ >= static_cast<int>(toBase_.size()) || toBase_[rank_] != link_->rank_) {
      throw Error(
          ErrorKind::Internal,
          fmt::format("this process is link rank {}, not group rank {}'s", link_->rank_, rank_));
    }
    if (board && id_ != 0) setUpBoard(std::move(*board));
    std::lock_guard lock(link_->mutex_);
    if (link_->open_.contains(id_) || link_->closed_.contains(id_)) {
      throw Error(ErrorKind::InvalidArgument,
                  fmt::format("channel {} of the shared connections was opened before", id_));
    }
    link_->open_[id_] = &state_;
    ++link_->channels_;
    // Early arrivals, and what the connections suffered before. One from
    // a link rank outside the group (a peer naming a channel it does not
    // share with this rank) is dropped, as after the channel opened.
    std::erase_if(link_->early_, [&](auto& early) {
      if (early.first != id_) return false;
      Delivery& d = early.second;
      const bool member = state_.fromBase[d.peer] >= 0;
      if (member && d.in.header.group != state_.group) {
        link_->takeEarly(d, true);
        link_->collided(state_, d.peer, d.in.header);
        return true;
      }
      if (!member || d.in.header.kind == wire::MessageKind::Leave) {
        link_->takeEarly(d, true);
        if (member) {
          link_->left(state_, d.peer);
        } else {
          droppedFromStranger(d.peer, d.in.header);
        }
        return true;
      }
      link_->takeEarly(d, false);
      if (!d.copied) link_->hold(d.peer, 1);
      state_.queue.push_back(std::move(d));
      return true;
    });
    for (int b = 0; b < link_->size_; ++b) {
      if (state_.fromBase[b] < 0) continue;
      if (link_->dead_[b]) state_.failures.emplace_back(b, *link_->dead_[b]);
      if (link_->departed_[b]) state_.disconnected.push_back(b);
    }
  }

  ~Channel() override {
    std::vector<std::pair<int, int>> held;  // (link rank, slot)
    for (size_t r = 0; r < held_.size(); ++r) {
      for (int slot : held_[r]) held.emplace_back(toBase_[r], slot);
    }
    link_->close(id_, held, std::move(boardRegion_));
  }

  size_t chunkBytes() const noexcept override { return base_.chunkBytes(); }
  int slotsPerPeer() const noexcept override { return slots_; }
  const std::string& peerAddress(int peer) const override {
    std::lock_guard lock(link_->mutex_);
    return base_.peerAddress(linkRank(peer));
  }
  // Every group's registrations are made in the link's protection domain,
  // so peers may write into them over the link's queue pairs.
  DirectWrites directWrites(int peer) const override {
    std::lock_guard lock(link_->mutex_);
    return base_.directWrites(linkRank(peer));
  }
  size_t sendBurst(int peer) const override {
    std::lock_guard lock(link_->mutex_);
    return base_.sendBurst(linkRank(peer));
  }

  bool trySend(int peer, const wire::Header& header, const uint8_t* data,
               const std::shared_ptr<ZeroCopyWrites>& zeroCopy,
               std::optional<DirectTarget> direct) override {
    wire::Header h = header;
    h.channel = id_;
    h.group = state_.group;
    const int b = linkRank(peer);
    std::lock_guard lock(link_->mutex_);
    state_.sent = true;
    base_.reserveCredits(reserve_);
    struct Reset {
      Transport& t;
      ~Reset() { t.reserveCredits(0); }
    } reset{base_};
    if (!base_.trySend(b, h, data, zeroCopy, direct)) return false;
    state_.sentAt = Clock::now();
    if (zeroCopy && (state_.zeroCopies.empty() || state_.zeroCopies.back().lock() != zeroCopy)) {
      state_.zeroCopies.emplace_back(zeroCopy);
    }
    return true;
  }
  void reserveCredits(size_t slots) override { reserve_ = slots; }

  const uint8_t* payload(int peer, int slot) const override {
    if (slot >= slots_) return copies_[peer][static_cast<size_t>(slot - slots_)].data();
    std::lock_guard lock(link_->mutex_);
    return base_.payload(linkRank(peer), slot);
  }
  void release(int peer, int slot) override {
    if (slot >= slots_) {
      auto& copy = copies_[peer][static_cast<size_t>(slot - slots_)];
      copy.clear();
      copy.shrink_to_fit();
      return;
    }
    auto& held = held_[peer];
    auto it = std::find(held.begin(), held.end(), slot);
    if (it != held.end()) held.erase(it);
    const int b = linkRank(peer);
    std::lock_guard lock(link_->mutex_);
    link_->hold(b, -1);
    base_.release(b, slot);
  }

  // What moved is this group's own: what this poll handed on to other
  // groups is not progress here (an idle group's thread that counted it
  // would spin as long as another group is busy, and contend with it for
  // the link). Completions (credits, finished writes) matter to the groups
  // that sent since they last looked; the others that did are woken.
  // A group served by another's thread (Link::servedByAnother) leaves the
  // base to it and takes what it was handed: an idle group stepped beside
  // a busy one (the engine thread, while a caller drives the busy group)
  // would otherwise take the busy group's arrivals and hand them over, and
  // the two threads would contend for the link on every message.
  bool poll(TransportSink& sink) override {
    bool any = false;
    {
      std::lock_guard lock(link_->mutex_);
      const auto now = Clock::now();
      if (link_->servedByAnother(state_, now)) {
        any = state_.woken;
      } else {
        link_->polling_ = &state_;
        state_.polled = now;
        struct Done {
          Link& link;
          ~Done() { link.polling_ = nullptr; }
        } done{*link_};
        if (base_.poll(*link_)) {
          any = state_.sent;
          link_->completionsFor(state_);
        }
        if (!link_->leaves_.empty()) link_->sendLeaves();
        state_.sent = false;
      }
      taken_.swap(state_.queue);
      failures_.swap(state_.failures);
      state_.woken = false;
    }
    for (auto& [b, error] : failures_) sink.failed(state_.fromBase[b], std::move(error));
    failures_.clear();
    for (Delivery& d : taken_) {
      const int peer = state_.fromBase[d.peer];
      if (d.copied) {
        auto& copies = copies_[peer];
        auto free = std::find_if(copies.begin(), copies.end(),
                                 [](const auto& c) { return c.empty() && c.capacity() == 0; });
        if (free == copies.end()) {
          copies.emplace_back();
          free = copies.end() - 1;
        }
        *free = std::move(d.copy);
        if (free->empty()) free->push_back(0);  // an empty payload still names a copy
        d.in.slot = slots_ + static_cast<int>(free - copies.begin());
      } else {
        held_[peer].push_back(d.in.slot);
      }
      sink.arrived(peer, d.in);
      any = true;
    }
    taken_.clear();
    return any;
  }
  bool flushCredits() override {
    std::lock_guard lock(link_->mutex_);
    return base_.flushCredits();
  }
  std::vector<int> takeDisconnected() override {
    std::vector<int> gone;
    std::lock_guard lock(link_->mutex_);
    link_->takeDepartures();
    for (int b : state_.disconnected) gone.push_back(state_.fromBase[b]);
    state_.disconnected.clear();
    return gone;
  }
  Departure departure(int peer) const override {
    std::lock_guard lock(link_->mutex_);
    const int b = linkRank(peer);
    if (state_.left[b] && !link_->departed_[b]) {
      return Departure{.call = "shared connection",
                       .status = fmt::format("its group (channel {}) was destroyed there", id_)};
    }
    return base_.departure(b);
  }

  void arm() override {
    std::lock_guard lock(link_->mutex_);
    state_.armed = true;
    state_.lent = link_->leaveToAnother(state_);
    if (!state_.lent) base_.arm();
  }
  void disarm() override {
    std::lock_guard lock(link_->mutex_);
    state_.armed = false;
    state_.lent = false;
    base_.disarm();
  }
  // A sleeper that relies on another group's thread waits for its eventfd
  // only: were the completion channel among its descriptors, every
  // completion would wake both threads.
  EventFds eventFds() const override {
    EventFds fds;
    {
      std::lock_guard lock(link_->mutex_);
      if (state_.lent)
        fds.fill(-1);
      else
        fds = base_.eventFds();
    }
    auto free = std::find(fds.begin(), fds.end(), -1);
    if (free == fds.end()) throw Error(ErrorKind::Internal, "more event descriptors than fit");
    *free = wake_.get();
    return fds;
  }
  void consumeEvents() override {
    uint64_t count = 0;
    [[maybe_unused]] ssize_t n = ::read(wake_.get(), &count, sizeof count);
    std::lock_guard lock(link_->mutex_);
    state_.armed = false;
    state_.lent = false;
    base_.consumeEvents();
  }
  // The connections stay for the other groups: what this group posted
  // lands on its own.
  void drain(const std::vector<bool>&) override {}
  void probe(int peer) override {
    std::lock_guard lock(link_->mutex_);
    base_.probe(linkRank(peer));
  }
  void prepare(int peer) override {
    std::lock_guard lock(link_->mutex_);
    base_.prepare(linkRank(peer));
  }
  std::string describePeer(int peer) const override {
    std::lock_guard lock(link_->mutex_);
    const int b = linkRank(peer);
    return fmt::format(
        "{} (shared with {} group(s); {} slot(s) held by them, this group's "
        "channel {})",
        base_.describePeer(b), link_->open_.size(), link_->held_[b], id_);
  }
  bool contended(int peer) const override {
    const int b = linkRank(peer);
    std::lock_guard lock(link_->mutex_);
    return link_->contended(b);
  }
  bool anyContended() const override {
    return link_->channels_.load(std::memory_order_relaxed) > 1 &&
           link_->contendedPeers_.load(std::memory_order_relaxed) > 0;
  }
  uint64_t contention() const override {
    return link_->contention_.load(std::memory_order_relaxed);
  }
  // The sooner of the base's (channel 0's board, a connection retried)
  // and this group's own board's.
  std::optional<std::chrono::microseconds> pollingSleep() override {
    std::lock_guard lock(link_->mutex_);
    auto sleep = base_.pollingSleep();
    if (own_) {
      if (auto mine = own_->pollingSleep(); mine && (!sleep || *mine < *sleep)) sleep = mine;
    }
    return sleep;
  }
  // Channel 0's one-shot board is the founding group's (its entries follow
  // its collectives' sequence numbers); a later group's is its own, in
  // memory each member registered for it. Both post through the shared
  // queues, so under the link's mutex too.
  Board* board() noexcept override {
    if (own_) return this;
    if (id_ != 0) return nullptr;
    std::lock_guard lock(link_->mutex_);
    board_ = base_.board();
    return board_ != nullptr ? this : nullptr;
  }

 private:
  int linkRank(int peer) const {
    const int b = peer >= 0 && peer < static_cast<int>(toBase_.size()) ? toBase_[peer] : -1;
    if (b < 0) {
      throw Error(ErrorKind::Internal,
                  fmt::format("group rank {} is not carried by the shared connections", peer));
    }
    return b;
  }

  // A later group's board: its own region, group rank r's entries at
  // r x kBoardEntries x the stride in every member's; written through the
  // base's queue pairs to the members' link ranks.
  void setUpBoard(ChannelBoard board) {
    RemoteWrites* writes = base_.remoteWrites();
    const size_t bytes = writes != nullptr ? writes->boardBytes() : 0;
    if (bytes == 0 || board.regions.size() != toBase_.size()) {
      throw Error(ErrorKind::Internal,
                  fmt::format("a board of {} regions for a group of {} over connections with a "
                              "board of {} bytes",
                              board.regions.size(), toBase_.size(), bytes));
    }
    const size_t stride = WrittenBoard::stride(bytes);
    const size_t mineAt = static_cast<size_t>(rank_) * kBoardEntries * stride;
    std::vector<BoardTarget> targets(toBase_.size());
    for (size_t r = 0; r < toBase_.size(); ++r) {
      if (static_cast<int>(r) == rank_) continue;
      targets[r] = {.via = linkRank(static_cast<int>(r)),
                    .addr = board.regions[r].first + mineAt,
                    .stride = stride,
                    .rkey = board.regions[r].second};
    }
    const uint8_t* region = board.mine.data;
    own_.emplace(rank_, static_cast<int>(toBase_.size()), bytes, *writes, std::move(targets),
                 [region, stride](int from, size_t entry) {
                   return reinterpret_cast<const uint64_t*>(
                       region + (static_cast<size_t>(from) * kBoardEntries + entry) * stride);
                 });
    boardRegion_ = std::move(board.mine.keep);
  }

  size_t maxBytes() const noexcept override { return own_ ? own_->maxBytes() : board_->maxBytes(); }
  bool writable(uint64_t sequence) override {
    std::lock_guard lock(link_->mutex_);
    return own_ ? own_->writable() : board_->writable(sequence);
  }
  void post(uint64_t sequence, uint64_t check, const uint8_t* data, size_t bytes) override {
    std::lock_guard lock(link_->mutex_);
    if (own_) {
      own_->post(sequence, check, data, bytes);
    } else {
      board_->post(sequence, check, data, bytes);
    }
  }
  const uint8_t* mine(uint64_t sequence) const override {
    std::lock_guard lock(link_->mutex_);
    return own_ ? own_->mine() : board_->mine(sequence);
  }
  const uint8_t* peek(int peer, uint64_t sequence, uint64_t check, size_t bytes) override {
    std::lock_guard lock(link_->mutex_);
    if (own_) return own_->peek(peer, sequence, check, bytes, base_.peerAddress(linkRank(peer)));
    return board_->peek(linkRank(peer), sequence, check, bytes);
  }
  void consumed(uint64_t sequence) override {
    std::lock_guard lock(link_->mutex_);
    if (own_) {
      own_->consumed(sequence);
    } else {
      board_->consumed(sequence);
    }
  }
  void engineWaits(bool waits) override {
    std::lock_guard lock(link_->mutex_);
    if (own_) {
      own_->engineWaits(waits);
    } else {
      board_->engineWaits(waits);
    }
  }
  // Own board: nothing handed to this group waits to be taken (another
  // group's poll may have queued it) and the base's last poll was not cut
  // short.
  bool quiet() const override {
    std::lock_guard lock(link_->mutex_);
    if (!own_) return board_->quiet();
    const Board* base = base_.board();
    return state_.queue.empty() && state_.failures.empty() && state_.disconnected.empty() &&
           (base == nullptr || base->quiet());
  }
  bool exclusive() const noexcept override { return true; }

  std::shared_ptr<Link> link_;
  Transport& base_;
  const uint32_t id_;
  const int rank_;
  const std::vector<int> toBase_;  // group rank -> link rank
  const int slots_;
  size_t reserve_ = 0;
  std::vector<std::vector<int>> held_;                     // by group rank: base slots delivered
  std::vector<std::vector<std::vector<uint8_t>>> copies_;  // by group rank
  EventFd wake_;
  Open state_;                   // in link_->open_ while the channel lives
  std::vector<Delivery> taken_;  // poll's, reused
  std::vector<std::pair<int, Error>> failures_;
  Board* board_ = nullptr;             // channel 0's: the base's
  std::optional<WrittenBoard> own_;    // a later group's
  std::shared_ptr<void> boardRegion_;  // own_'s memory, registered
};

std::unique_ptr<Transport> Link::open(uint32_t channel, int rank, std::vector<int> toBase,
                                      uint32_t group, std::optional<ChannelBoard> board) {
  return std::make_unique<Channel>(shared_from_this(), channel, rank, std::move(toBase), group,
                                   std::move(board));
}

}  // namespace rdmacc
