#include "tests/unit/engine/fake_transport.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>

#include <fmt/format.h>

namespace rdmacc::testing {

class FakeNetwork::Fake final : public Transport, private RemoteWrites {
 public:
  Fake(std::shared_ptr<FakeNetwork> net, int rank) : net_(std::move(net)), rank_(rank) {
    address_.resize(static_cast<size_t>(net_->size_));
    for (int p = 0; p < net_->size_; ++p)
      address_[static_cast<size_t>(p)] = fmt::format("fake:{}", p);
  }
  size_t chunkBytes() const noexcept override { return net_->slotBytes_ - wire::kHeaderBytes; }
  int slotsPerPeer() const noexcept override { return net_->slotsPerPeer_; }
  const std::string& peerAddress(int peer) const override {
    return address_.at(static_cast<size_t>(peer));
  }
  DirectWrites directWrites(int) const override { return DirectWrites::None; }
  bool trySend(int peer, const wire::Header& header, const uint8_t* data,
               const std::shared_ptr<ZeroCopyWrites>& zeroCopy,
               std::optional<DirectTarget>) override {
    return net_->trySend(rank_, peer, header, data, zeroCopy);
  }
  void reserveCredits(size_t slots) override {
    std::lock_guard lock(net_->mutex_);
    net_->ranks_[static_cast<size_t>(rank_)].reserved = slots;
  }
  const uint8_t* payload(int peer, int slot) const override {
    std::lock_guard lock(net_->mutex_);
    return net_->ranks_[static_cast<size_t>(rank_)]
               .slots[static_cast<size_t>(peer)][static_cast<size_t>(slot)]
               .bytes.data() +
           wire::kHeaderBytes;
  }
  void release(int peer, int slot) override { net_->release(rank_, peer, slot); }
  bool poll(TransportSink& sink) override { return net_->poll(rank_, sink); }
  bool flushCredits() override { return false; }
  std::vector<int> takeDisconnected() override {
    std::lock_guard lock(net_->mutex_);
    return std::exchange(net_->ranks_[static_cast<size_t>(rank_)].disconnected, {});
  }
  Departure departure(int) const override {
    return Departure{.call = "fake network", .status = "process exited"};
  }
  void arm() override {
    std::lock_guard lock(net_->mutex_);
    Rank& me = net_->ranks_[static_cast<size_t>(rank_)];
    me.armed = true;
    ++me.arms;
  }
  void disarm() override {}
  EventFds eventFds() const override {
    EventFds fds;
    fds.fill(-1);
    fds[0] = net_->ranks_[static_cast<size_t>(rank_)].wake;
    return fds;
  }
  void consumeEvents() override {
    uint64_t n;
    while (::read(net_->ranks_[static_cast<size_t>(rank_)].wake, &n, sizeof n) > 0) {
    }
  }
  void drain(const std::vector<bool>&) override {}
  void prepare(int peer) override {
    std::lock_guard lock(net_->mutex_);
    net_->ranks_[static_cast<size_t>(rank_)].journal.push_back(fmt::format("prepare {}", peer));
  }
  RemoteWrites* remoteWrites() noexcept override { return this; }
  Region registerRegion(size_t bytes) override {
    auto region = net_->registerRegion(rank_, bytes);
    auto* data = reinterpret_cast<uint8_t*>(region->words.data());
    return Region{.data = data,
                  .addr = reinterpret_cast<uintptr_t>(data),
                  .rkey = region->rkey,
                  .keep = region};
  }
  size_t boardBytes() const noexcept override {
    std::lock_guard lock(net_->mutex_);
    return net_->boardBytes_;
  }
  bool room(int) const override { return true; }
  void write(int peer, uint64_t addr, uint32_t rkey, const void* data, uint32_t length) override {
    net_->write(rank_, peer, addr, rkey, data, length);
  }

  std::string describePeer(int peer) const override {
    std::lock_guard lock(net_->mutex_);
    return fmt::format("{} of {} slots occupied",
                       net_->occupied_[static_cast<size_t>(rank_)][static_cast<size_t>(peer)],
                       net_->slotsPerPeer_);
  }

 private:
  std::shared_ptr<FakeNetwork> net_;
  int rank_;
  std::vector<std::string> address_;
};

FakeNetwork::FakeNetwork(int size, int slotsPerPeer, size_t slotBytes)
    : size_(size),
      slotsPerPeer_(slotsPerPeer),
      slotBytes_(slotBytes),
      ranks_(static_cast<size_t>(size)) {
  const auto n = static_cast<size_t>(size);
  occupied_.assign(n, std::vector<int>(n, 0));
  maxOccupied_ = messages_ = occupied_;
  for (auto& r : ranks_) {
    r.slots.assign(n, std::vector<Slot>(static_cast<size_t>(slotsPerPeer)));
    for (auto& peer : r.slots) {
      for (auto& s : peer) s.bytes.resize(slotBytes);
    }
    r.wake = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  }
}

FakeNetwork::~FakeNetwork() {
  for (auto& r : ranks_) ::close(r.wake);
}

std::unique_ptr<Transport> FakeNetwork::transport(int rank) {
  return std::make_unique<Fake>(shared_from_this(), rank);
}

void FakeNetwork::signal(int rank) {
  const uint64_t one = 1;
  (void)!::write(ranks_[static_cast<size_t>(rank)].wake, &one, sizeof one);
}

void FakeNetwork::completion(int rank) {
  Rank& r = ranks_[static_cast<size_t>(rank)];
  if (!r.armed) return;
  r.armed = false;
  signal(rank);
}

bool FakeNetwork::trySend(int from, int to, const wire::Header& h, const uint8_t* data,
                          const std::shared_ptr<ZeroCopyWrites>& zeroCopy) {
  std::lock_guard lock(mutex_);
  Rank& sender = ranks_[static_cast<size_t>(from)];
  Rank& receiver = ranks_[static_cast<size_t>(to)];
  if (sender.gone.count(to) || receiver.dead) return true;  // lost with the connection
  const std::string entry = fmt::format("send {}", to);
  if (sender.journal.empty() || sender.journal.back() != entry) sender.journal.push_back(entry);
  int& occupied = occupied_[static_cast<size_t>(from)][static_cast<size_t>(to)];
  // Credits the engine reserved are not ours to take (Transport::reserveCredits).
  if (occupied + static_cast<int>(sender.reserved) >= slotsPerPeer_) return false;
  auto& slots = receiver.slots[static_cast<size_t>(from)];
  int slot = 0;
  while (slots[static_cast<size_t>(slot)].busy) ++slot;  // occupied < slots: one is free
  Slot& s = slots[static_cast<size_t>(slot)];
  s.busy = true;
  std::memcpy(s.bytes.data(), &h, sizeof h);
  if (h.payload > 0) std::memcpy(s.bytes.data() + wire::kHeaderBytes, data, h.payload);
  receiver.arrivals.push_back(
      Pending{.from = from, .slot = slot, .header = h, .arrival = ++arrivalCount_});
  ++occupied;
  int& most = maxOccupied_[static_cast<size_t>(from)][static_cast<size_t>(to)];
  most = std::max(most, occupied);
  ++messages_[static_cast<size_t>(from)][static_cast<size_t>(to)];
  if (zeroCopy && sender.zeroCopy && h.payload > 0) {
    zeroCopy->add(data, h.payload);
    sender.writes.push_back(Rank::Write{zeroCopy, data, h.payload});
  }
  completion(to);
  return true;
}

void FakeNetwork::setPollDelay(int rank, std::chrono::microseconds delay) {
  std::lock_guard lock(mutex_);
  ranks_[static_cast<size_t>(rank)].pollDelay = delay;
}

bool FakeNetwork::poll(int rank, TransportSink& sink) {
  std::deque<Pending> arrivals;
  std::vector<std::pair<int, std::string>> failures;
  std::vector<Rank::Write> writes;
  std::chrono::microseconds delay{0};
  {
    std::lock_guard lock(mutex_);
    Rank& me = ranks_[static_cast<size_t>(rank)];
    arrivals.swap(me.arrivals);
    failures.swap(me.failures);
    for (auto& w : me.writes) ++w.polls;
    auto inFlight = std::partition(me.writes.begin(), me.writes.end(),
                                   [](const Rank::Write& w) { return w.polls >= 2; });
    writes.assign(me.writes.begin(), inFlight);
    me.writes.erase(me.writes.begin(), inFlight);
    delay = me.pollDelay;
  }
  if (delay.count() > 0) std::this_thread::sleep_for(delay);
  for (const auto& w : writes) w.owner->done(w.data, w.bytes);
  // Outside the lock: the sink may send (and so take it).
  for (const Pending& p : arrivals) {
    sink.arrived(p.from, Incoming{.slot = p.slot, .header = p.header, .arrival = p.arrival});
  }
  for (auto& [peer, why] : failures) {
    sink.failed(peer, Error(ErrorKind::Completion, why));
  }
  return !arrivals.empty() || !failures.empty() || !writes.empty();
}

void FakeNetwork::setZeroCopy(int rank, bool on) {
  std::lock_guard lock(mutex_);
  ranks_[static_cast<size_t>(rank)].zeroCopy = on;
}

void FakeNetwork::setBoardBytes(size_t bytes) {
  std::lock_guard lock(mutex_);
  boardBytes_ = bytes;
}

std::shared_ptr<FakeNetwork::Region> FakeNetwork::registerRegion(int rank, size_t bytes) {
  auto region = std::make_shared<Region>();
  region->words.assign((bytes + 7) / 8, 0);
  std::lock_guard lock(mutex_);
  region->rkey = ++rkeys_;
  ranks_[static_cast<size_t>(rank)].regions.push_back(region);
  return region;
}

size_t FakeNetwork::liveRegions(int rank) const {
  std::lock_guard lock(mutex_);
  const auto& regions = ranks_[static_cast<size_t>(rank)].regions;
  return static_cast<size_t>(
      std::count_if(regions.begin(), regions.end(), [](const auto& r) { return !r.expired(); }));
}

// Word by word and atomically, as the board's reader polls them (a NIC
// places aligned 8-byte words whole).
void FakeNetwork::write(int from, int to, uint64_t addr, uint32_t rkey, const void* data,
                        uint32_t length) {
  std::lock_guard lock(mutex_);
  for (const auto& weak : ranks_[static_cast<size_t>(to)].regions) {
    auto region = weak.lock();
    if (!region || region->rkey != rkey) continue;
    const auto base = reinterpret_cast<uintptr_t>(region->words.data());
    if (addr % 8 != 0 || length % 8 != 0 || addr < base ||
        addr + length > base + 8 * region->words.size()) {
      break;
    }
    const auto* words = static_cast<const uint64_t*>(data);
    auto* out = region->words.data() + (addr - base) / 8;
    for (size_t w = 0; w < length / 8; ++w) {
      std::atomic_ref<uint64_t>(out[w]).store(words[w], std::memory_order_release);
    }
    return;
  }
  ranks_[static_cast<size_t>(from)].failures.emplace_back(
      to, fmt::format("remote access error: rkey {:#x} at {:#x} ({} bytes)", rkey, addr, length));
  signal(from);
}

void FakeNetwork::release(int rank, int peer, int slot) {
  std::lock_guard lock(mutex_);
  ranks_[static_cast<size_t>(rank)]
      .slots[static_cast<size_t>(peer)][static_cast<size_t>(slot)]
      .busy = false;
  --occupied_[static_cast<size_t>(peer)][static_cast<size_t>(rank)];
  completion(peer);  // the sender may be waiting for this credit
}

void FakeNetwork::kill(int rank) {
  std::lock_guard lock(mutex_);
  ranks_[static_cast<size_t>(rank)].dead = true;
  for (int r = 0; r < size_; ++r) {
    if (r == rank) continue;
    Rank& other = ranks_[static_cast<size_t>(r)];
    other.gone.insert(rank);
    other.disconnected.push_back(rank);
    std::erase_if(other.arrivals, [&](const Pending& p) { return p.from == rank; });
    signal(r);
  }
}

void FakeNetwork::failTransfer(int rank, int peer, const std::string& why) {
  std::lock_guard lock(mutex_);
  ranks_[static_cast<size_t>(rank)].failures.emplace_back(peer, why);
  signal(rank);
}

size_t FakeNetwork::arms(int rank) const {
  std::lock_guard lock(mutex_);
  return ranks_[static_cast<size_t>(rank)].arms;
}

int FakeNetwork::maxOccupied(int from, int to) const {
  std::lock_guard lock(mutex_);
  return maxOccupied_[static_cast<size_t>(from)][static_cast<size_t>(to)];
}

int FakeNetwork::messages(int from, int to) const {
  std::lock_guard lock(mutex_);
  return messages_[static_cast<size_t>(from)][static_cast<size_t>(to)];
}

std::vector<std::string> FakeNetwork::journal(int rank) const {
  std::lock_guard lock(mutex_);
  return ranks_[static_cast<size_t>(rank)].journal;
}

}  // namespace rdmacc::testing
