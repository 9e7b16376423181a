#include "src/transport/rdma/handshake.hpp"

#include "src/store/auth.hpp"

#include <algorithm>

namespace rdmacc::handshake {
namespace {

template <typename T>
void put(uint8_t*& p, T v) {
  for (size_t i = 0; i < sizeof(T); ++i)
    *p++ = static_cast<uint8_t>(static_cast<uint64_t>(v) >> (8 * i));
}

template <typename T>
T get(const uint8_t*& p) {
  uint64_t v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<uint64_t>(*p++) << (8 * i);
  return static_cast<T>(v);
}

// The bytes the proof covers: every field before it, then the direction
// and the sender's queue pair number.
auth::Mac expectedProof(const Hello& h, std::string_view secret, Direction direction,
                        uint32_t senderQpn) {
  auto bytes = encode(h);
  std::array<uint8_t, 5> context{};
  uint8_t* p = context.data();
  put<uint8_t>(p, static_cast<uint8_t>(direction));
  put<uint32_t>(p, senderQpn);
  return auth::mac(secret, "rdmacc hello", std::span(bytes.data(), kHelloBytes - kProofBytes),
                   context);
}

}  // namespace

void seal(Hello& hello, std::string_view secret, Direction direction, uint32_t senderQpn) {
  const auto mac = expectedProof(hello, secret, direction, senderQpn);
  std::copy_n(mac.begin(), kProofBytes, hello.proof.begin());
}

const char* toString(RejectReason reason) noexcept {
  switch (reason) {
    case RejectReason::Malformed:
      return "not an rdmacc connection request";
    case RejectReason::BadVersion:
      return "protocol version mismatch";
    case RejectReason::BadToken:
      return "wrong group token (a process of another job or group, or a replayed request)";
    case RejectReason::BadRank:
      return "rank out of range or not expected to connect";
    case RejectReason::WrongTarget:
      return "connection meant for another rank";
    case RejectReason::WorldSizeMismatch:
      return "world size mismatch";
    case RejectReason::Duplicate:
      return "duplicate connection for an established queue pair";
    case RejectReason::BadQpIndex:
      return "queue pair index out of range (RDMACC_QPS_PER_PEER differs)";
    case RejectReason::GroupFormed:
      return "the group has already formed (a late or stranger connection)";
    case RejectReason::ConnectModeMismatch:
      return "one rank connects on first use, the other at formation (RDMACC_CONNECT differs)";
    case RejectReason::SlotMismatch:
      return "slots per peer or slot size differ (RDMACC_SLOTS_PER_PEER, RDMACC_SLOT_BYTES)";
    case RejectReason::Crossed:
      return "both ranks connected at once; the higher rank's connection is kept";
  }
  return "unknown reason";
}

std::array<uint8_t, kHelloBytes> encode(const Hello& h) {
  std::array<uint8_t, kHelloBytes> out{};
  uint8_t* p = out.data();
  put<uint32_t>(p, kMagic);
  put<uint16_t>(p, h.version);
  put<uint8_t>(p, h.qpIndex);
  put<uint8_t>(p, static_cast<uint8_t>((h.lazy ? 0x80u : 0u) | (h.boardBytes & kMaxBoardBytes)));
  put<uint32_t>(p, h.rank);
  put<uint32_t>(p, h.targetRank);
  put<uint32_t>(p, h.worldSize);
  put<uint16_t>(p, h.activeMtu);
  put<uint16_t>(p, h.slotsPerPeer);
  put<uint32_t>(p, h.slotBytes);
  put<uint64_t>(p, h.slotBase);
  put<uint32_t>(p, h.slotRkey);
  std::copy(h.proof.begin(), h.proof.end(), p);
  return out;
}

std::optional<Hello> decodeHello(std::span<const uint8_t> bytes) {
  if (bytes.size() < kHelloBytes) return std::nullopt;
  const uint8_t* p = bytes.data();
  if (get<uint32_t>(p) != kMagic) return std::nullopt;
  Hello h;
  h.version = get<uint16_t>(p);
  h.qpIndex = get<uint8_t>(p);
  const auto mode = get<uint8_t>(p);
  h.lazy = (mode & 0x80u) != 0;
  h.boardBytes = static_cast<uint8_t>(mode & kMaxBoardBytes);
  h.rank = get<uint32_t>(p);
  h.targetRank = get<uint32_t>(p);
  h.worldSize = get<uint32_t>(p);
  h.activeMtu = get<uint16_t>(p);
  h.slotsPerPeer = get<uint16_t>(p);
  h.slotBytes = get<uint32_t>(p);
  h.slotBase = get<uint64_t>(p);
  h.slotRkey = get<uint32_t>(p);
  std::copy_n(p, kProofBytes, h.proof.begin());
  return h;
}

std::array<uint8_t, kRejectBytes> encodeReject(RejectReason reason) {
  std::array<uint8_t, kRejectBytes> out{};
  uint8_t* p = out.data();
  put<uint32_t>(p, kMagic ^ 0xffffffffu);
  put<uint16_t>(p, kVersion);
  put<uint8_t>(p, static_cast<uint8_t>(reason));
  return out;
}

std::optional<RejectReason> decodeReject(std::span<const uint8_t> bytes) {
  if (bytes.size() < kRejectBytes) return std::nullopt;
  const uint8_t* p = bytes.data();
  if (get<uint32_t>(p) != (kMagic ^ 0xffffffffu)) return std::nullopt;
  get<uint16_t>(p);
  auto reason = get<uint8_t>(p);
  if (reason < 1 || reason > static_cast<uint8_t>(RejectReason::Crossed)) return std::nullopt;
  return static_cast<RejectReason>(reason);
}

std::optional<RejectReason> validate(const Hello& h, const Expectation& e) {
  if (h.version != kVersion) return RejectReason::BadVersion;
  if (h.worldSize != e.worldSize) return RejectReason::WorldSizeMismatch;
  if (h.targetRank != e.myRank) return RejectReason::WrongTarget;
  if (h.rank >= e.worldSize || h.rank < e.minPeer || h.rank > e.maxPeer || h.rank == e.myRank) {
    return RejectReason::BadRank;
  }
  if (h.qpIndex >= e.qpsPerPeer) return RejectReason::BadQpIndex;
  if (h.lazy != e.lazy) return RejectReason::ConnectModeMismatch;
  if (h.slotsPerPeer != e.slotsPerPeer || h.slotBytes != e.slotBytes) {
    return RejectReason::SlotMismatch;
  }
  // Last, so that a member of the group with another configuration learns
  // what differs rather than "wrong token".
  const auto proof = expectedProof(h, e.secret, e.direction, e.senderQpn);
  if (!auth::same(proof, h.proof.data(), kProofBytes)) return RejectReason::BadToken;
  return std::nullopt;
}

}  // namespace rdmacc::handshake
