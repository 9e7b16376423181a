// This rank's shared-memory segment: its file, made and sealed, its memory
// reserved, its head, rings and board built (ShmTransport::create); and a
// sender's reservation of its own slots in a peer's (reserveSlots).
#include <fcntl.h>
#include <linux/futex.h>
#include <linux/membarrier.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "rdmacc/error.hpp"
#include "src/transport/shm/doorbell.hpp"
#include "src/transport/shm/transport.hpp"
#include "src/transport/shm/transport_impl.hpp"

namespace rdmacc::shm {
namespace {

constexpr char kShmMemoryHint[] =
    "the host (or the container's memory limit) has too little memory for the segments: lower "
    "RDMACC_SLOTS_PER_PEER / RDMACC_SLOT_BYTES";

// Whether madvise(MADV_POPULATE_WRITE) works here (Linux 5.14 and later):
// it is what lets a sender reserve its slots with an error instead of a
// SIGBUS (reserveSlots); without it, the owner reserves its whole segment.
bool populateWorks() {
  static const bool works = [] {
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    void* p = ::mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return false;
    const bool ok = ::madvise(p, page, MADV_POPULATE_WRITE) == 0;
    ::munmap(p, page);
    return ok;
  }();
  return works;
}

void futexWakeAll(std::atomic<uint32_t>& word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr,
            0);
}

}  // namespace

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

// Our segment: a memfd of this user's, 0600, its memory reserved now (so
// too little memory fails with a clear error instead of a SIGBUS later;
// lazy, all but the peers' slots, which each sender reserves), then sealed: neither we nor a peer
// can shrink it under the others' mappings (which would make their next access fault) or grow it.
void ShmTransport::create(const std::string& name, std::shared_ptr<net::Fd> file) {
  lazySlots_ = lazySlots_ && populateWorks();
  name_ = name.empty() ? newSegmentName() : name;
  if (!validSegmentName(name_)) {
    throw Error(ErrorKind::InvalidArgument,
                fmt::format("'{}' is no segment name of rdmacc's", name_));
  }
  file_ = file ? std::move(file) : std::make_shared<net::Fd>(createSegmentFile(name_));
  const int fd = file_->get();
  const size_t bytes = geometry_.totalBytes();
  // The size first (at once), so that peers can map the head and wait on
  // it while the memory is reserved.
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    throw shmError("ftruncate", errno, fmt::format("sizing {}", name_), "");
  }
  // All of it, or (lazy) the head and rings and the board: each sender
  // reserves its slots when it first writes to us (reserveSlots).
  std::vector<std::pair<size_t, size_t>> reserved{{0, bytes}};
  if (lazySlots_) {
    reserved = {{0, geometry_.headBytes()},
                {geometry_.ringOffset(0), geometry_.slotsOffset(0)},
                {geometry_.boardOffset(), bytes}};
  }
  for (const auto& [from, to] : reserved) {
    if (from == to) continue;  // no board, or no lanes
    if (int rc = ::posix_fallocate(fd, static_cast<off_t>(from), static_cast<off_t>(to - from));
        rc != 0) {
      throw shmError("posix_fallocate", rc,
                     fmt::format("reserving {} KiB of shared memory for {} local peer(s){}",
                                 (to - from + 1023) >> 10, geometry_.lanes,
                                 lazySlots_ ? " (their rings)" : ""),
                     kShmMemoryHint);
    }
  }
  if (::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    throw shmError("fcntl(F_ADD_SEALS)", errno, fmt::format("sealing {}", name_), "");
  }
  mine_ = mapSegment(fd, bytes, name_);
  head_ = new (mine_.get()) SegmentHead{};
  head_->lanes = geometry_.lanes;
  head_->slots = geometry_.slots;
  head_->ringEntries = geometry_.ringEntries;
  head_->slotBytes = geometry_.slotBytes;
  head_->boardEntries = geometry_.boardEntries;
  head_->boardEntryBytes = geometry_.boardEntryBytes;
  head_->slotsReserved = lazySlots_ ? 0 : 1;
  sleepBarrier_ = membarrier_ &&
                  ::syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED, 0U, 0) == 0;
  head_->sleepBarrier = sleepBarrier_ ? 1 : 0;
  head_->base = reinterpret_cast<uintptr_t>(mine_.get());
  std::random_device random;
  head_->nonce = (uint64_t{random()} << 32 | random()) | 1;
  // The rings are left as the new file gives them, zero, which is a
  // RingHead's start: a page nobody wrote is not mapped along when a peer
  // touches its neighbour (fault-around), so a rank's resident memory
  // counts the rings in use, not a page of every lane of every peer.
  board_ = mine_.get() + geometry_.boardOffset();
  for (uint32_t entry = 0; entry < geometry_.boardEntries; ++entry) {
    new (mine_.get() + geometry_.boardOffset() + size_t{entry} * geometry_.boardEntryBytes)
        BoardEntry{};
  }
  doorbell_ = net::Fd(::socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  bell_ = net::Fd(::socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!doorbell_ || !bell_) throw shmError("socket", errno, "creating the wake-up sockets", "");
  // Each datagram then carries its sender's pid, as the kernel knows it:
  // the peers' hellos (hello.cpp).
  const int on = 1;
  if (::setsockopt(doorbell_.get(), SOL_SOCKET, SO_PASSCRED, &on, sizeof on) != 0) {
    throw shmError("setsockopt(SO_PASSCRED)", errno, "on the wake-up socket", "");
  }
  prepareDoorbellDirectory();
  socklen_t length = 0;
  sockaddr_un addr = doorbellAddress(name_, length);
  if (::bind(doorbell_.get(), reinterpret_cast<const sockaddr*>(&addr), length) != 0) {
    throw shmError("bind", errno, fmt::format("binding the wake-up socket {}", addr.sun_path), "");
  }
  doorbellPath_.path = addr.sun_path;
  head_->magic.store(kMagic, std::memory_order_release);  // built: peers may map it
  head_->built.store(1, std::memory_order_release);
  futexWakeAll(head_->built);
}

void ShmTransport::reserveSlots(int to, Peer& p) {
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto from = reinterpret_cast<uintptr_t>(p.outSlots) & ~(page - 1);
  const auto end = reinterpret_cast<uintptr_t>(p.outSlots) + geometry_.slots * geometry_.slotBytes;
  if (::madvise(reinterpret_cast<void*>(from), end - from, MADV_POPULATE_WRITE) != 0) {
    const int errnum = errno;
    throw Error(ErrorInfo{
        .kind = ErrorKind::Internal,
        .message = fmt::format("reserving {} KiB of shared memory for this rank's slots in rank "
                               "{}'s segment ({}) failed",
                               (end - from) >> 10, to, p.address),
        .call = "madvise(MADV_POPULATE_WRITE)",
        .errnum = errnum,
        .status = std::strerror(errnum),
        .peerRank = to,
        .hint = kShmMemoryHint});
  }
  p.slotsReserved = true;
}

}  // namespace rdmacc::shm

namespace rdmacc {

std::string newSegmentName() {
  std::random_device random;
  return fmt::format("/rdmacc-{}-{:08x}{:08x}", ::getpid(), random(), random());
}

std::string segmentRecord(const std::string& name, int fd) {
  return fmt::format("{}:{}:{}", name, ::getpid(), fd);
}

net::Fd createSegmentFile(const std::string& name) {
  // The memfd's name (what /proc/PID/maps shows) without the leading '/'.
  net::Fd fd(::memfd_create(name.c_str() + (name.starts_with('/') ? 1 : 0),
                            MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd) throw shm::shmError("memfd_create", errno, fmt::format("creating {}", name), "");
  if (::fchmod(fd.get(), 0600) != 0) {
    throw shm::shmError("fchmod", errno, fmt::format("making {} private", name), "");
  }
  return fd;
}

bool validSegmentName(std::string_view name) {
  return name.size() <= 64 && name.starts_with("/rdmacc-") &&
         name.find_first_not_of("/rdmacc-0123456789abcdef") == std::string_view::npos &&
         name.find('/', 1) == std::string_view::npos;
}

}  // namespace rdmacc
