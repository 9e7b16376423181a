// The private data of rdma_cm connect, accept and reject messages. Pure: no
// device needed, tested on the host. Fields are little-endian on the wire.
//
// A hello proves that its sender holds the group's secret without carrying
// it: `proof` is an HMAC-SHA256 (keyed with the secret, truncated to 128 bits)
// over the hello's other fields, its direction (request or reply) and the
// sender's queue pair number, which rdma_cm carries beside the private data.
// A hello seen on the fabric is useless for another rank pair, direction,
// queue pair, group or run, and the secret never crosses the network.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace rdmacc::handshake {

constexpr uint32_t kMagic = 0x43434452;  // "RDCC"
constexpr uint16_t kVersion = 8;
constexpr size_t kProofBytes = 16;
constexpr size_t kHelloBytes = 40 + kProofBytes;  // all 56 bytes of an IB CM REQ's private data
static_assert(kHelloBytes <= 56, "rdma_cm carries 56 bytes of private data in a request");
constexpr size_t kRejectBytes = 8;
// The largest one-shot board a hello can offer (7 bits).
constexpr uint8_t kMaxBoardBytes = 127;

// Sent by the connecting side in the REQ and by the accepting side in the REP.
struct Hello {
  uint16_t version = kVersion;
  uint8_t qpIndex = 0;
  // Whether the sender connects on first use (RDMACC_CONNECT; eager: at
  // formation), and the one-shot board it offers (payload bytes, 0: none;
  // eager only: its entries follow the slots, under the same rkey). One
  // byte on the wire: the flag is its top bit.
  bool lazy = false;
  uint8_t boardBytes = 0;
  uint32_t rank = 0;        // sender
  uint32_t targetRank = 0;  // receiver
  uint32_t worldSize = 0;
  uint16_t activeMtu = 0;  // sender port's active MTU, bytes
  // The sender's slots for the receiver, which writes into them with this
  // rkey from slotBase on (eager or lazy: no slot table goes through the
  // store).
  uint16_t slotsPerPeer = 0;
  uint32_t slotBytes = 0;
  uint64_t slotBase = 0;
  uint32_t slotRkey = 0;
  std::array<uint8_t, kProofBytes> proof{};  // see seal()
};

enum class Direction : uint8_t { Request = 1, Reply = 2 };

enum class RejectReason : uint8_t {
  Malformed = 1,
  BadVersion,
  BadToken,
  BadRank,
  WrongTarget,
  WorldSizeMismatch,
  Duplicate,
  BadQpIndex,
  GroupFormed,
  ConnectModeMismatch,
  SlotMismatch,
  // Both ranks connected to each other at once: the connection the higher
  // rank started wins, the lower rank's is refused with this.
  Crossed,
};
const char* toString(RejectReason reason) noexcept;

// Sets hello.proof for `secret` (the group's, see Mesh), the direction and
// the sender's queue pair number.
void seal(Hello& hello, std::string_view secret, Direction direction, uint32_t senderQpn);

std::array<uint8_t, kHelloBytes> encode(const Hello& hello);
// nullopt when the bytes are not an rdmacc hello (too short, wrong magic).
// Longer input is fine: IB CM pads private data to its full size.
std::optional<Hello> decodeHello(std::span<const uint8_t> bytes);

std::array<uint8_t, kRejectBytes> encodeReject(RejectReason reason);
std::optional<RejectReason> decodeReject(std::span<const uint8_t> bytes);

// What the receiving rank expects of a hello.
struct Expectation {
  uint32_t myRank = 0;
  uint32_t worldSize = 0;
  std::string_view secret;                   // the group's
  Direction direction = Direction::Request;  // of the hello received
  uint32_t senderQpn = 0;                    // as rdma_cm reported it with the hello
  uint32_t qpsPerPeer = 1;
  // Whether this rank connects on first use, and its slots per peer and
  // slot size (the sender must use the same).
  bool lazy = false;
  uint16_t slotsPerPeer = 0;
  uint32_t slotBytes = 0;
  // Inclusive range of ranks allowed to send this hello.
  uint32_t minPeer = 0;
  uint32_t maxPeer = 0;
};
std::optional<RejectReason> validate(const Hello& hello, const Expectation& expect);

}  // namespace rdmacc::handshake
