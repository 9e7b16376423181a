#include "src/shm_transport.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <random>
#include <string>

#include <fmt/format.h>

#include "rdmacc/error.hpp"
#include "rdmacc/log.hpp"
#include "src/buffer.hpp"
#include "src/peer_errors.hpp"
#include "src/slot_window.hpp"
#include "src/socket.hpp"
#include "src/store_util.hpp"

namespace rdmacc {
namespace {

using wire::Header;
using wire::kHeaderBytes;

constexpr uint64_t kMagic = 0x524443434d485331;  // "RDCCMHS1"
constexpr uint32_t kVersion = 1;

static_assert(std::atomic<uint64_t>::is_always_lock_free &&
                  std::atomic<uint32_t>::is_always_lock_free,
              "shared-memory rings need address-free atomics");

// At the start of every segment: what the owner built, checked by each peer
// that maps it, and the owner's flags.
struct SegmentHead {
  uint64_t magic = kMagic;
  uint32_t version = kVersion;
  uint32_t lanes = 0;  // one per local peer, in rank order
  uint32_t slots = 0;
  uint32_t ringEntries = 0;
  uint64_t slotBytes = 0;
  alignas(64) std::atomic<uint32_t> sleeping{0};  // the owner sleeps: ring its doorbell
  alignas(64) std::atomic<uint32_t> departed{0};  // the owner's transport is gone
};

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

constexpr size_t roundUp(size_t n, size_t to) {
  return (n + to - 1) / to * to;
}

struct Geometry {
  uint32_t lanes = 0;
  uint32_t slots = 0;
  uint32_t ringEntries = 0;
  size_t slotBytes = 0;
  size_t headBytes() const { return roundUp(sizeof(SegmentHead), 64); }
  size_t recordsBytes() const { return roundUp(ringEntries * sizeof(Record), 64); }
  size_t laneBytes() const { return sizeof(RingHead) + recordsBytes() + slots * slotBytes; }
  size_t totalBytes() const { return headBytes() + lanes * laneBytes(); }
  size_t laneOffset(size_t lane) const { return headBytes() + lane * laneBytes(); }
};

// Ring entries for a window of `slots`: every slot's message and as many
// credit records, rounded to a power of two.
uint32_t ringEntriesFor(int slots) {
  uint32_t n = 8;
  while (n < static_cast<uint32_t>(2 * slots + 4)) n *= 2;
  return n;
}

using Mapping = std::unique_ptr<uint8_t, PageUnmap>;

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

struct Peer {
  bool carried = false;
  int pid = -1;
  net::Fd pidfd;
  std::string address;  // "pid N on this host", for errors
  Mapping mapping;      // the peer's segment
  SegmentHead* head = nullptr;
  // This rank's lane in the peer's segment (we produce), and the peer's lane
  // in ours (we consume).
  RingHead* out = nullptr;
  Record* outRecords = nullptr;
  uint8_t* outSlots = nullptr;
  uint64_t outTail = 0;
  RingHead* in = nullptr;
  Record* inRecords = nullptr;
  uint8_t* inSlots = nullptr;
  uint64_t inHead = 0;
  sockaddr_un doorbell{};
  socklen_t doorbellLength = 0;
  bool reported = false;  // its departure was reported
  Departure how;          // and how it showed
  SlotWindow window;
};

class ShmTransport final : public Transport {
 public:
  ShmTransport(Store& store, const EngineOptions& options, const std::vector<bool>& carried);
  ~ShmTransport() override;

  size_t chunkBytes() const noexcept override { return geometry_.slotBytes - kHeaderBytes; }
  int slotsPerPeer() const noexcept override { return static_cast<int>(geometry_.slots); }
  const std::string& peerAddress(int peer) const override { return peers_[idx(peer)].address; }
  bool directWrites(int) const override { return false; }
  bool trySend(int peer, const Header& header, const uint8_t* data,
               const std::shared_ptr<ZeroCopyWrites>& zeroCopy,
               std::optional<DirectTarget> direct) override;
  void reserveCredits(size_t slots) override { creditReserve_ = slots; }
  const uint8_t* payload(int peer, int slot) const override {
    return peers_[idx(peer)].inSlots + static_cast<size_t>(slot) * geometry_.slotBytes +
           kHeaderBytes;
  }
  void release(int peer, int slot) override;
  bool poll(TransportSink& sink) override;
  bool flushCredits() override;
  std::vector<int> takeDisconnected() override;
  Departure departure(int peer) const override { return peers_[idx(peer)].how; }
  void arm() override;
  void disarm() override { consumeEvents(); }
  std::array<int, 4> eventFds() const override { return {doorbell_.get(), -1, -1, -1}; }
  void consumeEvents() override;
  void drain(const std::vector<bool>&) override {}  // every send completed when it returned

 private:
  static size_t idx(int rank) { return static_cast<size_t>(rank); }
  void create();
  void attach(Store& store, const std::string& group);
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

  int rank_;
  int size_;
  Geometry geometry_;
  std::string name_;  // our segment's, "/rdmacc-<pid>-<random>"
  bool unlinked_ = true;
  Mapping mine_;
  SegmentHead* head_ = nullptr;
  net::Fd doorbell_;  // bound: peers wake us through it
  net::Fd bell_;      // unbound: we wake peers through it
  std::vector<Peer> peers_;
  size_t creditReserve_ = 0;
  uint64_t arrivals_ = 0;
};

ShmTransport::ShmTransport(Store& store, const EngineOptions& options,
                           const std::vector<bool>& carried)
    : rank_(options.rank), size_(options.size), peers_(static_cast<size_t>(options.size)) {
  for (int rank = 0; rank < size_; ++rank) {
    peers_[idx(rank)].carried = rank != rank_ && carried[idx(rank)];
    if (peers_[idx(rank)].carried) ++geometry_.lanes;
  }
  geometry_.slots = static_cast<uint32_t>(options.slotsPerPeer);
  geometry_.ringEntries = ringEntriesFor(options.slotsPerPeer);
  geometry_.slotBytes = options.slotBytes;
  create();
  try {
    attach(store, options.group);
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
void ShmTransport::create() {
  std::random_device random;
  name_ = fmt::format("/rdmacc-{}-{:08x}{:08x}", ::getpid(), random(), random());
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
  for (uint32_t lane = 0; lane < geometry_.lanes; ++lane) {
    new (mine_.get() + geometry_.laneOffset(lane)) RingHead{};
  }
  doorbell_ = net::Fd(::socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  bell_ = net::Fd(::socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!doorbell_ || !bell_) throw shmError("socket", errno, "creating the wake-up sockets", "");
  socklen_t length = 0;
  sockaddr_un addr = doorbellAddress(name_, length);
  if (::bind(doorbell_.get(), reinterpret_cast<const sockaddr*>(&addr), length) != 0) {
    throw shmError("bind", errno, "binding the wake-up socket", "");
  }
}

// Publishes "name:pid", maps every local peer's segment (checking what its
// owner built against what this rank expects), and unlinks ours once every
// local peer mapped it.
void ShmTransport::attach(Store& store, const std::string& groupName) {
  PrefixStore group("rdmacc/shm/" + groupName, std::shared_ptr<Store>(&store, [](Store*) {}));
  group.set(fmt::format("{}", rank_), toBytes(fmt::format("{}:{}", name_, ::getpid())));
  // Our lane in a peer's segment: our index among its carried peers.
  auto laneIn = [&](int owner, int sender) {
    size_t lane = 0;
    for (int r = 0; r < sender; ++r) lane += r != owner && (peers_[idx(r)].carried || r == rank_);
    return lane;
  };
  const size_t bytes = geometry_.totalBytes();
  for (int rank = 0; rank < size_; ++rank) {
    Peer& p = peers_[idx(rank)];
    if (!p.carried) continue;
    const std::string key = fmt::format("{}", rank);
    const std::string text = toString(group.get(key));
    const auto fields = splitFields(text, ':');
    if (fields.size() != 2 || fields[0].size() > 64 || !fields[0].starts_with("/rdmacc-")) {
      throw Error(
          ErrorKind::Protocol,
          fmt::format("rank {} published malformed shared-memory information '{}'", rank, text));
    }
    const std::string name(fields[0]);
    p.pid = static_cast<int>(storeNumber(fields[1], INT32_MAX, key));
    p.address = fmt::format("pid {} on this host", p.pid);
    net::Fd fd(::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0));
    if (!fd) {
      throw shmError("shm_open", errno, fmt::format("opening rank {}'s segment {}", rank, name),
                     "ranks that share a host must share /dev/shm (the same mount namespace)");
    }
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0 || static_cast<size_t>(st.st_size) < bytes) {
      throw Error(ErrorKind::Protocol, fmt::format("rank {}'s segment {} has {} bytes, not {}",
                                                   rank, name, st.st_size, bytes));
    }
    p.mapping = mapSegment(fd.get(), bytes, name);
    p.head = reinterpret_cast<SegmentHead*>(p.mapping.get());
    if (p.head->magic != kMagic || p.head->version != kVersion ||
        p.head->lanes != geometry_.lanes || p.head->slots != geometry_.slots ||
        p.head->ringEntries != geometry_.ringEntries || p.head->slotBytes != geometry_.slotBytes) {
      throw Error(ErrorInfo{
          .kind = ErrorKind::InvalidArgument,
          .message =
              fmt::format("rank {}'s shared-memory segment has {} lanes of {} slots of {} "
                          "bytes (version {}), this rank expects {} of {} of {} (version {})",
                          rank, p.head->lanes, p.head->slots, p.head->slotBytes, p.head->version,
                          geometry_.lanes, geometry_.slots, geometry_.slotBytes, kVersion),
          .peerRank = rank,
          .hint = "run the same rdmacc version with the same RDMACC_SLOTS_PER_PEER and "
                  "RDMACC_SLOT_BYTES on every rank"});
    }
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
    p.pidfd = net::Fd(pidfdOpen(p.pid));
    group.set(fmt::format("mapped/{}/{}", rank_, name.substr(1)), toBytes("1"));
  }
  for (int rank = 0; rank < size_; ++rank) {
    if (peers_[idx(rank)].carried) group.get(fmt::format("mapped/{}/{}", rank, name_.substr(1)));
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

uint64_t ShmTransport::ringSpace(int to, Peer& p) const {
  const uint64_t head = p.out->head.load(std::memory_order_acquire);
  if (head > p.outTail || p.outTail - head > geometry_.ringEntries) {
    throw protocolViolation(
        to, p.address,
        wire::Violation{fmt::format("a ring head of {} (its tail is {})", head, p.outTail)});
  }
  return geometry_.ringEntries - (p.outTail - head);
}

// Appends a record to the peer's ring and rings its doorbell if it sleeps
// (Dekker pair with arm(): the tail is published before the flag is read).
void ShmTransport::publish(Peer& p, Record r) {
  p.outRecords[p.outTail % geometry_.ringEntries] = r;
  p.out->tail.store(++p.outTail, std::memory_order_release);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (p.head->sleeping.load(std::memory_order_relaxed) != 0) {
    ringDoorbell(p);
  }
}

bool ShmTransport::trySend(int to, const Header& header, const uint8_t* data,
                           const std::shared_ptr<ZeroCopyWrites>&, std::optional<DirectTarget>) {
  Peer& p = peers_[idx(to)];
  if (!p.window.canSend(creditReserve_) || ringSpace(to, p) == 0) return false;
  const int remote = p.window.nextRemote();
  uint8_t* slot = p.outSlots + static_cast<size_t>(remote) * geometry_.slotBytes;
  Header h = header;
  h.credits = p.window.takePiggybackCredits();
  std::memcpy(slot, &h, sizeof h);
  if (header.payload > 0) std::memcpy(slot + kHeaderBytes, data, header.payload);
  p.window.sent();
  publish(p, Record{static_cast<uint32_t>(remote),
                    static_cast<uint32_t>(kHeaderBytes + header.payload)});
  if (logEnabled(LogLevel::Trace))
    log(LogLevel::Trace, "-> rank {} slot {} (shm): {}", to, remote, wire::describe(header));
  return true;
}

void ShmTransport::release(int from, int slot) {
  if (peers_[idx(from)].window.release(slot)) flushCredits(from);
}

bool ShmTransport::flushCredits(int to) {
  Peer& p = peers_[idx(to)];
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
    if (peers_[idx(rank)].carried && peers_[idx(rank)].window.peerMayStall()) {
      any |= flushCredits(rank);
    }
  }
  return any;
}

bool ShmTransport::poll(TransportSink& sink) {
  const wire::Limits limits{.slotsPerPeer = static_cast<int>(geometry_.slots),
                            .slotBytes = geometry_.slotBytes};
  bool any = false;
  for (int from = 0; from < size_; ++from) {
    Peer& p = peers_[idx(from)];
    if (!p.carried) continue;
    const uint64_t tail = p.in->tail.load(std::memory_order_acquire);
    if (tail < p.inHead || tail - p.inHead > geometry_.ringEntries) {
      throw protocolViolation(
          from, p.address,
          wire::Violation{fmt::format("a ring tail of {} (the head is {})", tail, p.inHead)});
    }
    while (p.inHead < tail) {
      const Record r = p.inRecords[p.inHead % geometry_.ringEntries];
      p.in->head.store(++p.inHead, std::memory_order_release);
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
// exited (its pidfd is readable; without pidfds, kill(pid, 0)).
std::vector<int> ShmTransport::takeDisconnected() {
  std::vector<int> gone;
  for (int rank = 0; rank < size_; ++rank) {
    Peer& p = peers_[idx(rank)];
    if (!p.carried || p.reported) continue;
    bool exited = false;
    if (p.pidfd) {
      pollfd fd{p.pidfd.get(), POLLIN, 0};
      exited = ::poll(&fd, 1, 0) > 0;
    } else {
      exited = ::kill(p.pid, 0) != 0 && errno == ESRCH;
    }
    if (exited || p.head->departed.load() != 0) {
      p.reported = true;
      p.how = exited ? Departure{p.pidfd ? "poll(pidfd)" : "kill(pid, 0)",
                                 fmt::format("process {} exited", p.pid)}
                     : Departure{"shared memory", "its backend went away"};
      gone.push_back(rank);
    }
  }
  return gone;
}

void ShmTransport::arm() {
  head_->sleeping.store(1);
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

void ShmTransport::consumeEvents() {
  head_->sleeping.store(0, std::memory_order_relaxed);
  char buffer[64];
  while (::recv(doorbell_.get(), buffer, sizeof buffer, MSG_DONTWAIT) > 0) {
  }
}

}  // namespace

std::unique_ptr<Transport> makeShmTransport(Store& store, const EngineOptions& options,
                                            const std::vector<bool>& peers) {
  return std::make_unique<ShmTransport>(store, options, peers);
}

}  // namespace rdmacc
