// The shared-memory transport's setup: this rank's segment, the peers'
// (mapped and checked), the doorbells, and whether single-copy writes reach
// each peer.
#include <fcntl.h>
#include <linux/membarrier.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>
#include <string>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "rdmacc/error.hpp"
#include "rdmacc/log.hpp"
#include "src/core/deadline.hpp"
#include "src/store/store_util.hpp"
#include "src/transport/shm/cma.hpp"
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

Error shmError(const char* call, int errnum, const std::string& what, const std::string& hint) {
  return errnoError(ErrorKind::Internal, call, errnum, what, hint);
}

Mapping mapSegment(int fd, size_t bytes, const std::string& name) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    throw shmError("mmap", errno, fmt::format("mapping shared memory segment {}", name), "");
  }
  return Mapping(static_cast<uint8_t*>(p), PageUnmap{bytes});
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

sockaddr_un doorbellAddress(const std::string& name, socklen_t& length) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  // Abstract namespace: no file to clean up after a crash.
  const std::string path = "rdmacc" + name;
  std::memcpy(addr.sun_path + 1, path.data(), std::min(path.size(), sizeof addr.sun_path - 2));
  length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 +
                                  std::min(path.size(), sizeof addr.sun_path - 2));
  return addr;
}

}  // namespace

ShmTransport::ShmTransport(Store& store, const TransportOptions& options,
                           const std::vector<bool>& carried)
    : rank_(options.rank),
      size_(options.size),
      peers_(static_cast<size_t>(options.size)),
      singleCopy_(options.shmSingleCopy),
      membarrier_(options.shmMembarrier) {
  for (int rank = 0; rank < size_; ++rank) {
    peers_[idx(rank)].carried = rank != rank_ && carried[idx(rank)];
    if (peers_[idx(rank)].carried) ++geometry_.lanes;
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
  create(options.shmSegment);
  try {
    attach(store, options);
  } catch (...) {
    // A constructor that throws runs no destructor: without this, a peer that
    // never arrived would leave our segment in /dev/shm.
    if (!unlinked_) ::shm_unlink(name_.c_str());
    unlinked_ = true;
    throw;
  }
}

// Our segment: created exclusive, 0600, its memory reserved now (so a full
// /dev/shm fails here with a clear error instead of SIGBUS later).
void ShmTransport::create(const std::string& name) {
  std::random_device random;
  name_ = name.empty() ? newSegmentName() : name;
  if (!validSegmentName(name_)) {
    throw Error(ErrorKind::InvalidArgument,
                fmt::format("'{}' is no segment name of rdmacc's", name_));
  }
  const size_t bytes = geometry_.totalBytes();
  net::Fd fd(::shm_open(name_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  if (!fd) throw shmError("shm_open", errno, fmt::format("creating {}", name_), "");
  unlinked_ = false;
  if (int rc = ::posix_fallocate(fd.get(), 0, static_cast<off_t>(bytes)); rc != 0) {
    ::shm_unlink(name_.c_str());
    unlinked_ = true;
    throw shmError("posix_fallocate", rc,
                   fmt::format("reserving {} MiB of shared memory for {} local peer(s)",
                               (bytes + (1u << 20) - 1) >> 20, geometry_.lanes),
                   "/dev/shm is too small (containers: docker --shm-size, or a larger tmpfs), "
                   "or lower RDMACC_SLOTS_PER_PEER / RDMACC_SLOT_BYTES");
  }
  mine_ = mapSegment(fd.get(), bytes, name_);
  head_ = new (mine_.get()) SegmentHead{};
  head_->lanes = geometry_.lanes;
  head_->slots = geometry_.slots;
  head_->ringEntries = geometry_.ringEntries;
  head_->slotBytes = geometry_.slotBytes;
  head_->boardEntries = geometry_.boardEntries;
  head_->boardEntryBytes = geometry_.boardEntryBytes;
  sleepBarrier_ = membarrier_ &&
                  ::syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED, 0U, 0) == 0;
  head_->sleepBarrier = sleepBarrier_ ? 1 : 0;
  head_->base = reinterpret_cast<uintptr_t>(mine_.get());
  head_->nonce = (uint64_t{random()} << 32 | random()) | 1;
  for (uint32_t lane = 0; lane < geometry_.lanes; ++lane) {
    new (mine_.get() + geometry_.laneOffset(lane)) RingHead{};
  }
  board_ = mine_.get() + geometry_.boardOffset();
  for (uint32_t entry = 0; entry < geometry_.boardEntries; ++entry) {
    new (mine_.get() + geometry_.boardOffset() + size_t{entry} * geometry_.boardEntryBytes)
        BoardEntry{};
  }
  doorbell_ = net::Fd(::socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  bell_ = net::Fd(::socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!doorbell_ || !bell_) throw shmError("socket", errno, "creating the wake-up sockets", "");
  socklen_t length = 0;
  sockaddr_un addr = doorbellAddress(name_, length);
  if (::bind(doorbell_.get(), reinterpret_cast<const sockaddr*>(&addr), length) != 0) {
    throw shmError("bind", errno, "binding the wake-up socket", "");
  }
  head_->magic.store(kMagic, std::memory_order_release);  // built: peers may map it
}

// Learns every local peer's "name:pid" (from the host records the backend
// passed, or through its own exchange), maps each peer's segment once its
// owner built it (checking what it built against what this rank expects),
// and unlinks ours once every local peer mapped it.
void ShmTransport::attach(Store& store, const TransportOptions& options) {
  // Our lane in a peer's segment: our index among its carried peers.
  auto laneIn = [&](int owner, int sender) {
    size_t lane = 0;
    for (int r = 0; r < sender; ++r) lane += r != owner && (peers_[idx(r)].carried || r == rank_);
    return lane;
  };
  const size_t bytes = geometry_.totalBytes();
  // Every local peer's record at once (O(N) requests per group); the ranks
  // of this host take part, and only they.
  std::vector<int> local, carried;
  for (int rank = 0; rank < size_; ++rank) {
    if (peers_[idx(rank)].carried) carried.push_back(rank);
    if (peers_[idx(rank)].carried || rank == rank_) local.push_back(rank);
  }
  const std::string prefix = "rdmacc/shm/" + options.group;
  std::vector<Bytes> records;
  if (options.shmRecords.empty()) {
    records = exchangeRecords(store, options.allGather, prefix, rank_,
                              toBytes(fmt::format("{}:{}", name_, ::getpid())), local, carried);
  } else {
    for (int rank : carried) records.push_back(toBytes(options.shmRecords.at(idx(rank))));
  }
  const auto deadline = deadlineAfter(options.connectTimeout);
  size_t record = 0;
  for (int rank = 0; rank < size_; ++rank) {
    Peer& p = peers_[idx(rank)];
    if (!p.carried) continue;
    const std::string key = fmt::format("{}/{}", prefix, rank);
    const std::string text = toString(records[record++]);
    const auto fields = splitFields(text, ':');
    if (fields.size() != 2 || !validSegmentName(fields[0])) {
      throw Error(ErrorInfo{
          .kind = ErrorKind::Protocol,
          .message = fmt::format("rank {} published malformed shared-memory information '{}'", rank,
                                 text.substr(0, 100)),
          .peerRank = rank});
    }
    const std::string name(fields[0]);
    p.pid = static_cast<int>(storeNumber(fields[1], INT32_MAX, key));
    p.address = fmt::format("pid {} on this host", p.pid);
    p.pidfd = net::Fd(pidfdOpen(p.pid));
    const size_t present = mapPeerSegment(rank, p, name, deadline);
    if (p.head->version != kVersion || p.head->lanes != geometry_.lanes ||
        p.head->slots != geometry_.slots || p.head->ringEntries != geometry_.ringEntries ||
        p.head->slotBytes != geometry_.slotBytes ||
        p.head->boardEntries != geometry_.boardEntries ||
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
    if (present < bytes) {
      throw Error(ErrorKind::Protocol, fmt::format("rank {}'s segment {} has {} bytes, not {}",
                                                   rank, name, present, bytes));
    }
    p.board = p.mapping.get() + geometry_.boardOffset();
    uint8_t* theirs = p.mapping.get() + geometry_.laneOffset(laneIn(rank, rank_));
    p.out = reinterpret_cast<RingHead*>(theirs);
    p.outRecords = reinterpret_cast<Record*>(theirs + sizeof(RingHead));
    p.outSlots = theirs + sizeof(RingHead) + geometry_.recordsBytes();
    uint8_t* ours = mine_.get() + geometry_.laneOffset(laneIn(rank_, rank));
    p.in = reinterpret_cast<RingHead*>(ours);
    p.inRecords = reinterpret_cast<Record*>(ours + sizeof(RingHead));
    p.inSlots = ours + sizeof(RingHead) + geometry_.recordsBytes();
    p.doorbell = doorbellAddress(name, p.doorbellLength);
    p.window = SlotWindow(static_cast<int>(geometry_.slots));
    p.singleCopy = singleCopy_ && probeSingleCopy(rank, p);
    p.out->mapped.store(1, std::memory_order_release);
  }
  lightPublish_ = sleepBarrier_;
  for (int rank = 0; rank < size_; ++rank) {
    const Peer& p = peers_[idx(rank)];
    if (p.carried) lightPublish_ = lightPublish_ && p.head->sleepBarrier == 1;
  }
  log(LogLevel::Debug, "shared memory: {}",
      lightPublish_
          ? "publishing without a fence (every local rank issues membarrier before it sleeps)"
          : "publishing with a fence (RDMACC_SHM_MEMBARRIER=0, or membarrier(GLOBAL_EXPEDITED) not "
            "available, on some local rank)");
  unlinkOnceMapped(options.connectTimeout);
}

// Maps rank's segment once its owner built it (magic set): the name came
// with the host records, before the owner may have created it, so a
// missing, empty or unfinished segment is looked at again until the
// deadline or the owner's exit. Mapped as large as it is (at most what
// this rank expects), so that a segment of another geometry is named by
// its head, not only its size. Returns the bytes mapped.
size_t ShmTransport::mapPeerSegment(int rank, Peer& p, const std::string& name,
                                    std::chrono::steady_clock::time_point deadline) {
  const size_t bytes = geometry_.totalBytes();
  auto pause = std::chrono::microseconds(20);
  for (;;) {
    net::Fd fd(::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0));
    if (!fd && errno != ENOENT) {
      throw shmError("shm_open", errno, fmt::format("opening rank {}'s segment {}", rank, name),
                     "ranks that share a host must share /dev/shm (the same mount namespace)");
    }
    struct stat st {};
    if (fd && ::fstat(fd.get(), &st) != 0) {
      throw shmError("fstat", errno, fmt::format("of rank {}'s segment {}", rank, name), "");
    }
    // The ranks of a job are one user, and rdmacc creates segments 0600: a
    // segment of another user's under the published name, or one others may
    // open, is not the peer's (security.md, shared memory).
    if (fd && (st.st_uid != ::geteuid() || (st.st_mode & 077) != 0)) {
      throw Error(ErrorInfo{
          .kind = ErrorKind::Protocol,
          .message = fmt::format("rank {}'s segment /dev/shm{} belongs to uid {} with mode {:o}, "
                                 "not to this rank's uid {} with mode 600",
                                 rank, name, st.st_uid, st.st_mode & 0777, ::geteuid()),
          .peerRank = rank,
          .hint = "run every rank of a host as the same user; another user (or process) may "
                  "have created the name first"});
    }
    if (fd && static_cast<size_t>(st.st_size) >= geometry_.headBytes()) {
      const size_t present = std::min(static_cast<size_t>(st.st_size), bytes);
      p.mapping = mapSegment(fd.get(), present, name);
      p.head = reinterpret_cast<SegmentHead*>(p.mapping.get());
      const uint64_t magic = p.head->magic.load(std::memory_order_acquire);
      if (magic == kMagic) return present;
      if (magic != 0) {
        throw Error(ErrorInfo{
            .kind = ErrorKind::Protocol,
            .message = fmt::format("rank {}'s segment {} starts with {:#x}, not rdmacc's {:#x}",
                                   rank, name, magic, kMagic),
            .peerRank = rank});
      }
      p.head = nullptr;
      p.mapping = {};
    }
    if (processExited(p)) {
      throw Error(ErrorInfo{.kind = ErrorKind::PeerFailure,
                            .message = fmt::format("rank {} (pid {}) exited before its "
                                                   "shared-memory segment {} was ready",
                                                   rank, p.pid, name),
                            .peerRank = rank});
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      throw Error(ErrorInfo{
          .kind = ErrorKind::Timeout,
          .message =
              fmt::format("rank {}'s shared-memory segment {} was not ready in time", rank, name),
          .peerRank = rank,
          .hint = "see that rank's output; RDMACC_CONNECT_TIMEOUT bounds the wait"});
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(2000));
  }
}

// Each local peer says in its lane of our segment that it mapped it: no
// store request, and a peer that dies or never comes is named. Polled with
// a growing sleep (formation, not the data path).
void ShmTransport::unlinkOnceMapped(std::chrono::milliseconds timeout) {
  const auto deadline = deadlineAfter(timeout);
  auto pause = std::chrono::microseconds(20);
  for (;;) {
    std::vector<int> waiting, gone;
    for (int rank = 0; rank < size_; ++rank) {
      const Peer& p = peers_[idx(rank)];
      if (!p.carried || p.in->mapped.load(std::memory_order_acquire) == 1) continue;
      (processExited(p) ? gone : waiting).push_back(rank);
    }
    if (waiting.empty() && gone.empty()) break;
    if (!gone.empty() || std::chrono::steady_clock::now() >= deadline) {
      const std::vector<int>& named = gone.empty() ? waiting : gone;
      throw Error(ErrorInfo{
          .kind = gone.empty() ? ErrorKind::Timeout : ErrorKind::PeerFailure,
          .message = fmt::format(
              "rank(s) {} {} this rank's shared-memory segment {}", fmt::join(named, ", "),
              gone.empty() ? fmt::format("did not map within {} ms", timeout.count())
                           : std::string("exited before they mapped"),
              name_),
          .peerRank = named.front(),
          .hint = "see those ranks' output; RDMACC_CONNECT_TIMEOUT bounds the wait"});
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(2000));
  }
  ::shm_unlink(name_.c_str());
  unlinked_ = true;
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
  if (!unlinked_) ::shm_unlink(name_.c_str());
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
  if (!p.pidfd) {
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

namespace rdmacc {

std::string newSegmentName() {
  std::random_device random;
  return fmt::format("/rdmacc-{}-{:08x}{:08x}", ::getpid(), random(), random());
}

bool validSegmentName(std::string_view name) {
  return name.size() <= 64 && name.starts_with("/rdmacc-") &&
         name.find_first_not_of("/rdmacc-0123456789abcdef") == std::string_view::npos &&
         name.find('/', 1) == std::string_view::npos;
}

}  // namespace rdmacc
