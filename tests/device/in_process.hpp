// Helpers of the InProcess.* device tests: the ranks of a group as threads
// of one process over a HashStore, and a peer's own RDMA writes outside
// rdmacc's transport (what a hostile peer could post).
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "rdmacc/config.hpp"
#include "rdmacc/store.hpp"
#include "src/core/buffer.hpp"
#include "src/engine/engine.hpp"
#include "src/transport/options.hpp"
#include "src/transport/rdma/mesh.hpp"
#include "src/transport/transport.hpp"
#include "src/transport/wire.hpp"

namespace rdmacc {

// The configuration of in-process groups: a short connect timeout.
Config quickConfig(std::map<std::string, std::string> extra = {});

// A group of `size` ranks formed in this process, a thread per rank: each
// rank's mesh, then its RDMA transport (options' group, rank and size are
// filled in); errors[r] says why rank r could not form ("" when it did).
struct InProcessGroup {
  std::vector<std::unique_ptr<Mesh>> meshes;
  std::vector<std::unique_ptr<Transport>> transports;
  std::vector<std::string> errors;
};

InProcessGroup formInProcess(Store& store, const std::string& group, int size, const Config& config,
                             TransportOptions options);

// A peer's own RDMA operation, outside rdmacc's transport: 64 bytes from
// `local` (registered with `lkey`) to `remote` under `rkey` through `qp`
// of `mesh`; the completion's status.
ibv_wc_status rawTransfer(Mesh& mesh, ibv_qp* qp, ibv_wr_opcode opcode, uint8_t* local,
                          uint32_t lkey, uint64_t remote, uint32_t rkey);

// Rank 0's ring allgather of `bytes` into `target` (registered with its
// engine, so it advertises rank 1's block to rank 1), over a group of
// `size`; it times out after 3 s when rank 1 never sends.
std::shared_ptr<Work> advertisingAllgather(Engine& engine, uint8_t* target, size_t bytes, int size);

// The first advert that arrives at `transport` within 20 s (every message
// it polls is released).
std::optional<wire::Header> takeAdvert(Transport& transport);

// docs/security.md, "Memory the user registered": `attacker` writes 64
// bytes at `target` with `rkey` through its queue pair to rank 0 (`qp`):
// they land while `target` is in `registered`, and once it was removed the
// NIC refuses the write and the memory keeps what it had.
void expectRkeyOpensUntilDeregistered(Mesh& attacker, ibv_qp* qp, RegistrationCache& registered,
                                      uint8_t* target, uint32_t rkey);

}  // namespace rdmacc
