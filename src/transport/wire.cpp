#include "src/transport/wire.hpp"

#include <bit>

#include <fmt/format.h>

#include "rdmacc/work.hpp"
#include "src/transport/credits.hpp"

namespace rdmacc::wire {

std::string describe(const Header& h) {
  switch (h.kind) {
    case MessageKind::PointToPoint:
      return fmt::format("a send with tag {} ({} bytes, chunk {} of {} bytes)", h.sequence, h.check,
                         h.step, h.payload);
    case MessageKind::Advert:
      return fmt::format("an advert for {} #{} step {} ({} bytes)",
                         toString(static_cast<OpType>(h.opType)), h.sequence, h.step, h.length);
    case MessageKind::Abort:
      return fmt::format("an abort message ({} bytes)", h.payload);
    case MessageKind::Stuck:
      return fmt::format("a report of what a stuck rank waits for ({} bytes)", h.payload);
    case MessageKind::Leave:
      return fmt::format("a leave message for channel {} ({} bytes)", h.channel, h.payload);
    case MessageKind::Collective:
      return fmt::format("{} #{} step {} (check {:#x}, {} bytes)",
                         toString(static_cast<OpType>(h.opType)), h.sequence, h.step, h.check,
                         h.payload);
  }
  return fmt::format("a message of unknown kind {}", static_cast<unsigned>(h.kind));
}

SlotLedger::SlotLedger(int slots)
    : slots_(slots),
      sendable_((static_cast<size_t>(slots) + 63) / 64, ~uint64_t{0}),
      held_((static_cast<size_t>(slots) + 63) / 64, 0) {}

namespace {

Violation violation(std::string what) {
  return Violation{std::move(what)};
}

}  // namespace

std::optional<Violation> checkCompletion(const Completion& c, const Limits& limits,
                                         const SlotLedger& ledger, Arrival& out) {
  if (!c.rdmaWriteWithImm || !c.withImm) {
    return violation(fmt::format(
        "a receive completion that is not an RDMA write with immediate "
        "(opcode {}, immediate flag {})",
        c.rdmaWriteWithImm ? "RECV_RDMA_WITH_IMM" : "other", c.withImm ? "set" : "clear"));
  }
  if (credits::isCredit(c.imm)) {
    if (c.byteLen != 0) {
      return violation(
          fmt::format("a credit (immediate {:#x}) that carried {} bytes", c.imm, c.byteLen));
    }
    if ((c.imm & 0xffffu) == 0) {
      return violation(fmt::format("a credit (immediate {:#x}) that hands back no slot", c.imm));
    }
    std::optional<Violation> bad;
    credits::forEach(c.imm, [&](int slot) {
      if (bad) return;
      if (slot >= limits.slotsPerPeer) {
        bad = violation(fmt::format("a credit for slot {} of {} (immediate {:#x})", slot,
                                    limits.slotsPerPeer, c.imm));
      } else if (ledger.sendable(slot)) {
        bad =
            violation(fmt::format("a credit for slot {}, which this rank had not written since "
                                  "its last credit (a credit returned twice)",
                                  slot));
      }
    });
    if (bad) return bad;
    out = Arrival{.credit = true};
    return std::nullopt;
  }
  if ((c.imm >> 16) != 0) {
    return violation(fmt::format("a message immediate {:#x} with reserved bits 16..30 set", c.imm));
  }
  const int slot = static_cast<int>(c.imm & 0xffffu);
  if (slot >= limits.slotsPerPeer) {
    return violation(fmt::format("a message into slot {} of {}", slot, limits.slotsPerPeer));
  }
  if (ledger.held(slot)) {
    return violation(
        fmt::format("a message into slot {}, which still holds an earlier message "
                    "(its credit was never handed back)",
                    slot));
  }
  if (c.byteLen < kHeaderBytes || c.byteLen > limits.slotBytes) {
    return violation(fmt::format("a {}-byte write into slot {} (a message is {} to {} bytes)",
                                 c.byteLen, slot, kHeaderBytes, limits.slotBytes));
  }
  out = Arrival{.credit = false, .slot = slot};
  return std::nullopt;
}

std::optional<Violation> checkHeader(const Header& h, uint32_t byteLen, const Limits& limits,
                                     const SlotLedger& ledger) {
  if (h.magic != kMagic) {
    return violation(fmt::format("a header with magic {:#x} (expected {:#x})", h.magic, kMagic));
  }
  const auto kind = static_cast<unsigned>(h.kind);
  if (kind < static_cast<unsigned>(MessageKind::Collective) ||
      kind > static_cast<unsigned>(MessageKind::Leave)) {
    return violation(fmt::format("a message of unknown kind {}", kind));
  }
  if ((h.flags & ~kKnownFlags) != 0 || (h.flags != 0 && h.kind != MessageKind::Collective)) {
    return violation(fmt::format("{} with flags {:#x}", describe(h), h.flags));
  }
  const size_t maxPayload = limits.slotBytes - kHeaderBytes;
  if (h.payload > maxPayload) {
    return violation(fmt::format("{}: {} payload bytes, more than a slot's {}", describe(h),
                                 h.payload, maxPayload));
  }
  const bool direct = (h.flags & kDirect) != 0;
  const size_t expected = kHeaderBytes + (direct ? 0 : h.payload);
  if (byteLen != expected) {
    return violation(fmt::format("{} in a {}-byte write (its header says {} bytes)", describe(h),
                                 byteLen, expected));
  }
  if (h.kind == MessageKind::Leave && h.payload != 0) {
    return violation(fmt::format("{}: a leave message carries no payload", describe(h)));
  }
  if (h.kind == MessageKind::Advert) {
    if (h.payload != 0 || h.length == 0 || h.addr + h.length < h.addr) {
      return violation(
          fmt::format("{} at {:#x} with {} payload bytes", describe(h), h.addr, h.payload));
    }
  }
  for (uint64_t m = h.credits; m != 0; m &= m - 1) {
    const int slot = std::countr_zero(m);
    if (slot >= limits.slotsPerPeer) {
      return violation(
          fmt::format("{} handing back slot {} of {}", describe(h), slot, limits.slotsPerPeer));
    }
    if (ledger.sendable(slot)) {
      return violation(
          fmt::format("{} handing back slot {}, which this rank had not written "
                      "since its last credit (a credit returned twice)",
                      describe(h), slot));
    }
  }
  return std::nullopt;
}

std::optional<Violation> checkPointToPointChunk(const Header& h, size_t bytes, size_t done,
                                                size_t chunk) {
  const size_t left = bytes - done;  // done <= bytes: the receive's own count
  const size_t expected = left < chunk ? left : chunk;
  if (h.payload != expected) {
    return violation(
        fmt::format("{} carrying {} bytes where the receive expects {} ({} of {} "
                    "bytes received)",
                    describe(h), h.payload, expected, done, bytes));
  }
  return std::nullopt;
}

}  // namespace rdmacc::wire
