// Helpers of the InProcess.* device tests: the ranks of a group as threads
// of one process over a HashStore, and a peer's own RDMA writes outside
// rdmacc's transport (what a hostile peer could post).
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "rdmacc/config.hpp"
#include "rdmacc/store.hpp"
#include "src/transport/options.hpp"
#include "src/transport/rdma/mesh.hpp"
#include "src/transport/transport.hpp"

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

}  // namespace rdmacc
