// The errors that name a peer, built in one place so that every part of the
// engine words them the same way.
#pragma once

#include <string>

#include "rdmacc/error.hpp"
#include "src/wire.hpp"

namespace rdmacc {

// How the transport learned that a peer is gone: the call that reported it
// and what it said.
struct Departure {
  std::string call;    // e.g. "rdma_get_cm_event"
  std::string status;  // e.g. "RDMA_CM_EVENT_DISCONNECTED"
};

// The peer's connection ended (its process exited, crashed or destroyed its
// backend).
Error peerGone(int peer, const std::string& address, const Departure& how);

// The peer broke the protocol: its message is never used, and the error names
// it and what it sent.
Error protocolViolation(int peer, const std::string& address, const wire::Violation& v);

}  // namespace rdmacc
