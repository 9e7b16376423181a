// What RDMA hardware this host has, and which device, port, address and GID
// rdmacc would use with a given configuration (rdmacc-info prints both).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "rdmacc/config.hpp"

namespace rdmacc {

struct GidEntry {
  int index = 0;
  std::array<uint8_t, 16> raw{};
  std::string address;  // text form, e.g. ::ffff:192.168.77.1
  std::string type;     // "RoCE v2", "IB/RoCE v1", or "" when unknown
  std::string netdev;   // the netdev the GID belongs to (RoCE), if known

  // The IPv4 address of an IPv4-mapped GID (::ffff:a.b.c.d), host byte order.
  std::optional<uint32_t> ipv4() const;
  bool isRoceV2() const { return type == "RoCE v2"; }
};

struct PortInfo {
  int port = 1;
  bool active = false;
  std::string state;      // "ACTIVE", "DOWN", ...
  std::string linkLayer;  // "Ethernet" (RoCE) or "InfiniBand"
  int activeMtu = 0;      // bytes
  int maxMtu = 0;         // bytes
  std::vector<GidEntry> gids;
};

struct DeviceInfo {
  std::string name;
  std::string firmware;
  uint64_t nodeGuid = 0;
  int maxQpWr = 0;
  int maxCqe = 0;
  uint64_t maxMrSize = 0;
  std::vector<PortInfo> ports;
};

// Every RDMA device with every port. An empty list is not an error.
std::vector<DeviceInfo> listDevices();

// Where rdmacc will talk from.
struct Endpoint {
  std::string device;
  int port = 1;
  std::string ipv4;  // address rdma_cm binds to
  int gidIndex = 0;
  std::string gid;  // text form of the chosen GID
  std::string gidType;
  int activeMtu = 0;   // bytes, this port's
  std::string reason;  // how the choice was made, for rdmacc-info and logs
};

// Chooses device, port and address from RDMACC_IB_HCA, RDMACC_SOCKET_IFNAME,
// RDMACC_IB_GID_INDEX. With several usable ports (RDMACC_IB_HCA lists more
// than one, or it is empty and the host has several), the local ranks spread
// over them: local rank r takes port r mod n, as NCCL's ranks spread over a
// host's NICs. Throws Error(NoDevice/InvalidArgument) that names what exists
// and what to change.
Endpoint selectEndpoint(const Config& config);  // local rank from the environment
Endpoint selectEndpoint(const Config& config, int localRank);
// The ports one rank stripes its RDMA traffic over (RDMACC_IB_RAILS =
// `count`): local rank r takes usable ports r, r + 1, ... (mod n). Throws
// Error(InvalidArgument) when fewer than `count` ports are usable.
std::vector<Endpoint> selectEndpoints(const Config& config, int localRank, int count);

// RDMACC_IB_HCA's syntax, "device[:port][,device[:port]]..." (pure; throws
// Error(InvalidArgument) naming the bad entry). Port 0: any port.
struct HcaEntry {
  std::string device;
  int port = 0;
};
std::vector<HcaEntry> parseHcaList(const std::string& text);

// The GID rule alone, on a port's table (pure; tested without a device):
// an explicit index must exist (and be RoCE v2 on Ethernet); otherwise the
// RoCE v2 IPv4-mapped GID equal to `bindAddress`, else the first RoCE v2
// IPv4-mapped GID; on InfiniBand, GID 0.
struct GidChoice {
  int index = -1;
  std::string reason;
};
GidChoice chooseGid(const std::string& device, const PortInfo& port, int requestedIndex,
                    std::optional<uint32_t> bindAddress);

// Text helpers.
std::string formatGid(const std::array<uint8_t, 16>& raw);
std::string formatIpv4(uint32_t hostOrder);
std::string describeGids(const PortInfo& port);  // "0: fe80::.. (RoCE v2), 1: ..."

// Whether memory registered with a device stays correct in this process
// across fork() (PyTorch's DataLoader workers fork): the kernel keeps it so
// (Linux >= 5.13 with rdma-core >= 35: "unneeded"), RDMAV_FORK_SAFE=1 or
// ibv_fork_init() made it so ("enabled"), or neither (atRisk: a forked child
// can leave the parent's registered pages copy-on-write, and the device
// then reads or writes pages the parent no longer sees).
struct ForkSafety {
  bool atRisk = false;
  std::string text;
};
ForkSafety forkSafety();

// The locked-memory limit (RLIMIT_MEMLOCK soft limit) in bytes; nullopt = unlimited.
std::optional<uint64_t> lockedMemoryLimit();

}  // namespace rdmacc
