#include "src/transport/rdma/transport_impl.hpp"

#include <arpa/inet.h>

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "rdmacc/log.hpp"
#include "src/transport/credits.hpp"
#include "src/transport/peer_errors.hpp"
#include "src/transport/rdma/wr_id.hpp"
#include "src/transport/registration_cache.hpp"
#include "verbs/error.hpp"

namespace rdmacc::rdma {

using wire::describe;
using wire::Header;
using wire::kDirect;
using wire::kHeaderBytes;
using wire::MessageKind;

// ------------------------------------------------------------- posting --

// Selective signalling: at most signalRun() writes in a row go unsignaled,
// and every write is signaled once few staging slots or send queue entries
// are left, so slots held by unsignaled writes are always released soon.
bool RdmaTransport::mustSignal(const PeerState& p, const Lane& lane, bool usesStaging) const {
  int run = signalRun();
  return lane.unsignaledRun + 1 >= run ||
         (usesStaging && static_cast<int>(p.freeStaging.size()) <= run) ||
         lane.sendQueueUsed() + run + 2 >= static_cast<int>(mesh_.qpParams().sendDepth);
}

// The header goes from a staging slot, the payload copied after it, or
// (zero-copy, when `owner` is given and the payload lies in memory the user
// registered) gathered straight from the user's buffer. With a direct target
// the payload is first written to the peer's advertised destination and the
// header follows on the same queue pair (so it arrives after the data).
bool RdmaTransport::trySend(int to, const Header& header, const uint8_t* data,
                            const std::shared_ptr<ZeroCopyWrites>& owner,
                            std::optional<DirectTarget> direct) {
  PeerState& p = peer(to);
  if (p.lanes.empty()) {  // not connected yet (lazy)
    // A collective's peers connect when it starts (prepare); other
    // messages start the connection themselves.
    const bool collective =
        header.kind == MessageKind::Collective || header.kind == MessageKind::Advert;
    if (!collective || startsPreparedPair(to)) mesh_.connect(to);
    if (mesh_.connecting()) takeConnectionEvents();
    return false;
  }
  size_t laneIndex = header.kind == MessageKind::Collective ? p.nextLane : 0;
  Lane& lane = p.lanes[laneIndex];
  if (!p.window.canSend(creditReserve_) || p.freeStaging.empty() ||
      sendQueueFull(lane, direct ? 2 : 1)) {
    return false;
  }
  int remote = p.window.nextRemote();
  int staging = p.freeStaging.back();
  uint8_t* slot = stagingSlot(to, staging);
  Header h = header;
  h.credits = p.window.takePiggybackCredits();
  if (direct) h.flags |= kDirect;
  std::memcpy(slot, &h, sizeof h);
  std::shared_ptr<const Registration> registration;
  if (owner && zeroCopy_ && owner->registrations() != nullptr &&
      header.payload >= zeroCopyMinBytes_) {
    registration = owner->registrations()->find(data, header.payload);
  }
  if (header.payload > 0 && !registration) {
    std::memcpy(slot + kHeaderBytes, data, header.payload);
  }
  const auto wrId = pack(WrId{WrKind::WriteImm, static_cast<uint8_t>(laneIndex),
                              static_cast<uint16_t>(to), static_cast<uint32_t>(staging)});
  // The payload: after the header in the slot, or gathered from the user's
  // registered buffer; to the slot, or (direct) to the peer's destination.
  const void* payloadAt = registration ? data : slot + kHeaderBytes;
  uint32_t payloadKey = registration ? registration->lkey : p.stagingLkey;
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
      .lkey = p.stagingLkey,
      .length = static_cast<uint32_t>(kHeaderBytes + (registration || direct ? 0 : header.payload)),
      .remoteAddr = p.remoteBase + static_cast<uint64_t>(remote) * slotBytes_,
      .rkey = lane.rkey,
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
    throw verbs::verbsError("ibv_post_send", rc, fmt::format("posting a message to rank {}", to));
  }
  if (count == 2) posted(lane, -1, false);  // the direct payload write
  if (header.kind == MessageKind::Collective) p.nextLane = (p.nextLane + 1) % p.lanes.size();
  if (registration) {
    owner->add(data, header.payload);
    p.slotWrites[static_cast<size_t>(staging)] =
        SlotWrite{std::move(registration), owner, data, header.payload};
  }
  p.window.sent();
  if (w.inlineData) {
    posted(lane, -1, w.signaled);
  } else {
    p.freeStaging.pop_back();
    posted(lane, staging, w.signaled);
  }
  if (logEnabled(LogLevel::Trace))
    log(LogLevel::Trace, "-> rank {} slot {} lane {}: {}{}{}", to, remote, laneIndex,
        describe(header), p.slotWrites[static_cast<size_t>(staging)].owner ? " (zero-copy)" : "",
        direct ? " (direct)" : "");
  return true;
}

// ------------------------------------------------------------- credits --

// Hands a consumed slot back to its sender: on the next message to it, or by
// a credit message once half the peer's slots wait (so a one-way stream never
// stalls), or by flushCredits() when the engine has nothing else to do and
// the peer may be short of slots.
void RdmaTransport::release(int from, int slot) {
  if (peer(from).window.release(slot)) flushCredits(from);
}

bool RdmaTransport::flushCredits(int to) {
  PeerState& p = peer(to);
  Lane& lane = p.lanes[0];
  bool any = false;
  while (p.window.owesCredits() && !sendQueueFull(lane)) {
    postControl(to, 0, ControlTag::Credits, p.window.takeCreditMessage(),
                mustSignal(p, lane, false), "returning credits to");
    any = true;
  }
  return any;
}

void RdmaTransport::postControl(int to, size_t laneIndex, ControlTag tag,
                                std::optional<uint32_t> imm, bool signaled, const char* why) {
  PeerState& p = peer(to);
  Lane& lane = p.lanes[laneIndex];
  verbs::WriteRequest w{.wrId = pack(WrId{WrKind::Control, static_cast<uint8_t>(laneIndex),
                                          static_cast<uint16_t>(to), static_cast<uint32_t>(tag)}),
                        .remoteAddr = p.remoteBase,
                        .rkey = lane.rkey,
                        .imm = imm,
                        .signaled = signaled};
  if (int rc = verbs::postWrite(lane.qp, w); rc != 0) {
    throw verbs::verbsError("ibv_post_send", rc, fmt::format("{} rank {}", why, to));
  }
  posted(lane, -1, signaled);
}

bool RdmaTransport::flushCredits() {
  bool any = false;
  for (int rank = 0; rank < size_; ++rank) {
    // (peers without lanes are reached through shared memory)
    if (rank != rank_ && !peer(rank).lanes.empty() && peer(rank).window.peerMayStall()) {
      any |= flushCredits(rank);
    }
  }
  return any;
}

// --------------------------------------------------------- completions --

bool RdmaTransport::poll(TransportSink& sink) {
  if (++pollsSinceAsync_ >= kAsyncPollEvery) takeAsyncEvents();
  // Lazy: while connections are being made (else takeDisconnected looks).
  if (mesh_.connecting()) takeConnectionEvents();
  if (!asyncFailures_.empty()) deliverAsyncFailures(sink);
  std::array<ibv_wc, 64> wcs;
  int n = mesh_.cq().poll(wcs);
  pollSaturated_ = n == static_cast<int>(wcs.size());
  for (int i = 0; i < n; ++i) {
    const ibv_wc& wc = wcs[static_cast<size_t>(i)];
    WrId id = unpack(wc.wr_id);
    std::optional<ReceiveOrigin> origin;
    if (id.kind == WrKind::Recv) {  // from the shared receive queue: its qp_num names the peer
      origin = mesh_.receiveOrigin(wc);
      if (!origin) {
        throw Error(ErrorKind::Internal,
                    fmt::format("a receive completion from queue pair {}, which is none of this "
                                "group's",
                                wc.qp_num));
      }
      id.peer = static_cast<uint16_t>(origin->peer);
      id.qp = static_cast<uint8_t>(origin->qp);
    }
    int from = id.peer;
    if (logEnabled(LogLevel::Trace)) {
      log(LogLevel::Trace, "wc kind {} peer {} tag {} status {} opcode {}",
          static_cast<int>(id.kind), from, id.tag, static_cast<int>(wc.status),
          static_cast<int>(wc.opcode));
    }
    if (id.kind == WrKind::Bind) {  // a memory window over our slots: not a write
      if (wc.status != IBV_WC_SUCCESS) {
        sink.failed(from, verbs::completionError(wc, from, mesh_.peerAddress(from),
                                                 "binding a memory window for it"));
      }
      continue;
    }
    if (wc.status != IBV_WC_SUCCESS) {
      const char* what = id.kind == WrKind::Recv ? "a receive" : "an RDMA write";
      sink.failed(from, verbs::completionError(wc, from, mesh_.peerAddress(from), what));
      continue;
    }
    PeerState& p = peer(from);
    if (p.lanes.empty()) {  // lazy: it wrote before rdma_cm told us the connection is up
      mesh_.establishEarly(from);
      takeConnectionEvents();
      if (p.lanes.empty()) {
        throw Error(ErrorKind::Internal,
                    fmt::format("a completion from rank {}, which has no connection", from));
      }
    }
    if (id.kind == WrKind::Recv) {
      onReceive(sink, *origin,
                wire::Completion{.rdmaWriteWithImm = wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM,
                                 .withImm = (wc.wc_flags & IBV_WC_WITH_IMM) != 0,
                                 .imm = ntohl(wc.imm_data),
                                 .byteLen = wc.byte_len});
    } else {
      writesCompleted(p, p.lanes[id.qp]);
    }
  }
  return n > 0;
}

// A signaled write completed: so did every write posted before it.
void RdmaTransport::writesCompleted(PeerState& p, Lane& lane) {
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
    if (w.signaled) break;
  }
  ++lane.completions;
}

void RdmaTransport::onReceive(TransportSink& sink, const ReceiveOrigin& origin,
                              const wire::Completion& completion) {
  const int from = origin.peer;
  PeerState& p = peer(from);
  if (int rc = mesh_.repostReceive(origin); rc != 0) {
    throw verbs::verbsError("ibv_post_recv", rc,
                            fmt::format("reposting a receive for rank {}", from));
  }
  const wire::Limits limits{.slotsPerPeer = slotsPerPeer_, .slotBytes = slotBytes_};
  Incoming in;
  bool message = false;
  if (auto bad = p.window.accept(completion, p.recvBase, limits, arrivals_, in, message)) {
    throw protocolViolation(from, peerAddress(from), *bad);
  }
  if (!message) return;
  if (logEnabled(LogLevel::Trace))
    log(LogLevel::Trace, "<- rank {} slot {}: {}", from, in.slot, describe(in.header));
  sink.arrived(from, in);
}

// ----------------------------------------------------------- keep-alive --

void RdmaTransport::prepare(int to) {
  if (!mesh_.lazy() || !peer(to).lanes.empty() || !startsPreparedPair(to)) return;
  mesh_.connect(to);
}

void RdmaTransport::probe(int to) {
  PeerState& p = peer(to);
  // An operation waits for a peer not connected yet (lazy): connecting is
  // the probe; a peer that no longer listens fails at once (Mesh).
  if (p.lanes.empty()) {
    mesh_.connect(to);
    return;
  }
  for (size_t i = 0; i < p.lanes.size(); ++i) {
    Lane& lane = p.lanes[i];
    // Writes outstanding and not one completed since the previous probe (a
    // keep-alive interval ago): their packets are being retried, or the queue
    // pair stalled in the device. A zero-byte write behind them fails on a
    // dead path when the retries are spent; a stalled one it does not move
    // (seen with soft-RoCE: checkStalls() ends that).
    const bool stalled = !lane.posted.empty() && lane.completions == lane.completionsSeen;
    lane.completionsSeen = lane.completions;
    // Otherwise a signaled write last in the queue tests the path already (a
    // failing QP completes every outstanding request in error); lanes other
    // than the first are probed only when stalled.
    if (!stalled && (i > 0 || (!lane.posted.empty() && lane.unsignaledRun == 0))) continue;
    if (sendQueueFull(lane)) continue;
    if (stalled) {
      log(LogLevel::Debug,
          "rank {} queue pair {}: {} write(s) outstanding, none completed in a keep-alive "
          "interval; posting a probe behind them",
          to, i, lane.sendQueueUsed());
    }
    postControl(to, i, ControlTag::Probe, std::nullopt, true, "probing");
  }
}

std::string RdmaTransport::describePeer(int to) const {
  const PeerState& p = peer(to);
  if (p.lanes.empty()) {
    return mesh_.lazy() ? "RDMA: not connected (connections start on first use)"
                        : "RDMA: no queue pair";
  }
  std::string lanes;
  for (const Lane& lane : p.lanes) {
    lanes += fmt::format(", queue {}/{} ({} unsignaled at the back)", lane.sendQueueUsed(),
                         mesh_.qpParams().sendDepth, lane.unsignaledRun);
  }
  return fmt::format("RDMA: {}, {} staging slot(s) free{}", p.window.describe(),
                     p.freeStaging.size(), lanes);
}

// ------------------------------------------------------------ shutdown --

// A peer may still be waiting for our last message of a completed operation.
void RdmaTransport::drain(const std::vector<bool>& dead) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  auto alive = [&](int rank) { return rank != rank_ && !dead[static_cast<size_t>(rank)]; };
  auto outstanding = [&] {
    for (int rank = 0; rank < size_; ++rank) {
      if (!alive(rank)) continue;
      for (const Lane& lane : peer(rank).lanes) {
        if (lane.sendQueueUsed() > 0) return true;
      }
    }
    return false;
  };
  // Failures while draining are of no interest any more.
  struct Ignore final : TransportSink {
    void arrived(int, const Incoming&) override {}
    void failed(int, Error) override {}
  } ignore;
  try {
    // Unsignaled writes at the end are seen landing through a signaled
    // zero-byte write behind them (no immediate: it consumes no receive).
    for (int rank = 0; rank < size_; ++rank) {
      if (!alive(rank)) continue;
      PeerState& p = peer(rank);
      for (size_t i = 0; i < p.lanes.size(); ++i) {
        Lane& lane = p.lanes[i];
        if (lane.unsignaledRun == 0) continue;
        try {
          postControl(rank, i, ControlTag::Flush, std::nullopt, true, "flushing writes to");
        } catch (const Error& e) {  // that lane failed: it has nothing left to flush
          log(LogLevel::Debug, "while draining: {}", e.what());
        }
      }
    }
    while (outstanding() && std::chrono::steady_clock::now() < deadline) {
      if (!poll(ignore)) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  } catch (const std::exception& e) {
    log(LogLevel::Debug, "while draining: {}", e.what());
  }
}

}  // namespace rdmacc::rdma
