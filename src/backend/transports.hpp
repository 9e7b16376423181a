// The group's transports, made from where its peers are: shared memory to
// the peers on this host, RDMA to the others (one transport per rail, each
// peer striped over every rail), one transport when one carries every peer,
// else all behind a composite. The backend places peers, so it owns this
// choice; the engine receives the result and never names a transport.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "rdmacc/store.hpp"
#include "src/transport/options.hpp"
#include "src/transport/transport.hpp"

namespace rdmacc {

class Mesh;

// How the RDMA peers are reached besides `rails`: through `channel`, a
// shared link's (the group made no mesh: docs/decisions/019); or over the
// one rail, with the transport made there handed to `share`, which returns
// the group's own channel of a new link.
struct RdmaPath {
  std::unique_ptr<Transport> channel;
  std::function<std::unique_ptr<Transport>(std::unique_ptr<Transport>)> share;
};

// `rails`: one mesh per NIC this rank stripes its RDMA peers over
// (RDMACC_IB_RAILS); empty when every peer is reached through shared memory.
// Resolves options.slotBytes 0 (autoSlotBytes) and sets up every transport
// (slot regions exchanged through `store`); throws Error when that fails or
// the slot size is not usable.
std::unique_ptr<Transport> makeTransports(const std::vector<Mesh*>& rails, Store& store,
                                          TransportOptions options, RdmaPath rdma = {});

}  // namespace rdmacc
