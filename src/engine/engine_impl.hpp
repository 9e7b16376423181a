// The engine core's state, shared by engine/engine.cpp (intake, the progress loop,
// completion) and engine/failure.cpp (deadlines, departures, aborts, the
// search for the rank a stuck group waits on). Private to those two files.
#pragma once

#include "src/core/by_rank.hpp"
#include "src/engine/engine.hpp"

#include <chrono>
#include <deque>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "rdmacc/error.hpp"
#include "rdmacc/log.hpp"
#include "src/engine/active.hpp"
#include "src/engine/blame.hpp"
#include "src/engine/event_trace.hpp"
#include "src/engine/executor.hpp"
#include "src/engine/matching.hpp"
#include "src/engine/progress.hpp"
#include "src/transport/peer_errors.hpp"

namespace rdmacc {

using Clock = std::chrono::steady_clock;

// The engine core: intake of submitted operations, admission of overlapping
// collectives, completion in submission order, deadlines and failure (a
// broken group fails everything pending, and the peers are told). The
// executor moves the operations, the transport carries their messages, and
// Progress decides who calls step() and when.
struct Engine::Impl final : TransportSink, Steppable, Matching::Claims {
  EngineOptions options;
  int rank;
  int size;
  std::unique_ptr<Transport> transport;
  size_t chunk;
  ByRank<bool> dead;  // peers that disconnected
  // Peers that disconnected at least kDepartureGrace ago: what they sent
  // before leaving has arrived, so an operation that still misses messages
  // of theirs (or must send to them) fails.
  ByRank<bool> gone;
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
  // The broken group's report (breakGroup), and the peers it has not reached.
  std::string reportText;
  uint64_t reportCheck = 0;  // the root rank + 1 (0: this rank)
  std::vector<int> reportUnsent;
  std::vector<bool> probedScratch;

  std::deque<std::unique_ptr<Active>> collectives;    // the front one runs
  std::vector<std::unique_ptr<Active>> pointToPoint;  // in submission order
  std::vector<std::unique_ptr<Operation>> intakeTaken;
  std::optional<Error> broken;

  // Shared with other threads.
  mutable std::mutex intakeMutex;
  std::vector<std::unique_ptr<Operation>> intake;
  uint64_t collectiveCount = 0;  // sequence numbers, under intakeMutex
  uint64_t pointToPointCount = 0;
  std::shared_ptr<const Work::ProgressDriver> workDriver;  // every Work's (Engine::driver)
  std::optional<std::string> abortRequest;
  bool brokenShared = false;
  // Nothing taken from the intake is unfinished (set false when ops are
  // taken, under intakeMutex; true after a round that left none): with an
  // empty intake, tryOneShot may run a call on the caller's thread.
  std::atomic<bool> drained{true};
  std::optional<Error> brokenCopy;
  Progress loop;  // last: its thread starts after everything above exists

  Impl(std::unique_ptr<Transport> t, EngineOptions o)
      : options(std::move(o)),
        rank(options.rank),
        size(options.size),
        transport(std::move(t)),
        chunk(transport->chunkBytes()),
        dead(size, false),
        gone(size, false),
        matching(*transport, size, options.unexpectedBytes),
        executor(*transport, matching, options, gone),
        pool(options.registrations),
        loop(*transport, *this, options) {}

  // ------------------------------------- claims (Matching::park) --

  uint64_t operationChanges = 0;  // operations taken in and finished so far

  bool takes(int peer, const wire::Header& h) const override {
    if (h.kind == wire::MessageKind::Collective) {
      return std::any_of(collectives.begin(), collectives.end(), [&](const auto& a) {
        return a->started && static_cast<uint32_t>(a->op->sequence) == h.sequence;
      });
    }
    if (h.kind == wire::MessageKind::PointToPoint) {
      return std::any_of(pointToPoint.begin(), pointToPoint.end(), [&](const auto& a) {
        return receives(*a, peer) && a->op->tag == h.sequence;
      });
    }
    return true;
  }
  bool receivesFrom(int peer) const override {
    return std::any_of(pointToPoint.begin(), pointToPoint.end(),
                       [&](const auto& a) { return receives(*a, peer); });
  }
  bool awaits(int peer) const override {
    return std::any_of(collectives.begin(), collectives.end(), [&](const auto& a) {
      return a->started && rdmacc::needs(*a, peer, chunk, matching);
    });
  }
  static bool receives(const Active& a, int peer) {
    return !a.op->isSend && (a.source < 0 || a.source == peer);
  }

  // ----------------------------------------------------------- arrivals --

  void arrived(int peer, const Incoming& in) override {
    if (in.header.kind == wire::MessageKind::Abort) {
      onAbort(peer, in);
    } else if (in.header.kind == wire::MessageKind::Stuck) {
      onStuck(peer, in);
    } else if (in.header.kind == wire::MessageKind::Leave) {
      // A shared link takes its channels' leave messages: one here came
      // over a connection of this group's own.
      transport->release(peer, in.slot);
      throw protocolViolation(peer, transport->peerAddress(peer),
                              wire::Violation{"a leave message over a connection no other group "
                                              "shares"});
    } else {
      traceStage(options.trace, EventTrace::Stage::Arrival,
                 in.header.kind == wire::MessageKind::PointToPoint, in.header.sequence, peer);
      matching.arrived(peer, in);
    }
  }

  // ---------------------------------------- failure (engine/failure.cpp) --
  // A departed peer's queue pair fails our pending credits; the operations
  // that needed the peer are failed by its departure.
  void failed(int peer, Error error) override;
  void onAbort(int peer, const Incoming& in);
  // A departed peer fails the operations that still need it (and so the
  // group); operations that are past it finish normally.
  bool pollConnectionEvents(Clock::time_point now);
  void checkDeadlines(Clock::time_point now);
  void concludeStuck(Clock::time_point now);
  Error timedOut(const Operation& op, const std::vector<int>& waiting,
                 const std::vector<int>& stuckOn) const;
  // A peer's Stuck message: kept for the search (ours, or one that starts
  // when our own collective times out), and answered once with what this
  // rank waits for (it may be a collective ahead, waiting for a rank still
  // stuck in the previous one).
  void onStuck(int peer, const Incoming& in);
  void tellStuck(const std::vector<int>& waits);
  void sendStuckReports();
  // The broken group's report to the peers it has not reached yet.
  bool sendReports();
  // Sends `header` with `text` as its payload to each peer of `unsent` that
  // has room for it now; those sent to (or dead, or failing) leave the list,
  // the others stay for a later call. Whether any left.
  bool sendToEach(std::vector<int>& unsent, wire::Header header, std::string_view text);
  // Keep-alive: every `keepalive`, the peers that pending operations wait
  // for are probed; a path that no longer carries packets fails through
  // the transport (the peer and the completion status named).
  void probeAwaitedPeers(Clock::time_point now);
  // Fails everything pending; later submissions fail at once. Every peer
  // is told, with the rank at the root of the failure: `passOn` (a peer's
  // report this rank received) or this rank's own error.
  struct Report {
    std::string_view text;
    int root = -1;
  };
  void breakGroup(const Error& error, std::optional<Report> passOn = std::nullopt);
  void failAll(const Error& error);

  // --------------------------------------------------------------- loop --

  bool takeIntake();
  // Gives op its Work and queues it (under intakeMutex; numbered already).
  std::shared_ptr<Work> enqueue(std::unique_ptr<Operation> op);
  void requestAbort(const std::string& reason);

  bool advance();

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

  // Engine::tryOneShot's parts (engine/one_shot.cpp).
  bool finishEarlierOneShots();
  bool awaitBoardPeers(Board& board, const OneShotCall& call, uint64_t sequence, bool exclusive);

  // Nothing pending but one-shot collectives (under the progress lock).
  bool onlyBoardWork() {
    if (!pointToPoint.empty() || broken) return false;
    for (const auto& a : collectives) {
      if (!a->op->schedule || !a->op->schedule->board) return false;
    }
    std::lock_guard lock(intakeMutex);
    for (const auto& op : intake) {
      if (op->pointToPoint || !op->schedule || !op->schedule->board) return false;
    }
    return true;
  }

  bool idle() const override {
    return collectives.empty() && pointToPoint.empty() && departures.empty() &&
           failedCompletions.empty();
  }

  void stopping() override { transport->drain(dead.vector()); }
};

}  // namespace rdmacc
