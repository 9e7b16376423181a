#include "src/routed_transport.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "rdmacc/error.hpp"

namespace rdmacc {
namespace {

class RoutedTransport final : public Transport, private TransportSink {
 public:
  RoutedTransport(std::unique_ptr<Transport> first, std::unique_ptr<Transport> second,
                  std::vector<bool> secondPeers)
      : first_(std::move(first)), second_(std::move(second)), secondPeers_(std::move(secondPeers)) {
    if (first_->chunkBytes() != second_->chunkBytes() ||
        first_->slotsPerPeer() != second_->slotsPerPeer()) {
      throw Error(ErrorKind::Internal,
                  fmt::format("transports with different slots ({} x {} and {} x {} bytes)",
                              first_->slotsPerPeer(), first_->chunkBytes(), second_->slotsPerPeer(),
                              second_->chunkBytes()));
    }
  }

  size_t chunkBytes() const noexcept override { return first_->chunkBytes(); }
  int slotsPerPeer() const noexcept override { return first_->slotsPerPeer(); }
  const std::string& peerAddress(int peer) const override { return of(peer).peerAddress(peer); }
  DirectWrites directWrites(int peer) const override { return of(peer).directWrites(peer); }
  bool trySend(int peer, const wire::Header& header, const uint8_t* data,
               const std::shared_ptr<ZeroCopyWrites>& zeroCopy,
               std::optional<DirectTarget> direct) override {
    return of(peer).trySend(peer, header, data, zeroCopy, direct);
  }
  void reserveCredits(size_t slots) override {
    first_->reserveCredits(slots);
    second_->reserveCredits(slots);
  }
  const uint8_t* payload(int peer, int slot) const override { return of(peer).payload(peer, slot); }
  void release(int peer, int slot) override { of(peer).release(peer, slot); }
  bool poll(TransportSink& sink) override {
    sink_ = &sink;
    bool any = first_->poll(*this);
    any |= second_->poll(*this);
    return any;
  }
  bool flushCredits() override {
    bool any = first_->flushCredits();
    any |= second_->flushCredits();
    return any;
  }
  std::vector<int> takeDisconnected() override {
    auto gone = first_->takeDisconnected();
    for (int peer : second_->takeDisconnected()) gone.push_back(peer);
    return gone;
  }
  Departure departure(int peer) const override { return of(peer).departure(peer); }
  void arm() override {
    first_->arm();
    second_->arm();
  }
  void disarm() override {
    first_->disarm();
    second_->disarm();
  }
  std::array<int, 4> eventFds() const override {
    std::array<int, 4> fds{-1, -1, -1, -1};
    size_t n = 0;
    for (const auto* t : {first_.get(), second_.get()}) {
      for (int fd : t->eventFds()) {
        if (fd >= 0 && n < fds.size()) fds[n++] = fd;
      }
    }
    return fds;
  }
  void consumeEvents() override {
    first_->consumeEvents();
    second_->consumeEvents();
  }
  void probe(int peer) override { of(peer).probe(peer); }
  void drain(const std::vector<bool>& dead) override {
    first_->drain(dead);
    second_->drain(dead);
  }

 private:
  Transport& of(int peer) const {
    return secondPeers_[static_cast<size_t>(peer)] ? *second_ : *first_;
  }
  // Arrivals of both, numbered in the order this transport saw them.
  void arrived(int peer, const Incoming& in) override {
    Incoming renumbered = in;
    renumbered.arrival = arrivals_++;
    sink_->arrived(peer, renumbered);
  }
  void failed(int peer, Error error) override { sink_->failed(peer, std::move(error)); }

  std::unique_ptr<Transport> first_;
  std::unique_ptr<Transport> second_;
  std::vector<bool> secondPeers_;
  TransportSink* sink_ = nullptr;
  uint64_t arrivals_ = 0;
};

}  // namespace

std::unique_ptr<Transport> makeRoutedTransport(std::unique_ptr<Transport> first,
                                               std::unique_ptr<Transport> second,
                                               std::vector<bool> secondPeers) {
  return std::make_unique<RoutedTransport>(std::move(first), std::move(second),
                                           std::move(secondPeers));
}

}  // namespace rdmacc
