// Several transports behind one. Each peer is carried by one or more of them
// (its "carriers"): the peers on this host through shared memory, the others
// through RDMA, over one rail or striped over several (RDMACC_IB_RAILS, one
// RDMA transport per NIC). Collective chunks that go through slots take a
// peer's carriers round-robin; everything else (point-to-point messages,
// whose order per peer matters, adverts and direct writes, whose rkeys belong
// to the first rail's registrations, aborts) takes its first carrier. Arrival
// order is renumbered across all, so any-source receives still take the
// oldest message.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "src/transport/transport.hpp"

namespace rdmacc {

// `carriers[peer]`: indices into `children` of the transports that reach
// peer, the first one first (empty for this rank). Every child must have the
// same chunk size and slots per peer.
std::unique_ptr<Transport> makeCompositeTransport(std::vector<std::unique_ptr<Transport>> children,
                                                  std::vector<std::vector<uint8_t>> carriers);

}  // namespace rdmacc
