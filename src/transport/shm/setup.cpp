// The shared-memory transport's setup: the peers' segments (mapped and
// checked), the hellos owed, and whether single-copy writes reach each peer;
// this rank's own segment is made in segment.cpp.
#include <fcntl.h>
#include <linux/futex.h>
#include <sys/epoll.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "rdmacc/error.hpp"
#include "rdmacc/log.hpp"
#include "src/core/deadline.hpp"
#include "src/store/store_util.hpp"
#include "src/transport/shm/cma.hpp"
#include "src/transport/shm/doorbell.hpp"
#include "src/transport/shm/transport.hpp"
#include "src/transport/shm/transport_impl.hpp"

namespace rdmacc::shm {
namespace {

// Ring entries for a window of `slots`: every slot's message and as many
// credit records, rounded to a power of two.
uint32_t ringEntriesFor(int slots) {
  uint32_t n = 8;
  while (n < static_cast<uint32_t>(2 * slots + 4)) n *= 2;
  return n;
}

// Waits while `word` (in shared memory: a futex of no process in particular)
// holds `expected`, at most `timeout`.
void futexWait(std::atomic<uint32_t>& word, uint32_t expected, std::chrono::microseconds timeout) {
  const timespec limit{.tv_sec = static_cast<time_t>(timeout.count() / 1'000'000),
                       .tv_nsec = static_cast<long>(timeout.count() % 1'000'000) * 1000};
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT, expected, &limit, nullptr,
            0);
}

int pidfdOpen(int pid) {
#ifdef SYS_pidfd_open
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
#else
  (void)pid;
  errno = ENOSYS;
  return -1;
#endif
}

}  // namespace

ShmTransport::ShmTransport(Store& store, const TransportOptions& options,
                           const std::vector<bool>& carried)
    : rank_(options.rank),
      size_(options.size),
      peers_(options.size),
      singleCopy_(options.shmSingleCopy),
      membarrier_(options.shmMembarrier),
      lazySlots_(options.lazy),
      connectTimeout_(options.connectTimeout) {
  for (int rank = 0; rank < size_; ++rank) {
    peers_[rank].carried = rank != rank_ && carried[idx(rank)];
    if (peers_[rank].carried) ++geometry_.lanes;
  }
  geometry_.slots = static_cast<uint32_t>(options.slotsPerPeer);
  geometry_.ringEntries = ringEntriesFor(options.slotsPerPeer);
  geometry_.slotBytes = options.slotBytes;
  // The one-shot board: only when this transport carries every peer (a
  // mixed group's collectives cross the network anyway).
  if (options.shmOneShotBytes > 0 && geometry_.lanes + 1 == static_cast<uint32_t>(size_)) {
    geometry_.boardEntries = kBoardEntries;
    geometry_.boardEntryBytes =
        static_cast<uint32_t>(roundUp(kBoardEntryHead + options.shmOneShotBytes, 64));
    oneShotBytes_ = options.shmOneShotBytes;
  }
  // A board's first small collective reads every peer's segment anyway:
  // mapping them then would only move the joins out of formation (where
  // they overlap the other processes' start) into one collective that all
  // ranks wait in. So only a group without a board maps at first contact.
  lazyJoin_ = options.lazy && geometry_.boardEntries == 0;
  create(options.shmSegment, options.shmSegmentFile);
  attach(store, options);
}

// Learns every local peer's "name:pid" (from the host records the backend
// passed, or through its own exchange), maps each peer's segment once its
// owner built it (checking what it built against what this rank expects),
// and closes our file once every local peer mapped it.
void ShmTransport::attach(Store& store, const TransportOptions& options) {
  // Our lane in a peer's segment: our index among its carried peers.
  auto laneIn = [&](int owner, int sender) {
    size_t lane = 0;
    for (int r = 0; r < sender; ++r) lane += r != owner && (peers_[r].carried || r == rank_);
    return lane;
  };
  // Every local peer's record at once (O(N) requests per group); the ranks
  // of this host take part, and only they.
  std::vector<int> local, carried;
  for (int rank = 0; rank < size_; ++rank) {
    if (peers_[rank].carried) carried.push_back(rank);
    if (peers_[rank].carried || rank == rank_) local.push_back(rank);
  }
  const std::string prefix = "rdmacc/shm/" + options.group;
  std::vector<Bytes> records;
  if (options.shmRecords.empty()) {
    records = exchangeRecords(store, options.allGather, prefix, rank_,
                              toBytes(segmentRecord(name_, file_->get())), local, carried);
  } else {
    for (int rank : carried) records.push_back(toBytes(options.shmRecords.at(idx(rank))));
  }
  size_t record = 0;
  for (int rank = 0; rank < size_; ++rank) {
    Peer& p = peers_[rank];
    if (!p.carried) continue;
    const std::string key = fmt::format("{}/{}", prefix, rank);
    const std::string text = toString(records[record++]);
    const auto fields = splitFields(text, ':');
    if (fields.size() != 3 || !validSegmentName(fields[0])) {
      throw Error(ErrorInfo{
          .kind = ErrorKind::Protocol,
          .message = fmt::format("rank {} published malformed shared-memory information '{}'", rank,
                                 text.substr(0, 100)),
          .peerRank = rank});
    }
    p.segment = fields[0];
    p.pid = static_cast<int>(storeNumber(fields[1], INT32_MAX, key));
    p.path = fmt::format("/proc/{}/fd/{}", p.pid, storeNumber(fields[2], INT32_MAX, key));
    p.address = fmt::format("pid {} on this host", p.pid);
    p.pidfd = net::Fd(pidfdOpen(p.pid));
    watchExit(rank, p);
    p.outLane = laneIn(rank, rank_);
    p.inLane = laneIn(rank_, rank);
    // Its lane in our segment: what it sends is read from the start.
    uint8_t* ours = mine_.get() + geometry_.ringOffset(p.inLane);
    p.in = reinterpret_cast<RingHead*>(ours);
    p.inRecords = reinterpret_cast<Record*>(ours + sizeof(RingHead));
    p.inSlots = mine_.get() + geometry_.slotsOffset(p.inLane);
    p.doorbell = doorbellAddress(p.segment, p.doorbellLength);
    p.window = SlotWindow(static_cast<int>(geometry_.slots));
  }
  lightPublish_ = sleepBarrier_;
  if (lazyJoin_) {
    log(LogLevel::Debug, "shared memory: a local peer's segment is mapped at first contact");
    return;
  }
  // Eager: every peer's segment in rank order, each waited for in turn.
  // Until it exists: one open per pause, the pause growing to 5 ms (a host
  // of hundreds of ranks on a few CPUs must not spend them polling); once
  // it is mapped, asleep on its `built` word until the owner wakes us.
  const auto deadline = deadlineAfter(options.connectTimeout);
  for (int rank : carried) {
    Peer& p = peers_[rank];
    p.joinBy = deadline;
    auto pause = std::chrono::microseconds(50);
    while (!tryJoin(rank, p)) {
      if (p.head != nullptr) {
        futexWait(p.head->built, 0, std::chrono::milliseconds(100));
      } else {
        std::this_thread::sleep_for(pause);
        pause = std::min(pause * 2, std::chrono::microseconds(5000));
      }
    }
  }
  // Hellos that came while we waited: the first operations may already
  // write single-copy (the rest are read by the engine's polls).
  sendOwedHellos();
  drainDoorbell();
  log(LogLevel::Debug, "shared memory: {}",
      lightPublish_
          ? "publishing without a fence (every local rank issues membarrier before it sleeps)"
          : "publishing with a fence (RDMACC_SHM_MEMBARRIER=0, or membarrier(GLOBAL_EXPEDITED) not "
            "available, on some local rank)");
  closeIfMapped();
}

// Adds rank's pidfd to exits_ (made at the first call). Without either the
// peer's exit is looked for on its own (processExited).
void ShmTransport::watchExit(int rank, Peer& p) {
  if (!p.pidfd) return;
  if (!exits_) {
    exits_ = net::Fd(::epoll_create1(EPOLL_CLOEXEC));
    if (!exits_) return;
  }
  epoll_event event{};
  event.events = EPOLLIN;
  event.data.u32 = static_cast<uint32_t>(rank);
  p.watched = ::epoll_ctl(exits_.get(), EPOLL_CTL_ADD, p.pidfd.get(), &event) == 0;
}

bool ShmTransport::tryJoin(int rank, Peer& p) {
  if (p.joined) return true;
  const auto now = std::chrono::steady_clock::now();
  if (p.joinBy == std::chrono::steady_clock::time_point{})
    p.joinBy = deadlineAfter(connectTimeout_);
  if (tryMapPeerSegment(rank, p, p.path)) {
    joinPeer(rank, p);
    return true;
  }
  // Whether the owner still lives is asked every 100 ms.
  if (now >= p.exitCheck) {
    p.exitCheck = now + std::chrono::milliseconds(100);
    if (processExited(p)) {
      throw Error(ErrorInfo{.kind = ErrorKind::PeerFailure,
                            .message = fmt::format("rank {} (pid {}) exited before its "
                                                   "shared-memory segment {} was ready",
                                                   rank, p.pid, p.segment),
                            .peerRank = rank});
    }
  }
  if (now >= p.joinBy) {
    throw Error(ErrorInfo{
        .kind = ErrorKind::Timeout,
        .message =
            fmt::format("rank {}'s shared-memory segment {} ({}) was not ready within {} ms{}",
                        rank, p.segment, p.path, connectTimeout_.count(),
                        p.waitingFor.empty() ? "" : fmt::format(": it {}", p.waitingFor)),
        .peerRank = rank,
        .hint = "see that rank's output; RDMACC_CONNECT_TIMEOUT bounds the wait"});
  }
  return false;
}

// Checks rank's mapped segment against what this rank expects, wires its
// lanes to ours, and tells its owner (and wakes it, if it sleeps) that this
// rank has mapped it.
void ShmTransport::joinPeer(int rank, Peer& p) {
  const size_t bytes = geometry_.totalBytes();
  if (p.head->version != kVersion || p.head->lanes != geometry_.lanes ||
      p.head->slots != geometry_.slots || p.head->ringEntries != geometry_.ringEntries ||
      p.head->slotBytes != geometry_.slotBytes || p.head->boardEntries != geometry_.boardEntries ||
      p.head->boardEntryBytes != geometry_.boardEntryBytes) {
    throw Error(ErrorInfo{
        .kind = ErrorKind::InvalidArgument,
        .message = fmt::format("rank {}'s shared-memory segment has {} lanes of {} slots of {} "
                               "bytes and {} board entries of {} bytes (version {}), this rank "
                               "expects {} of {} of {} and {} of {} (version {})",
                               rank, p.head->lanes, p.head->slots, p.head->slotBytes,
                               p.head->boardEntries, p.head->boardEntryBytes, p.head->version,
                               geometry_.lanes, geometry_.slots, geometry_.slotBytes,
                               geometry_.boardEntries, geometry_.boardEntryBytes, kVersion),
        .peerRank = rank,
        .hint = "run the same rdmacc version with the same RDMACC_SLOTS_PER_PEER, "
                "RDMACC_SLOT_BYTES and RDMACC_SHM_ONE_SHOT_BYTES on every rank"});
  }
  if (p.mappedBytes < bytes) {
    throw Error(ErrorKind::Protocol, fmt::format("rank {}'s segment {} has {} bytes, not {}", rank,
                                                 p.segment, p.mappedBytes, bytes));
  }
  p.board = p.mapping.get() + geometry_.boardOffset();
  uint8_t* theirs = p.mapping.get() + geometry_.ringOffset(p.outLane);
  p.out = reinterpret_cast<RingHead*>(theirs);
  p.outRecords = reinterpret_cast<Record*>(theirs + sizeof(RingHead));
  p.outSlots = p.mapping.get() + geometry_.slotsOffset(p.outLane);
  p.slotsReserved = p.head->slotsReserved != 0;
  p.joined = true;
  if (lightPublish_ && p.head->sleepBarrier != 1) {
    lightPublish_ = false;
    log(LogLevel::Debug,
        "shared memory: publishing with a fence from now on (rank {} issues no "
        "membarrier before it sleeps: RDMACC_SHM_MEMBARRIER=0 or not available)",
        rank);
  }
  p.singleCopy = singleCopy_ && probeSingleCopy(rank, p);
  unverified_ += p.singleCopy ? 1 : 0;
  sendHello(p);
  // The last of the owner's peers to map it wakes it (if it sleeps) to
  // close its file; seq_cst with the owner's sleeping flag (arm): either it sees the
  // count before it sleeps, or this rank sees it asleep and rings.
  if (p.head->mappedBy.fetch_add(1) + 1 == p.head->lanes && p.head->sleeping.load() != 0) {
    ringDoorbell(p);
  }
}

// Once every local peer has mapped our segment nobody needs to open it:
// its descriptor is closed then (the memory lives while it is mapped).
// Formation does not wait for it; the engine's polls look until it happens.
void ShmTransport::closeIfMapped() {
  if (!file_ || head_->mappedBy.load() < geometry_.lanes) return;
  file_.reset();
}

// One look at rank's segment: true once it is mapped and its owner has
// built it (magic set). It is opened through the owner's descriptor
// (/proc/PID/fd/FD, from its record), which the owner keeps open until its
// local peers mapped it; an unfinished segment (too small, not sealed yet)
// is not an error (false: look again). Mapped as large as it is (at most
// what this rank expects), so that a segment of another geometry is named
// by its head, not only its size; kept mapped while the owner finishes it.
bool ShmTransport::tryMapPeerSegment(int rank, Peer& p, const std::string& path) {
  if (!p.mapping) {
    net::Fd fd(::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOCTTY));
    if (!fd) {
      if (errno == ENOENT) {  // its process went away (looked after by the caller)
        p.waitingFor = "could not be opened (no such process or descriptor)";
        return false;
      }
      throw shmError("open", errno, fmt::format("opening rank {}'s segment {}", rank, path),
                     "the ranks of a host must run as the same user, in one pid namespace, and "
                     "may open each other's files in /proc (not if a rank is not dumpable)");
    }
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) {
      throw shmError("fstat", errno, fmt::format("of rank {}'s segment {}", rank, path), "");
    }
    // The ranks of a job are one user, and rdmacc creates segments 0600: a
    // file of another user's, or one others may open, is not the peer's
    // (security.md, shared memory).
    if (st.st_uid != ::geteuid() || (st.st_mode & 077) != 0 || !S_ISREG(st.st_mode)) {
      throw Error(ErrorInfo{
          .kind = ErrorKind::Protocol,
          .message = fmt::format("rank {}'s segment {} belongs to uid {} with mode {:o}, "
                                 "not to this rank's uid {} with mode 600",
                                 rank, path, st.st_uid, st.st_mode & 0777, ::geteuid()),
          .peerRank = rank,
          .hint = "run every rank of a host as the same user; the record in the store may "
                  "not be the rank's"});
    }
    if (static_cast<size_t>(st.st_size) < geometry_.headBytes()) {
      p.waitingFor = "was not sized yet";
      return false;
    }
    // Sealed against shrinking, or its owner could make our accesses fault.
    const int seals = ::fcntl(fd.get(), F_GET_SEALS);
    if (seals < 0) {
      throw Error(
          ErrorInfo{.kind = ErrorKind::Protocol,
                    .message = fmt::format("rank {}'s segment {} is no sealable memory file ({})",
                                           rank, path, std::strerror(errno)),
                    .peerRank = rank});
    }
    if ((seals & F_SEAL_SHRINK) == 0) {
      p.waitingFor = "was not sealed against shrinking";
      return false;
    }
    p.mappedBytes = std::min(static_cast<size_t>(st.st_size), geometry_.totalBytes());
    p.mapping = mapSegment(fd.get(), p.mappedBytes, path);
    p.head = reinterpret_cast<SegmentHead*>(p.mapping.get());
  }
  const uint64_t magic = p.head->magic.load(std::memory_order_acquire);
  if (magic == kMagic) return true;
  if (magic != 0) {
    throw Error(ErrorInfo{
        .kind = ErrorKind::Protocol,
        .message = fmt::format("rank {}'s segment {} starts with {:#x}, not rdmacc's {:#x}", rank,
                               path, magic, kMagic),
        .peerRank = rank});
  }
  return false;
}

ShmTransport::~ShmTransport() {
  if (head_ != nullptr) {
    head_->departed.store(1);
    for (Peer& p : peers_) {
      if (p.carried) {
        ringDoorbell(p);
      }
    }
  }
}

// Single-copy writes need the kernel's leave (same user, no security
// module against it) and a pid that is the peer's: the word read at the
// peer's segment through process_vm_readv must be the one this rank's
// mapping of it shows (another process under that pid, e.g. in another pid
// namespace, would not have it). Without a pidfd, no writes: a pid could be
// reused unseen.
bool ShmTransport::probeSingleCopy(int rank, const Peer& p) const {
  std::string why;
  uint64_t seen = 0;
  const uint64_t at =
      p.head->base + static_cast<uint64_t>(reinterpret_cast<const uint8_t*>(&p.head->nonce) -
                                           reinterpret_cast<const uint8_t*>(p.head));
  if (p.pid == ::getpid()) {
    // Writing into one's own process is always permitted, whatever Yama
    // says: a peer that published this rank's pid (and copied its base and
    // nonce) would pass the check below and steer this rank's writes within
    // its own memory. Ranks in one process (tests) lose only the shortcut.
    why = "it gave this process's own pid";
  } else if (!p.pidfd) {
    why = "no pidfd (Linux < 5.3)";
  } else if (!cma::read(p.pid, at, &seen, sizeof seen, why)) {
  } else if (seen != p.head->nonce) {
    why = fmt::format("pid {} is not the process that owns the segment", p.pid);
  } else {
    return true;
  }
  log(LogLevel::Info,
      "no single-copy writes to rank {} ({}): {}; large messages to it take two copies", rank,
      p.address, why);
  return false;
}

}  // namespace rdmacc::shm
