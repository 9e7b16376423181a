// Devices, ports and GID tables.
#pragma once

#include <infiniband/verbs.h>

#include <string>

#include "rdmacc/topology.hpp"
#include "verbs/handles.hpp"

namespace rdmacc::verbs {

// Opens the device by name; throws Error(NoDevice) listing the devices there are.
ContextPtr openDevice(const std::string& name);
PortInfo queryPort(ibv_context* context, int port);

int mtuBytes(ibv_mtu mtu) noexcept;
// Largest enum not above bytes (bytes >= 256).
ibv_mtu mtuFromBytes(int bytes) noexcept;

// The text that tells a user with no device how to get one.
std::string noDeviceHint();

}  // namespace rdmacc::verbs
