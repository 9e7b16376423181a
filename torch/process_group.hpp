// BackendRdmacc: rdmacc's VerbsBackend as a torch.distributed backend, plus
// the pieces it needs: a c10d::Store seen as an rdmacc::Store, at::Tensor
// seen as rdmacc::Tensor, and a c10d::Work over an rdmacc::Work. One class for
// both plug-in points: c10d::Backend on PyTorch >= 2.0 (ProcessGroup
// dispatches to it by device), c10d::ProcessGroup on 1.13 (Debian 12's torch);
// the build defines RDMACC_TORCH_BACKEND_API from Torch_VERSION.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#if RDMACC_TORCH_BACKEND_API
#include <torch/csrc/distributed/c10d/Backend.hpp>
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#endif
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "rdmacc/backend.hpp"
#include "tensors.hpp"

namespace rdmacc_torch {

#if RDMACC_TORCH_BACKEND_API
using BackendBase = c10d::Backend;
#else
using BackendBase = c10d::ProcessGroup;
#endif

// Threading: as c10d's ProcessGroup; calls may come from any thread, the
// caller orders collectives. Work completes on rdmacc's progress thread or on
// a thread blocked in wait(), which runs the future's callbacks holding only
// the progress lock (they may issue collectives, not wait for them).
class BackendRdmacc final : public BackendBase {
 public:
  // Forms the group through the store (rdma_cm mesh) or throws naming what
  // failed. timeout is the default for every operation (c10d's pg timeout).
  // groupName appears in rdmacc's log and error messages.
  BackendRdmacc(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                std::chrono::milliseconds timeout, std::string groupName = "default");
  ~BackendRdmacc() override;

  // What torch.distributed.Backend.register_backend(..., extended_api=True)
  // calls: the group's store, rank, size, timeout and name.
  static c10::intrusive_ptr<BackendBase> create(const c10d::DistributedBackendOptions& options);

  const std::string getBackendName() const override { return "rdmacc"; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputTensors,
                                           std::vector<at::Tensor>& inputTensors,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& outputBuffer, at::Tensor& inputBuffer,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputTensorLists,
      std::vector<at::Tensor>& inputTensors, const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputTensors,
                                        std::vector<at::Tensor>& inputTensors,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputTensors,
                                         std::vector<std::vector<at::Tensor>>& inputTensors,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputTensors,
                                                std::vector<std::vector<at::Tensor>>& inputTensors,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& outputBuffer, at::Tensor& inputBuffer,
      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& outputBuffer, at::Tensor& inputBuffer,
                                               std::vector<int64_t>& outputSplitSizes,
                                               std::vector<int64_t>& inputSplitSizes,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputTensors,
                                          std::vector<at::Tensor>& inputTensors,
                                          const c10d::AllToAllOptions& opts) override;
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) override;
  void setSequenceNumberForGroup() override;
  uint64_t getSequenceNumberForGroup() override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dstRank,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int srcRank,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

#if RDMACC_TORCH_BACKEND_API
  // Coalescing (torch >= 2.0: _coalescing_manager, batch_isend_irecv): the
  // operations issued between start and end run as they are issued (in
  // order, several in flight); endCoalescing returns one Work for them all.
  bool supportsCoalescing() const override {
    return true;
  }
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;
  // One _allgather_base / _reduce_scatter_base per pair, one Work for all.
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
#endif

  // Zero-copy for tensors reused across many operations (VerbsBackend::
  // registerMemory): deregister before the tensor's storage is freed.
  void registerTensor(const at::Tensor& tensor);
  void deregisterTensor(const at::Tensor& tensor);

#if RDMACC_TORCH_BACKEND_API
  // Both end the group here (pending operations fail with Aborted, the
  // connections close); later calls raise "shut down". abort() does not
  // wait for peers either: rdmacc has no collective teardown.
  void shutdown() override;
  void abort() override;
#endif

 private:
  // The core, or a c10::Error once shut down.
  rdmacc::VerbsBackend& core() const;
  // Destroys the core (joins its progress thread) without holding the GIL.
  void destroyCore() noexcept;
  // Every operation's c10d Work: also recorded in the open collections
  // (coalescing, *_tensor_coalesced) so that they can be combined.
  c10::intrusive_ptr<c10d::Work> wrap(std::shared_ptr<rdmacc::Work> work, int rank,
                                      c10d::OpType type, std::vector<at::Tensor> outputs,
                                      std::vector<at::Tensor> inputs = {});
  // allreduce of a sparse COO tensor (SUM; sparse_allreduce.cpp).
  c10::intrusive_ptr<c10d::Work> allreduceSparse(at::Tensor& tensor,
                                                 const c10d::AllreduceOptions& opts);
  struct Member {
    std::shared_ptr<rdmacc::Work> work;
    std::vector<at::Tensor> outputs;
  };
  std::vector<Member> closeCollection();
  c10::intrusive_ptr<c10d::Work> combine(std::vector<Member> members);
  template <typename F>
  c10::intrusive_ptr<c10d::Work> collected(F&& issue);

  std::mutex coreMutex_;  // serialises destroyCore()
  std::shared_ptr<rdmacc::VerbsBackend> backend_;
  std::mutex collectMutex_;
  std::vector<std::vector<Member>> collections_;  // open ones, innermost last
  bool coalescing_ = false;                       // collections_.front() is startCoalescing's
};

// The name of the 1.13 line (a process group there).
using ProcessGroupRdmacc = BackendRdmacc;

}  // namespace rdmacc_torch
