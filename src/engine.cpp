#include "src/engine.hpp"

#include <arpa/inet.h>
#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <thread>

#include <fmt/format.h>

#include "rdmacc/error.hpp"
#include "rdmacc/log.hpp"
#include "src/buffer.hpp"
#include "src/credits.hpp"
#include "src/mesh.hpp"
#include "src/reduce.hpp"
#include "src/registration_cache.hpp"
#include "src/ring.hpp"
#include "src/socket.hpp"
#include "src/store_util.hpp"
#include "src/wire.hpp"
#include "src/wr_id.hpp"
#include "verbs/error.hpp"

namespace rdmacc {
namespace {

using Clock = std::chrono::steady_clock;

using wire::describe;
using wire::Header;
using wire::kDirect;
using wire::kHeaderBytes;
using wire::MessageKind;

constexpr auto kDepartureGrace = std::chrono::milliseconds(200);
// A sleeping thread with pending work wakes at least this often (deadlines).
constexpr auto kSleepSlice = std::chrono::microseconds(20000);
// After a waiting caller got its work done, the engine thread stays parked
// this long: a caller waiting on operations back to back keeps driving them
// alone, without the engine thread competing for the lock and the CPU.
constexpr auto kDriverLinger = std::chrono::microseconds(1000);

struct Incoming {
  int slot = 0;
  Header header;
  uint64_t arrival = 0;
};

// An operation's zero-copy writes still in flight: the hardware may still be
// reading those bytes, so the operation does not write over them (receives,
// Avg's division, its epilogue) and does not complete until they are done.
struct ZeroCopyWrites {
  std::vector<std::pair<const uint8_t*, size_t>> ranges;
  bool overlaps(const uint8_t* p, size_t n) const {
    for (const auto& [q, m] : ranges) {
      if (p < q + m && q < p + n) return true;
    }
    return false;
  }
  void done(const uint8_t* p, size_t n) {
    auto it = std::find(ranges.begin(), ranges.end(), std::make_pair(p, n));
    if (it != ranges.end()) ranges.erase(it);
  }
};

// What a staging slot's write reads besides the slot (its zero-copy payload).
struct SlotWrite {
  std::shared_ptr<const Registration> registration;  // keeps the region registered
  std::shared_ptr<ZeroCopyWrites> owner;
  const uint8_t* data = nullptr;
  size_t bytes = 0;
};

// One queue pair to a peer. Writes posted and not yet known complete, in
// posting order: most go unsignaled, and a signaled completion means every
// write posted before it on the queue pair is complete too (RC order), so it
// releases them all.
// Where a peer lets this rank write a receive of its directly.
struct Advert {
  uint32_t sequence = 0;
  uint32_t step = 0;
  uint8_t opType = 0;
  uint64_t check = 0;
  uint64_t addr = 0;
  uint32_t rkey = 0;
  uint32_t length = 0;
};

// A remote write straight into a peer's advertised destination.
struct DirectTarget {
  uint64_t addr = 0;
  uint32_t rkey = 0;
};

struct Lane {
  ibv_qp* qp = nullptr;
  uint32_t maxInline = 0;  // what the device granted: messages this small go inline
  struct Posted {
    int staging = -1;  // -1: no staging slot (credits, fences)
    bool signaled = false;
  };
  Ring<Posted> posted;
  int unsignaledRun = 0;  // unsignaled writes at the back of `posted`
  int sendQueueUsed() const { return static_cast<int>(posted.size()); }
};

struct PeerState {
  // RDMACC_QPS_PER_PEER lanes: collective chunks go round-robin over all of
  // them (receivers match chunks by index, so they may overtake each other);
  // point-to-point messages, credits and aborts keep to lane 0 and its order.
  std::vector<Lane> lanes;
  size_t nextLane = 0;
  uint64_t remoteBase = 0;  // where this rank's slots start in the peer's region
  uint32_t rkey = 0;
  Ring<int> freeRemote;               // the peer's slots we may write (our credits)
  std::vector<int> freeStaging;       // our staging slots for this peer
  std::vector<SlotWrite> slotWrites;  // by staging slot: zero-copy payloads in flight
  std::vector<Incoming> inbox;        // arrived, not yet consumed (each holds a slot)
  std::vector<int> pendingCredits;    // consumed slots not yet handed back to the peer
  std::deque<Advert> adverts;         // the peer's direct-receive destinations, oldest first
  wire::SlotLedger ledger;            // who owns which slot, both ways: checks every arrival
};

// Adverts a peer may have outstanding: one per receive of the collectives in
// flight; a peer that sends more is broken (they would grow without bound).
constexpr size_t kMaxAdvertsPerPeer = 4096;

// Memory an operation touches, as address intervals (empty: lo == hi).
struct Span {
  uintptr_t lo = 0;
  uintptr_t hi = 0;
  bool overlaps(const Span& o) const { return lo < o.hi && o.lo < hi; }
  void cover(const uint8_t* base, size_t offset, size_t bytes) {
    if (base == nullptr || bytes == 0) return;
    uintptr_t from = reinterpret_cast<uintptr_t>(base) + offset, to = from + bytes;
    if (lo == hi) {
      lo = from, hi = to;
    } else {
      lo = std::min(lo, from), hi = std::max(hi, to);
    }
  }
};

struct Active {
  std::unique_ptr<Operation> op;
  // Collectives: what the operation reads and writes (send buffer, receive
  // buffer, the copy-in's source), unless `opaque`: a prologue or epilogue
  // touches memory the engine cannot see. Decides whether it may run while
  // earlier collectives do.
  bool opaque = true;
  std::array<Span, 3> footprint{};
  bool latencyBound = false;  // every message fits one slot
  std::shared_ptr<ZeroCopyWrites> zeroCopy = std::make_shared<ZeroCopyWrites>();
  // Direct receives: the adverts still to send, which receives ([step][recv])
  // peers may write directly, and the registrations that keep those
  // destinations writable until the operation ends.
  std::vector<std::pair<int, Header>> advertsToSend;
  size_t advertsSent = 0;
  std::vector<std::vector<char>> advertised;  // empty: nothing advertised
  std::vector<std::shared_ptr<const Registration>> exposed;
  bool started = false;
  bool finished = false;  // collectives: every step and the epilogue done
  size_t step = 0;
  std::vector<size_t> sent, sentMessages, received, receivedMessages;
  Clock::time_point deadline{};
  // point to point
  int source = -1;
  size_t done = 0;
  uint32_t chunks = 0;

  // For the next operation: the vectors keep their capacity, so a finished
  // Active is reused without allocating.
  void reset() {
    op.reset();
    if (zeroCopy.use_count() == 1) {
      zeroCopy->ranges.clear();
    } else {  // a write's record still holds it (failure paths): leave it to that
      zeroCopy = std::make_shared<ZeroCopyWrites>();
    }
    advertsToSend.clear();
    advertsSent = 0;
    advertised.clear();
    exposed.clear();
    started = finished = false;
    opaque = true;
    latencyBound = false;
    footprint = {};
    step = 0;
    sent.clear();
    sentMessages.clear();
    received.clear();
    receivedMessages.clear();
    deadline = {};
    source = -1;
    done = 0;
    chunks = 0;
  }
};

}  // namespace

struct Engine::Impl {
  Mesh& mesh;
  EngineOptions options;
  int rank;
  int size;
  size_t chunk;
  PageBuffer recvRegion;     // [peer][slot] of slotBytes: what peers write into
  PageBuffer stagingRegion;  // [peer][slot]: what we write from
  // One registration of the receive region per peer, over that peer's slots
  // only: its rkey lets it write those and nothing else of this process.
  std::vector<verbs::MrPtr> recvMrs;  // by peerIndex; after the mesh's PD
  verbs::MrPtr stagingMr;
  std::vector<PeerState> peers;
  std::vector<bool> dead;                                     // peers that disconnected
  std::vector<std::pair<int, Clock::time_point>> departures;  // (peer, verdict time)
  // Failed completions wait for the same grace: when the peer's disconnect
  // follows, the peer's death is the cause (not "remote access error").
  struct FailedCompletion {
    int peer;
    Error error;
    Clock::time_point verdict;
  };
  std::vector<FailedCompletion> failedCompletions;
  uint64_t arrivals = 0;
  Clock::time_point lastConnectionCheck{};

  std::deque<std::unique_ptr<Active>> collectives;    // the front one runs
  std::optional<uint32_t> lastFinished;               // sequence of the last finished collective
  std::vector<std::unique_ptr<Active>> pointToPoint;  // in submission order
  // Finished Actives kept for reuse, and buffers the loop reuses: the steady
  // state of the progress loop allocates nothing.
  std::vector<std::unique_ptr<Active>> spareActives;
  std::vector<std::unique_ptr<Operation>> intakeTaken;
  std::vector<char> streaming;  // advancePointToPoint: peers with a send in progress
  // Credits trySend leaves untouched: while collectives behind the oldest
  // one send, half of every peer's slots stay for the oldest, so messages
  // that run ahead never take the window the oldest one needs.
  size_t creditReserve = 0;
  std::optional<Error> broken;

  // Shared with other threads.
  std::mutex intakeMutex;
  std::vector<std::unique_ptr<Operation>> intake;
  std::optional<std::string> abortRequest;
  bool brokenShared = false;
  std::optional<Error> brokenCopy;
  net::Fd wakeFd;
  // Dekker pair between submitters and the engine: a submission writes the
  // eventfd only when the engine sleeps or is about to (a syscall, and under
  // emulation a costly one, saved per operation while it spins).
  std::atomic<bool> intakePending{false};
  std::atomic<int> sleepers{0};
  // Progress is made by whoever holds progressMutex: the engine thread, or a
  // caller blocked in Work::wait() (a "driver"), which saves the two thread
  // hand-offs per operation that dominate small-message latency. A driver
  // that finds nothing to do sleeps on the completion channel itself. While a
  // driver is active, and for a moment after one left with its work done
  // (it is likely back with the next operation), the engine thread parks.
  std::mutex progressMutex;
  std::atomic<int> drivers{0};
  std::atomic<bool> latencyBound{false};  // the oldest pending work, as of the last step
  std::atomic<Clock::rep> driverLeft{0};  // when the last driver left content; 0: none since
  bool stopped = false;                   // under progressMutex: no more progress after ~Engine
  std::jthread thread;                    // last: starts after everything above exists

  Impl(Mesh& m, EngineOptions o) : mesh(m), options(std::move(o)), rank(m.rank()), size(m.size()) {}

  // Both regions hold slotsPerPeer slots for every other rank, in rank order
  // without this one: peerIndex(owner, peer) is where peer's slots sit in
  // owner's region.
  static size_t peerIndex(int owner, int peer) {
    return static_cast<size_t>(peer < owner ? peer : peer - 1);
  }
  size_t slotOffset(int peer, int slot) const {
    return (peerIndex(rank, peer) * static_cast<size_t>(options.slotsPerPeer) +
            static_cast<size_t>(slot)) *
           options.slotBytes;
  }
  uint8_t* recvSlot(int peer, int slot) { return recvRegion.data() + slotOffset(peer, slot); }
  uint8_t* stagingSlot(int peer, int slot) { return stagingRegion.data() + slotOffset(peer, slot); }
  size_t messages(size_t bytes) const { return bytes == 0 ? 1 : (bytes + chunk - 1) / chunk; }

  void wake() {
    uint64_t one = 1;
    ssize_t ignored = ::write(wakeFd.get(), &one, sizeof one);
    (void)ignored;
  }

  // ------------------------------------------------------------- posting --

  // Selective signalling: at most signalRun() writes in a row go unsignaled,
  // and every write is signaled once few staging slots or send queue entries
  // are left, so slots held by unsignaled writes are always released soon.
  int signalRun() const { return std::max(1, options.slotsPerPeer / 4); }
  bool mustSignal(const PeerState& p, const Lane& lane, bool usesStaging) const {
    int run = signalRun();
    return lane.unsignaledRun + 1 >= run ||
           (usesStaging && static_cast<int>(p.freeStaging.size()) <= run) ||
           lane.sendQueueUsed() + run + 2 >= static_cast<int>(mesh.qpParams().sendDepth);
  }
  static void posted(Lane& lane, int staging, bool signaled) {
    lane.posted.push_back({staging, signaled});
    lane.unsignaledRun = signaled ? 0 : lane.unsignaledRun + 1;
  }

  // Whether `entries` more work requests would leave less than one for a fence.
  bool sendQueueFull(const Lane& lane, int entries = 1) const {
    return lane.sendQueueUsed() + entries + 1 > static_cast<int>(mesh.qpParams().sendDepth);
  }

  // Sends one message: the header from a staging slot, the payload copied
  // after it, or (zero-copy, when `owner` is given and the payload lies in
  // memory the user registered) gathered straight from the user's buffer.
  // With a direct target the payload is first written to the peer's
  // advertised destination and the header follows on the same queue pair (so
  // it arrives after the data).
  bool trySend(int peer, const Header& header, const uint8_t* data,
               const std::shared_ptr<ZeroCopyWrites>& owner = nullptr,
               std::optional<DirectTarget> direct = std::nullopt) {
    PeerState& p = peers[static_cast<size_t>(peer)];
    size_t laneIndex = header.kind == MessageKind::Collective ? p.nextLane : 0;
    Lane& lane = p.lanes[laneIndex];
    if (p.freeRemote.size() <= creditReserve || p.freeStaging.empty() ||
        sendQueueFull(lane, direct ? 2 : 1)) {
      return false;
    }
    int remote = p.freeRemote.front();
    int staging = p.freeStaging.back();
    uint8_t* slot = stagingSlot(peer, staging);
    Header h = header;
    h.credits = takePiggybackCredits(p);
    if (direct) h.flags |= kDirect;
    std::memcpy(slot, &h, sizeof h);
    std::shared_ptr<const Registration> registration;
    if (owner && options.registrations != nullptr && header.payload >= options.zeroCopyMinBytes) {
      registration = options.registrations->find(data, header.payload);
    }
    if (header.payload > 0 && !registration) {
      std::memcpy(slot + kHeaderBytes, data, header.payload);
    }
    const auto wrId = pack(WrId{WrKind::WriteImm, static_cast<uint8_t>(laneIndex),
                                static_cast<uint16_t>(peer), static_cast<uint32_t>(staging)});
    // The payload: after the header in the slot, or gathered from the user's
    // registered buffer; to the slot, or (direct) to the peer's destination.
    const void* payloadAt = registration ? data : slot + kHeaderBytes;
    uint32_t payloadKey = registration ? registration->lkey : stagingMr->lkey;
    std::array<verbs::WriteRequest, 2> wrs;
    size_t count = 0;
    if (direct && header.payload > 0) {
      wrs[count++] = verbs::WriteRequest{.wrId = wrId,
                                         .local = payloadAt,
                                         .lkey = payloadKey,
                                         .length = header.payload,
                                         .remoteAddr = direct->addr,
                                         .rkey = direct->rkey,
                                         .signaled = false};
    }
    verbs::WriteRequest& w = wrs[count++];
    w = verbs::WriteRequest{
        .wrId = wrId,
        .local = slot,
        .lkey = stagingMr->lkey,
        .length =
            static_cast<uint32_t>(kHeaderBytes + (registration || direct ? 0 : header.payload)),
        .remoteAddr = p.remoteBase + static_cast<uint64_t>(remote) * options.slotBytes,
        .rkey = p.rkey,
        .imm = static_cast<uint32_t>(remote)};
    // Small messages go inline: the provider copies them into the work
    // request, so the staging slot is free again as soon as the post returns
    // (not when a direct write still reads its payload from the slot).
    w.inlineData = !registration && !direct && w.length <= lane.maxInline;
    // A zero-copy write's completion lets its operation finish: always signaled.
    w.signaled = registration != nullptr || mustSignal(p, lane, !w.inlineData);
    if (registration && !direct) {
      w.local2 = payloadAt;
      w.lkey2 = payloadKey;
      w.length2 = header.payload;
    }
    if (int rc = verbs::postWrites(lane.qp, std::span(wrs.data(), count)); rc != 0) {
      throw verbs::verbsError("ibv_post_send", rc,
                              fmt::format("posting a message to rank {}", peer));
    }
    if (count == 2) posted(lane, -1, false);  // the direct payload write
    if (header.kind == MessageKind::Collective) p.nextLane = (p.nextLane + 1) % p.lanes.size();
    if (registration) {
      owner->ranges.emplace_back(data, header.payload);
      p.slotWrites[static_cast<size_t>(staging)] =
          SlotWrite{std::move(registration), owner, data, header.payload};
    }
    p.freeRemote.pop_front();
    p.ledger.written(remote);
    if (w.inlineData) {
      posted(lane, -1, w.signaled);
    } else {
      p.freeStaging.pop_back();
      posted(lane, staging, w.signaled);
    }
    if (logEnabled(LogLevel::Trace))
      log(LogLevel::Trace, "-> rank {} slot {} lane {}: {}{}{}", peer, remote, laneIndex,
          describe(header), p.slotWrites[static_cast<size_t>(staging)].owner ? " (zero-copy)" : "",
          direct ? " (direct)" : "");
    return true;
  }

  // Hands a consumed slot back to its sender: on the next message to it, or
  // by a credit message once half the peer's slots wait (so a one-way stream
  // never stalls), or when the engine has nothing else to do and the peer may
  // be short of slots (step()).
  void release(int peer, int slot) {
    PeerState& p = peers[static_cast<size_t>(peer)];
    p.pendingCredits.push_back(slot);
    if (p.pendingCredits.size() * 2 >= static_cast<size_t>(options.slotsPerPeer)) {
      flushCredits(peer);
    }
  }

  // Whether the peer may be short of slots in our region: at least half of
  // them are consumed but not handed back, or hold messages we have not
  // consumed yet. Below that the peer still has half its window (less what
  // is in flight to us, which arrives and is counted then), so credits can
  // wait for a message to ride on instead of costing a post each: a rank
  // that only receives (broadcast, the leaves of a tree) used to send one
  // credit message per operation.
  bool peerMayStall(const PeerState& p) const {
    return !p.pendingCredits.empty() && (p.pendingCredits.size() + p.inbox.size()) * 2 >=
                                            static_cast<size_t>(options.slotsPerPeer);
  }

  static uint64_t takePiggybackCredits(PeerState& p) {
    uint64_t mask = 0;
    for (auto it = p.pendingCredits.begin(); it != p.pendingCredits.end();) {
      if (*it < 64) {
        mask |= uint64_t{1} << *it;
        p.ledger.handedBack(*it);
        it = p.pendingCredits.erase(it);
      } else {
        ++it;
      }
    }
    return mask;
  }

  bool flushCredits(int peer) {
    PeerState& p = peers[static_cast<size_t>(peer)];
    Lane& lane = p.lanes[0];
    bool any = false;
    while (!p.pendingCredits.empty() && !sendQueueFull(lane)) {
      const uint32_t imm = credits::take(p.pendingCredits);
      credits::forEach(imm, [&](int slot) { p.ledger.handedBack(slot); });
      verbs::WriteRequest w{.wrId = pack(WrId{WrKind::Control, 0, static_cast<uint16_t>(peer), 0}),
                            .remoteAddr = p.remoteBase,
                            .rkey = p.rkey,
                            .imm = imm,
                            .signaled = mustSignal(p, lane, false)};
      if (int rc = verbs::postWrite(lane.qp, w); rc != 0) {
        throw verbs::verbsError("ibv_post_send", rc,
                                fmt::format("returning credits to rank {}", peer));
      }
      posted(lane, -1, w.signaled);
      any = true;
    }
    return any;
  }

  // --------------------------------------------------------- completions --

  bool pollCompletions() {
    std::array<ibv_wc, 64> wcs;
    int n = mesh.cq().poll(wcs);
    for (int i = 0; i < n; ++i) {
      const ibv_wc& wc = wcs[static_cast<size_t>(i)];
      WrId id = unpack(wc.wr_id);
      int peer = id.peer;
      if (logEnabled(LogLevel::Trace)) {
        log(LogLevel::Trace, "wc kind {} peer {} tag {} status {} opcode {}",
            static_cast<int>(id.kind), peer, id.tag, static_cast<int>(wc.status),
            static_cast<int>(wc.opcode));
      }
      if (wc.status != IBV_WC_SUCCESS) {
        // A departed peer's queue pair fails our pending credits; the
        // operations that needed the peer were failed when it disconnected.
        if (dead[static_cast<size_t>(peer)]) continue;
        const char* what = id.kind == WrKind::Recv ? "a receive" : "an RDMA write";
        bool known = false;
        for (const auto& f : failedCompletions) known = known || f.peer == peer;
        if (!known) {
          failedCompletions.push_back(
              FailedCompletion{peer, verbs::completionError(wc, peer, mesh.peerAddress(peer), what),
                               Clock::now() + kDepartureGrace});
        }
        continue;
      }
      PeerState& p = peers[static_cast<size_t>(peer)];
      switch (id.kind) {
        case WrKind::Recv:
          onReceive(peer, id.qp,
                    wire::Completion{.rdmaWriteWithImm = wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM,
                                     .withImm = (wc.wc_flags & IBV_WC_WITH_IMM) != 0,
                                     .imm = ntohl(wc.imm_data),
                                     .byteLen = wc.byte_len},
                    wc.wr_id);
          break;
        default:
          writesCompleted(p, p.lanes[id.qp]);
          break;
      }
    }
    return n > 0;
  }

  // A signaled write completed: so did every write posted before it.
  void writesCompleted(PeerState& p, Lane& lane) {
    while (!lane.posted.empty()) {
      Lane::Posted w = lane.posted.front();
      lane.posted.pop_front();
      if (w.staging >= 0) {
        p.freeStaging.push_back(w.staging);
        SlotWrite& zc = p.slotWrites[static_cast<size_t>(w.staging)];
        if (zc.owner) {
          zc.owner->done(zc.data, zc.bytes);
          zc = SlotWrite{};
        }
      }
      if (w.signaled) return;
    }
  }

  // A peer that breaks the protocol breaks the group: its message is never
  // used, and the error names it and what it sent.
  Error protocolViolation(int peer, const wire::Violation& v) const {
    return Error(ErrorInfo{
        .kind = ErrorKind::Protocol,
        .message = fmt::format("rank {} sent {}", peer, v.what),
        .peerRank = peer,
        .peerAddress = mesh.peerAddress(peer),
        .hint = "every rank must run the same rdmacc version with the same RDMACC_SLOTS_PER_PEER "
                "and RDMACC_SLOT_BYTES; anything else is a bug or a stranger on the network"});
  }

  // A slot of the peer's handed back (checked by wire::): ours to write again.
  static void credited(PeerState& p, int slot) {
    p.ledger.credited(slot);
    p.freeRemote.push_back(slot);
  }

  void onReceive(int peer, size_t laneIndex, const wire::Completion& completion, uint64_t wrId) {
    PeerState& p = peers[static_cast<size_t>(peer)];
    if (int rc = verbs::postEmptyRecvs(p.lanes[laneIndex].qp, wrId, 1); rc != 0) {
      throw verbs::verbsError("ibv_post_recv", rc,
                              fmt::format("reposting a receive for rank {}", peer));
    }
    const wire::Limits limits{.slotsPerPeer = options.slotsPerPeer, .slotBytes = options.slotBytes};
    wire::Arrival arrival;
    if (auto bad = wire::checkCompletion(completion, limits, p.ledger, arrival)) {
      throw protocolViolation(peer, *bad);
    }
    if (arrival.credit) {
      credits::forEach(completion.imm, [&](int slot) { credited(p, slot); });
      return;
    }
    const int slot = arrival.slot;
    Incoming in{slot, {}, arrivals++};
    std::memcpy(&in.header, recvSlot(peer, slot), sizeof in.header);
    if (auto bad = wire::checkHeader(in.header, completion.byteLen, limits, p.ledger)) {
      throw protocolViolation(peer, wire::Violation{fmt::format("{} (slot {})", bad->what, slot)});
    }
    p.ledger.arrived(slot);
    for (uint64_t m = in.header.credits; m != 0; m &= m - 1) credited(p, std::countr_zero(m));
    if (in.header.kind == MessageKind::Advert) {
      const Header& h = in.header;
      release(peer, slot);
      // One for an operation this rank finished (it sent everything through
      // the slots first) is of no use any more.
      if (lastFinished && static_cast<int32_t>(h.sequence - *lastFinished) <= 0) return;
      if (p.adverts.size() >= kMaxAdvertsPerPeer) {
        throw protocolViolation(
            peer, wire::Violation{fmt::format("more than {} adverts not yet used ({})",
                                              kMaxAdvertsPerPeer, describe(h))});
      }
      p.adverts.push_back(Advert{.sequence = h.sequence,
                                 .step = h.step,
                                 .opType = h.opType,
                                 .check = h.check,
                                 .addr = h.addr,
                                 .rkey = h.rkey,
                                 .length = h.length});
      if (logEnabled(LogLevel::Trace))
        log(LogLevel::Trace, "<- rank {} slot {}: {}", peer, slot, describe(h));
      return;
    }
    if (in.header.kind == MessageKind::Abort) {
      std::string text(reinterpret_cast<const char*>(recvSlot(peer, slot)) + kHeaderBytes,
                       in.header.payload);
      release(peer, slot);
      // The root cause as the reporting rank saw it (a rank it lost), or
      // the reporting rank itself.
      const uint64_t root = in.header.check;
      const bool relayed = root > 0 && root <= static_cast<uint64_t>(size) &&
                           root - 1 != static_cast<uint64_t>(rank);
      const int cause = relayed ? static_cast<int>(root - 1) : peer;
      breakGroup(Error(ErrorInfo{
                     .kind = ErrorKind::PeerFailure,
                     .message = relayed ? fmt::format("rank {} reported a failure of rank {}: {}",
                                                      peer, cause, text)
                                        : fmt::format("rank {} reported a failure: {}", peer, text),
                     .peerRank = cause,
                     .peerAddress = mesh.peerAddress(cause)}),
                 /*tellPeers=*/false);
      return;
    }
    if (logEnabled(LogLevel::Trace))
      log(LogLevel::Trace, "<- rank {} slot {}: {}", peer, slot, describe(in.header));
    p.inbox.push_back(in);
  }

  // Whether the operation still has to exchange messages with peer.
  bool needs(const Active& a, int peer) const {
    const Operation& op = *a.op;
    if (op.pointToPoint) return op.peer == peer || (op.peer < 0 && a.source == peer);
    for (size_t k = a.started ? a.step : 0; k < op.steps().size(); ++k) {
      const Step& s = op.steps()[k];
      for (size_t i = 0; i < s.sends.size(); ++i) {
        bool done =
            a.started && k == a.step && a.sentMessages[i] == messages(s.sends[i].range.bytes);
        if (s.sends[i].peer == peer && !done) return true;
      }
      for (size_t j = 0; j < s.recvs.size(); ++j) {
        bool done =
            a.started && k == a.step && a.receivedMessages[j] == messages(s.recvs[j].range.bytes);
        if (s.recvs[j].peer == peer && !done) return true;
      }
    }
    return false;
  }

  Error peerGone(int peer) const {
    return Error(ErrorInfo{
        .kind = ErrorKind::PeerFailure,
        .message = fmt::format("rank {} disconnected", peer),
        .call = "rdma_get_cm_event",
        .status = "RDMA_CM_EVENT_DISCONNECTED",
        .peerRank = peer,
        .peerAddress = mesh.peerAddress(peer),
        .hint = "its process exited or crashed, or destroyed its backend early; see its output"});
  }

  // A departed peer fails the operations that still need it (and so the
  // group); operations that are past it finish normally. The verdict waits a
  // grace period: the peer's last messages may still sit in our completion
  // queue when the disconnect event arrives.
  bool pollConnectionEvents() {
    auto gone = mesh.takeDisconnectedPeers();
    bool progress = !gone.empty();
    auto now = Clock::now();
    for (int peer : gone) {
      if (dead[static_cast<size_t>(peer)]) continue;
      dead[static_cast<size_t>(peer)] = true;
      departures.emplace_back(peer, now + kDepartureGrace);
      // Its failed writes are explained by its departure.
      std::erase_if(failedCompletions, [&](const FailedCompletion& f) { return f.peer == peer; });
    }
    for (auto it = failedCompletions.begin(); it != failedCompletions.end();) {
      if (it->verdict > now) {
        ++it;
        continue;
      }
      Error error = it->error;
      failedCompletions.erase(it);
      breakGroup(error);
      return true;
    }
    for (auto it = departures.begin(); it != departures.end();) {
      if (it->second > now) {
        ++it;
        continue;
      }
      int peer = it->first;
      it = departures.erase(it);
      bool needed = false;
      for (const auto& a : collectives) needed = needed || needs(*a, peer);
      for (const auto& a : pointToPoint) needed = needed || needs(*a, peer);
      if (needed) {
        // The others learn it from this rank (with the dead rank as the
        // cause) rather than from this rank's own departure later.
        breakGroup(peerGone(peer));
        progress = true;
      } else {
        log(LogLevel::Info, "rank {} disconnected; operations that involve it will fail", peer);
      }
    }
    return progress;
  }

  // --------------------------------------------------------- collectives --

  void finalize(Active& a, const std::vector<Range>& ranges) {
    const Operation& op = *a.op;
    if (op.avgDivisor <= 1) return;
    for (const Range& r : ranges) {
      divideBy(op.recvBase + r.offset, r.bytes / elementSize(op.dtype), op.dtype, op.avgDivisor);
    }
  }

  void enterStep(Active& a) {
    const Step& s = a.op->steps()[a.step];
    a.sent.assign(s.sends.size(), 0);
    a.sentMessages.assign(s.sends.size(), 0);
    a.received.assign(s.recvs.size(), 0);
    a.receivedMessages.assign(s.recvs.size(), 0);
    finalize(a, s.finalize);
  }

  using InboxIt = std::vector<Incoming>::iterator;

  // The message with chunk `index` of the current step from peer, if it
  // arrived. Chunks may overtake each other across lanes and a peer may be a
  // step or an operation ahead, so the inbox is searched by key; a message of
  // this operation that disagrees on what the operation is (or one of an
  // earlier operation) is a mismatch: the ranks called different collectives.
  std::optional<InboxIt> findCollective(const Active& a, int peer, uint32_t index, size_t payload) {
    const Operation& op = *a.op;
    auto sequence = static_cast<uint32_t>(op.sequence);
    auto& box = peers[static_cast<size_t>(peer)].inbox;
    for (auto it = box.begin(); it != box.end(); ++it) {
      const Header& h = it->header;
      if (h.kind != MessageKind::Collective) continue;
      if (h.sequence != sequence) {
        // One of an operation this rank already finished: the peer is out of
        // step. Any other belongs to another operation in flight, or to a
        // later one, and waits.
        if (static_cast<int32_t>(h.sequence - oldestSequence()) < 0) mismatch(a, peer, h, payload);
        continue;
      }
      if (h.opType != static_cast<uint8_t>(op.type) || h.check != op.checkValue) {
        mismatch(a, peer, h, payload);
      }
      if (h.step == a.step && h.chunk == index) {
        if (h.payload != payload) mismatch(a, peer, h, payload);
        return it;
      }
    }
    return std::nullopt;
  }

  uint32_t oldestSequence() const {
    return static_cast<uint32_t>(collectives.front()->op->sequence);
  }

  void consume(int peer, InboxIt in) {
    int slot = in->slot;
    peers[static_cast<size_t>(peer)].inbox.erase(in);
    release(peer, slot);
  }

  [[noreturn]] void mismatch(const Active& a, int peer, const Header& got, size_t expectedPayload) {
    const Operation& op = *a.op;
    throw Error(ErrorInfo{
        .kind = ErrorKind::Protocol,
        .message = fmt::format(
            "rank {} sent {} while this rank expects {} #{} step {} (check {:#x}, {} bytes)", peer,
            describe(got), toString(op.type), op.sequence, a.step, op.checkValue, expectedPayload),
        .peerRank = peer,
        .peerAddress = mesh.peerAddress(peer),
        .hint = "every rank must call the same collectives in the same order with the same sizes, "
                "dtypes, roots "
                "and reduce ops"});
  }

  // Copy receives into memory the user registered, of at least
  // zeroCopyMinBytes: the sending peer may write them straight into place.
  // Every schedule keeps what makes this safe at any time after the start
  // (schedule.hpp): a Copy receive's destination is not read or written by
  // this rank before the receive, except by accesses the sender's data
  // depends on.
  void prepareAdverts(Active& a) {
    const Operation& op = *a.op;
    // Nothing registered (the common case): no bookkeeping per operation.
    if (options.registrations == nullptr || op.recvBase == nullptr ||
        options.registrations->entries() == 0) {
      return;
    }
    for (size_t k = 0; k < op.steps().size(); ++k) {
      const auto& recvs = op.steps()[k].recvs;
      for (size_t j = 0; j < recvs.size(); ++j) {
        const RecvSpec& r = recvs[j];
        if (r.combine != Combine::Copy || r.range.bytes == 0 ||
            r.range.bytes < options.zeroCopyMinBytes || r.range.bytes > UINT32_MAX) {
          continue;
        }
        const uint8_t* dst = op.recvBase + r.range.offset;
        auto registration = options.registrations->find(dst, r.range.bytes);
        if (!registration) continue;
        if (a.advertised.empty()) {  // the first: the table for every step and receive
          a.advertised.resize(op.steps().size());
          for (size_t i = 0; i < op.steps().size(); ++i) {
            a.advertised[i].assign(op.steps()[i].recvs.size(), 0);
          }
        }
        a.advertised[k][j] = 1;
        a.advertsToSend.emplace_back(r.peer,
                                     Header{.kind = MessageKind::Advert,
                                            .opType = static_cast<uint8_t>(op.type),
                                            .sequence = static_cast<uint32_t>(op.sequence),
                                            .step = static_cast<uint32_t>(k),
                                            .check = op.checkValue,
                                            .addr = reinterpret_cast<uintptr_t>(dst),
                                            .rkey = registration->rkey,
                                            .length = static_cast<uint32_t>(r.range.bytes)});
        a.exposed.push_back(std::move(registration));
      }
    }
  }

  // Where the chunk at `offset` of this step's send to peer goes when the
  // peer advertised the receive; nullopt: through its slots.
  std::optional<DirectTarget> directTarget(const Active& a, int peer, size_t offset,
                                           size_t payload) {
    const Operation& op = *a.op;
    for (const Advert& ad : peers[static_cast<size_t>(peer)].adverts) {
      if (ad.sequence != static_cast<uint32_t>(op.sequence) || ad.step != a.step) continue;
      // One that disagrees with this operation: the slots path reports the mismatch.
      if (ad.opType != static_cast<uint8_t>(op.type) || ad.check != op.checkValue ||
          offset + payload > ad.length) {
        return std::nullopt;
      }
      return DirectTarget{ad.addr + offset, ad.rkey};
    }
    return std::nullopt;
  }

  void finishedCollective(uint32_t sequence) {
    lastFinished = sequence;
    for (PeerState& p : peers) {
      std::erase_if(p.adverts, [&](const Advert& ad) {
        return static_cast<int32_t>(ad.sequence - sequence) <= 0;
      });
    }
  }

  bool advanceCollective(Active& a) {
    Operation& op = *a.op;
    bool progress = false;
    if (!a.started) {
      for (int peer = 0; peer < size; ++peer) {
        if (dead[static_cast<size_t>(peer)] && needs(a, peer)) throw peerGone(peer);
      }
      a.started = true;
      a.deadline = Clock::now() + op.timeout;
      if (logEnabled(LogLevel::Trace))
        log(LogLevel::Trace, "start {} ({} steps)", op.description(), op.steps().size());
      if (op.copyIn.bytes > 0 && op.copyIn.to != op.copyIn.from) {
        std::memmove(op.copyIn.to, op.copyIn.from, op.copyIn.bytes);
      }
      if (op.prologue) op.prologue();
      if (!op.steps().empty()) enterStep(a);
      prepareAdverts(a);
      progress = true;
    }
    while (a.advertsSent < a.advertsToSend.size()) {
      auto& [peer, header] = a.advertsToSend[a.advertsSent];
      if (!trySend(peer, header, nullptr)) break;
      ++a.advertsSent;
      progress = true;
    }
    while (a.step < op.steps().size()) {
      const Step& s = op.steps()[a.step];
      bool complete = true;
      for (size_t i = 0; i < s.sends.size(); ++i) {
        const SendSpec& send = s.sends[i];
        size_t bytes = send.range.bytes;
        while (a.sentMessages[i] < messages(bytes)) {
          size_t available = bytes;
          bool gatesDone = true;
          for (int g : send.gates) {
            available = std::min(available, a.received[static_cast<size_t>(g)]);
            gatesDone = gatesDone && a.receivedMessages[static_cast<size_t>(g)] ==
                                         messages(s.recvs[static_cast<size_t>(g)].range.bytes);
          }
          size_t payload = std::min(chunk, bytes - a.sent[i]);
          if (a.sent[i] + payload > available || (payload == 0 && !gatesDone)) break;
          Header h{.kind = MessageKind::Collective,
                   .opType = static_cast<uint8_t>(op.type),
                   .sequence = static_cast<uint32_t>(op.sequence),
                   .step = static_cast<uint32_t>(a.step),
                   .payload = static_cast<uint32_t>(payload),
                   .chunk = static_cast<uint32_t>(a.sentMessages[i]),
                   .check = op.checkValue};
          if (!trySend(send.peer, h, op.sendBase + send.range.offset + a.sent[i], a.zeroCopy,
                       directTarget(a, send.peer, a.sent[i], payload))) {
            break;
          }
          a.sent[i] += payload;
          ++a.sentMessages[i];
          progress = true;
        }
        complete = complete && a.sentMessages[i] == messages(bytes);
      }
      for (size_t j = 0; j < s.recvs.size(); ++j) {
        const RecvSpec& recv = s.recvs[j];
        size_t bytes = recv.range.bytes;
        while (a.receivedMessages[j] < messages(bytes)) {
          if (recv.afterSend >= 0 &&
              a.sentMessages[static_cast<size_t>(recv.afterSend)] <= a.receivedMessages[j]) {
            break;  // that chunk is still to be sent from the bytes we would overwrite
          }
          size_t payload = std::min(chunk, bytes - a.received[j]);
          auto found =
              findCollective(a, recv.peer, static_cast<uint32_t>(a.receivedMessages[j]), payload);
          if (!found) break;
          InboxIt in = *found;
          uint8_t* dst = op.recvBase + recv.range.offset + a.received[j];
          if (in->header.flags & kDirect) {  // the payload is already in place
            if (a.advertised.empty() || !a.advertised[a.step][j]) {
              throw Error(ErrorInfo{
                  .kind = ErrorKind::Protocol,
                  .message = fmt::format("rank {} wrote {} directly, but this rank did not "
                                         "advertise that receive",
                                         recv.peer, describe(in->header)),
                  .peerRank = recv.peer,
                  .hint = "every rank must run the same rdmacc version"});
            }
          } else {
            if (a.zeroCopy->overlaps(dst, payload)) break;  // a write still reads these bytes
            const uint8_t* src = recvSlot(recv.peer, in->slot) + kHeaderBytes;
            if (recv.combine == Combine::Copy) {
              if (payload > 0) std::memcpy(dst, src, payload);
            } else {
              reduceInto(dst, src, payload / elementSize(op.dtype), op.dtype, op.reduceOp);
            }
          }
          consume(recv.peer, in);
          a.received[j] += payload;
          ++a.receivedMessages[j];
          progress = true;
        }
        complete = complete && a.receivedMessages[j] == messages(bytes);
      }
      if (!complete) return progress;
      if (a.step + 1 < op.steps().size()) {
        for (const Range& r : op.steps()[a.step + 1].finalize) {
          if (a.zeroCopy->overlaps(op.recvBase + r.offset, r.bytes)) return progress;
        }
      }
      ++a.step;
      if (a.step < op.steps().size()) enterStep(a);
      progress = true;
    }
    // The epilogue may write the buffers, and the caller may reuse them once
    // the work completes.
    if (!a.zeroCopy->ranges.empty()) return progress;
    if (op.epilogue) op.epilogue();
    a.finished = true;
    return true;
  }

  // ------------------------------------------------------ point to point --

  bool advanceSend(Active& a) {
    Operation& op = *a.op;
    bool progress = false;
    while (a.chunks < messages(op.bytes)) {
      size_t payload = std::min(chunk, op.bytes - a.done);
      Header h{.kind = MessageKind::PointToPoint,
               .sequence = op.tag,
               .step = a.chunks,
               .payload = static_cast<uint32_t>(payload),
               .check = op.bytes};
      if (!trySend(op.peer, h, op.buffer + a.done, a.zeroCopy)) break;
      a.done += payload;
      ++a.chunks;
      progress = true;
    }
    return progress;
  }

  bool advanceRecv(Active& a) {
    Operation& op = *a.op;
    bool progress = false;
    while (a.chunks < messages(op.bytes)) {
      std::optional<InboxIt> match;
      int from = -1;
      auto look = [&](int peer) {
        auto& box = peers[static_cast<size_t>(peer)].inbox;
        for (auto it = box.begin(); it != box.end(); ++it) {
          if (it->header.kind == MessageKind::PointToPoint && it->header.sequence == op.tag &&
              it->header.step == a.chunks) {
            if (!match || it->arrival < (*match)->arrival) match = it, from = peer;
            return;
          }
        }
      };
      if (a.source >= 0) {
        look(a.source);
      } else {
        for (int peer = 0; peer < size; ++peer) {
          if (peer != rank) look(peer);
        }
      }
      if (!match) break;
      InboxIt found = *match;
      if (found->header.check != op.bytes) {
        throw Error(ErrorInfo{
            .kind = ErrorKind::InvalidArgument,
            .message =
                fmt::format("rank {} sent {} bytes with tag {}, but the receive expects {} bytes",
                            from, found->header.check, op.tag, op.bytes),
            .peerRank = from,
            .hint =
                "the tensors of a send and its matching recv must have the same size and dtype"});
      }
      if (auto bad = wire::checkPointToPointChunk(found->header, op.bytes, a.done, chunk)) {
        throw protocolViolation(from, *bad);
      }
      size_t payload = found->header.payload;
      if (payload > 0)
        std::memcpy(op.buffer + a.done, recvSlot(from, found->slot) + kHeaderBytes, payload);
      consume(from, found);
      a.source = from;
      a.done += payload;
      ++a.chunks;
      progress = true;
    }
    return progress;
  }

  bool advancePointToPoint() {
    if (pointToPoint.empty()) return false;
    bool progress = false;
    streaming.assign(static_cast<size_t>(size), 0);  // one send per peer at a time
    for (auto it = pointToPoint.begin(); it != pointToPoint.end();) {
      Active& a = **it;
      Operation& op = *a.op;
      if (!a.started) {
        if (op.peer >= 0 && dead[static_cast<size_t>(op.peer)]) throw peerGone(op.peer);
        a.started = true;
        a.deadline = Clock::now() + op.timeout;
        if (op.peer >= 0) a.source = op.peer;
      }
      if (op.isSend) {
        if (streaming[static_cast<size_t>(op.peer)]) {
          ++it;
          continue;
        }
        streaming[static_cast<size_t>(op.peer)] = true;
        progress |= advanceSend(a);
      } else {
        progress |= advanceRecv(a);
      }
      if (a.chunks == messages(op.bytes) && a.zeroCopy->ranges.empty()) {
        op.work->finish(nullptr, a.source);
        recycle(std::move(*it));
        it = pointToPoint.erase(it);
        progress = true;
      } else {
        ++it;
      }
    }
    return progress;
  }

  // ------------------------------------------------------------- failure --

  std::vector<int> awaited(const Active& a) const {
    std::vector<int> out;
    const Operation& op = *a.op;
    if (op.pointToPoint) {
      if (a.source >= 0) out.push_back(a.source);
      return out;
    }
    if (!a.started || a.step >= op.steps().size()) return out;
    const Step& s = op.steps()[a.step];
    for (size_t j = 0; j < s.recvs.size(); ++j) {
      if (a.receivedMessages[j] < messages(s.recvs[j].range.bytes)) out.push_back(s.recvs[j].peer);
    }
    for (size_t i = 0; i < s.sends.size(); ++i) {
      if (a.sentMessages[i] < messages(s.sends[i].range.bytes) &&
          std::find(out.begin(), out.end(), s.sends[i].peer) == out.end()) {
        out.push_back(s.sends[i].peer);
      }
    }
    return out;
  }

  void checkDeadlines() {
    auto now = Clock::now();
    auto expired = [&](const Active& a) { return a.started && now > a.deadline; };
    const Active* late = nullptr;
    for (const auto& a : collectives) {
      if (late == nullptr && expired(*a)) late = a.get();
    }
    for (const auto& a : pointToPoint) {
      if (late == nullptr && expired(*a)) late = a.get();
    }
    if (late == nullptr) return;
    auto waiting = awaited(*late);
    const Operation& op = *late->op;
    breakGroup(Error(ErrorInfo{
        .kind = ErrorKind::Timeout,
        .message = fmt::format("{} timed out after {} ms{}", op.description(), op.timeout.count(),
                               waiting.empty() ? std::string()
                                               : fmt::format(", still waiting for rank(s) {}",
                                                             fmt::join(waiting, ", "))),
        .peerRank = waiting.size() == 1 ? waiting.front() : -1,
        .hint =
            "a rank is missing, slower, or called different collectives; raise the op's timeout "
            "(RDMACC_TIMEOUT) if it is only slow"}));
  }

  // Fails everything pending; later submissions fail at once.
  void breakGroup(const Error& error, bool tellPeers = true) {
    if (broken) return;
    broken = error;
    bool pending = !collectives.empty() || !pointToPoint.empty();
    log(pending ? LogLevel::Error : LogLevel::Info, "group '{}' is broken: {}", options.group,
        error.what());
    {
      std::lock_guard lock(intakeMutex);
      brokenShared = true;
      brokenCopy = error;
    }
    if (tellPeers) {
      // The rank at the root of the failure travels with it (check = root +
      // 1; 0: this rank itself), so every survivor names the same rank.
      std::string text = std::string(error.what()).substr(0, chunk);
      const int root = error.info().peerRank;
      for (int peer = 0; peer < size; ++peer) {
        if (peer == rank || dead[static_cast<size_t>(peer)]) continue;
        Header h{.kind = MessageKind::Abort,
                 .payload = static_cast<uint32_t>(text.size()),
                 .check = root >= 0 && root < size && root != peer ? static_cast<uint64_t>(root) + 1
                                                                   : 0};
        try {
          trySend(peer, h, reinterpret_cast<const uint8_t*>(text.data()));
        } catch (const Error&) {  // best effort: the peer may be the one that failed
        }
      }
    }
    failAll(error);
  }

  void failAll(const Error& error) {
    auto fail = [&](Active& a) {
      ErrorInfo info = error.info();
      if (std::string what = a.op->description(); info.message.find(what) == std::string::npos) {
        info.message = fmt::format("{} failed: {}", what, info.message);
      }
      a.op->work->finish(std::make_exception_ptr(Error(std::move(info))));
    };
    for (auto& a : collectives) fail(*a);
    for (auto& a : pointToPoint) fail(*a);
    collectives.clear();
    pointToPoint.clear();
  }

  // ---------------------------------------------------------------- loop --

  bool takeIntake() {
    if (!intakePending.load(std::memory_order_acquire)) return false;
    std::vector<std::unique_ptr<Operation>>& ops = intakeTaken;  // empty, with capacity
    std::optional<std::string> abortReason;
    {
      std::lock_guard lock(intakeMutex);
      intakePending.store(false, std::memory_order_relaxed);
      ops.swap(intake);
      abortReason.swap(abortRequest);
    }
    if (abortReason) breakGroup(Error(ErrorKind::Aborted, *abortReason));
    const bool any = !ops.empty();
    for (auto& op : ops) {
      std::unique_ptr<Active> a;
      if (spareActives.empty()) {
        a = std::make_unique<Active>();
      } else {
        a = std::move(spareActives.back());
        spareActives.pop_back();
      }
      a->op = std::move(op);
      if (a->op->pointToPoint) {
        a->latencyBound = a->op->bytes <= chunk;
        pointToPoint.push_back(std::move(a));
      } else {
        computeFootprint(*a);
        collectives.push_back(std::move(a));
      }
    }
    ops.clear();
    if (broken) failAll(*broken);
    return any || abortReason.has_value();
  }

  void computeFootprint(Active& a) const {
    const Operation& op = *a.op;
    // A barrier is a fence: it starts after every earlier collective finished
    // here and nothing starts before it completes, so that a completed
    // barrier still means every rank is done with what came before it.
    a.opaque = static_cast<bool>(op.prologue) || static_cast<bool>(op.epilogue) ||
               op.type == OpType::Barrier;
    a.footprint = {};
    a.latencyBound = true;
    for (const Step& s : op.steps()) {
      for (const SendSpec& send : s.sends) {
        a.latencyBound &= send.range.bytes <= chunk;
        a.footprint[0].cover(op.sendBase, send.range.offset, send.range.bytes);
      }
      for (const RecvSpec& recv : s.recvs) {
        a.footprint[1].cover(op.recvBase, recv.range.offset, recv.range.bytes);
      }
      for (const Range& r : s.finalize) a.footprint[1].cover(op.recvBase, r.offset, r.bytes);
    }
    a.footprint[1].cover(op.copyIn.to, 0, op.copyIn.bytes);
    a.footprint[2].cover(op.copyIn.from, 0, op.copyIn.bytes);
  }

  // Whether collectives[i] may start while the ones before it still run:
  // neither it nor any of them has opaque copies, and its memory does not
  // overlap theirs (a collective on the result of the previous one waits
  // for it, as it would on a stream).
  bool mayStartAhead(size_t i) const {
    const Active& a = *collectives[i];
    if (a.opaque) return false;
    for (size_t j = 0; j < i; ++j) {
      const Active& b = *collectives[j];
      if (b.finished) continue;
      if (b.opaque) return false;
      for (const Span& x : a.footprint) {
        for (const Span& y : b.footprint) {
          if (x.overlaps(y)) return false;
        }
      }
    }
    return true;
  }

  // A finished Active goes back to the pool (a few are enough: operations
  // finish about as fast as they start).
  void recycle(std::unique_ptr<Active> a) {
    if (spareActives.size() >= 64) return;
    a->reset();
    spareActives.push_back(std::move(a));
  }

  bool step() {
    bool progress = takeIntake();
    progress |= pollCompletions();
    // Two syscalls (rdma_get_cm_event on a non-blocking channel): every 10 ms
    // is plenty next to the departure grace.
    if (Clock::now() - lastConnectionCheck > std::chrono::milliseconds(10)) {
      lastConnectionCheck = Clock::now();
      progress |= pollConnectionEvents();
    }
    // The oldest collective runs, and up to collectivesInFlight - 1 later
    // ones that may start ahead (in submission order); they complete in
    // submission order.
    const size_t window = std::min(collectives.size(), options.collectivesInFlight);
    for (size_t i = 0; i < window && !broken; ++i) {
      Active& a = *collectives[i];
      if (a.finished) continue;
      if (!a.started && i > 0 && !mayStartAhead(i)) break;
      struct Reserve {  // reset even when advancing throws (aborts must still go out)
        size_t& value;
        ~Reserve() { value = 0; }
      } reserve{creditReserve};
      creditReserve = i == 0 ? 0 : static_cast<size_t>(options.slotsPerPeer + 1) / 2;
      bool before = a.started;
      bool moved = advanceCollective(a);
      progress |= moved || !before;
    }
    while (!broken && !collectives.empty() && collectives.front()->finished) {
      Active& a = *collectives.front();
      finishedCollective(static_cast<uint32_t>(a.op->sequence));
      a.op->work->finish(nullptr);
      recycle(std::move(collectives.front()));
      collectives.pop_front();
      progress = true;
    }
    if (!broken) progress |= advancePointToPoint();
    if (!broken) checkDeadlines();
    // How long to spin next: the oldest work's kind.
    latencyBound.store(!collectives.empty()    ? collectives.front()->latencyBound
                       : !pointToPoint.empty() ? pointToPoint.front()->latencyBound
                                               : false,
                       std::memory_order_relaxed);
    // Credits that found no message to ride on go now, before the engine
    // spins or sleeps, to a peer that may be waiting for them.
    if (!progress) {
      for (int peer = 0; peer < size; ++peer) {
        if (peer != rank && peerMayStall(peers[static_cast<size_t>(peer)])) {
          progress |= flushCredits(peer);
        }
      }
    }
    return progress;
  }

  // Blocks until a completion, a submission, an rdma_cm event or maxWait;
  // the engine thread (mayIdle) without pending work until one of the events.
  // Drivers use it too.
  void sleep(std::chrono::microseconds maxWait, bool mayIdle) {
    sleepers.fetch_add(1);  // seq_cst: pairs with submit()'s store and load
    struct Awake {
      std::atomic<int>& count;
      ~Awake() { count.fetch_sub(1); }
    } awake{sleepers};
    if (intakePending.load()) return;
    bool idle = false;
    {
      std::lock_guard lock(progressMutex);
      if (stopped) return;
      mesh.cq().arm();
      if (guardedStep()) return;  // a completion may have landed before the arm
      idle = mayIdle && collectives.empty() && pointToPoint.empty() && departures.empty() &&
             failedCompletions.empty();
    }
    waitForEvents(/*completions=*/true,
                  idle ? std::nullopt : std::optional<std::chrono::microseconds>(maxWait));
    std::lock_guard lock(progressMutex);
    mesh.cq().drainEvents();
  }

  // Blocks until a wake-up (eventfd), with `completions` also a completion or
  // an rdma_cm event, or `limit`; consumes the wake-up.
  void waitForEvents(bool completions, std::optional<std::chrono::microseconds> limit) {
    std::array<pollfd, 3> fds{
        {{wakeFd.get(), POLLIN, 0}, {mesh.cq().fd(), POLLIN, 0}, {mesh.eventFd(), POLLIN, 0}}};
    nfds_t count = !completions ? 1 : fds[2].fd >= 0 ? 3 : 2;
    timespec ts{};
    if (limit) {
      ts.tv_sec = limit->count() / 1000000;
      ts.tv_nsec = limit->count() % 1000000 * 1000;
    }
    if (::ppoll(fds.data(), count, limit ? &ts : nullptr, nullptr) > 0 &&
        (fds[0].revents & POLLIN)) {
      uint64_t v = 0;
      ssize_t ignored = ::read(wakeFd.get(), &v, sizeof v);
      (void)ignored;
    }
  }

  // step() with failures turned into a broken group. Under progressMutex.
  bool guardedStep() {
    try {
      return step();
    } catch (const Error& e) {
      breakGroup(e);
    } catch (const std::exception& e) {
      breakGroup(Error(ErrorKind::Internal, e.what()));
    }
    return true;
  }

  // A caller waiting for `work` makes progress itself until it completes or
  // `until`: polling while things move or for the spin time, then sleeping on
  // the completion channel (with pending work, deadlines are checked at least
  // every kSleepSlice). Work::wait() then blocks for what is left, if anything.
  void drive(const Work& work, Clock::time_point until) {
    drivers.fetch_add(1);
    auto lastProgress = Clock::now();
    bool completed = false;
    while (!(completed = work.isCompleted())) {
      bool progress = false;
      {
        std::unique_lock lock(progressMutex, std::try_to_lock);
        if (lock.owns_lock()) {
          if (stopped) break;
          progress = guardedStep();
        }
      }
      auto now = Clock::now();
      if (now >= until) break;
      if (progress) {
        lastProgress = now;
      } else if (now - lastProgress > spinTime()) {
        sleep(std::chrono::duration_cast<std::chrono::microseconds>(
                  std::min<Clock::duration>(until - now, kSleepSlice)),
              /*mayIdle=*/false);
        lastProgress = Clock::now();
      } else if (options.spinYield) {
        sched_yield();
      }
    }
    driverLeft.store(completed ? Clock::now().time_since_epoch().count() : 0);
    drivers.fetch_sub(1);
    if (!completed) wake();  // the engine thread takes over at once
  }

  std::chrono::microseconds spinTime() const {
    return latencyBound.load(std::memory_order_relaxed) ? options.spinLatencyBound : options.spin;
  }

  // How long the engine thread stays out of the way of drivers.
  std::chrono::microseconds driverPause() const {
    using std::chrono::microseconds;
    // A driver that leaves without its work done wakes the engine thread.
    if (drivers.load() > 0) return std::chrono::duration_cast<microseconds>(kSleepSlice);
    Clock::rep left = driverLeft.load();
    if (left == 0) return microseconds(0);
    auto since = Clock::now() - Clock::time_point(Clock::duration(left));
    if (since >= kDriverLinger) return microseconds(0);
    return std::chrono::duration_cast<microseconds>(kDriverLinger - since) + microseconds(1);
  }

  void run(const std::stop_token& stop) {
    auto lastProgress = Clock::now();
    while (!stop.stop_requested()) {
      if (auto pause = driverPause(); pause.count() > 0) {
        park(pause);
        lastProgress = Clock::now();
        continue;
      }
      bool progress = false;
      {
        std::lock_guard lock(progressMutex);
        progress = guardedStep();
      }
      auto now = Clock::now();
      if (progress) {
        lastProgress = now;
        continue;
      }
      if (now - lastProgress < spinTime()) {
        if (options.spinYield) sched_yield();
        continue;
      }
      try {
        sleep(kSleepSlice, /*mayIdle=*/true);
      } catch (const std::exception& e) {
        log(LogLevel::Error, "progress engine: {}", e.what());
      }
    }
    std::lock_guard lock(progressMutex);
    drain();
  }

  // While drivers make progress: wait for a wake-up or `pause`.
  void park(std::chrono::microseconds pause) { waitForEvents(/*completions=*/false, pause); }

  // Before the queue pairs go away, let the writes already posted land: a
  // peer may still be waiting for our last message of a completed operation.
  void drain() {
    auto deadline = Clock::now() + std::chrono::seconds(2);
    auto outstanding = [&] {
      for (int peer = 0; peer < size; ++peer) {
        if (peer == rank || dead[static_cast<size_t>(peer)]) continue;
        for (const Lane& lane : peers[static_cast<size_t>(peer)].lanes) {
          if (lane.sendQueueUsed() > 0) return true;
        }
      }
      return false;
    };
    try {
      // Unsignaled writes at the end are seen landing through a signaled
      // zero-byte write behind them (no immediate: it consumes no receive).
      for (int peer = 0; peer < size; ++peer) {
        PeerState& p = peers[static_cast<size_t>(peer)];
        if (peer == rank || dead[static_cast<size_t>(peer)]) continue;
        for (size_t i = 0; i < p.lanes.size(); ++i) {
          Lane& lane = p.lanes[i];
          if (lane.unsignaledRun == 0) continue;
          verbs::WriteRequest w{.wrId = pack(WrId{WrKind::Control, static_cast<uint8_t>(i),
                                                  static_cast<uint16_t>(peer), 0}),
                                .remoteAddr = p.remoteBase,
                                .rkey = p.rkey};
          if (verbs::postWrite(lane.qp, w) == 0) posted(lane, -1, true);
        }
      }
      while (outstanding() && Clock::now() < deadline) {
        if (!pollCompletions()) std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    } catch (const std::exception& e) {
      log(LogLevel::Debug, "while draining: {}", e.what());
    }
  }
};

size_t autoSlotBytes(int worldSize, int slotsPerPeer) {
  constexpr size_t kBudget = size_t{32} << 20;  // both regions together
  constexpr size_t kMin = size_t{16} << 10;
  size_t bytes = size_t{256} << 10;
  size_t perSlotOfEveryPeer = 2 * static_cast<size_t>(std::max(worldSize - 1, 1)) *
                              static_cast<size_t>(std::max(slotsPerPeer, 1));
  while (bytes > kMin && bytes * perSlotOfEveryPeer > kBudget) bytes /= 2;
  return bytes;
}

Engine::Engine(Mesh& mesh, Store& store, EngineOptions options)
    : impl_(std::make_unique<Impl>(mesh, options)) {
  Impl& s = *impl_;
  if (options.slotBytes == 0) {
    options.slotBytes = autoSlotBytes(s.size, options.slotsPerPeer);
    s.options.slotBytes = options.slotBytes;
  }
  if (options.slotBytes < 2 * kHeaderBytes || options.slotBytes % 64 != 0 ||
      options.slotBytes > (1u << 30)) {
    throw Error(
        ErrorKind::InvalidArgument, fmt::format("slot size {} is not usable", options.slotBytes),
        "RDMACC_SLOT_BYTES must be 0 (automatic) or a multiple of 64 between 128 and 1 GiB");
  }
  const auto recvDepth = mesh.qpParams().recvDepth;
  const auto sendDepth = mesh.qpParams().sendDepth;
  if (static_cast<uint32_t>(2 * options.slotsPerPeer + 4) > std::min(recvDepth, sendDepth)) {
    throw Error(
        ErrorKind::InvalidArgument,
        fmt::format("{} slots per peer need queue depths of at least {} (send {}, receive {})",
                    options.slotsPerPeer, 2 * options.slotsPerPeer + 4, sendDepth, recvDepth),
        "raise RDMACC_QP_SEND_DEPTH/RDMACC_QP_RECV_DEPTH or lower RDMACC_SLOTS_PER_PEER");
  }
  s.chunk = options.slotBytes - kHeaderBytes;
  // A group of one has no peers; its regions are a token slot.
  size_t region = s.size == 1 ? options.slotBytes
                              : static_cast<size_t>(s.size - 1) *
                                    static_cast<size_t>(options.slotsPerPeer) * options.slotBytes;
  s.recvRegion = PageBuffer(region);
  s.stagingRegion = PageBuffer(region);
  const size_t perPeer = static_cast<size_t>(options.slotsPerPeer) * options.slotBytes;
  std::string rkeys;
  for (int peer = 0; peer < s.size; ++peer) {
    if (peer == s.rank) continue;
    s.recvMrs.push_back(
        verbs::registerMemory(mesh.pd(), s.recvSlot(peer, 0), perPeer, verbs::kRemoteWriteAccess));
    rkeys += fmt::format("{}{}", rkeys.empty() ? "" : ",", s.recvMrs.back()->rkey);
  }
  s.stagingMr =
      verbs::registerMemory(mesh.pd(), s.stagingRegion.data(), region, IBV_ACCESS_LOCAL_WRITE);

  PrefixStore group("rdmacc/engine/" + options.group,
                    std::shared_ptr<Store>(&store, [](Store*) {}));
  // "base:slots:slotBytes:rkey,rkey,...": one rkey per peer, in rank order
  // without this rank.
  group.set(fmt::format("slots/{}", s.rank),
            toBytes(fmt::format("{}:{}:{}:{}", reinterpret_cast<uintptr_t>(s.recvRegion.data()),
                                options.slotsPerPeer, options.slotBytes, rkeys)));
  s.peers.resize(static_cast<size_t>(s.size));
  s.dead.assign(static_cast<size_t>(s.size), false);
  for (int peer = 0; peer < s.size; ++peer) {
    if (peer == s.rank) continue;
    const std::string key = fmt::format("slots/{}", peer);
    const std::string text = toString(group.get(key));
    const auto fields = splitFields(text, ':');
    if (fields.size() != 4) {
      throw Error(ErrorKind::Protocol,
                  fmt::format("rank {} published malformed slot information '{}'", peer, text));
    }
    const uint64_t base = storeNumber(fields[0], UINT64_MAX, key);
    const auto slots = static_cast<int>(storeNumber(fields[1], INT32_MAX, key));
    const size_t slotBytes = storeNumber(fields[2], SIZE_MAX, key);
    // Our rkey in the peer's list: its peers in rank order, without itself.
    const size_t mine = Impl::peerIndex(peer, s.rank);
    const auto peerRkeys = splitFields(fields[3], ',');
    if (peerRkeys.size() != static_cast<size_t>(s.size - 1)) {
      throw Error(ErrorKind::Protocol, fmt::format("rank {} published {} rkeys for a group of {}",
                                                   peer, peerRkeys.size(), s.size));
    }
    const auto rkey = static_cast<uint32_t>(storeNumber(peerRkeys[mine], UINT32_MAX, key));
    if (slots != options.slotsPerPeer || slotBytes != options.slotBytes) {
      throw Error(ErrorInfo{
          .kind = ErrorKind::InvalidArgument,
          .message = fmt::format("rank {} uses {} slots of {} bytes, this rank {} of {}", peer,
                                 slots, slotBytes, options.slotsPerPeer, options.slotBytes),
          .peerRank = peer,
          .hint = "set RDMACC_SLOTS_PER_PEER and RDMACC_SLOT_BYTES the same on every rank"});
    }
    PeerState& p = s.peers[static_cast<size_t>(peer)];
    p.lanes.resize(static_cast<size_t>(mesh.qpsPerPeer()));
    for (size_t i = 0; i < p.lanes.size(); ++i) {
      p.lanes[i].qp = mesh.qp(peer, static_cast<int>(i));
      p.lanes[i].maxInline = verbs::maxInlineData(p.lanes[i].qp);
    }
    p.remoteBase = base + mine * static_cast<uint64_t>(slots) * slotBytes;
    p.rkey = rkey;
    for (int i = 0; i < slots; ++i) {
      p.freeRemote.push_back(i);
      p.freeStaging.push_back(slots - 1 - i);
    }
    p.slotWrites.resize(static_cast<size_t>(slots));
    p.ledger = wire::SlotLedger(slots);
    // Bounded by the slots: reserved once, never allocated per message.
    p.inbox.reserve(static_cast<size_t>(slots));
    p.pendingCredits.reserve(static_cast<size_t>(slots));
    for (Lane& lane : p.lanes) lane.posted.reserve(mesh.qpParams().sendDepth);
  }
  s.wakeFd = net::Fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!s.wakeFd)
    throw errnoError(ErrorKind::Internal, "eventfd", errno, "starting the progress engine");
  gate_ = std::make_shared<DriverGate>();
  gate_->impl = impl_.get();
  s.thread = std::jthread([impl = impl_.get()](std::stop_token st) { impl->run(st); });
}

Engine::~Engine() {
  {
    std::lock_guard lock(impl_->progressMutex);
    impl_->stopped = true;  // drivers leave
  }
  impl_->wake();  // a sleeping one too
  {
    std::unique_lock lock(gate_->mutex);  // waits for the drivers inside
    gate_->impl = nullptr;
  }
  impl_->thread.request_stop();
  impl_->wake();
  if (impl_->thread.joinable()) impl_->thread.join();
  impl_->takeIntake();
  impl_->failAll(
      Error(ErrorKind::Aborted, "the backend was destroyed before the operation completed"));
}

std::string Operation::description() const {
  return detail[0] == '\0' ? fmt::format("{} #{}", toString(type), sequence)
                           : fmt::format("{} #{} ({})", toString(type), sequence, detail.data());
}

void Engine::submit(std::unique_ptr<Operation> op) {
  {
    std::lock_guard lock(impl_->intakeMutex);
    if (impl_->brokenShared) {
      ErrorInfo info = impl_->brokenCopy->info();
      info.message = fmt::format("{} cannot start: the group is broken by an earlier failure: {}",
                                 op->description(), info.message);
      op->work->finish(std::make_exception_ptr(Error(std::move(info))));
      return;
    }
    impl_->intake.push_back(std::move(op));
    impl_->intakePending.store(true);
  }
  if (impl_->sleepers.load() > 0) impl_->wake();
}

void Engine::abort(const std::string& reason) {
  {
    std::lock_guard lock(impl_->intakeMutex);
    impl_->abortRequest = reason;
    impl_->intakePending.store(true);
  }
  impl_->wake();
}

std::shared_ptr<const Work::ProgressDriver> Engine::driver() {
  return std::make_shared<const Work::ProgressDriver>(
      [gate = gate_](const Work& work, std::chrono::steady_clock::time_point until) {
        std::shared_lock lock(gate->mutex);
        if (gate->impl != nullptr) gate->impl->drive(work, until);
      });
}

size_t Engine::chunkBytes() const noexcept {
  return impl_->chunk;
}

}  // namespace rdmacc
