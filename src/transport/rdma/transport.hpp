// The RDMA transport: messages go by RDMA WRITE_WITH_IMM into per-peer
// staging slots of the receiver's region under credit-based flow control,
// over RDMACC_QPS_PER_PEER reliable-connected queue pairs per peer (lanes),
// with selective signalling, inline small messages, zero-copy payloads from
// memory the user registered and direct writes into advertised receives.
// Every arrival is validated by wire:: before anything of it is used.
#pragma once

#include <memory>

#include "rdmacc/store.hpp"
#include "src/transport/options.hpp"
#include "src/transport/registration_cache.hpp"
#include "src/transport/transport.hpp"

struct ibv_pd;

namespace rdmacc {

class Mesh;

// The staging slot size when none is configured: large slots (fewer, larger
// RDMA writes and a deeper window per peer) as long as both slot regions
// (2 x (worldSize - 1) x slotsPerPeer x bytes) fit in 32 MiB; a power of two
// from 256 KiB down to 16 KiB. The same on every rank of a group.
size_t autoSlotBytes(int worldSize, int slotsPerPeer);

// Registers the slot regions and exchanges them with the peers through the
// store (under the group's name); throws Error when that fails or the peers'
// slot geometry differs from this rank's. `options.slotBytes` 0 is resolved
// with autoSlotBytes. Keeps references to the mesh and the registrations.
std::unique_ptr<Transport> makeRdmaTransport(Mesh& mesh, Store& store,
                                             const TransportOptions& options);

// How memory the user registers (registerMemory) is registered with `pd`:
// exactly [begin, begin + length), with remote write, since peers write
// direct receives into it with the rkey an advert carries (that rkey opens
// the whole registration until it is deregistered: docs/security.md). A
// null pd (no RDMA peer) registers nothing with a device.
RegistrationCache::Registrar userMemoryRegistrar(ibv_pd* pd);

}  // namespace rdmacc
