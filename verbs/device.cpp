#include "verbs/device.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

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

}  // namespace

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

std::shared_ptr<SharedDevice> SharedDevice::open(const std::string& name) {
  // By process and name: a child forked after a group formed cannot use its
  // parent's context (rdma-core's contexts do not survive fork).
  // Never destroyed: a group may be destroyed after static destruction began.
  static auto* mutex = new std::mutex;
  static auto* open = new std::map<std::pair<pid_t, std::string>, std::weak_ptr<SharedDevice>>;
  std::lock_guard lock(*mutex);
  auto& entry = (*open)[{::getpid(), name}];
  if (auto device = entry.lock()) return device;
  ContextPtr context = openDevice(name);
  makeAsyncNonBlocking(context.get());
  std::shared_ptr<SharedDevice> device(new SharedDevice(std::move(context)));
  entry = device;
  return device;
}

SharedDevice::~SharedDevice() = default;

int SharedDevice::subscribe() {
  std::lock_guard lock(mutex_);
  mailboxes_[nextMailbox_];
  return nextMailbox_++;
}

void SharedDevice::unsubscribe(int mailbox) {
  std::lock_guard lock(mutex_);
  mailboxes_.erase(mailbox);
}

std::vector<AsyncEvent> SharedDevice::takeAsyncEvents(int mailbox) {
  std::lock_guard lock(mutex_);
  std::vector<AsyncEvent> fresh = verbs::takeAsyncEvents(context_.get());
  std::vector<AsyncEvent> mine;
  for (auto& [id, events] : mailboxes_) {
    if (id == mailbox) {
      mine.swap(events);
      continue;
    }
    for (AsyncEvent e : fresh) {
      e.first = false;
      events.push_back(e);
    }
  }
  mine.insert(mine.end(), fresh.begin(), fresh.end());
  return mine;
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
      case IBV_EVENT_CQ_ERR:
        e.cq = event.element.cq;
        break;
      case IBV_EVENT_SRQ_ERR:
      case IBV_EVENT_SRQ_LIMIT_REACHED:
        e.srq = event.element.srq;
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

}  // namespace rdmacc
