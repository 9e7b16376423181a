// The engine's failure paths: deadlines and the search for the rank a stuck
// group waits on, departed peers and failed completions, aborts from peers,
// and breaking the group (every pending operation fails, the peers are told).
#include <algorithm>
#include <chrono>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "rdmacc/error.hpp"
#include "rdmacc/log.hpp"
#include "src/engine/engine_impl.hpp"

namespace rdmacc {
namespace {

using Clock = std::chrono::steady_clock;

// A departed peer, or a failed completion, gets its verdict this late: the
// peer's last messages may still sit in the completion queue when its
// disconnect event arrives, and a failed write whose peer's disconnect follows
// is explained by the peer's death (not "remote access error").
constexpr auto kDepartureGrace = std::chrono::milliseconds(200);

// How long a rank whose collective timed out waits for the ranks it waits
// for to report what they wait for (engine/blame.hpp): the ranks of a stuck group
// time out within moments of each other.
constexpr auto kStuckGrace = std::chrono::milliseconds(1000);

}  // namespace

// A departed peer's queue pair fails our pending credits; the operations
// that needed the peer are failed by its departure.
void Engine::Impl::failed(int peer, Error error) {
  if (dead[peer]) return;
  for (const auto& f : failedCompletions) {
    if (f.peer == peer) return;
  }
  failedCompletions.push_back(
      FailedCompletion{peer, std::move(error), Clock::now() + kDepartureGrace});
}

void Engine::Impl::onAbort(int peer, const Incoming& in) {
  std::string text(reinterpret_cast<const char*>(transport->payload(peer, in.slot)),
                   in.header.payload);
  transport->release(peer, in.slot);
  // The root cause as the reporting rank saw it (a rank it lost, maybe this
  // one), or the reporting rank itself.
  const uint64_t check = in.header.check;
  const int root =
      check > 0 && check <= static_cast<uint64_t>(size) ? static_cast<int>(check - 1) : peer;
  const bool relayed = root != peer && root != rank;
  const int cause = relayed ? root : peer;
  // Passed on as it came (not nested in this rank's words), with the same
  // root: in a lazy group the reporting rank talks only to the peers it
  // connected to, so the report travels along the connections, and a rank
  // that waits for a rank that waits for the failed one learns it now
  // rather than at its timeout.
  breakGroup(Error(ErrorInfo{
                 .kind = ErrorKind::PeerFailure,
                 .message = relayed ? fmt::format("rank {} reported a failure of rank {}: {}", peer,
                                                  cause, text)
                                    : fmt::format("rank {} reported a failure: {}", peer, text),
                 .peerRank = cause,
                 .peerAddress = transport->peerAddress(cause)}),
             Report{.text = text, .root = root});
}

// A departed peer fails the operations that still need it (and so the
// group); operations that are past it finish normally.
bool Engine::Impl::pollConnectionEvents(Clock::time_point now) {
  auto left = transport->takeDisconnected();
  bool progress = !left.empty();
  for (int peer : left) {
    if (dead[peer]) continue;
    dead[peer] = true;
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
    gone[peer] = true;
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

void Engine::Impl::checkDeadlines(Clock::time_point now) {
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
  // What this rank sees of each awaited peer: enough to tell a peer that
  // sent nothing from a path that stalled (credits, queues) or a message
  // that arrived but did not match.
  for (int peer : waiting) {
    log(LogLevel::Warn, "{}{} waits for rank {}: {}; {}", op.description(),
        op.pointToPoint ? "" : fmt::format(" step {}", late->step), peer,
        transport->describePeer(peer), matching.describePeer(peer));
  }
  if (op.pointToPoint || waiting.empty()) {
    breakGroup(timedOut(op, waiting, {}));
    return;
  }
  // A collective: ask who the awaited ranks wait for (engine/blame.hpp), so that
  // every rank names the one the group is stuck on, not its neighbour. The
  // verdict comes when the chains are known, at the latest after the grace.
  const auto grace = std::min<std::chrono::milliseconds>(
      kStuckGrace, std::max(op.timeout, std::chrono::milliseconds(100)));
  stuck.emplace(StuckTimeout{op.sequence, waiting, StuckSearch(rank, size, waiting, now + grace)});
  for (auto& [peer, report] : earlyStuckReports) stuck->search.report(peer, std::move(report));
  earlyStuckReports.clear();
  tellStuck(waiting);
  concludeStuck(now);
}

void Engine::Impl::concludeStuck(Clock::time_point now) {
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

Error Engine::Impl::timedOut(const Operation& op, const std::vector<int>& waiting,
                             const std::vector<int>& stuckOn) const {
  const bool sameAsWaiting = stuckOn.empty() || stuckOn == waiting;
  const std::vector<int>& culprits = sameAsWaiting ? waiting : stuckOn;
  return Error(ErrorInfo{
      .kind = ErrorKind::Timeout,
      .message = fmt::format(
          "{} timed out after {} ms{}{}", op.description(), op.timeout.count(),
          waiting.empty() ? std::string()
                          : fmt::format(", still waiting for rank(s) {}", fmt::join(waiting, ", ")),
          sameAsWaiting ? std::string()
                        : fmt::format("; the group is stuck on rank(s) {}, which did not say "
                                      "what they wait for (stopped or hung) or wait for "
                                      "nobody (not in a collective)",
                                      fmt::join(stuckOn, ", "))),
      .peerRank = culprits.size() == 1 ? culprits.front() : -1,
      .hint = matching.parkFull()
                  ? fmt::format("messages no started operation takes filled the room for them, "
                                "and the peers could send nothing else: {}",
                                Matching::kParkFullAdvice)
                  : "a rank is missing, slower, or called different collectives; raise the op's "
                    "timeout (RDMACC_TIMEOUT) if it is only slow"});
}

// A peer's Stuck message: kept for the search (ours, or one that starts
// when our own collective times out), and answered once with what this
// rank waits for (it may be a collective ahead, waiting for a rank still
// stuck in the previous one).
void Engine::Impl::onStuck(int peer, const Incoming& in) {
  auto waitsFor =
      parseRanks(std::string_view(reinterpret_cast<const char*>(transport->payload(peer, in.slot)),
                                  in.header.payload),
                 size);
  transport->release(peer, in.slot);
  if (stuck) {
    stuck->search.report(peer, std::move(waitsFor));
  } else if (std::none_of(earlyStuckReports.begin(), earlyStuckReports.end(),
                          [&](const auto& r) { return r.first == peer; })) {
    earlyStuckReports.emplace_back(peer, std::move(waitsFor));  // the first per peer counts
  }
  if (stuckTold) return;
  if (collectives.empty()) {
    tellStuck({});  // in no collective at all
  } else if (auto waits = awaited(*collectives.front(), chunk); !waits.empty()) {
    tellStuck(waits);
  }
}

void Engine::Impl::tellStuck(const std::vector<int>& waits) {
  stuckTold = true;
  stuckText = formatRanks(waits, chunk);
  stuckUnsent.clear();
  for (int peer = 0; peer < size; ++peer) {
    if (peer != rank && !dead[peer]) stuckUnsent.push_back(peer);
  }
  sendStuckReports();
}

// Retried while a search runs: a peer whose slots are full (it is behind,
// holding messages of ours for a later collective) gets it once one frees.
void Engine::Impl::sendStuckReports() {
  sendToEach(stuckUnsent, wire::Header{.kind = wire::MessageKind::Stuck}, stuckText);
}

// Retried by every round of the broken group (advance()).
bool Engine::Impl::sendReports() {
  return sendToEach(reportUnsent,
                    wire::Header{.kind = wire::MessageKind::Abort, .check = reportCheck},
                    reportText);
}

bool Engine::Impl::sendToEach(std::vector<int>& unsent, wire::Header header,
                              std::string_view text) {
  header.payload = static_cast<uint32_t>(text.size());
  const size_t before = unsent.size();
  std::erase_if(unsent, [&](int peer) {
    if (dead[peer]) return true;
    try {
      return transport->trySend(peer, header, reinterpret_cast<const uint8_t*>(text.data()));
    } catch (const Error&) {
      return true;  // the peer is failing: it needs no report
    }
  });
  return unsent.size() != before;
}

// Keep-alive: every `keepalive`, the peers that pending operations wait
// for are probed; a path that no longer carries packets fails through
// the transport (the peer and the completion status named).
void Engine::Impl::probeAwaitedPeers(Clock::time_point now) {
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
void Engine::Impl::breakGroup(const Error& error, std::optional<Report> passOn) {
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
  // The rank at the root of the failure travels with it (check = root + 1,
  // also to that rank; 0: this rank itself), so every survivor names the
  // same rank. A rank breaks once, so each tells each peer at most once.
  // A peer with no free slot for it (or, lazy, not connected yet) gets it
  // when one frees (advance() retries): its own timeout may be far off.
  reportText = passOn ? passOn->text : std::string_view(error.what());
  reportText.resize(std::min(reportText.size(), chunk));
  const int root = passOn ? passOn->root : error.info().peerRank;
  reportCheck = root >= 0 && root < size ? static_cast<uint64_t>(root) + 1 : 0;
  for (int peer = 0; peer < size; ++peer) {
    if (peer != rank && !dead[peer]) reportUnsent.push_back(peer);
  }
  sendReports();
  failAll(error);
}

void Engine::Impl::failAll(const Error& error) {
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

}  // namespace rdmacc
