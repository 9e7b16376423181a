#include "src/transport/shm/transport.hpp"
#include "src/core/buffer.hpp"

#include <linux/membarrier.h>
#include <poll.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>

#include <fmt/format.h>

#include "rdmacc/error.hpp"
#include "rdmacc/log.hpp"
#include "src/transport/peer_errors.hpp"
#include "src/transport/shm/cma.hpp"
#include "src/transport/shm/transport_impl.hpp"

namespace rdmacc::shm {

// The head the peer published is read only when the one seen last leaves
// no room: its cache line stays with the peer while the ring has space.
uint64_t ShmTransport::ringSpace(int to, Peer& p) const {
  if (p.outTail - p.outHead < geometry_.ringEntries) {
    return geometry_.ringEntries - (p.outTail - p.outHead);
  }
  const uint64_t head = p.out->head.load(std::memory_order_acquire);
  if (head < p.outHead || head > p.outTail || p.outTail - head > geometry_.ringEntries) {
    throw protocolViolation(
        to, p.address,
        wire::Violation{fmt::format("a ring head of {} (its tail is {})", head, p.outTail)});
  }
  p.outHead = head;
  return geometry_.ringEntries - (p.outTail - head);
}

// Appends a record to the peer's ring and rings its doorbell if it sleeps
// (Dekker pair with arm(): the tail is published before the flag is read).
void ShmTransport::publish(Peer& p, Record r) {
  p.outRecords[p.outTail % geometry_.ringEntries] = r;
  p.out->tail.store(++p.outTail, std::memory_order_release);
  publishFence();
  if (p.head->sleeping.load(std::memory_order_relaxed) != 0) {
    ringDoorbell(p);
  }
}

// Only while the peer's process lives (its pid could be another's once it
// exited), and only to the peer that owns the segment (probeSingleCopy)
// and said hello from the pid its record gives (hello.cpp).
// A write the kernel refuses (the peer advertised memory it does not have,
// or a security module changed its mind) sends that payload, and every
// later one, through the slots.
// Its pidfd is readable, or without one, kill(pid, 0) finds no process.
bool ShmTransport::processExited(const Peer& p) {
  if (!p.pidfd) return ::kill(p.pid, 0) != 0 && errno == ESRCH;
  pollfd fd{p.pidfd.get(), POLLIN, 0};
  return ::poll(&fd, 1, 0) > 0;
}

bool ShmTransport::writeDirect(int to, Peer& p, const uint8_t* data, const DirectTarget& target,
                               size_t bytes) {
  if (processExited(p)) return false;
  std::string why;
  if (cma::write(p.pid, data, target.addr, bytes, why)) {
    std::atomic_thread_fence(std::memory_order_seq_cst);  // the data before the record
    return true;
  }
  p.singleCopy = false;
  log(LogLevel::Warn,
      "a single-copy write of {} bytes to rank {} ({}) at {:#x} failed ({}); messages to it take "
      "two copies from now on",
      bytes, to, p.address, target.addr, why);
  return false;
}

bool ShmTransport::trySend(int to, const Header& header, const uint8_t* data,
                           const std::shared_ptr<ZeroCopyWrites>&,
                           std::optional<DirectTarget> direct) {
  Peer& p = peers_[to];
  if (!tryJoin(to, p)) return false;  // its segment is not built yet: tried again
  if (!p.window.canSend(creditReserve_) || ringSpace(to, p) == 0) return false;
  if (!p.slotsReserved) reserveSlots(to, p);
  const int remote = p.window.nextRemote();
  uint8_t* slot = p.outSlots + static_cast<size_t>(remote) * geometry_.slotBytes;
  const bool single = direct && header.payload > 0 && p.singleCopy && p.pidVerified &&
                      writeDirect(to, p, data, *direct, header.payload);
  Header h = header;
  h.credits = p.window.takePiggybackCredits();
  if (single) h.flags |= wire::kDirect;
  std::memcpy(slot, &h, sizeof h);
  if (!single) copyBytes(slot + kHeaderBytes, data, header.payload);
  p.window.sent();
  publish(p, Record{static_cast<uint32_t>(remote),
                    static_cast<uint32_t>(kHeaderBytes + (single ? 0 : header.payload))});
  if (logEnabled(LogLevel::Trace))
    log(LogLevel::Trace, "-> rank {} slot {} (shm): {}{}", to, remote, wire::describe(header),
        single ? " (direct)" : "");
  return true;
}

std::string ShmTransport::describePeer(int to) const {
  const Peer& p = peers_[to];
  if (!p.joined) {
    return fmt::format("shared memory: {}, its segment not mapped yet{}", p.window.describe(),
                       p.waitingFor.empty() ? "" : fmt::format(" (it {})", p.waitingFor));
  }
  return fmt::format(
      "shared memory: {}, ring {} of {} entries used by us, {} of {} by it, single-copy writes "
      "{}",
      p.window.describe(), p.outTail - p.out->head.load(std::memory_order_relaxed),
      geometry_.ringEntries, p.in->tail.load(std::memory_order_relaxed) - p.inHead,
      geometry_.ringEntries,
      !p.singleCopy   ? "off"
      : p.pidVerified ? "on"
                      : "waiting for its hello from its pid");
}

void ShmTransport::release(int from, int slot) {
  if (peers_[from].window.release(slot)) flushCredits(from);
}

bool ShmTransport::flushCredits(int to) {
  Peer& p = peers_[to];
  if (!tryJoin(to, p)) return false;
  bool any = false;
  while (p.window.owesCredits() && ringSpace(to, p) > 0) {
    publish(p, Record{p.window.takeCreditMessage(), 0});
    any = true;
  }
  return any;
}

bool ShmTransport::flushCredits() {
  bool any = false;
  for (int rank = 0; rank < size_; ++rank) {
    if (peers_[rank].carried && peers_[rank].window.peerMayStall()) {
      any |= flushCredits(rank);
    }
  }
  return any;
}

bool ShmTransport::poll(TransportSink& sink) {
  closeIfMapped();
  // Until every peer's hello is in, look for them here too: a busy engine
  // thread may not sleep (and read the doorbell) for a while. Before the
  // rings: a wake-up drained here announced a record published before it.
  if (hellosOwed_ > 0 || unverified_ > 0) {
    sendOwedHellos();
    drainDoorbell();
  }
  const wire::Limits limits{.slotsPerPeer = static_cast<int>(geometry_.slots),
                            .slotBytes = geometry_.slotBytes};
  bool any = false;
  for (int from = 0; from < size_; ++from) {
    Peer& p = peers_[from];
    if (!p.carried) continue;
    const uint64_t tail = p.in->tail.load(std::memory_order_acquire);
    if (tail < p.inHead || tail - p.inHead > geometry_.ringEntries) {
      throw protocolViolation(
          from, p.address,
          wire::Violation{fmt::format("a ring tail of {} (the head is {})", tail, p.inHead)});
    }
    if (p.inHead == tail) continue;
    // The records are copied out before the head that frees them is
    // published, once for the batch.
    struct Publish {
      Peer& p;
      ~Publish() { p.in->head.store(p.inHead, std::memory_order_release); }
    } publishHead{p};
    while (p.inHead < tail) {
      const Record r = p.inRecords[p.inHead % geometry_.ringEntries];
      ++p.inHead;
      any = true;
      Incoming in;
      bool message = false;
      const wire::Completion c{
          .rdmaWriteWithImm = true, .withImm = true, .imm = r.imm, .byteLen = r.bytes};
      if (auto bad = p.window.accept(c, p.inSlots, limits, arrivals_, in, message)) {
        throw protocolViolation(from, p.address, *bad);
      }
      if (!message) continue;
      if (logEnabled(LogLevel::Trace))
        log(LogLevel::Trace, "<- rank {} slot {} (shm): {}", from, in.slot,
            wire::describe(in.header));
      sink.arrived(from, in);
    }
  }
  return any;
}

// A peer is gone when its transport went away (its flag) or its process
// exited (its pidfd is readable: exits_ names those; without pidfds,
// kill(pid, 0)).
std::vector<int> ShmTransport::takeDisconnected() {
  if (exits_) {
    std::array<epoll_event, 16> events{};
    int n = 0;
    while ((n = ::epoll_wait(exits_.get(), events.data(), static_cast<int>(events.size()), 0)) >
           0) {
      for (int i = 0; i < n; ++i) {
        const uint32_t rank = events[static_cast<size_t>(i)].data.u32;
        if (rank >= static_cast<uint32_t>(size_) || !peers_[rank].watched) continue;
        Peer& p = peers_[rank];
        ::epoll_ctl(exits_.get(), EPOLL_CTL_DEL, p.pidfd.get(), nullptr);
        p.watched = false;
        p.exited = true;
      }
      if (n < static_cast<int>(events.size())) break;
    }
  }
  std::vector<int> gone;
  for (int rank = 0; rank < size_; ++rank) {
    Peer& p = peers_[rank];
    if (!p.carried || p.reported) continue;
    const bool exited = p.exited || (!p.watched && processExited(p));
    if (exited || (p.joined && p.head->departed.load() != 0)) {
      p.reported = true;
      p.how = exited ? Departure{p.pidfd ? "poll(pidfd)" : "kill(pid, 0)",
                                 fmt::format("process {} exited", p.pid)}
                     : Departure{"shared memory", "its backend went away"};
      gone.push_back(rank);
    }
  }
  return gone;
}

// The other half of publishFence(): the flag is raised before this rank
// looks for work again (Progress::sleep). With sleepBarrier_, the membarrier
// makes every registered peer's thread pass a full fence in the meantime, so
// a peer either saw the flag or published before this rank looks.
void ShmTransport::arm() {
  head_->sleeping.store(1);
  if (!sleepBarrier_ || ::syscall(SYS_membarrier, MEMBARRIER_CMD_GLOBAL_EXPEDITED, 0U, 0) != 0) {
    // Registered, it cannot fail; if it did, a wake-up could be missed, and
    // a thread that sleeps with work pending still wakes every
    // Progress::kSleepSlice.
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }
}

void ShmTransport::consumeEvents() {
  head_->sleeping.store(0, std::memory_order_relaxed);
  sendOwedHellos();
  drainDoorbell();
}

}  // namespace rdmacc::shm

namespace rdmacc {

std::unique_ptr<Transport> makeShmTransport(Store& store, const TransportOptions& options,
                                            const std::vector<bool>& peers) {
  return std::make_unique<shm::ShmTransport>(store, options, peers);
}

}  // namespace rdmacc
