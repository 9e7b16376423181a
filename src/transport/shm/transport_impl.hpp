// The shared-memory transport's inside, shared by its setup
// (transport/shm/setup.cpp: segments, mapping the peers', the single-copy check) and
// its data path (transport/shm/transport.cpp: sending, polling, credits, departures).
// Private to those two files; the interface is transport/shm/transport.hpp.
#pragma once

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "rdmacc/error.hpp"
#include "rdmacc/store.hpp"
#include "src/core/buffer.hpp"
#include "src/core/by_rank.hpp"
#include "src/store/socket.hpp"
#include "src/transport/options.hpp"
#include "src/transport/slot_window.hpp"
#include "src/transport/transport.hpp"
#include "src/transport/wire.hpp"

namespace rdmacc::shm {

using wire::Header;
using wire::kHeaderBytes;

constexpr uint64_t kMagic = 0x524443434d485331;  // "RDCCMHS1"
constexpr uint32_t kVersion = 7;

static_assert(std::atomic<uint64_t>::is_always_lock_free &&
                  std::atomic<uint32_t>::is_always_lock_free,
              "shared-memory rings need address-free atomics");

// At the start of every segment: what the owner built, checked by each peer
// that maps it, and the owner's flags.
struct SegmentHead {
  // kMagic once the owner has built the whole segment (release): its name
  // travels with the host records, so a peer may open it before that.
  std::atomic<uint64_t> magic{0};
  // 1 after magic: the word peers wait on (futex) for the owner to finish.
  std::atomic<uint32_t> built{0};
  uint32_t version = kVersion;
  uint32_t lanes = 0;  // one per local peer, in rank order
  uint32_t slots = 0;
  uint32_t ringEntries = 0;
  uint64_t slotBytes = 0;
  // Where the owner mapped this segment, and a random word of it: a peer
  // that reads the word at that address through the kernel (cma::read) and
  // finds what its own mapping shows knows single-copy writes reach the
  // owner.
  uint64_t base = 0;
  uint64_t nonce = 0;
  // The one-shot board after the lanes (0 entries: none).
  uint32_t boardEntries = 0;
  uint32_t boardEntryBytes = 0;
  // 1: after raising `sleeping` the owner issues membarrier(GLOBAL_EXPEDITED)
  // before it looks for work (ShmTransport::arm), so a peer that registered
  // for it may publish and then read `sleeping` without a fence of its own.
  uint32_t sleepBarrier = 0;
  // 1: the owner reserved the whole segment. 0: only the heads, rings and
  // board; each sender reserves its own slots in it before its first write
  // (ShmTransport::reserveSlots), so that a host's shared memory grows with
  // the pairs that talk, not with the square of its ranks.
  uint32_t slotsReserved = 1;
  alignas(64) std::atomic<uint32_t> sleeping{0};  // the owner sleeps: ring its doorbell
  // The owner's engine runs a one-shot collective (Board::engineWaits): only
  // then do board posts and reads ring a sleeping owner's doorbell.
  std::atomic<uint32_t> boardWaiting{0};
  alignas(64) std::atomic<uint32_t> departed{0};  // the owner's transport is gone
  // Local peers that have mapped this segment: at `lanes` the owner closes
  // it (the last peer rings the doorbell if the owner sleeps).
  std::atomic<uint32_t> mappedBy{0};
  // The last collective whose board entries the owner read (Board::consumed).
  alignas(64) std::atomic<uint64_t> boardConsumed{0};
};

// One entry of an owner's board (64-byte aligned): the payload follows at
// kBoardEntryHead, in the same cache line as the sequence up to 40 bytes, so
// a reader of a small contribution takes one cache-line transfer, not two.
// The owner writes check, bytes and the payload, then the sequence (release).
struct BoardEntry {
  std::atomic<uint64_t> sequence{0};
  uint64_t check = 0;
  uint64_t bytes = 0;
};
constexpr size_t kBoardEntryHead = sizeof(BoardEntry);
// Entries per rank: a rank may post this many one-shot collectives ahead of
// the slowest peer's reading.
constexpr uint32_t kBoardEntries = 8;

// One sender's lane in the receiver's segment: the ring of arrival records
// (the sender advances tail, the receiver head), then the sender's slots.
struct RingHead {
  alignas(64) std::atomic<uint64_t> tail{0};
  alignas(64) std::atomic<uint64_t> head{0};
};

// What a WRITE_WITH_IMM's completion tells the receiver on the RDMA
// transport: the immediate (a slot, or a credit) and the bytes written.
struct Record {
  uint32_t imm = 0;
  uint32_t bytes = 0;
};

// A segment: the head, every lane's ring (records), each lane's slots on
// pages of their own, then the board. The rings come together so that a
// lazy segment reserves them in one range; a lane's slots start on a page
// boundary so that the sender reserving them reserves nobody else's.
struct Geometry {
  // 4 KiB, the smallest page: on hosts with larger pages a reservation may
  // take a neighbour's first page along (harmless).
  static constexpr size_t kLaneAlign = 4096;
  // The head alone in the first 64 KiB: a peer's first look at it is a
  // read, and the kernel maps the written pages around a read fault along
  // with it (fault-around, 64 KiB by default), which would make every
  // ring in the block count as each rank's resident memory.
  static constexpr size_t kHeadBlock = 64 * 1024;
  uint32_t lanes = 0;
  uint32_t slots = 0;
  uint32_t ringEntries = 0;
  size_t slotBytes = 0;
  uint32_t boardEntries = 0;
  uint32_t boardEntryBytes = 0;
  size_t headBytes() const { return roundUp(sizeof(SegmentHead), 64); }
  size_t recordsBytes() const { return roundUp(ringEntries * sizeof(Record), 64); }
  size_t ringBytes() const { return sizeof(RingHead) + recordsBytes(); }
  size_t ringOffset(size_t lane) const {
    return roundUp(headBytes(), kHeadBlock) + lane * ringBytes();
  }
  size_t slotsBytes() const { return roundUp(slots * slotBytes, kLaneAlign); }
  size_t slotsOffset(size_t lane) const {
    return roundUp(ringOffset(lanes), kLaneAlign) + lane * slotsBytes();
  }
  size_t boardOffset() const { return slotsOffset(lanes); }
  size_t totalBytes() const { return boardOffset() + size_t{boardEntries} * boardEntryBytes; }
};

using Mapping = std::unique_ptr<uint8_t, PageUnmap>;

// transport/shm/segment.cpp: a failed call's error, and a segment mapped
// shared (throws on failure).
Error shmError(const char* call, int errnum, const std::string& what, const std::string& hint);
Mapping mapSegment(int fd, size_t bytes, const std::string& name);

struct Peer {
  bool carried = false;
  int pid = -1;
  net::Fd pidfd;
  bool watched = false;    // its pidfd is in ShmTransport::exits_
  std::string address;     // "pid N on this host", for errors
  std::string waitingFor;  // what its segment lacked at the last look (for the timeout)
  std::string segment;     // its segment's name, from its record
  std::string path;        // where it is opened: /proc/PID/fd/FD
  size_t outLane = 0;      // this rank's lane in the peer's segment
  size_t inLane = 0;       // the peer's lane in ours
  // Its segment is mapped and checked, and ours is wired to it (joinPeer):
  // at formation in eager groups, at first contact in lazy ones.
  bool joined = false;
  std::chrono::steady_clock::time_point joinBy{};     // set at the first attempt
  std::chrono::steady_clock::time_point exitCheck{};  // next look at its process
  Mapping mapping;                                    // the peer's segment
  size_t mappedBytes = 0;
  SegmentHead* head = nullptr;
  // This rank's lane in the peer's segment (we produce), and the peer's lane
  // in ours (we consume).
  RingHead* out = nullptr;
  Record* outRecords = nullptr;
  uint8_t* outSlots = nullptr;
  bool slotsReserved = false;  // outSlots have memory behind them (SegmentHead::slotsReserved)
  uint64_t outTail = 0;
  uint64_t outHead = 0;  // the peer's head as last read (it only grows)
  RingHead* in = nullptr;
  Record* inRecords = nullptr;
  uint8_t* inSlots = nullptr;
  uint64_t inHead = 0;
  sockaddr_un doorbell{};
  socklen_t doorbellLength = 0;
  bool exited = false;    // exits_ said its process exited
  bool reported = false;  // its departure was reported
  Departure how;          // and how it showed
  SlotWindow window;
  bool singleCopy = false;  // direct writes into its memory (cma) work
  // The kernel saw a process under `pid` send this peer's hello (hello.cpp):
  // single-copy writes go to it only then, so its record cannot aim them at
  // a third process.
  bool pidVerified = false;
  bool helloOwed = false;       // ours to it was refused (its queue was full): again
  bool mismatchLogged = false;  // a hello for it came from another pid (logged once)
  uint64_t boardConsumed = 0;   // its head's boardConsumed as last read
  uint8_t* board = nullptr;     // its board in its segment
};

class ShmTransport final : public Transport, public Board {
 public:
  ShmTransport(Store& store, const TransportOptions& options, const std::vector<bool>& carried);
  ~ShmTransport() override;

  size_t chunkBytes() const noexcept override { return geometry_.slotBytes - kHeaderBytes; }
  int slotsPerPeer() const noexcept override { return static_cast<int>(geometry_.slots); }
  const std::string& peerAddress(int peer) const override { return peers_[peer].address; }
  DirectWrites directWrites(int peer) const override {
    return peers_[peer].singleCopy ? DirectWrites::AnyMemory : DirectWrites::None;
  }
  bool trySend(int peer, const Header& header, const uint8_t* data,
               const std::shared_ptr<ZeroCopyWrites>& zeroCopy,
               std::optional<DirectTarget> direct) override;
  void reserveCredits(size_t slots) override { creditReserve_ = slots; }
  std::string describePeer(int peer) const override;
  const uint8_t* payload(int peer, int slot) const override {
    return peers_[peer].inSlots + static_cast<size_t>(slot) * geometry_.slotBytes + kHeaderBytes;
  }
  void release(int peer, int slot) override;
  bool poll(TransportSink& sink) override;
  bool flushCredits() override;
  std::vector<int> takeDisconnected() override;
  Departure departure(int peer) const override { return peers_[peer].how; }
  void arm() override;
  void disarm() override { consumeEvents(); }
  EventFds eventFds() const override {
    EventFds fds;
    fds.fill(-1);
    fds[0] = doorbell_.get();
    return fds;
  }
  void consumeEvents() override;
  void drain(const std::vector<bool>&) override {}  // every send completed when it returned
  Board* board() noexcept override { return geometry_.boardEntries > 0 ? this : nullptr; }

  // Board (transport/shm/board.cpp).
  size_t maxBytes() const noexcept override { return oneShotBytes_; }
  bool writable(uint64_t sequence) override;
  void post(uint64_t sequence, uint64_t check, const uint8_t* data, size_t bytes) override;
  const uint8_t* mine(uint64_t sequence) const override {
    return boardEntry(board_, sequence) + kBoardEntryHead;
  }
  const uint8_t* peek(int peer, uint64_t sequence, uint64_t check, size_t bytes) override;
  void consumed(uint64_t sequence) override;
  bool quiet() const override;
  void engineWaits(bool waits) override {
    head_->boardWaiting.store(waits ? 1 : 0, std::memory_order_relaxed);
  }

 private:
  static size_t idx(int rank) { return static_cast<size_t>(rank); }
  // Every rank's board has kBoardEntries (attach() checked): a mask, not a
  // division, on the one-shot path.
  uint8_t* boardEntry(uint8_t* board, uint64_t sequence) const {
    return board + (sequence % kBoardEntries) * geometry_.boardEntryBytes;
  }
  // Rings the doorbell of every peer that sleeps while its engine waits on
  // the board (after publishFence(): a Dekker pair with arm()).
  void wakeSleepingPeers() const;
  // Between publishing something (a ring tail, a board entry, a consumed
  // mark) and reading whether a peer sleeps: a full fence, or only the
  // compiler's when every peer pays for the pair in arm() (membarrier, the
  // asymmetric Dekker pattern): the fence stalls every small message's
  // sender for a cache-line transfer, the membarrier costs only a rank that
  // goes to sleep.
  void publishFence() const {
    if (lightPublish_) {
      std::atomic_signal_fence(std::memory_order_seq_cst);
    } else {
      std::atomic_thread_fence(std::memory_order_seq_cst);
    }
  }
  void create(const std::string& name, std::shared_ptr<net::Fd> file);
  void attach(Store& store, const TransportOptions& options);
  bool tryMapPeerSegment(int rank, Peer& p, const std::string& path);
  // One attempt at mapping and joining rank's segment, true once joined;
  // throws when its process exited or it was not ready by p.joinBy.
  bool tryJoin(int rank, Peer& p);
  void watchExit(int rank, Peer& p);
  void joinPeer(int rank, Peer& p);
  // Closes our segment's descriptor once every local peer mapped it.
  void closeIfMapped();
  // Free ring entries in peer's lane; throws when the peer corrupted its head.
  uint64_t ringSpace(int to, Peer& p) const;
  void publish(Peer& p, Record r);
  // Wakes the peer. An extra wake-up costs a poll; one refused because the
  // socket's buffer is full is not needed (unread ones are there).
  void ringDoorbell(const Peer& p) const {
    ::sendto(bell_.get(), "", 1, MSG_DONTWAIT | MSG_NOSIGNAL,
             reinterpret_cast<const sockaddr*>(&p.doorbell), p.doorbellLength);
  }
  bool flushCredits(int to);
  // Hellos (hello.cpp): ours to a peer, sent until its doorbell takes it,
  // and theirs to us, read with the sender's pid the kernel attaches.
  void sendHello(Peer& p);
  void sendOwedHellos();
  void drainDoorbell();
  void takeHello(const void* data, size_t bytes, int senderPid);
  bool probeSingleCopy(int rank, const Peer& p) const;
  // Gives our slots in the peer's segment their memory (once, before the
  // first write to them), failing with an error instead of a SIGBUS later.
  void reserveSlots(int to, Peer& p);
  static bool processExited(const Peer& p);
  bool writeDirect(int to, Peer& p, const uint8_t* data, const DirectTarget& target, size_t bytes);

  int rank_;
  int size_;
  Geometry geometry_;
  std::string name_;  // our segment's, "/rdmacc-<pid>-<random>"
  // Its memfd, open (and so reachable through /proc/PID/fd) until every
  // local peer mapped it; shared with the backend that published its number.
  std::shared_ptr<net::Fd> file_;
  Mapping mine_;
  SegmentHead* head_ = nullptr;
  uint8_t* board_ = nullptr;  // ours, in our segment
  // The collective this rank last posted to each of its entries (what a
  // peer must have consumed before the entry is written again): kept here,
  // not read back from the shared entry.
  std::array<uint64_t, kBoardEntries> posted_{};
  // The doorbell's file, removed with the transport (also when its
  // constructor throws: a member's destructor still runs).
  struct BoundPath {
    std::string path;
    BoundPath() = default;
    BoundPath(const BoundPath&) = delete;
    BoundPath& operator=(const BoundPath&) = delete;
    ~BoundPath() {
      if (!path.empty()) ::unlink(path.c_str());
    }
  };
  BoundPath doorbellPath_;
  // An epoll set of the local peers' pidfds: one epoll_wait tells which
  // exited, where a look at each would cost a syscall per peer every
  // connection check (takeDisconnected) on every rank of the host.
  net::Fd exits_;
  net::Fd doorbell_;  // bound (after doorbellPath_: closed first): peers wake us through it
  net::Fd bell_;      // unbound: we wake peers through it
  ByRank<Peer> peers_;
  size_t creditReserve_ = 0;
  size_t hellosOwed_ = 0;  // peers whose doorbell refused our hello so far
  size_t unverified_ = 0;  // peers open to single-copy writes whose hello is not in
  uint64_t arrivals_ = 0;
  bool singleCopy_;          // RDMACC_SHM_SINGLE_COPY
  size_t oneShotBytes_ = 0;  // RDMACC_SHM_ONE_SHOT_BYTES when there is a board
  bool membarrier_;          // RDMACC_SHM_MEMBARRIER
  // TransportOptions::lazy, where the kernel can populate pages (create()).
  bool lazySlots_;
  // TransportOptions::lazy and no board: a peer's segment is mapped at
  // first contact (ShmTransport's constructor says why not with a board).
  bool lazyJoin_ = false;
  std::chrono::milliseconds connectTimeout_;
  // This process registered for membarrier(GLOBAL_EXPEDITED): arm() issues
  // one (SegmentHead::sleepBarrier).
  bool sleepBarrier_ = false;
  // And so does every local peer joined so far (only those are published
  // to or read): publishFence() is the compiler's only.
  bool lightPublish_ = false;
};

}  // namespace rdmacc::shm
