// Transports of several ranks in one process, joined by a FakeNetwork: each
// message is copied into one of the receiver's slots, and the sender may
// write a peer's slot again only after the receiver released it (the credit
// protocol of the real transports, without a device or shared memory). The
// engine, executor, matching and progress run over it unchanged, so their
// ordering, credits, timeouts and failure handling are host-testable and
// deterministic enough to assert on.
#pragma once

#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "src/transport/transport.hpp"

namespace rdmacc::testing {

// Threading: every method may be called from any thread (one mutex).
class FakeNetwork : public std::enable_shared_from_this<FakeNetwork> {
 public:
  FakeNetwork(int size, int slotsPerPeer, size_t slotBytes);
  ~FakeNetwork();
  // Rank `rank`'s transport (once per rank); it keeps the network alive.
  std::unique_ptr<Transport> transport(int rank);
  // Every other rank sees `rank`'s connections end (as a process exit);
  // what it sent and was not polled yet is dropped.
  void kill(int rank);
  // Reports a failed transfer to `rank` on its connection to `peer`, as a
  // failed completion would, at its next poll.
  void failTransfer(int rank, int peer, const std::string& why);
  // The most messages `from` ever had in `to`'s slots at once, and how many
  // it sent there.
  int maxOccupied(int from, int to) const;
  int messages(int from, int to) const;
  // Each poll of `rank`'s transport takes this long (a device that is slow
  // to poll, as under emulation): widens the gaps between the engine
  // thread's decisions in a round.
  void setPollDelay(int rank, std::chrono::microseconds delay);
  // What `rank`'s transport was asked, in order: "prepare P" for each
  // Transport::prepare, "send P" for the first message to P of each run of
  // messages to it.
  std::vector<std::string> journal(int rank) const;
  // How often `rank`'s transport was armed (Transport::arm).
  size_t arms(int rank) const;
  // `rank`'s sends with a ZeroCopyWrites record are zero-copy (as from
  // registered memory over RDMA): recorded in it until the second poll of
  // `rank`'s transport after the send completes them (the first finds them
  // in flight). Off by default.
  void setZeroCopy(int rank, bool on);
  // Every rank's connections have a one-shot board of `bytes` and write
  // peers' registered memory (RemoteWrites): a write lands at once, and
  // one outside a live region of the target fails the writer's connection
  // to it, as a remote access error would. 0, the default: neither.
  void setBoardBytes(size_t bytes);
  // `rank`'s regions registered for remote writes and not freed yet.
  size_t liveRegions(int rank) const;

 private:
  class Fake;
  struct Region {
    std::vector<uint64_t> words;
    uint32_t rkey = 0;
  };
  struct Slot {
    bool busy = false;
    std::vector<uint8_t> bytes;
  };
  struct Pending {
    int from;
    int slot;
    wire::Header header;
    uint64_t arrival;
  };
  struct Rank {
    std::vector<std::vector<Slot>> slots;  // [sender][slot], in this rank's memory
    std::deque<Pending> arrivals;
    std::vector<std::pair<int, std::string>> failures;
    std::vector<int> disconnected;
    std::set<int> gone;
    size_t reserved = 0;
    std::chrono::microseconds pollDelay{0};
    bool zeroCopy = false;
    struct Write {
      std::shared_ptr<ZeroCopyWrites> owner;
      const uint8_t* data;
      size_t bytes;
      int polls = 0;  // polls of the sender's since the send
    };
    std::vector<Write> writes;  // zero-copy, not completed yet
    bool dead = false;
    int wake = -1;       // eventfd
    bool armed = false;  // the next arrival or credit writes `wake`
    size_t arms = 0;
    std::vector<std::string> journal;
    std::vector<std::weak_ptr<Region>> regions;  // registered for remote writes
  };
  std::shared_ptr<Region> registerRegion(int rank, size_t bytes);
  void write(int from, int to, uint64_t addr, uint32_t rkey, const void* data, uint32_t length);
  bool trySend(int from, int to, const wire::Header& h, const uint8_t* data,
               const std::shared_ptr<ZeroCopyWrites>& zeroCopy);
  bool poll(int rank, TransportSink& sink);
  void release(int rank, int peer, int slot);
  // Under mutex_. signal(): a departure or failure, which wakes a sleeper
  // whether armed or not (RDMA: the rdma_cm and async event channels).
  // completion(): an arrival or a credit, which wakes one only once armed,
  // and once per arm (a completion channel).
  void signal(int rank);
  void completion(int rank);

  const int size_;
  const int slotsPerPeer_;
  const size_t slotBytes_;
  mutable std::mutex mutex_;
  std::vector<Rank> ranks_;
  std::vector<std::vector<int>> occupied_, maxOccupied_, messages_;
  uint64_t arrivalCount_ = 0;
  size_t boardBytes_ = 0;
  uint32_t rkeys_ = 0;
};

}  // namespace rdmacc::testing
