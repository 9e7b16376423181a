// Backend: the c10d Backend contract (same method names and argument shapes,
// rdmacc::Tensor instead of at::Tensor), and VerbsBackend, its RDMA
// implementation.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "rdmacc/options.hpp"
#include "rdmacc/store.hpp"
#include "rdmacc/types.hpp"
#include "rdmacc/work.hpp"

namespace rdmacc {

// Every call is asynchronous and returns a Work at once; every rank must call
// the collectives in the same order (point-to-point calls may interleave
// freely). Collectives complete in submission order. Argument errors throw
// Error(InvalidArgument) from the call, before any data moves.
// Threading: calls may come from any thread, but the caller orders them.
class Backend {
 public:
  Backend(int rank, int size);
  virtual ~Backend();
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  int getRank() const noexcept { return rank_; }
  int getSize() const noexcept { return size_; }
  virtual const std::string getBackendName() const = 0;

  virtual std::shared_ptr<Work> broadcast(std::vector<Tensor>& tensors,
                                          const BroadcastOptions& opts = BroadcastOptions()) = 0;
  virtual std::shared_ptr<Work> allreduce(std::vector<Tensor>& tensors,
                                          const AllreduceOptions& opts = AllreduceOptions()) = 0;
  virtual std::shared_ptr<Work> allreduce_coalesced(
      std::vector<Tensor>& tensors,
      const AllreduceCoalescedOptions& opts = AllreduceCoalescedOptions()) = 0;
  virtual std::shared_ptr<Work> reduce(std::vector<Tensor>& tensors,
                                       const ReduceOptions& opts = ReduceOptions()) = 0;
  virtual std::shared_ptr<Work> allgather(std::vector<std::vector<Tensor>>& outputTensors,
                                          std::vector<Tensor>& inputTensors,
                                          const AllgatherOptions& opts = AllgatherOptions()) = 0;
  virtual std::shared_ptr<Work> _allgather_base(
      Tensor& outputBuffer, Tensor& inputBuffer,
      const AllgatherOptions& opts = AllgatherOptions()) = 0;
  virtual std::shared_ptr<Work> allgather_coalesced(
      std::vector<std::vector<Tensor>>& outputTensorLists, std::vector<Tensor>& inputTensors,
      const AllgatherOptions& opts = AllgatherOptions()) = 0;
  virtual std::shared_ptr<Work> gather(std::vector<std::vector<Tensor>>& outputTensors,
                                       std::vector<Tensor>& inputTensors,
                                       const GatherOptions& opts = GatherOptions()) = 0;
  virtual std::shared_ptr<Work> scatter(std::vector<Tensor>& outputTensors,
                                        std::vector<std::vector<Tensor>>& inputTensors,
                                        const ScatterOptions& opts = ScatterOptions()) = 0;
  virtual std::shared_ptr<Work> reduce_scatter(
      std::vector<Tensor>& outputTensors, std::vector<std::vector<Tensor>>& inputTensors,
      const ReduceScatterOptions& opts = ReduceScatterOptions()) = 0;
  virtual std::shared_ptr<Work> _reduce_scatter_base(
      Tensor& outputBuffer, Tensor& inputBuffer,
      const ReduceScatterOptions& opts = ReduceScatterOptions()) = 0;
  // Split sizes count elements (c10d counts rows of dim 0; for a flat tensor
  // they are the same). Empty splits mean equal parts.
  virtual std::shared_ptr<Work> alltoall_base(Tensor& outputBuffer, Tensor& inputBuffer,
                                              std::vector<int64_t>& outputSplitSizes,
                                              std::vector<int64_t>& inputSplitSizes,
                                              const AllToAllOptions& opts = AllToAllOptions()) = 0;
  virtual std::shared_ptr<Work> alltoall(std::vector<Tensor>& outputTensors,
                                         std::vector<Tensor>& inputTensors,
                                         const AllToAllOptions& opts = AllToAllOptions()) = 0;
  // Rank 0 waits for every rank; throws Error naming the ranks that did not
  // arrive within the timeout (the first one unless waitAllRanks).
  virtual void monitoredBarrier(const BarrierOptions& opts = BarrierOptions(),
                                bool waitAllRanks = false) = 0;
  // Rank 0 publishes its sequence number through the store; the others adopt it.
  virtual void setSequenceNumberForGroup() = 0;
  virtual uint64_t getSequenceNumberForGroup() = 0;
  virtual std::shared_ptr<Work> send(std::vector<Tensor>& tensors, int dstRank, int tag) = 0;
  virtual std::shared_ptr<Work> recv(std::vector<Tensor>& tensors, int srcRank, int tag) = 0;
  // Work::sourceRank() tells where the message came from.
  virtual std::shared_ptr<Work> recvAnysource(std::vector<Tensor>& tensors, int tag) = 0;
  virtual std::shared_ptr<Work> barrier(const BarrierOptions& opts = BarrierOptions()) = 0;

 protected:
  const int rank_;
  const int size_;
};

struct VerbsBackendOptions {
  std::string groupName = "default";  // one mesh per name in a store
  std::chrono::milliseconds timeout =
      kUseDefaultTimeout;                     // default op timeout; else RDMACC_TIMEOUT
  std::map<std::string, std::string> config;  // explicit RDMACC_* values, above the environment
  // The launcher's exchange (initFromEnvironment sets it under PMIx). Only
  // for a group whose ranks are the launcher's ranks; empty: the store.
  AllGather allGather;
};

class VerbsBackend final : public Backend {
 public:
  using Options = VerbsBackendOptions;

  // Forms the group (rdma_cm mesh, slot exchange) or throws Error naming what
  // failed and which ranks are missing.
  VerbsBackend(std::shared_ptr<Store> store, int rank, int size, Options options = Options());
  ~VerbsBackend() override;

  const std::string getBackendName() const override { return "rdmacc"; }
  // The RDMA ports this rank reaches its peers through, one per rail
  // ("mlx5_0:1"); empty when every peer is reached through shared memory.
  std::vector<std::string> rdmaPorts() const;
  // Queue pairs this rank holds now, over all rails (RDMACC_CONNECT=lazy:
  // only to the peers operations have talked to so far).
  int queuePairs() const;
  // Receives posted for those queue pairs (writes with immediate data
  // consume one each): with RDMACC_SRQ=1, 2 x RDMACC_SLOTS_PER_PEER + 4 per
  // queue pair in one shared receive queue per rail, else
  // RDMACC_QP_RECV_DEPTH per queue pair.
  size_t receivesPosted() const;
  std::shared_ptr<Work> broadcast(std::vector<Tensor>& tensors,
                                  const BroadcastOptions& opts = BroadcastOptions()) override;
  std::shared_ptr<Work> allreduce(std::vector<Tensor>& tensors,
                                  const AllreduceOptions& opts = AllreduceOptions()) override;
  std::shared_ptr<Work> allreduce_coalesced(
      std::vector<Tensor>& tensors,
      const AllreduceCoalescedOptions& opts = AllreduceCoalescedOptions()) override;
  std::shared_ptr<Work> reduce(std::vector<Tensor>& tensors,
                               const ReduceOptions& opts = ReduceOptions()) override;
  std::shared_ptr<Work> allgather(std::vector<std::vector<Tensor>>& outputTensors,
                                  std::vector<Tensor>& inputTensors,
                                  const AllgatherOptions& opts = AllgatherOptions()) override;
  std::shared_ptr<Work> _allgather_base(Tensor& outputBuffer, Tensor& inputBuffer,
                                        const AllgatherOptions& opts = AllgatherOptions()) override;
  std::shared_ptr<Work> allgather_coalesced(
      std::vector<std::vector<Tensor>>& outputTensorLists, std::vector<Tensor>& inputTensors,
      const AllgatherOptions& opts = AllgatherOptions()) override;
  std::shared_ptr<Work> gather(std::vector<std::vector<Tensor>>& outputTensors,
                               std::vector<Tensor>& inputTensors,
                               const GatherOptions& opts = GatherOptions()) override;
  std::shared_ptr<Work> scatter(std::vector<Tensor>& outputTensors,
                                std::vector<std::vector<Tensor>>& inputTensors,
                                const ScatterOptions& opts = ScatterOptions()) override;
  std::shared_ptr<Work> reduce_scatter(
      std::vector<Tensor>& outputTensors, std::vector<std::vector<Tensor>>& inputTensors,
      const ReduceScatterOptions& opts = ReduceScatterOptions()) override;
  std::shared_ptr<Work> _reduce_scatter_base(
      Tensor& outputBuffer, Tensor& inputBuffer,
      const ReduceScatterOptions& opts = ReduceScatterOptions()) override;
  std::shared_ptr<Work> alltoall_base(Tensor& outputBuffer, Tensor& inputBuffer,
                                      std::vector<int64_t>& outputSplitSizes,
                                      std::vector<int64_t>& inputSplitSizes,
                                      const AllToAllOptions& opts = AllToAllOptions()) override;
  std::shared_ptr<Work> alltoall(std::vector<Tensor>& outputTensors,
                                 std::vector<Tensor>& inputTensors,
                                 const AllToAllOptions& opts = AllToAllOptions()) override;
  void monitoredBarrier(const BarrierOptions& opts = BarrierOptions(),
                        bool waitAllRanks = false) override;
  void setSequenceNumberForGroup() override;
  uint64_t getSequenceNumberForGroup() override;
  std::shared_ptr<Work> send(std::vector<Tensor>& tensors, int dstRank, int tag) override;
  std::shared_ptr<Work> recv(std::vector<Tensor>& tensors, int srcRank, int tag) override;
  std::shared_ptr<Work> recvAnysource(std::vector<Tensor>& tensors, int tag) override;
  std::shared_ptr<Work> barrier(const BarrierOptions& opts = BarrierOptions()) override;

  // Zero-copy (like ncclCommRegister): registers the pages holding
  // [ptr, ptr + bytes) with the device, so that messages of at least
  // RDMACC_ZERO_COPY_MIN_BYTES sent from them skip the staging copy. Register
  // buffers you reuse across many operations; deregister before freeing them
  // (a transfer in flight keeps its registration until it completes).
  // Registering the same pointer twice needs two deregistrations. Unregistered
  // memory is copied, which is always correct. Throws Error(Registration) when
  // the device refuses (locked-memory limit: see docs/troubleshooting.md).
  void registerMemory(void* ptr, size_t bytes);
  void deregisterMemory(void* ptr);

  // Payload bytes per message: transfers larger than this are pipelined in chunks.
  size_t chunkBytes() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Builds the store and the backend from the launcher's environment
// (RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT of torchrun and rdmacc-run,
// OMPI_COMM_WORLD_*, PMI_*, SLURM_*; see environment.hpp).
std::shared_ptr<VerbsBackend> initFromEnvironment(
    VerbsBackend::Options options = VerbsBackend::Options());

}  // namespace rdmacc
