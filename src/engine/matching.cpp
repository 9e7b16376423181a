#include "src/engine/matching.hpp"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "rdmacc/error.hpp"
#include "rdmacc/log.hpp"
#include "src/transport/peer_errors.hpp"

namespace rdmacc {
namespace {

using wire::describe;
using wire::Header;
using wire::MessageKind;

// Adverts a peer may have outstanding: one per receive of the collectives in
// flight; a peer that sends more is broken (they would grow without bound).
constexpr size_t kMaxAdvertsPerPeer = 4096;

}  // namespace

Matching::Matching(Transport& transport, int size, size_t parkLimit)
    : transport_(transport),
      inbox_(size),
      inSlots_(size, 0),
      pressure_(std::max<size_t>(1, static_cast<size_t>(transport.slotsPerPeer()) / 2)),
      parkLimit_(parkLimit),
      adverts_(size) {
  // Bounded by the slots: reserved once, never allocated per message (only
  // parked messages, an exception, grow an inbox past them).
  for (auto& box : inbox_) box.reserve(static_cast<size_t>(transport.slotsPerPeer()));
}

void Matching::arrived(int peer, const Incoming& in) {
  if (in.header.kind != MessageKind::Advert) {
    inbox_[peer].push_back(Waiting{in, nullptr});
    if (++inSlots_[peer] == pressure_) ++pressured_;
    pointToPointInSlots_ += in.header.kind == MessageKind::PointToPoint;
    parkAgain_ = true;
    return;
  }
  const Header& h = in.header;
  transport_.release(peer, in.slot);
  // One for an operation this rank finished (it sent everything through the
  // slots first) is of no use any more.
  if (lastFinished_ && static_cast<int32_t>(h.sequence - *lastFinished_) <= 0) return;
  auto& adverts = adverts_[peer];
  if (adverts.size() >= kMaxAdvertsPerPeer) {
    throw protocolViolation(peer, transport_.peerAddress(peer),
                            wire::Violation{fmt::format("more than {} adverts not yet used ({})",
                                                        kMaxAdvertsPerPeer, describe(h))});
  }
  adverts.push_back(Advert{.sequence = h.sequence,
                           .step = h.step,
                           .opType = h.opType,
                           .check = h.check,
                           .addr = h.addr,
                           .rkey = h.rkey,
                           .length = h.length});
}

std::optional<Matching::It> Matching::findCollective(const Expectation& e, int peer, uint32_t index,
                                                     size_t payload) {
  const auto sequence = static_cast<uint32_t>(e.sequence);
  auto& box = inbox_[peer];
  for (auto it = box.begin(); it != box.end(); ++it) {
    const Header& h = it->header;
    if (h.kind != MessageKind::Collective) continue;
    if (h.sequence != sequence) {
      // One of an operation this rank already finished: the peer is out of
      // step. Any other belongs to another operation in flight, or to a
      // later one, and waits.
      if (static_cast<int32_t>(h.sequence - e.oldestSequence) < 0) mismatch(e, peer, h, payload);
      continue;
    }
    if (h.opType != static_cast<uint8_t>(e.type) || h.check != e.check) {
      mismatch(e, peer, h, payload);
    }
    if (h.step == e.step && h.chunk == index) {
      if (h.payload != payload) mismatch(e, peer, h, payload);
      return it;
    }
  }
  return std::nullopt;
}

size_t Matching::waiting(int peer, MessageKind kind, uint32_t sequence, uint32_t step) const {
  size_t n = 0;
  for (const Incoming& in : inbox_[peer]) {
    const Header& h = in.header;
    n += h.kind == kind && h.sequence == sequence &&
         (kind == MessageKind::PointToPoint || h.step == step);
  }
  return n;
}

std::optional<Matching::Found> Matching::findPointToPoint(int source, uint32_t tag,
                                                          uint32_t index) {
  std::optional<Found> match;
  auto look = [&](int peer) {
    auto& box = inbox_[peer];
    for (auto it = box.begin(); it != box.end(); ++it) {
      if (it->header.kind == MessageKind::PointToPoint && it->header.sequence == tag &&
          it->header.step == index) {
        if (!match || it->arrival < match->it->arrival) match = Found{peer, it};
        return;
      }
    }
  };
  if (source >= 0) {
    look(source);
  } else {
    for (int peer = 0; peer < static_cast<int>(inbox_.size()); ++peer) look(peer);
  }
  return match;
}

void Matching::consume(int peer, It in) {
  if (in->parked) {
    parkedBytes_ -= in->header.payload;
    inbox_[peer].erase(in);
    parkAgain_ = parkFull_;  // room for one that did not fit
    return;
  }
  const int slot = in->slot;
  const MessageKind kind = in->header.kind;
  inbox_[peer].erase(in);
  leftSlot(peer, kind);
  transport_.release(peer, slot);
}

void Matching::leftSlot(int peer, MessageKind kind) {
  pointToPointInSlots_ -= kind == MessageKind::PointToPoint;
  if (inSlots_[peer]-- == pressure_ && --pressured_ == 0) parkFull_ = false;
}

bool Matching::park(const Claims& claims, bool pointToPointPending, uint64_t operationChanges) {
  // Connections shared with other groups (Transport::contended): one of
  // them may wait for a peer whose slots this group's messages hold.
  const bool shared = transport_.anyContended();
  const uint64_t contention = shared ? transport_.contention() : contention_;
  // Without a receive only point-to-point messages may go; and only a new
  // message, or an operation that came or went, changes what may go.
  if (parkLimit_ == 0 ||
      (!parkAgain_ && operationChanges == operationChanges_ && contention == contention_)) {
    return false;
  }
  if (!shared && (pressured_ == 0 || (!pointToPointPending && pointToPointInSlots_ == 0))) {
    return false;
  }
  parkAgain_ = false;
  operationChanges_ = operationChanges;
  contention_ = contention;
  bool released = false, full = false;
  for (int peer = 0; peer < static_cast<int>(inbox_.size()); ++peer) {
    const bool contended = shared && inSlots_[peer] > 0 && transport_.contended(peer);
    if (inSlots_[peer] < pressure_ && !contended) continue;
    const bool receiving = claims.receivesFrom(peer);
    std::optional<bool> waits;  // asked only for a message that could go
    for (Waiting& w : inbox_[peer]) {
      const Header& h = w.header;
      // A direct write's payload is at its destination, not in the slot.
      if (w.parked || (h.flags & wire::kDirect) != 0 || claims.takes(peer, h)) continue;
      if (!contended) {
        if (h.kind == MessageKind::Collective && !receiving) continue;
        if (!waits) waits = receiving || claims.awaits(peer);
        if (!*waits) break;
      }
      if (parkedBytes_ + h.payload > parkLimit_) {
        full = true;
        break;
      }
      w.parked = std::make_unique_for_overwrite<uint8_t[]>(std::max<size_t>(h.payload, 1));
      std::memcpy(w.parked.get(), transport_.payload(peer, w.slot), h.payload);
      transport_.release(peer, w.slot);
      w.slot = -1;
      parkedBytes_ += h.payload;
      leftSlot(peer, h.kind);
      released = true;
    }
  }
  parkFull_ = full;
  return released;
}

void Matching::mismatch(const Expectation& e, int peer, const Header& got,
                        size_t expectedPayload) const {
  throw Error(ErrorInfo{
      .kind = ErrorKind::Protocol,
      .message = fmt::format(
          "rank {} sent {} while this rank expects {} #{} step {} (check {:#x}, {} bytes)", peer,
          describe(got), toString(e.type), e.sequence, e.step, e.check, expectedPayload),
      .peerRank = peer,
      .peerAddress = transport_.peerAddress(peer),
      .hint = "every rank must call the same collectives in the same order with the same sizes, "
              "dtypes, roots and reduce ops"});
}

std::optional<DirectTarget> Matching::directTarget(const Expectation& e, int peer, size_t offset,
                                                   size_t payload) const {
  for (const Advert& ad : adverts_[peer]) {
    if (ad.sequence != static_cast<uint32_t>(e.sequence) || ad.step != e.step) continue;
    // One that disagrees with this operation: the slots path reports the mismatch.
    if (ad.opType != static_cast<uint8_t>(e.type) || ad.check != e.check ||
        offset + payload > ad.length) {
      return std::nullopt;
    }
    return DirectTarget{ad.addr + offset, ad.rkey};
  }
  return std::nullopt;
}

void Matching::finished(uint32_t sequence) {
  lastFinished_ = sequence;
  for (auto& adverts : adverts_) {
    std::erase_if(adverts, [&](const Advert& ad) {
      return static_cast<int32_t>(ad.sequence - sequence) <= 0;
    });
  }
}

std::string Matching::describePeer(int peer) const {
  const Inbox& inbox = inbox_[peer];
  std::string what;
  for (size_t i = 0; i < inbox.size() && i < 4; ++i) {
    what += (i == 0 ? "" : "; ") + wire::describe(inbox[i].header);
  }
  if (inbox.size() > 4) what += "; ...";
  std::string parked;
  if (const size_t n = inbox.size() - inSlots_[peer]; n > 0 || parkFull_) {
    parked =
        fmt::format(", {} parked (copied out of their slots; the group's {} of {} bytes used{})", n,
                    parkedBytes_, parkLimit_,
                    parkFull_ ? fmt::format(": full; {}", kParkFullAdvice) : std::string());
  }
  return fmt::format("{} message(s) waiting{}{}{}{}, {} advert(s)", inbox.size(),
                     what.empty() ? "" : " (", what, what.empty() ? "" : ")", parked,
                     adverts_[peer].size());
}

}  // namespace rdmacc
