// The errors that name a peer, built in one place so that every part of the
// engine words them the same way.
#pragma once

#include <string>

#include "rdmacc/error.hpp"
#include "src/transport/wire.hpp"

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

// A peer's one-shot board entry (shared memory or RDMA) for collective
// #sequence holds another operation: what it posted (collective, size,
// check value) against this rank's call.
Error boardMismatch(int peer, const std::string& address, uint64_t sequence,
                    uint64_t postedSequence, uint64_t postedBytes, uint64_t postedCheck,
                    uint64_t bytes, uint64_t check);

}  // namespace rdmacc
