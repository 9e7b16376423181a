// wr_id is packed data, never a pointer: a completion must be attributable to
// (kind, peer, qp, tag) even after the object that posted it is gone.
#pragma once

#include <cstdint>

namespace rdmacc {

enum class WrKind : uint8_t { Recv = 1, Write = 2, WriteImm = 3, Control = 4, Bind = 5 };

// The tag of a Control write: what it was posted for (logs and traces read it).
enum class ControlTag : uint32_t { Credits = 0, Probe = 1, Board = 2, Flush = 3 };

struct WrId {
  WrKind kind = WrKind::Write;
  uint8_t qp = 0;     // queue pair index within the peer
  uint16_t peer = 0;  // peer rank
  uint32_t tag = 0;   // owner-defined: slot, step, sequence, ...

  friend constexpr bool operator==(const WrId&, const WrId&) = default;
};

// Bits: kind 63..56, qp 55..48, peer 47..32, tag 31..0.
constexpr uint64_t pack(WrId w) noexcept {
  return static_cast<uint64_t>(w.kind) << 56 | static_cast<uint64_t>(w.qp) << 48 |
         static_cast<uint64_t>(w.peer) << 32 | w.tag;
}

constexpr WrId unpack(uint64_t v) noexcept {
  return WrId{static_cast<WrKind>(v >> 56), static_cast<uint8_t>(v >> 48),
              static_cast<uint16_t>(v >> 32), static_cast<uint32_t>(v)};
}

// src/backend/arguments.hpp's kMaxWorldSize keeps every peer rank within the field.
static_assert(unpack(pack(WrId{WrKind::WriteImm, 3, 65535, 0xdeadbeef})) ==
              WrId{WrKind::WriteImm, 3, 65535, 0xdeadbeef});

}  // namespace rdmacc
