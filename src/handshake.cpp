#include "src/handshake.hpp"

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

}  // namespace

const char* toString(RejectReason reason) noexcept {
  switch (reason) {
    case RejectReason::Malformed:
      return "not an rdmacc connection request";
    case RejectReason::BadVersion:
      return "protocol version mismatch";
    case RejectReason::BadToken:
      return "wrong group token (a process of another job or group)";
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
  }
  return "unknown reason";
}

std::array<uint8_t, kHelloBytes> encode(const Hello& h) {
  std::array<uint8_t, kHelloBytes> out{};
  uint8_t* p = out.data();
  put<uint32_t>(p, kMagic);
  put<uint16_t>(p, h.version);
  put<uint16_t>(p, h.qpIndex);
  put<uint32_t>(p, h.rank);
  put<uint32_t>(p, h.targetRank);
  put<uint32_t>(p, h.worldSize);
  put<uint64_t>(p, h.token);
  put<uint32_t>(p, h.activeMtu);
  return out;
}

std::optional<Hello> decodeHello(std::span<const uint8_t> bytes) {
  if (bytes.size() < kHelloBytes) return std::nullopt;
  const uint8_t* p = bytes.data();
  if (get<uint32_t>(p) != kMagic) return std::nullopt;
  Hello h;
  h.version = get<uint16_t>(p);
  h.qpIndex = get<uint16_t>(p);
  h.rank = get<uint32_t>(p);
  h.targetRank = get<uint32_t>(p);
  h.worldSize = get<uint32_t>(p);
  h.token = get<uint64_t>(p);
  h.activeMtu = get<uint32_t>(p);
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
  if (reason < 1 || reason > static_cast<uint8_t>(RejectReason::GroupFormed)) return std::nullopt;
  return static_cast<RejectReason>(reason);
}

std::optional<RejectReason> validate(const Hello& h, const Expectation& e) {
  if (h.version != kVersion) return RejectReason::BadVersion;
  if (h.token != e.token) return RejectReason::BadToken;
  if (h.worldSize != e.worldSize) return RejectReason::WorldSizeMismatch;
  if (h.targetRank != e.myRank) return RejectReason::WrongTarget;
  if (h.rank >= e.worldSize || h.rank < e.minPeer || h.rank > e.maxPeer || h.rank == e.myRank) {
    return RejectReason::BadRank;
  }
  if (h.qpIndex >= e.qpsPerPeer) return RejectReason::BadQpIndex;
  return std::nullopt;
}

}  // namespace rdmacc::handshake
