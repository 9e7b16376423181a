// Devices, ports and GID tables.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "rdmacc/topology.hpp"
#include "verbs/handles.hpp"

namespace rdmacc::verbs {

// Opens the device by name; throws Error(NoDevice) listing the devices there are.
ContextPtr openDevice(const std::string& name);
PortInfo queryPort(ibv_context* context, int port);

int mtuBytes(ibv_mtu mtu) noexcept;
// Largest enum not above bytes (bytes >= 256).
ibv_mtu mtuFromBytes(int bytes) noexcept;

// The device's asynchronous events (port up/down, a queue pair or the CQ in
// error, the device failed). makeAsyncNonBlocking once, after opening;
// takeAsyncEvents returns (and acknowledges) every event pending, never
// blocking.
struct AsyncEvent {
  ibv_event_type type;
  const char* name;      // ibv_event_type_str
  ibv_qp* qp = nullptr;  // the queue pair, for QP events
  int port = 0;          // the port, for port events
};
void makeAsyncNonBlocking(ibv_context* context);
std::vector<AsyncEvent> takeAsyncEvents(ibv_context* context);

// The text that tells a user with no device how to get one.
std::string noDeviceHint();

// The IPv4 address (host byte order) of a network interface, or of the
// IPoIB interface of an InfiniBand port; none when it has none.
std::optional<uint32_t> interfaceIpv4(const std::string& ifname);
std::optional<uint32_t> ipoibAddress(const std::string& device, int port);

}  // namespace rdmacc::verbs
