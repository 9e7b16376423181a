// Endpoint selection: which device, port, GID and address a rank (or each of
// its rails) uses, from RDMACC_IB_HCA, RDMACC_SOCKET_IFNAME,
// RDMACC_IB_GID_INDEX and the local rank. Policy, over verbs/'s device
// queries (listDevices) and the GID rule (chooseGid, topology.cpp).
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "rdmacc/environment.hpp"
#include "rdmacc/error.hpp"
#include "rdmacc/topology.hpp"
#include "verbs/device.hpp"

namespace rdmacc {
namespace {

std::string listPorts(const DeviceInfo& d) {
  std::string out;
  for (const auto& p : d.ports) {
    out += fmt::format("{}{}:{} {} ({})", out.empty() ? "" : ", ", d.name, p.port, p.state,
                       p.linkLayer);
  }
  return out;
}

// Every device RDMACC_IB_HCA names must exist.
void checkNamedDevices(const std::vector<HcaEntry>& wants, const std::vector<DeviceInfo>& devices) {
  std::vector<std::string> names;
  for (const auto& d : devices) names.push_back(d.name);
  for (const auto& want : wants) {
    if (std::find(names.begin(), names.end(), want.device) == names.end()) {
      throw Error(ErrorKind::NoDevice,
                  fmt::format("RDMACC_IB_HCA names device '{}', which does not exist", want.device),
                  fmt::format("devices here: {}", fmt::join(names, ", ")));
    }
  }
}

// Decides whether a port can carry the rank's traffic and with which GID
// and address; remembers why the others cannot, for the error if none can.
class PortJudge {
 public:
  PortJudge(const Config& config, const std::vector<HcaEntry>& wants)
      : gidIndex_(static_cast<int>(config.getInt("RDMACC_IB_GID_INDEX"))),
        exact_(wants.size() == 1),  // one port named: its problem is reported precisely
        wants_(wants) {
    const std::string& ifname = config.getString("RDMACC_SOCKET_IFNAME");
    if (ifname.empty()) return;
    ifAddress_ = verbs::interfaceIpv4(ifname);
    if (!ifAddress_) {
      throw Error(
          ErrorKind::InvalidArgument,
          fmt::format("RDMACC_SOCKET_IFNAME={} has no IPv4 address (or does not exist)", ifname),
          "name an interface listed by `ip -4 addr` that carries the RDMA traffic");
    }
  }

  std::optional<Endpoint> operator()(const DeviceInfo& d, const PortInfo& p) {
    const std::string where = fmt::format("{}:{}", d.name, p.port);
    if (!p.active) {
      rejected.push_back(fmt::format("{} is {} (not ACTIVE)", where, p.state));
      return std::nullopt;
    }
    std::optional<uint32_t> address = ifAddress_;
    if (!address && p.linkLayer == "InfiniBand") address = verbs::ipoibAddress(d.name, p.port);
    if (!address && p.linkLayer == "Ethernet" && gidIndex_ >= 0) {
      for (const auto& g : p.gids) {
        if (g.index == gidIndex_) address = g.ipv4();
      }
    }
    GidChoice gid;
    try {
      gid = chooseGid(d.name, p, gidIndex_, address);
    } catch (const Error& e) {
      if (exact_ && (wants_[0].port > 0 || d.ports.size() == 1)) throw;
      rejected.push_back(fmt::format("{}: {}", where, e.info().message));
      return std::nullopt;
    }
    const GidEntry* entry = nullptr;
    for (const auto& g : p.gids) {
      if (g.index == gid.index) entry = &g;
    }
    if (!address && entry != nullptr) address = entry->ipv4();
    if (!address) {
      rejected.push_back(fmt::format("{} has no IPv4 address for rdma_cm", where));
      return std::nullopt;
    }
    return Endpoint{.device = d.name,
                    .port = p.port,
                    .ipv4 = formatIpv4(*address),
                    .gidIndex = gid.index,
                    .gid = entry ? entry->address : "",
                    .gidType = entry ? entry->type : "",
                    .activeMtu = p.activeMtu,
                    .reason = gid.reason};
  }

  bool exact() const { return exact_; }
  std::vector<std::string> rejected;

 private:
  int gidIndex_;
  bool exact_;
  const std::vector<HcaEntry>& wants_;
  std::optional<uint32_t> ifAddress_;
};

// The usable ports: those RDMACC_IB_HCA lists, in its order (the first that
// works per entry), else every port of every device.
std::vector<Endpoint> usablePorts(const std::string& hca, const std::vector<HcaEntry>& wants,
                                  const std::vector<DeviceInfo>& devices, PortJudge& judge) {
  std::vector<Endpoint> found;
  if (wants.empty()) {
    for (const auto& d : devices) {
      for (const auto& p : d.ports) {
        if (auto ep = judge(d, p)) found.push_back(std::move(*ep));
      }
    }
    return found;
  }
  for (const auto& want : wants) {
    for (const auto& d : devices) {
      if (d.name != want.device) continue;
      bool portExists = false;
      for (const auto& p : d.ports) {
        if (want.port > 0 && p.port != want.port) continue;
        portExists = true;
        if (auto ep = judge(d, p)) {
          found.push_back(std::move(*ep));
          break;
        }
      }
      if (want.port > 0 && !portExists) {
        if (judge.exact()) {
          throw Error(ErrorKind::NoDevice,
                      fmt::format("RDMACC_IB_HCA={}: port {} does not exist", hca, want.port),
                      fmt::format("ports: {}", listPorts(d)));
        }
        judge.rejected.push_back(fmt::format("{}:{} does not exist", want.device, want.port));
      }
    }
  }
  return found;
}

// Several usable ports: the local ranks of a host spread over them, as
// NCCL's do; a rank that stripes over `count` takes the ports after its own.
std::vector<Endpoint> spread(const std::vector<Endpoint>& found, const std::string& hca,
                             int localRank, int count) {
  const std::string from = hca.empty() ? "active ports" : "RDMACC_IB_HCA=" + hca;
  std::vector<Endpoint> chosen;
  for (int i = 0; i < count; ++i) {
    const size_t pick =
        (static_cast<size_t>(std::max(localRank, 0)) + static_cast<size_t>(i)) % found.size();
    Endpoint ep = found[pick];
    ep.reason =
        found.size() == 1
            ? fmt::format("{}; {}", hca.empty() ? "first active port" : "RDMACC_IB_HCA=" + hca,
                          ep.reason)
        : count == 1
            ? fmt::format("port {} of {} usable ({}) for local rank {}; {}", pick + 1, found.size(),
                          from, localRank, ep.reason)
            : fmt::format("rail {} of {}: port {} of {} usable ({}) for local rank {}; {}", i + 1,
                          count, pick + 1, found.size(), from, localRank, ep.reason);
    chosen.push_back(std::move(ep));
  }
  return chosen;
}

}  // namespace

std::vector<HcaEntry> parseHcaList(const std::string& text) {
  std::vector<HcaEntry> out;
  if (text.empty()) return out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    std::string item =
        text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    start = comma == std::string::npos ? text.size() + 1 : comma + 1;
    if (item.empty()) {
      throw Error(ErrorKind::InvalidArgument,
                  fmt::format("RDMACC_IB_HCA='{}' has an empty entry", text),
                  "write device[:port] entries separated by commas, e.g. mlx5_0:1,mlx5_1:1");
    }
    HcaEntry e;
    auto colon = item.find(':');
    e.device = item.substr(0, colon);
    if (colon != std::string::npos) {
      const std::string port = item.substr(colon + 1);
      int64_t n = -1;
      if (!port.empty() && port.size() <= 3 &&
          port.find_first_not_of("0123456789") == std::string::npos) {
        n = std::stoi(port);
      }
      if (n < 1 || n > 255) {
        throw Error(ErrorKind::InvalidArgument,
                    fmt::format("RDMACC_IB_HCA='{}' has a bad port in '{}'", text, item),
                    "write it as device[:port] with port 1..255, e.g. mlx5_0:1");
      }
      e.port = static_cast<int>(n);
    }
    if (e.device.empty()) {
      throw Error(ErrorKind::InvalidArgument,
                  fmt::format("RDMACC_IB_HCA='{}' has an entry without a device: '{}'", text, item),
                  "write device[:port] entries, e.g. mlx5_0:1,mlx5_1:1");
    }
    out.push_back(std::move(e));
  }
  return out;
}

Endpoint selectEndpoint(const Config& config) {
  return selectEndpoint(config, localRankFromEnvironment());
}

Endpoint selectEndpoint(const Config& config, int localRank) {
  return selectEndpoints(config, localRank, 1).front();
}

std::vector<Endpoint> selectEndpoints(const Config& config, int localRank, int count) {
  const std::string& hca = config.getString("RDMACC_IB_HCA");
  const std::vector<HcaEntry> wants = parseHcaList(hca);
  const std::vector<DeviceInfo> devices = listDevices();
  if (devices.empty()) {
    throw Error(ErrorKind::NoDevice, "no RDMA device found (ibv_get_device_list is empty)",
                verbs::noDeviceHint());
  }
  checkNamedDevices(wants, devices);
  PortJudge judge(config, wants);
  const std::vector<Endpoint> found = usablePorts(hca, wants, devices, judge);
  if (found.empty()) {
    throw Error(
        ErrorKind::NoDevice,
        fmt::format("no usable RDMA port: {}", fmt::join(judge.rejected, "; ")),
        "bring a port up (`rdma link`, `ibv_devinfo`), give its netdev an IPv4 address, or pick "
        "another with RDMACC_IB_HCA=device:port");
  }
  if (count < 1 || static_cast<size_t>(count) > found.size()) {
    throw Error(ErrorKind::InvalidArgument,
                fmt::format("RDMACC_IB_RAILS={} but {} usable port(s) ({})", count, found.size(),
                            hca.empty() ? "every active port" : "RDMACC_IB_HCA=" + hca),
                "list as many ports in RDMACC_IB_HCA (device:port,...) as rails, or lower "
                "RDMACC_IB_RAILS");
  }
  return spread(found, hca, localRank, count);
}

}  // namespace rdmacc
