#include "src/engine.hpp"

#include <chrono>
#include <deque>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>

#include <fmt/format.h>

#include "rdmacc/error.hpp"
#include "rdmacc/log.hpp"
#include "src/active.hpp"
#include "src/blame.hpp"
#include "src/executor.hpp"
#include "src/matching.hpp"
#include "src/mesh.hpp"
#include "src/peer_errors.hpp"
#include "src/progress.hpp"
#include "src/rdma_transport.hpp"
#include "src/routed_transport.hpp"
#include "src/shm_transport.hpp"

namespace rdmacc {
namespace {

using Clock = std::chrono::steady_clock;

// A departed peer, or a failed completion, gets its verdict this late: the
// peer's last messages may still sit in the completion queue when its
// disconnect event arrives, and a failed write whose peer's disconnect follows
// is explained by the peer's death (not "remote access error").
constexpr auto kDepartureGrace = std::chrono::milliseconds(200);

// How long a rank whose collective timed out waits for the ranks it waits
// for to report what they wait for (blame.hpp): the ranks of a stuck group
// time out within moments of each other.
constexpr auto kStuckGrace = std::chrono::milliseconds(1000);

}  // namespace

// The engine core: intake of submitted operations, admission of overlapping
// collectives, completion in submission order, deadlines and failure (a
// broken group fails everything pending, and the peers are told). The
// executor moves the operations, the transport carries their messages, and
// Progress decides who calls step() and when.
struct Engine::Impl final : TransportSink, Steppable {
  EngineOptions options;
  int rank;
  int size;
  std::unique_ptr<Transport> transport;
  size_t chunk;
  std::vector<bool> dead;  // peers that disconnected
  // Peers that disconnected at least kDepartureGrace ago: what they sent
  // before leaving has arrived, so an operation that still misses messages
  // of theirs (or must send to them) fails.
  std::vector<bool> gone;
  Store& store;  // outlives the engine (VerbsBackend owns both)
  Matching matching;
  Executor executor;
  ActivePool pool;

  std::vector<std::pair<int, Clock::time_point>> departures;  // (peer, verdict time)
  struct FailedCompletion {
    int peer;
    Error error;
    Clock::time_point verdict;
  };
  std::vector<FailedCompletion> failedCompletions;
  Clock::time_point lastConnectionCheck{};
  Clock::time_point nextDeadlineCheck{};
  Clock::time_point nextProbe{};
  std::vector<int> awaitedScratch;  // keep-alive: no allocation per round
  // A collective that timed out while the ranks are asked what they wait for.
  struct StuckTimeout {
    uint64_t sequence;
    std::vector<int> waiting;
    StuckSearch search;
  };
  std::optional<StuckTimeout> stuck;
  std::vector<std::pair<int, std::optional<std::vector<int>>>> earlyStuckReports;
  bool stuckTold = false;  // this rank sent what it waits for (once per group)
  std::string stuckText;
  std::vector<int> stuckUnsent;
  std::vector<bool> probedScratch;

  std::deque<std::unique_ptr<Active>> collectives;    // the front one runs
  std::vector<std::unique_ptr<Active>> pointToPoint;  // in submission order
  std::vector<std::unique_ptr<Operation>> intakeTaken;
  std::optional<Error> broken;

  // Shared with other threads.
  std::mutex intakeMutex;
  std::vector<std::unique_ptr<Operation>> intake;
  std::optional<std::string> abortRequest;
  bool brokenShared = false;
  std::optional<Error> brokenCopy;
  Progress loop;  // last: its thread starts after everything above exists

  Impl(Mesh* mesh, Store& groupStore, EngineOptions o)
      : options(resolved(std::move(o))),
        rank(options.rank),
        size(options.size),
        transport(makeTransport(mesh, groupStore, options)),
        chunk(transport->chunkBytes()),
        dead(static_cast<size_t>(size), false),
        gone(static_cast<size_t>(size), false),
        store(groupStore),
        matching(*transport, size),
        executor(*transport, matching, options, gone),
        loop(*transport, *this, options) {}

  static EngineOptions resolved(EngineOptions o) {
    if (o.slotBytes == 0) o.slotBytes = autoSlotBytes(o.size, o.slotsPerPeer);
    if (o.slotBytes < 2 * wire::kHeaderBytes || o.slotBytes % 64 != 0 || o.slotBytes > (1u << 30)) {
      throw Error(
          ErrorKind::InvalidArgument, fmt::format("slot size {} is not usable", o.slotBytes),
          "RDMACC_SLOT_BYTES must be 0 (automatic) or a multiple of 64 between 128 and 1 GiB");
    }
    if (o.sharedMemoryPeers.empty()) o.sharedMemoryPeers.assign(static_cast<size_t>(o.size), false);
    return o;
  }

  // Shared memory to the peers on this host, RDMA to the others: one
  // transport when every peer takes the same, else both behind a router.
  static std::unique_ptr<Transport> makeTransport(Mesh* mesh, Store& store,
                                                  const EngineOptions& options) {
    const auto& shm = options.sharedMemoryPeers;
    bool anyShm = false, anyRdma = false;
    for (int peer = 0; peer < options.size; ++peer) {
      if (peer == options.rank) continue;
      (shm[static_cast<size_t>(peer)] ? anyShm : anyRdma) = true;
    }
    if (mesh == nullptr) {
      if (anyRdma) {
        throw Error(ErrorKind::Internal, "peers on other hosts, but no connection mesh to them");
      }
      return makeShmTransport(store, options, shm);
    }
    auto rdma = makeRdmaTransport(*mesh, store, options);
    if (!anyShm) return rdma;
    return makeRoutedTransport(std::move(rdma), makeShmTransport(store, options, shm), shm);
  }

  // ----------------------------------------------------------- arrivals --

  void arrived(int peer, const Incoming& in) override {
    if (in.header.kind == wire::MessageKind::Abort) {
      onAbort(peer, in);
    } else if (in.header.kind == wire::MessageKind::Stuck) {
      onStuck(peer, in);
    } else {
      matching.arrived(peer, in);
    }
  }

  // A departed peer's queue pair fails our pending credits; the operations
  // that needed the peer are failed by its departure.
  void failed(int peer, Error error) override {
    if (dead[static_cast<size_t>(peer)]) return;
    for (const auto& f : failedCompletions) {
      if (f.peer == peer) return;
    }
    failedCompletions.push_back(
        FailedCompletion{peer, std::move(error), Clock::now() + kDepartureGrace});
  }

  void onAbort(int peer, const Incoming& in) {
    std::string text(reinterpret_cast<const char*>(transport->payload(peer, in.slot)),
                     in.header.payload);
    transport->release(peer, in.slot);
    // The root cause as the reporting rank saw it (a rank it lost), or the
    // reporting rank itself.
    const uint64_t root = in.header.check;
    const bool relayed =
        root > 0 && root <= static_cast<uint64_t>(size) && root - 1 != static_cast<uint64_t>(rank);
    const int cause = relayed ? static_cast<int>(root - 1) : peer;
    breakGroup(Error(ErrorInfo{
                   .kind = ErrorKind::PeerFailure,
                   .message = relayed ? fmt::format("rank {} reported a failure of rank {}: {}",
                                                    peer, cause, text)
                                      : fmt::format("rank {} reported a failure: {}", peer, text),
                   .peerRank = cause,
                   .peerAddress = transport->peerAddress(cause)}),
               /*tellPeers=*/false);
  }

  // A departed peer fails the operations that still need it (and so the
  // group); operations that are past it finish normally.
  bool pollConnectionEvents(Clock::time_point now) {
    auto left = transport->takeDisconnected();
    bool progress = !left.empty();
    for (int peer : left) {
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
      gone[static_cast<size_t>(peer)] = true;
      bool needed = false;
      for (const auto& a : collectives) needed = needed || needs(*a, peer, chunk, matching);
      for (const auto& a : pointToPoint) needed = needed || needs(*a, peer, chunk, matching);
      if (needed) {
        // The others learn it from this rank (with the dead rank as the
        // cause) rather than from this rank's own departure later.
        breakGroup(peerGone(peer, transport->peerAddress(peer), transport->departure(peer)));
        progress = true;
      } else {
        log(LogLevel::Info, "rank {} disconnected; operations that involve it will fail", peer);
      }
    }
    return progress;
  }

  // ------------------------------------------------------------ failure --

  void checkDeadlines(Clock::time_point now) {
    if (stuck) {
      sendStuckReports();
      concludeStuck(now);
      return;
    }
    auto expired = [&](const Active& a) { return a.started && now > a.deadline; };
    const Active* late = nullptr;
    for (const auto& a : collectives) {
      if (late == nullptr && expired(*a)) late = a.get();
    }
    for (const auto& a : pointToPoint) {
      if (late == nullptr && expired(*a)) late = a.get();
    }
    if (late == nullptr) return;
    auto waiting = awaited(*late, chunk);
    const Operation& op = *late->op;
    if (op.pointToPoint || waiting.empty()) {
      breakGroup(timedOut(op, waiting, {}));
      return;
    }
    // A collective: ask who the awaited ranks wait for (blame.hpp), so that
    // every rank names the one the group is stuck on, not its neighbour. The
    // verdict comes when the chains are known, at the latest after the grace.
    const auto grace = std::min<std::chrono::milliseconds>(
        kStuckGrace, std::max(op.timeout, std::chrono::milliseconds(100)));
    stuck.emplace(
        StuckTimeout{op.sequence, waiting, StuckSearch(rank, size, waiting, now + grace)});
    for (auto& [peer, report] : earlyStuckReports) stuck->search.report(peer, std::move(report));
    earlyStuckReports.clear();
    tellStuck(waiting);
    concludeStuck(now);
  }

  void concludeStuck(Clock::time_point now) {
    const Active* op = nullptr;
    for (const auto& a : collectives) {
      if (a->op->sequence == stuck->sequence) op = a.get();
    }
    if (op == nullptr) {  // it finished after all: its messages were only late
      stuck.reset();
      return;
    }
    if (auto ends = stuck->search.conclusion(now)) {
      breakGroup(timedOut(*op->op, stuck->waiting, *ends));
    }
  }

  Error timedOut(const Operation& op, const std::vector<int>& waiting,
                 const std::vector<int>& stuckOn) const {
    const bool sameAsWaiting = stuckOn.empty() || stuckOn == waiting;
    const std::vector<int>& culprits = sameAsWaiting ? waiting : stuckOn;
    return Error(ErrorInfo{
        .kind = ErrorKind::Timeout,
        .message = fmt::format(
            "{} timed out after {} ms{}{}", op.description(), op.timeout.count(),
            waiting.empty()
                ? std::string()
                : fmt::format(", still waiting for rank(s) {}", fmt::join(waiting, ", ")),
            sameAsWaiting ? std::string()
                          : fmt::format("; the group is stuck on rank(s) {}, which did not say "
                                        "what they wait for (stopped or hung) or wait for "
                                        "nobody (not in a collective)",
                                        fmt::join(stuckOn, ", "))),
        .peerRank = culprits.size() == 1 ? culprits.front() : -1,
        .hint =
            "a rank is missing, slower, or called different collectives; raise the op's timeout "
            "(RDMACC_TIMEOUT) if it is only slow"});
  }

  // A peer's Stuck message: kept for the search (ours, or one that starts
  // when our own collective times out), and answered once with what this
  // rank waits for (it may be a collective ahead, waiting for a rank still
  // stuck in the previous one).
  void onStuck(int peer, const Incoming& in) {
    auto waitsFor = parseRanks(
        std::string_view(reinterpret_cast<const char*>(transport->payload(peer, in.slot)),
                         in.header.payload),
        size);
    transport->release(peer, in.slot);
    if (stuck) {
      stuck->search.report(peer, std::move(waitsFor));
    } else {
      earlyStuckReports.emplace_back(peer, std::move(waitsFor));
    }
    if (stuckTold) return;
    if (collectives.empty()) {
      tellStuck({});  // in no collective at all
    } else if (auto waits = awaited(*collectives.front(), chunk); !waits.empty()) {
      tellStuck(waits);
    }
  }

  void tellStuck(const std::vector<int>& waits) {
    stuckTold = true;
    stuckText = formatRanks(waits, chunk);
    stuckUnsent.clear();
    for (int peer = 0; peer < size; ++peer) {
      if (peer != rank && !dead[static_cast<size_t>(peer)]) stuckUnsent.push_back(peer);
    }
    sendStuckReports();
  }

  // Best effort, retried while a search runs: a peer whose slots are full
  // (it is behind, holding messages of ours for a later collective) gets it
  // once one frees.
  void sendStuckReports() {
    std::erase_if(stuckUnsent, [&](int peer) {
      if (dead[static_cast<size_t>(peer)]) return true;
      wire::Header h{.kind = wire::MessageKind::Stuck,
                     .payload = static_cast<uint32_t>(stuckText.size())};
      try {
        return transport->trySend(peer, h, reinterpret_cast<const uint8_t*>(stuckText.data()));
      } catch (const Error&) {
        return true;  // the peer is failing; the search does not need it
      }
    });
  }

  // Keep-alive: every `keepalive`, the peers that pending operations wait
  // for are probed; a path that no longer carries packets fails through
  // the transport (the peer and the completion status named).
  void probeAwaitedPeers(Clock::time_point now) {
    if (options.keepalive.count() == 0) return;
    if (now < nextProbe) return;
    if (nextProbe == Clock::time_point{}) {  // the first call: nothing waited yet
      nextProbe = now + options.keepalive;
      // a step's receives and sends, with room to spare
      awaitedScratch.reserve(4 * static_cast<size_t>(size) + 16);
      probedScratch.assign(static_cast<size_t>(size), false);
      return;
    }
    nextProbe = now + options.keepalive;
    std::vector<bool>& probed = probedScratch;
    probed.assign(static_cast<size_t>(size), false);
    auto probe = [&](const Active& a) {
      if (!a.started) return;
      awaitedInto(a, chunk, awaitedScratch);
      for (int peer : awaitedScratch) {
        if (peer == rank || peer < 0 || peer >= size) continue;
        auto p = static_cast<size_t>(peer);
        if (probed[p] || dead[p] || gone[p]) continue;
        probed[p] = true;
        transport->probe(peer);
      }
    };
    for (const auto& a : collectives) probe(*a);
    for (const auto& a : pointToPoint) probe(*a);
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
        wire::Header h{.kind = wire::MessageKind::Abort,
                       .payload = static_cast<uint32_t>(text.size()),
                       .check = root >= 0 && root < size && root != peer
                                    ? static_cast<uint64_t>(root) + 1
                                    : 0};
        try {
          transport->trySend(peer, h, reinterpret_cast<const uint8_t*>(text.data()));
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

  // --------------------------------------------------------------- loop --

  bool takeIntake() {
    if (!loop.pending()) return false;
    std::vector<std::unique_ptr<Operation>>& ops = intakeTaken;  // empty, with capacity
    std::optional<std::string> abortReason;
    {
      std::lock_guard lock(intakeMutex);
      loop.clearPending();
      ops.swap(intake);
      abortReason.swap(abortRequest);
    }
    if (abortReason) breakGroup(Error(ErrorKind::Aborted, *abortReason));
    const bool any = !ops.empty();
    for (auto& op : ops) {
      std::unique_ptr<Active> a = pool.take(std::move(op));
      if (a->op->pointToPoint) {
        a->latencyBound = a->op->bytes <= chunk;
        pointToPoint.push_back(std::move(a));
      } else {
        computeFootprint(*a, chunk);
        collectives.push_back(std::move(a));
      }
    }
    ops.clear();
    if (broken) failAll(*broken);
    return any || abortReason.has_value();
  }

  bool advance() {
    bool progress = takeIntake();
    progress |= transport->poll(*this);
    // One clock read per round (under emulation, or with a clock source that
    // is not the TSC, each is costly) for what is timed below.
    const auto now = Clock::now();
    // Two syscalls (rdma_get_cm_event on a non-blocking channel): every 10 ms
    // is plenty next to the departure grace.
    if (now - lastConnectionCheck > std::chrono::milliseconds(10)) {
      lastConnectionCheck = now;
      progress |= pollConnectionEvents(now);
    }
    // The oldest collective runs, and up to collectivesInFlight - 1 later
    // ones that may start ahead (in submission order); they complete in
    // submission order. While later ones send, half of every peer's slots
    // stay for the oldest, so messages that run ahead never take the window
    // the oldest one needs.
    const size_t window = std::min(collectives.size(), options.collectivesInFlight);
    for (size_t i = 0; i < window && !broken; ++i) {
      Active& a = *collectives[i];
      if (a.finished) continue;
      if (!a.started && i > 0 && !mayStartAhead(collectives, i)) break;
      struct Reserve {  // reset even when advancing throws (aborts must still go out)
        Transport& t;
        ~Reserve() { t.reserveCredits(0); }
      } reserve{*transport};
      transport->reserveCredits(i == 0 ? 0
                                       : static_cast<size_t>(transport->slotsPerPeer() + 1) / 2);
      bool before = a.started;
      bool moved =
          executor.advanceCollective(a, static_cast<uint32_t>(collectives.front()->op->sequence));
      progress |= moved || !before;
    }
    while (!broken && !collectives.empty() && collectives.front()->finished) {
      Active& a = *collectives.front();
      matching.finished(static_cast<uint32_t>(a.op->sequence));
      a.op->work->finish(nullptr);
      pool.give(std::move(collectives.front()));
      collectives.pop_front();
      progress = true;
    }
    if (!broken) progress |= executor.advancePointToPoint(pointToPoint, pool);
    // Deadlines to the millisecond: the scan of every pending operation is
    // not repeated on every round of a spinning loop.
    if (!broken && now >= nextDeadlineCheck) {
      nextDeadlineCheck = now + std::chrono::milliseconds(1);
      checkDeadlines(now);
    }
    if (!broken) probeAwaitedPeers(now);
    // How long to spin next: the oldest work's kind.
    loop.setLatencyBound(!collectives.empty()    ? collectives.front()->latencyBound
                         : !pointToPoint.empty() ? pointToPoint.front()->latencyBound
                                                 : false);
    // Credits that found no message to ride on go now, before the engine
    // spins or sleeps, to a peer that may be waiting for them.
    if (!progress) progress |= transport->flushCredits();
    return progress;
  }

  // advance() with failures turned into a broken group.
  bool step() override {
    try {
      return advance();
    } catch (const Error& e) {
      breakGroup(e);
    } catch (const std::exception& e) {
      breakGroup(Error(ErrorKind::Internal, e.what()));
    }
    return true;
  }

  bool idle() const override {
    return collectives.empty() && pointToPoint.empty() && departures.empty() &&
           failedCompletions.empty();
  }

  void stopping() override { transport->drain(dead); }
};

Engine::Engine(Mesh* mesh, Store& store, EngineOptions options)
    : impl_(std::make_unique<Impl>(mesh, store, std::move(options))) {
  gate_ = std::make_shared<DriverGate>();
  gate_->impl = impl_.get();
  impl_->loop.start();
}

Engine::~Engine() {
  impl_->loop.stopDrivers();
  {
    std::unique_lock lock(gate_->mutex);  // waits for the drivers inside
    gate_->impl = nullptr;
  }
  impl_->loop.join();
  impl_->takeIntake();
  impl_->failAll(
      Error(ErrorKind::Aborted, "the backend was destroyed before the operation completed"));
}

std::string Operation::description() const {
  if (detailFormat.empty()) return fmt::format("{} #{}", toString(type), sequence);
  fmt::dynamic_format_arg_store<fmt::format_context> args;
  for (size_t i = 0; i < detailArgCount; ++i) {
    std::visit([&](auto v) { args.push_back(v); }, detailArgs[i]);
  }
  return fmt::format("{} #{} ({})", toString(type), sequence, fmt::vformat(detailFormat, args));
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
    impl_->loop.markPending();
  }
  impl_->loop.wakeSleepers();
}

void Engine::abort(const std::string& reason) {
  {
    std::lock_guard lock(impl_->intakeMutex);
    impl_->abortRequest = reason;
    impl_->loop.markPending();
  }
  impl_->loop.wake();
}

std::shared_ptr<const Work::ProgressDriver> Engine::driver() {
  return std::make_shared<const Work::ProgressDriver>(
      [gate = gate_](const Work& work, std::chrono::steady_clock::time_point until) {
        std::shared_lock lock(gate->mutex);
        if (gate->impl != nullptr) gate->impl->loop.drive(work, until);
      });
}

size_t Engine::chunkBytes() const noexcept {
  return impl_->chunk;
}

}  // namespace rdmacc
