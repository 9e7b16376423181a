#include "src/transport/composite.hpp"
#include "src/core/by_rank.hpp"

#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include "rdmacc/error.hpp"

namespace rdmacc {
namespace {

class CompositeTransport final : public Transport, private TransportSink {
 public:
  CompositeTransport(std::vector<std::unique_ptr<Transport>> children,
                     std::vector<std::vector<uint8_t>> carriers)
      : children_(std::move(children)),
        carriers_(std::move(carriers)),
        next_(static_cast<int>(carriers_.size()), 0),
        departedVia_(static_cast<int>(carriers_.size()), -1) {
    for (const auto& child : children_) {
      if (child->chunkBytes() != children_[0]->chunkBytes() ||
          child->slotsPerPeer() != children_[0]->slotsPerPeer()) {
        throw Error(ErrorKind::Internal,
                    fmt::format("transports with different slots ({} x {} and {} x {} bytes)",
                                children_[0]->slotsPerPeer(), children_[0]->chunkBytes(),
                                child->slotsPerPeer(), child->chunkBytes()));
      }
    }
    for (const auto& list : carriers_) {
      for (uint8_t c : list) {
        if (c >= children_.size())
          throw Error(ErrorKind::Internal, "a carrier that is not a child");
      }
    }
  }

  size_t chunkBytes() const noexcept override { return children_[0]->chunkBytes(); }
  int slotsPerPeer() const noexcept override { return children_[0]->slotsPerPeer(); }
  const std::string& peerAddress(int peer) const override { return first(peer).peerAddress(peer); }
  DirectWrites directWrites(int peer) const override { return first(peer).directWrites(peer); }
  size_t sendBurst(int peer) const override { return first(peer).sendBurst(peer); }

  bool trySend(int peer, const wire::Header& header, const uint8_t* data,
               const std::shared_ptr<ZeroCopyWrites>& zeroCopy,
               std::optional<DirectTarget> direct) override {
    const auto& list = carriersOf(peer);
    if (list.size() == 1 || direct || header.kind != wire::MessageKind::Collective) {
      return children_[list[0]]->trySend(peer, header, data, zeroCopy, direct);
    }
    // Round-robin from where the last one went; a rail without a free slot
    // or credit now is skipped.
    uint8_t& next = next_[peer];
    for (size_t i = 0; i < list.size(); ++i) {
      const size_t k = (next + i) % list.size();
      if (children_[list[k]]->trySend(peer, header, data, zeroCopy, std::nullopt)) {
        next = static_cast<uint8_t>((k + 1) % list.size());
        return true;
      }
    }
    return false;
  }
  void reserveCredits(size_t slots) override {
    for (auto& child : children_) child->reserveCredits(slots);
  }
  std::string describePeer(int peer) const override {
    std::string all;
    for (uint8_t c : carriersOf(peer)) {
      all += (all.empty() ? "" : "; ") + children_[c]->describePeer(peer);
    }
    return all;
  }
  // A slot number names the carrier too: slot x K + k for the peer's k-th of
  // K carriers (K = 1: the child's own number).
  const uint8_t* payload(int peer, int slot) const override {
    auto [child, childSlot] = slotOf(peer, slot);
    return child.payload(peer, childSlot);
  }
  void release(int peer, int slot) override {
    auto [child, childSlot] = slotOf(peer, slot);
    child.release(peer, childSlot);
  }
  bool poll(TransportSink& sink) override {
    sink_ = &sink;
    bool any = false;
    for (polling_ = 0; polling_ < children_.size(); ++polling_)
      any |= children_[polling_]->poll(*this);
    return any;
  }
  bool flushCredits() override {
    bool any = false;
    for (auto& child : children_) any |= child->flushCredits();
    return any;
  }
  // A peer carried by several transports left once, whichever saw it first.
  std::vector<int> takeDisconnected() override {
    std::vector<int> gone;
    for (size_t c = 0; c < children_.size(); ++c) {
      for (int peer : children_[c]->takeDisconnected()) {
        int& via = departedVia_[peer];
        if (via >= 0) continue;
        via = static_cast<int>(c);
        gone.push_back(peer);
      }
    }
    return gone;
  }
  Departure departure(int peer) const override {
    const int via = departedVia_[peer];
    return via >= 0 ? children_[static_cast<size_t>(via)]->departure(peer)
                    : first(peer).departure(peer);
  }
  void arm() override {
    for (auto& child : children_) child->arm();
  }
  void disarm() override {
    for (auto& child : children_) child->disarm();
  }
  EventFds eventFds() const override {
    EventFds fds;
    fds.fill(-1);
    size_t n = 0;
    for (const auto& child : children_) {
      for (int fd : child->eventFds()) {
        if (fd < 0) continue;
        if (n == fds.size()) throw Error(ErrorKind::Internal, "more event descriptors than fit");
        fds[n++] = fd;
      }
    }
    return fds;
  }
  void consumeEvents() override {
    for (auto& child : children_) child->consumeEvents();
  }
  // The soonest any child must look again (an RDMA connection waiting to be
  // retried, a shared link whose other poller may stop).
  std::optional<std::chrono::microseconds> pollingSleep() override {
    std::optional<std::chrono::microseconds> soonest;
    for (auto& child : children_) {
      if (auto sleep = child->pollingSleep()) soonest = std::min(soonest.value_or(*sleep), *sleep);
    }
    return soonest;
  }
  // Every path to the peer must carry packets.
  void probe(int peer) override {
    for (uint8_t c : carriersOf(peer)) children_[c]->probe(peer);
  }
  void drain(const std::vector<bool>& dead) override {
    for (auto& child : children_) child->drain(dead);
  }
  void prepare(int peer) override {
    for (uint8_t c : carriersOf(peer)) children_[c]->prepare(peer);
  }
  bool contended(int peer) const override {
    const auto& list = carriersOf(peer);
    return std::any_of(list.begin(), list.end(),
                       [&](uint8_t c) { return children_[c]->contended(peer); });
  }
  bool anyContended() const override {
    return std::any_of(children_.begin(), children_.end(),
                       [](const auto& child) { return child->anyContended(); });
  }
  uint64_t contention() const override {
    uint64_t sum = 0;
    for (const auto& child : children_) sum += child->contention();
    return sum;
  }

 private:
  const std::vector<uint8_t>& carriersOf(int peer) const {
    const auto& list = carriers_.at(static_cast<size_t>(peer));
    if (list.empty())
      throw Error(ErrorKind::Internal, fmt::format("no transport to rank {}", peer));
    return list;
  }
  Transport& first(int peer) const { return *children_[carriersOf(peer)[0]]; }
  // The child that holds one of our slot numbers, and its own number for it.
  std::pair<Transport&, int> slotOf(int peer, int slot) const {
    const auto& list = carriersOf(peer);
    const int k = static_cast<int>(list.size());
    return {*children_[list[static_cast<size_t>(slot % k)]], slot / k};
  }

  // Arrivals of every child, numbered in the order this transport saw them,
  // their slots numbered as payload() and release() take them.
  void arrived(int peer, const Incoming& in) override {
    const auto& list = carriersOf(peer);
    const auto k = std::find(list.begin(), list.end(), polling_) - list.begin();
    if (static_cast<size_t>(k) == list.size()) {
      throw Error(
          ErrorKind::Internal,
          fmt::format("a message from rank {} on a transport that does not carry it", peer));
    }
    Incoming renumbered = in;
    renumbered.slot = in.slot * static_cast<int>(list.size()) + static_cast<int>(k);
    renumbered.arrival = arrivals_++;
    sink_->arrived(peer, renumbered);
  }
  void failed(int peer, Error error) override { sink_->failed(peer, std::move(error)); }

  std::vector<std::unique_ptr<Transport>> children_;
  std::vector<std::vector<uint8_t>> carriers_;
  ByRank<uint8_t> next_;     // by peer: the carrier the next collective chunk tries first
  ByRank<int> departedVia_;  // by peer: the child that reported its departure
  TransportSink* sink_ = nullptr;
  size_t polling_ = 0;  // the child whose poll() is delivering
  uint64_t arrivals_ = 0;
};

}  // namespace

std::unique_ptr<Transport> makeCompositeTransport(std::vector<std::unique_ptr<Transport>> children,
                                                  std::vector<std::vector<uint8_t>> carriers) {
  return std::make_unique<CompositeTransport>(std::move(children), std::move(carriers));
}

}  // namespace rdmacc
