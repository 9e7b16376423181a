#include "verbs/device.hpp"

#include <fcntl.h>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "rdmacc/environment.hpp"
#include "rdmacc/error.hpp"
#include "verbs/error.hpp"

namespace rdmacc::verbs {
namespace {

std::string readSysfs(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (in) std::getline(in, line);
  return line;
}

const char* portStateName(ibv_port_state s) {
  switch (s) {
    case IBV_PORT_NOP:
      return "NOP";
    case IBV_PORT_DOWN:
      return "DOWN";
    case IBV_PORT_INIT:
      return "INIT";
    case IBV_PORT_ARMED:
      return "ARMED";
    case IBV_PORT_ACTIVE:
      return "ACTIVE";
    case IBV_PORT_ACTIVE_DEFER:
      return "ACTIVE_DEFER";
  }
  return "UNKNOWN";
}

DeviceListPtr deviceList(int& count) {
  count = 0;
  DeviceListPtr list(ibv_get_device_list(&count));
  if (!list) {
    // ENOSYS: no kernel support at all; treat like "no devices", the caller explains.
    count = 0;
  }
  return list;
}

std::vector<std::string> deviceNames() {
  int n = 0;
  auto list = deviceList(n);
  std::vector<std::string> names;
  for (int i = 0; i < n; ++i) names.emplace_back(ibv_get_device_name(list.get()[i]));
  return names;
}

// IPv4 address of a network interface, host byte order.
std::optional<uint32_t> interfaceIpv4(const std::string& ifname) {
  ifaddrs* all = nullptr;
  if (::getifaddrs(&all) != 0) return std::nullopt;
  std::optional<uint32_t> found;
  for (ifaddrs* a = all; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET || ifname != a->ifa_name)
      continue;
    found = ntohl(reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr.s_addr);
    break;
  }
  ::freeifaddrs(all);
  return found;
}

// The IPoIB interface of an InfiniBand port, if any.
std::optional<uint32_t> ipoibAddress(const std::string& device, int port) {
  std::string base = fmt::format("/sys/class/infiniband/{}/device/net", device);
  std::ifstream probe(base);
  ifaddrs* all = nullptr;
  if (::getifaddrs(&all) != 0) return std::nullopt;
  std::optional<uint32_t> found;
  for (ifaddrs* a = all; a != nullptr && !found; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    std::string dir = fmt::format("{}/{}", base, a->ifa_name);
    std::string devPort = readSysfs(dir + "/dev_port");
    if (devPort.empty()) continue;
    if (std::stoi(devPort) + 1 == port)
      found = ntohl(reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr.s_addr);
  }
  ::freeifaddrs(all);
  return found;
}

std::string listPorts(const DeviceInfo& d) {
  std::string out;
  for (const auto& p : d.ports) {
    out += fmt::format("{}{}:{} {} ({})", out.empty() ? "" : ", ", d.name, p.port, p.state,
                       p.linkLayer);
  }
  return out;
}

}  // namespace

std::string noDeviceHint() {
  return "load soft-RoCE and create a device on a netdev with an IPv4 address: "
         "`modprobe rdma_rxe && rdma link add rxe0 type rxe netdev eth0`; on a machine whose "
         "kernel has no RDMA support, run through the project's harness: "
         "tools/with-rdma-device -- COMMAND (boots a soft-RoCE VM)";
}

int mtuBytes(ibv_mtu mtu) noexcept {
  switch (mtu) {
    case IBV_MTU_256:
      return 256;
    case IBV_MTU_512:
      return 512;
    case IBV_MTU_1024:
      return 1024;
    case IBV_MTU_2048:
      return 2048;
    case IBV_MTU_4096:
      return 4096;
  }
  return 0;
}

ibv_mtu mtuFromBytes(int bytes) noexcept {
  if (bytes >= 4096) return IBV_MTU_4096;
  if (bytes >= 2048) return IBV_MTU_2048;
  if (bytes >= 1024) return IBV_MTU_1024;
  if (bytes >= 512) return IBV_MTU_512;
  return IBV_MTU_256;
}

void makeAsyncNonBlocking(ibv_context* context) {
  int flags = ::fcntl(context->async_fd, F_GETFL);
  if (flags < 0 || ::fcntl(context->async_fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    throw verbsError("fcntl", errno, "cannot make the device's async event fd non-blocking");
  }
}

std::vector<AsyncEvent> takeAsyncEvents(ibv_context* context) {
  std::vector<AsyncEvent> events;
  ibv_async_event event{};
  while (ibv_get_async_event(context, &event) == 0) {
    AsyncEvent e{.type = event.event_type, .name = ibv_event_type_str(event.event_type)};
    switch (event.event_type) {
      case IBV_EVENT_QP_FATAL:
      case IBV_EVENT_QP_REQ_ERR:
      case IBV_EVENT_QP_ACCESS_ERR:
      case IBV_EVENT_COMM_EST:
      case IBV_EVENT_SQ_DRAINED:
      case IBV_EVENT_PATH_MIG:
      case IBV_EVENT_PATH_MIG_ERR:
      case IBV_EVENT_QP_LAST_WQE_REACHED:
        e.qp = event.element.qp;
        break;
      case IBV_EVENT_PORT_ACTIVE:
      case IBV_EVENT_PORT_ERR:
      case IBV_EVENT_LID_CHANGE:
      case IBV_EVENT_PKEY_CHANGE:
      case IBV_EVENT_SM_CHANGE:
      case IBV_EVENT_CLIENT_REREGISTER:
      case IBV_EVENT_GID_CHANGE:
        e.port = event.element.port_num;
        break;
      default:
        break;
    }
    ibv_ack_async_event(&event);
    events.push_back(e);
  }
  return events;
}

ContextPtr openDevice(const std::string& name) {
  int n = 0;
  auto list = deviceList(n);
  for (int i = 0; i < n; ++i) {
    if (name != ibv_get_device_name(list.get()[i])) continue;
    ContextPtr ctx(ibv_open_device(list.get()[i]));
    if (!ctx)
      throw verbsError("ibv_open_device", errno, fmt::format("cannot open RDMA device {}", name));
    return ctx;
  }
  auto names = deviceNames();
  throw Error(ErrorKind::NoDevice, fmt::format("RDMA device '{}' not found", name),
              names.empty()
                  ? noDeviceHint()
                  : fmt::format("devices here: {}; fix RDMACC_IB_HCA", fmt::join(names, ", ")));
}

PortInfo queryPort(ibv_context* context, int port) {
  ibv_port_attr attr{};
  if (int rc = ibv_query_port(context, static_cast<uint8_t>(port), &attr); rc != 0) {
    throw verbsError(
        "ibv_query_port", rc,
        fmt::format("cannot query port {} of {}", port, ibv_get_device_name(context->device)));
  }
  PortInfo info;
  info.port = port;
  info.active = attr.state == IBV_PORT_ACTIVE;
  info.state = portStateName(attr.state);
  info.linkLayer = attr.link_layer == IBV_LINK_LAYER_ETHERNET ? "Ethernet" : "InfiniBand";
  info.activeMtu = mtuBytes(attr.active_mtu);
  info.maxMtu = mtuBytes(attr.max_mtu);
  std::string dev = ibv_get_device_name(context->device);
  for (int i = 0; i < attr.gid_tbl_len; ++i) {
    ibv_gid gid{};
    if (ibv_query_gid(context, static_cast<uint8_t>(port), i, &gid) != 0) continue;
    GidEntry e;
    e.index = i;
    std::copy(std::begin(gid.raw), std::end(gid.raw), e.raw.begin());
    bool zero = std::all_of(e.raw.begin(), e.raw.end(), [](uint8_t b) { return b == 0; });
    if (zero) continue;  // unused slot
    e.address = formatGid(e.raw);
    std::string sys = fmt::format("/sys/class/infiniband/{}/ports/{}/gid_attrs", dev, port);
    e.type = readSysfs(fmt::format("{}/types/{}", sys, i));
    e.netdev = readSysfs(fmt::format("{}/ndevs/{}", sys, i));
    if (e.type == "IB/RoCE v1" && info.linkLayer == "InfiniBand") e.type = "IB";
    info.gids.push_back(std::move(e));
  }
  return info;
}

}  // namespace rdmacc::verbs

namespace rdmacc {

ForkSafety forkSafety() {
  switch (::ibv_is_fork_initialized()) {
    case IBV_FORK_UNNEEDED:
      return {false, "unneeded (the kernel keeps registered memory correct across fork)"};
    case IBV_FORK_ENABLED:
      return {false, "enabled (RDMAV_FORK_SAFE=1 or ibv_fork_init)"};
    case IBV_FORK_DISABLED:
    default:
      return {true,
              "at risk: this kernel does not keep registered memory correct across fork() and "
              "fork support is off; a process that forks after registering (DataLoader workers) "
              "can corrupt transfers. Fix: export RDMAV_FORK_SAFE=1 before the process starts, or "
              "a kernel >= 5.13"};
  }
}

std::vector<DeviceInfo> listDevices() {
  int n = 0;
  auto list = verbs::deviceList(n);
  std::vector<DeviceInfo> out;
  for (int i = 0; i < n; ++i) {
    verbs::ContextPtr ctx(ibv_open_device(list.get()[i]));
    DeviceInfo d;
    d.name = ibv_get_device_name(list.get()[i]);
    if (!ctx) {
      d.firmware = fmt::format("(cannot open: {})", std::strerror(errno));
      out.push_back(std::move(d));
      continue;
    }
    ibv_device_attr attr{};
    if (ibv_query_device(ctx.get(), &attr) == 0) {
      d.firmware = attr.fw_ver;
      d.nodeGuid = be64toh(attr.node_guid);
      d.maxQpWr = attr.max_qp_wr;
      d.maxCqe = attr.max_cqe;
      d.maxMrSize = attr.max_mr_size;
      for (int p = 1; p <= attr.phys_port_cnt; ++p)
        d.ports.push_back(verbs::queryPort(ctx.get(), p));
    }
    out.push_back(std::move(d));
  }
  return out;
}

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
  const std::string& ifname = config.getString("RDMACC_SOCKET_IFNAME");
  const int gidIndex = static_cast<int>(config.getInt("RDMACC_IB_GID_INDEX"));
  const std::vector<HcaEntry> wants = parseHcaList(hca);
  auto devices = listDevices();
  if (devices.empty()) {
    throw Error(ErrorKind::NoDevice, "no RDMA device found (ibv_get_device_list is empty)",
                verbs::noDeviceHint());
  }
  for (const auto& want : wants) {
    bool exists = false;
    std::vector<std::string> names;
    for (const auto& d : devices) {
      names.push_back(d.name);
      exists = exists || d.name == want.device;
    }
    if (!exists) {
      throw Error(ErrorKind::NoDevice,
                  fmt::format("RDMACC_IB_HCA names device '{}', which does not exist", want.device),
                  fmt::format("devices here: {}", fmt::join(names, ", ")));
    }
  }
  std::optional<uint32_t> ifAddress;
  if (!ifname.empty()) {
    ifAddress = verbs::interfaceIpv4(ifname);
    if (!ifAddress) {
      throw Error(
          ErrorKind::InvalidArgument,
          fmt::format("RDMACC_SOCKET_IFNAME={} has no IPv4 address (or does not exist)", ifname),
          "name an interface listed by `ip -4 addr` that carries the RDMA traffic");
    }
  }

  // One device and port named exactly: its problem is reported precisely.
  const bool exact = wants.size() == 1;
  std::vector<std::string> rejected;
  auto usable = [&](const DeviceInfo& d, const PortInfo& p) -> std::optional<Endpoint> {
    std::string where = fmt::format("{}:{}", d.name, p.port);
    if (!p.active) {
      rejected.push_back(fmt::format("{} is {} (not ACTIVE)", where, p.state));
      return std::nullopt;
    }
    std::optional<uint32_t> address = ifAddress;
    if (!address && p.linkLayer == "InfiniBand") address = verbs::ipoibAddress(d.name, p.port);
    if (!address && p.linkLayer == "Ethernet" && gidIndex >= 0) {
      for (const auto& g : p.gids) {
        if (g.index == gidIndex) address = g.ipv4();
      }
    }
    GidChoice gid;
    try {
      gid = chooseGid(d.name, p, gidIndex, address);
    } catch (const Error& e) {
      if (exact && (wants[0].port > 0 || d.ports.size() == 1)) throw;
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
    Endpoint ep;
    ep.device = d.name;
    ep.port = p.port;
    ep.ipv4 = formatIpv4(*address);
    ep.gidIndex = gid.index;
    ep.gid = entry ? entry->address : "";
    ep.gidType = entry ? entry->type : "";
    ep.activeMtu = p.activeMtu;
    ep.reason = gid.reason;
    return ep;
  };

  // The usable ports: those RDMACC_IB_HCA lists, in its order, else every
  // port of every device. The first one that works per listed entry.
  std::vector<Endpoint> found;
  if (wants.empty()) {
    for (const auto& d : devices) {
      for (const auto& p : d.ports) {
        if (auto ep = usable(d, p)) found.push_back(std::move(*ep));
      }
    }
  } else {
    for (const auto& want : wants) {
      for (const auto& d : devices) {
        if (d.name != want.device) continue;
        bool portExists = false;
        for (const auto& p : d.ports) {
          if (want.port > 0 && p.port != want.port) continue;
          portExists = true;
          if (auto ep = usable(d, p)) {
            found.push_back(std::move(*ep));
            break;
          }
        }
        if (want.port > 0 && !portExists) {
          if (exact) {
            throw Error(ErrorKind::NoDevice,
                        fmt::format("RDMACC_IB_HCA={}: port {} does not exist", hca, want.port),
                        fmt::format("ports: {}", verbs::listPorts(d)));
          }
          rejected.push_back(fmt::format("{}:{} does not exist", want.device, want.port));
        }
      }
    }
  }
  if (found.empty()) {
    throw Error(
        ErrorKind::NoDevice, fmt::format("no usable RDMA port: {}", fmt::join(rejected, "; ")),
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
  // Several: the local ranks of a host spread over them, as NCCL's do; a
  // rank that stripes over `count` takes the ports after its own too.
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

}  // namespace rdmacc
