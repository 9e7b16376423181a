// Two transports behind one: each peer is reached through one of them (the
// peers on this host through shared memory, the others through RDMA). Arrival
// order is renumbered across both, so any-source receives still take the
// oldest message.
#pragma once

#include <memory>
#include <vector>

#include "src/transport.hpp"

namespace rdmacc {

// `second[peer]`: peer goes through `second`, else through `first`. Both must
// have the same chunk size and slots per peer.
std::unique_ptr<Transport> makeRoutedTransport(std::unique_ptr<Transport> first,
                                               std::unique_ptr<Transport> second,
                                               std::vector<bool> secondPeers);

}  // namespace rdmacc
