// The device-independent half of topology.hpp: GID choice and formatting.
#include <arpa/inet.h>
#include <sys/resource.h>

#include <fmt/format.h>

#include "rdmacc/error.hpp"
#include "rdmacc/topology.hpp"

namespace rdmacc {

std::optional<uint32_t> GidEntry::ipv4() const {
  for (int i = 0; i < 10; ++i) {
    if (raw[i] != 0) return std::nullopt;
  }
  if (raw[10] != 0xff || raw[11] != 0xff) return std::nullopt;
  return static_cast<uint32_t>(raw[12]) << 24 | static_cast<uint32_t>(raw[13]) << 16 |
         static_cast<uint32_t>(raw[14]) << 8 | raw[15];
}

std::string formatGid(const std::array<uint8_t, 16>& raw) {
  char text[INET6_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET6, raw.data(), text, sizeof text);
  return text;
}

std::string formatIpv4(uint32_t hostOrder) {
  return fmt::format("{}.{}.{}.{}", hostOrder >> 24, (hostOrder >> 16) & 0xff,
                     (hostOrder >> 8) & 0xff, hostOrder & 0xff);
}

std::string describeGids(const PortInfo& port) {
  std::string out;
  for (const auto& g : port.gids) {
    if (!out.empty()) out += ", ";
    out +=
        fmt::format("{}: {} ({}{}{})", g.index, g.address, g.type.empty() ? "type unknown" : g.type,
                    g.netdev.empty() ? "" : ", ", g.netdev);
  }
  return out.empty() ? "none" : out;
}

GidChoice chooseGid(const std::string& device, const PortInfo& port, int requestedIndex,
                    std::optional<uint32_t> bindAddress) {
  const bool ethernet = port.linkLayer == "Ethernet";
  auto where = [&] { return fmt::format("{} port {}", device, port.port); };
  if (requestedIndex >= 0) {
    for (const auto& g : port.gids) {
      if (g.index != requestedIndex) continue;
      if (ethernet && !g.isRoceV2()) {
        throw Error(ErrorKind::NoDevice,
                    fmt::format("RDMACC_IB_GID_INDEX={} on {} is a {} GID, not RoCE v2",
                                requestedIndex, where(), g.type.empty() ? "typeless" : g.type),
                    fmt::format("pick a RoCE v2 GID or unset RDMACC_IB_GID_INDEX; GIDs: {}",
                                describeGids(port)));
      }
      return {requestedIndex, fmt::format("RDMACC_IB_GID_INDEX={}", requestedIndex)};
    }
    throw Error(ErrorKind::NoDevice,
                fmt::format("RDMACC_IB_GID_INDEX={} does not exist on {}", requestedIndex, where()),
                fmt::format("pick one of: {}", describeGids(port)));
  }
  if (!ethernet) {
    if (port.gids.empty()) {
      throw Error(ErrorKind::NoDevice, fmt::format("{} has an empty GID table", where()),
                  "check that the subnet manager (opensm) has configured the port");
    }
    return {port.gids.front().index, "InfiniBand port GID (index 0)"};
  }
  const GidEntry* firstV4 = nullptr;
  for (const auto& g : port.gids) {
    if (!g.isRoceV2() || !g.ipv4()) continue;
    if (bindAddress && g.ipv4() == bindAddress) {
      return {g.index, fmt::format("auto: RoCE v2, IPv4-mapped, matches bound address {}",
                                   formatIpv4(*bindAddress))};
    }
    if (firstV4 == nullptr) firstV4 = &g;
  }
  if (bindAddress) {
    throw Error(
        ErrorKind::NoDevice,
        fmt::format("{} has no RoCE v2 GID for address {}", where(), formatIpv4(*bindAddress)),
        fmt::format("the address must belong to the port's netdev; GIDs: {}", describeGids(port)));
  }
  if (firstV4 != nullptr) return {firstV4->index, "auto: first RoCE v2 IPv4-mapped GID"};
  throw Error(
      ErrorKind::NoDevice, fmt::format("{} has no RoCE v2 IPv4-mapped GID", where()),
      fmt::format("give the port's netdev an IPv4 address (ip addr add ... dev <netdev>); GIDs: {}",
                  describeGids(port)));
}

std::optional<uint64_t> lockedMemoryLimit() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_MEMLOCK, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return std::nullopt;
  return static_cast<uint64_t>(rl.rlim_cur);
}

}  // namespace rdmacc
