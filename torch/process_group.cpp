#include "process_group.hpp"

// No fmt here: pip's torch ships its own (newer) fmt headers, which would
// shadow the system's that librdmacc is built with.

#include <ATen/core/ivalue.h>
#include <pybind11/pybind11.h>

#include <exception>
#include <utility>

#include "rdmacc/error.hpp"

namespace rdmacc_torch {
namespace {

using c10d::OpType;

// c10d's Store as rdmacc's. c10::Errors become rdmacc::Errors, so that the
// mesh's failure handling (which catches rdmacc::Error) sees them.
// Threading: as the wrapped store (c10d stores are thread-safe).
class StoreAdapter final : public rdmacc::Store {
 public:
  explicit StoreAdapter(c10::intrusive_ptr<c10d::Store> store)
      : Store(store->getTimeout()), store_(std::move(store)) {}

  void set(const std::string& key, const rdmacc::Bytes& value) override {
    guarded("set", key, [&] { store_->set(key, value); });
  }
  rdmacc::Bytes get(const std::string& key) override {
    return guarded("get", key, [&] {
      store_->wait({key}, timeout());
      return store_->get(key);
    });
  }
  int64_t add(const std::string& key, int64_t delta) override {
    return guarded("add", key, [&] { return store_->add(key, delta); });
  }
  bool check(const std::vector<std::string>& keys) override {
    return guarded("check", keys.empty() ? "" : keys.front(), [&] { return store_->check(keys); });
  }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    guarded("wait for", keys.empty() ? "" : keys.front(), [&] { store_->wait(keys, timeout); });
  }
  bool deleteKey(const std::string& key) override {
    return guarded("deleteKey", key, [&] { return store_->deleteKey(key); });
  }
  using Store::wait;

 private:
  template <class F>
  auto guarded(const char* what, const std::string& key, F&& fn) -> decltype(fn()) {
    try {
      return fn();
    } catch (const rdmacc::Error&) {
      throw;
    } catch (const c10::Error& e) {
      fail(what, key, e.what_without_backtrace());
    } catch (const std::exception& e) {
      fail(what, key, e.what());
    }
  }
  [[noreturn]] static void fail(const char* what, const std::string& key, const std::string& why) {
    bool timedOut = why.find("imeout") != std::string::npos;
    throw rdmacc::Error(
        timedOut ? rdmacc::ErrorKind::Timeout : rdmacc::ErrorKind::Store,
        c10::str("torch.distributed store: ", what, " '", key, "' failed: ", why),
        timedOut ? "a rank did not arrive in time: start every rank, or raise the timeout"
                 : "the store lives in rank 0 (MASTER_ADDR:MASTER_PORT); check that it is alive");
  }

  c10::intrusive_ptr<c10d::Store> store_;
};

// A c10d::Work over an rdmacc::Work. The future completes with the output
// tensors on rdmacc's progress thread (c10d runs then() callbacks there).
class WorkRdmacc final : public c10d::Work {
 public:
  WorkRdmacc(std::shared_ptr<rdmacc::Work> work, int rank, OpType type,
             std::vector<at::Tensor> outputs, std::vector<at::Tensor> inputs)
      : c10d::Work(rank, type),
        work_(std::move(work)),
        outputs_(std::move(outputs)),
        future_(c10::make_intrusive<c10::ivalue::Future>(
            c10::ListType::create(c10::TensorType::get()))) {
    // The callback holds every tensor until the operation is over, even when
    // the caller drops this Work: rdmacc writes into them until then.
    work_->then([future = future_, outputs = outputs_,
                 inputs = std::move(inputs)](rdmacc::Work& w) mutable {
      if (w.isSuccess()) {
        future->markCompleted(c10::IValue(outputs));
      } else {
        future->setError(w.exception());
      }
      inputs.clear();
    });
  }

  bool isCompleted() override { return work_->isCompleted(); }
  bool isSuccess() const override { return work_->isSuccess(); }
  std::exception_ptr exception() const override { return work_->exception(); }
  int sourceRank() const override { return work_->sourceRank(); }
  std::vector<at::Tensor> result() override { return outputs_; }
  void synchronize() override {}  // CPU tensors: complete means visible
  bool wait(std::chrono::milliseconds timeout) override {
    // c10d: a zero timeout means no limit.
    return timeout == kNoTimeout ? work_->wait() : work_->wait(timeout);
  }
  void abort() override { work_->abort(); }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  std::shared_ptr<rdmacc::Work> work_;
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace

c10::intrusive_ptr<c10d::Work> BackendRdmacc::wrap(std::shared_ptr<rdmacc::Work> work, int rank,
                                                   OpType type, std::vector<at::Tensor> outputs,
                                                   std::vector<at::Tensor> inputs) {
  {
    std::lock_guard lock(collectMutex_);
    for (auto& open : collections_) open.push_back(Member{work, outputs});
  }
  return c10::make_intrusive<WorkRdmacc>(std::move(work), rank, type, std::move(outputs),
                                         std::move(inputs));
}

std::vector<BackendRdmacc::Member> BackendRdmacc::closeCollection() {
  std::lock_guard lock(collectMutex_);
  std::vector<Member> members = std::move(collections_.back());
  collections_.pop_back();
  return members;
}

// One Work over several: complete when all are, failed with the first
// failure; its result is every member's outputs in order.
c10::intrusive_ptr<c10d::Work> BackendRdmacc::combine(std::vector<Member> members) {
  auto all = std::make_shared<rdmacc::Work>(
      members.empty() ? rdmacc::OpType::Barrier : members.front().work->opType(),
      members.empty() ? 0 : members.front().work->sequenceNumber());
  struct State {
    std::mutex mutex;
    size_t left = 0;
    std::exception_ptr first;
  };
  auto state = std::make_shared<State>();
  state->left = members.size();
  std::vector<at::Tensor> outputs;
  for (const auto& m : members) outputs.insert(outputs.end(), m.outputs.begin(), m.outputs.end());
  if (members.empty()) all->finish(nullptr);
  for (const auto& m : members) {
    m.work->then([state, all](rdmacc::Work& w) {
      std::exception_ptr done;
      bool last = false;
      {
        std::lock_guard lock(state->mutex);
        if (!w.isSuccess() && !state->first) state->first = w.exception();
        last = --state->left == 0;
        done = state->first;
      }
      if (last) all->finish(done);
    });
  }
#if RDMACC_TORCH_BACKEND_API
  const OpType type = OpType::COALESCED;
#else
  const OpType type = OpType::UNKNOWN;
#endif
  return c10::make_intrusive<WorkRdmacc>(std::move(all), rank_, type, std::move(outputs),
                                         std::vector<at::Tensor>{});
}

#if RDMACC_TORCH_BACKEND_API
void BackendRdmacc::startCoalescing() {
  std::lock_guard lock(collectMutex_);
  TORCH_CHECK(!coalescing_,
              "rdmacc: startCoalescing while coalescing already (call endCoalescing)");
  coalescing_ = true;
  collections_.insert(collections_.begin(), std::vector<Member>{});
}

c10::intrusive_ptr<c10d::Work> BackendRdmacc::endCoalescing() {
  std::vector<Member> members;
  {
    std::lock_guard lock(collectMutex_);
    TORCH_CHECK(coalescing_, "rdmacc: endCoalescing without startCoalescing");
    coalescing_ = false;
    members = std::move(collections_.front());
    collections_.erase(collections_.begin());
  }
  return combine(std::move(members));
}

// Runs issue() with a collection open: one Work for everything it issued.
template <typename F>
c10::intrusive_ptr<c10d::Work> BackendRdmacc::collected(F&& issue) {
  {
    std::lock_guard lock(collectMutex_);
    collections_.emplace_back();
  }
  try {
    issue();
  } catch (...) {
    closeCollection();
    throw;
  }
  return combine(closeCollection());
}

c10::intrusive_ptr<c10d::Work> BackendRdmacc::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  TORCH_CHECK(outputs.size() == inputs.size(),
              "rdmacc allgather_into_tensor_coalesced: ", outputs.size(), " outputs for ",
              inputs.size(), " inputs");
  return collected([&] {
    for (size_t i = 0; i < inputs.size(); ++i) _allgather_base(outputs[i], inputs[i], opts);
  });
}

c10::intrusive_ptr<c10d::Work> BackendRdmacc::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK(outputs.size() == inputs.size(),
              "rdmacc reduce_scatter_tensor_coalesced: ", outputs.size(), " outputs for ",
              inputs.size(), " inputs");
  return collected([&] {
    for (size_t i = 0; i < inputs.size(); ++i) _reduce_scatter_base(outputs[i], inputs[i], opts);
  });
}
#endif

BackendRdmacc::BackendRdmacc(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                             std::chrono::milliseconds timeout, std::string groupName)
    : BackendBase(rank, size) {
  TORCH_CHECK(store, "rdmacc: no store given");
  rdmacc::VerbsBackend::Options options;
  options.timeout = timeout;
  options.groupName = std::move(groupName);
  backend_ = std::make_shared<rdmacc::VerbsBackend>(std::make_shared<StoreAdapter>(store), rank,
                                                    size, std::move(options));
  init();
}

// The progress thread may need the GIL while we join it: dropping its last
// reference to a tensor that Python also knew decrefs the Python object.
// A BackendRdmacc dies wherever its last reference goes, e.g. in a DDP
// Reducer deallocated by Python with the GIL held; joining the thread then
// would wait for a GIL this thread holds (the deadlock torch fixed for its
// own groups by releasing the GIL in their Python holders). So: let go of
// it while the core (and its thread) is destroyed.
void BackendRdmacc::destroyCore() noexcept {
  std::shared_ptr<rdmacc::VerbsBackend> core;
  {
    std::lock_guard lock(coreMutex_);
    core = std::move(backend_);
  }
  if (core == nullptr) return;
  if (Py_IsInitialized() != 0 && PyGILState_Check() != 0) {
    pybind11::gil_scoped_release release;
    core.reset();
  } else {
    core.reset();
  }
}

rdmacc::VerbsBackend& BackendRdmacc::core() const {
  // Read without the lock: c10d does not call shutdown() concurrently with
  // operations on the same group (destroy_process_group comes last).
  rdmacc::VerbsBackend* core = backend_.get();
  TORCH_CHECK(core != nullptr, "rdmacc: the process group was shut down (",
              "destroy_process_group, shutdown or abort); create a new one");
  return *core;
}

BackendRdmacc::~BackendRdmacc() {
  destroyCore();
}

#if RDMACC_TORCH_BACKEND_API
// destroy_process_group calls shutdown() on every backend: the group's
// operations still in flight fail with ErrorKind::Aborted, its connections
// and threads are gone, and later calls raise a clear error.
void BackendRdmacc::shutdown() {
  destroyCore();
}
void BackendRdmacc::abort() {
  destroyCore();
}
#endif

c10::intrusive_ptr<BackendBase> BackendRdmacc::create(
    const c10d::DistributedBackendOptions& options) {
  // torch numbers its groups: the default one is "0", new_group()s "1", "2", ...
  std::string name = "torch-" + options.group_id;
  return c10::make_intrusive<BackendRdmacc>(
      options.store, options.group_rank, options.group_size,
      std::chrono::duration_cast<std::chrono::milliseconds>(options.timeout), std::move(name));
}

c10::intrusive_ptr<c10d::Work> BackendRdmacc::broadcast(std::vector<at::Tensor>& tensors,
                                                        const c10d::BroadcastOptions& opts) {
  auto in = views(tensors, "broadcast");
  rdmacc::BroadcastOptions o{
      .rootRank = opts.rootRank, .rootTensor = opts.rootTensor, .timeout = opts.timeout};
  return wrap(core().broadcast(in, o), rank_, OpType::BROADCAST, tensors);
}

c10::intrusive_ptr<c10d::Work> BackendRdmacc::allreduce(std::vector<at::Tensor>& tensors,
                                                        const c10d::AllreduceOptions& opts) {
  if (tensors.size() == 1 && tensors[0].defined() && tensors[0].layout() == at::kSparse) {
    return allreduceSparse(tensors[0], opts);
  }
  auto in = views(tensors, "allreduce");
  rdmacc::AllreduceOptions o{.timeout = opts.timeout};
  o.reduceOp = toReduceOp(opts.reduceOp, &o.preMulFactor);
  return wrap(core().allreduce(in, o), rank_, OpType::ALLREDUCE, tensors);
}

c10::intrusive_ptr<c10d::Work> BackendRdmacc::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  auto in = views(tensors, "allreduce_coalesced");
  rdmacc::AllreduceCoalescedOptions o;
  o.timeout = opts.timeout;
  o.reduceOp = toReduceOp(opts.reduceOp, &o.preMulFactor);
  return wrap(core().allreduce_coalesced(in, o), rank_, OpType::ALLREDUCE_COALESCED, tensors);
}

c10::intrusive_ptr<c10d::Work> BackendRdmacc::reduce(std::vector<at::Tensor>& tensors,
                                                     const c10d::ReduceOptions& opts) {
  auto in = views(tensors, "reduce");
  rdmacc::ReduceOptions o{
      .rootRank = opts.rootRank, .rootTensor = opts.rootTensor, .timeout = opts.timeout};
  o.reduceOp = toReduceOp(opts.reduceOp, &o.preMulFactor);
  return wrap(core().reduce(in, o), rank_, OpType::REDUCE, tensors);
}

c10::intrusive_ptr<c10d::Work> BackendRdmacc::allgather(
    std::vector<std::vector<at::Tensor>>& outputTensors, std::vector<at::Tensor>& inputTensors,
    const c10d::AllgatherOptions& opts) {
  auto out = views(outputTensors, "allgather");
  auto in = views(inputTensors, "allgather");
  auto w = core().allgather(out, in, rdmacc::AllgatherOptions{.timeout = opts.timeout});
  return wrap(std::move(w), rank_, OpType::ALLGATHER, flatten(outputTensors), inputTensors);
}

c10::intrusive_ptr<c10d::Work> BackendRdmacc::_allgather_base(at::Tensor& outputBuffer,
                                                              at::Tensor& inputBuffer,
                                                              const c10d::AllgatherOptions& opts) {
  auto out = view(outputBuffer, "_allgather_base");
  auto in = view(inputBuffer, "_allgather_base");
  auto w = core()._allgather_base(out, in, rdmacc::AllgatherOptions{.timeout = opts.timeout});
  return wrap(std::move(w), rank_, OpType::_ALLGATHER_BASE, {outputBuffer}, {inputBuffer});
}

c10::intrusive_ptr<c10d::Work> BackendRdmacc::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputTensorLists, std::vector<at::Tensor>& inputTensors,
    const c10d::AllgatherOptions& opts) {
  auto out = views(outputTensorLists, "allgather_coalesced");
  auto in = views(inputTensors, "allgather_coalesced");
  auto w = core().allgather_coalesced(out, in, rdmacc::AllgatherOptions{.timeout = opts.timeout});
  return wrap(std::move(w), rank_, OpType::ALLGATHER_COALESCED, flatten(outputTensorLists),
              inputTensors);
}

c10::intrusive_ptr<c10d::Work> BackendRdmacc::gather(
    std::vector<std::vector<at::Tensor>>& outputTensors, std::vector<at::Tensor>& inputTensors,
    const c10d::GatherOptions& opts) {
  auto out = views(outputTensors, "gather");
  auto in = views(inputTensors, "gather");
  auto w = core().gather(out, in,
                         rdmacc::GatherOptions{.rootRank = opts.rootRank, .timeout = opts.timeout});
  return wrap(std::move(w), rank_, OpType::GATHER, flatten(outputTensors), inputTensors);
}

c10::intrusive_ptr<c10d::Work> BackendRdmacc::scatter(
    std::vector<at::Tensor>& outputTensors, std::vector<std::vector<at::Tensor>>& inputTensors,
    const c10d::ScatterOptions& opts) {
  auto out = views(outputTensors, "scatter");
  auto in = views(inputTensors, "scatter");
  auto w = core().scatter(
      out, in, rdmacc::ScatterOptions{.rootRank = opts.rootRank, .timeout = opts.timeout});
  return wrap(std::move(w), rank_, OpType::SCATTER, outputTensors, flatten(inputTensors));
}

c10::intrusive_ptr<c10d::Work> BackendRdmacc::reduce_scatter(
    std::vector<at::Tensor>& outputTensors, std::vector<std::vector<at::Tensor>>& inputTensors,
    const c10d::ReduceScatterOptions& opts) {
  auto out = views(outputTensors, "reduce_scatter");
  auto in = views(inputTensors, "reduce_scatter");
  rdmacc::ReduceScatterOptions o{.timeout = opts.timeout};
  o.reduceOp = toReduceOp(opts.reduceOp, &o.preMulFactor);
  return wrap(core().reduce_scatter(out, in, o), rank_, OpType::REDUCE_SCATTER, outputTensors,
              flatten(inputTensors));
}

c10::intrusive_ptr<c10d::Work> BackendRdmacc::_reduce_scatter_base(
    at::Tensor& outputBuffer, at::Tensor& inputBuffer, const c10d::ReduceScatterOptions& opts) {
  auto out = view(outputBuffer, "_reduce_scatter_base");
  auto in = view(inputBuffer, "_reduce_scatter_base");
  rdmacc::ReduceScatterOptions o{.timeout = opts.timeout};
  o.reduceOp = toReduceOp(opts.reduceOp, &o.preMulFactor);
  return wrap(core()._reduce_scatter_base(out, in, o), rank_, OpType::_REDUCE_SCATTER_BASE,
              {outputBuffer}, {inputBuffer});
}

c10::intrusive_ptr<c10d::Work> BackendRdmacc::alltoall_base(at::Tensor& outputBuffer,
                                                            at::Tensor& inputBuffer,
                                                            std::vector<int64_t>& outputSplitSizes,
                                                            std::vector<int64_t>& inputSplitSizes,
                                                            const c10d::AllToAllOptions& opts) {
  auto out = view(outputBuffer, "alltoall_base");
  auto in = view(inputBuffer, "alltoall_base");
  auto outSplits = splitElements(outputSplitSizes, outputBuffer, size_, "output");
  auto inSplits = splitElements(inputSplitSizes, inputBuffer, size_, "input");
  auto w = core().alltoall_base(out, in, outSplits, inSplits,
                                rdmacc::AllToAllOptions{.timeout = opts.timeout});
  return wrap(std::move(w), rank_, OpType::ALLTOALL_BASE, {outputBuffer}, {inputBuffer});
}

c10::intrusive_ptr<c10d::Work> BackendRdmacc::alltoall(std::vector<at::Tensor>& outputTensors,
                                                       std::vector<at::Tensor>& inputTensors,
                                                       const c10d::AllToAllOptions& opts) {
  auto out = views(outputTensors, "alltoall");
  auto in = views(inputTensors, "alltoall");
  auto w = core().alltoall(out, in, rdmacc::AllToAllOptions{.timeout = opts.timeout});
  return wrap(std::move(w), rank_, OpType::ALLTOALL, outputTensors, inputTensors);
}

void BackendRdmacc::monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) {
  core().monitoredBarrier(rdmacc::BarrierOptions{.timeout = opts.timeout}, waitAllRanks);
}

void BackendRdmacc::setSequenceNumberForGroup() {
  core().setSequenceNumberForGroup();
}

void BackendRdmacc::registerTensor(const at::Tensor& tensor) {
  rdmacc::Tensor t = view(tensor, "register_memory");
  core().registerMemory(t.data, t.bytes());
}

void BackendRdmacc::deregisterTensor(const at::Tensor& tensor) {
  rdmacc::Tensor t = view(tensor, "deregister_memory");
  core().deregisterMemory(t.data);
}

uint64_t BackendRdmacc::getSequenceNumberForGroup() {
  return core().getSequenceNumberForGroup();
}

c10::intrusive_ptr<c10d::Work> BackendRdmacc::send(std::vector<at::Tensor>& tensors, int dstRank,
                                                   int tag) {
  auto in = views(tensors, "send");
  return wrap(core().send(in, dstRank, tag), rank_, OpType::SEND, {}, tensors);
}

c10::intrusive_ptr<c10d::Work> BackendRdmacc::recv(std::vector<at::Tensor>& tensors, int srcRank,
                                                   int tag) {
  auto out = views(tensors, "recv");
  return wrap(core().recv(out, srcRank, tag), rank_, OpType::RECV, tensors);
}

c10::intrusive_ptr<c10d::Work> BackendRdmacc::recvAnysource(std::vector<at::Tensor>& tensors,
                                                            int tag) {
  auto out = views(tensors, "recvAnysource");
  return wrap(core().recvAnysource(out, tag), rank_, OpType::RECVANYSOURCE, tensors);
}

c10::intrusive_ptr<c10d::Work> BackendRdmacc::barrier(const c10d::BarrierOptions& opts) {
  return wrap(core().barrier(rdmacc::BarrierOptions{.timeout = opts.timeout}), rank_,
              OpType::BARRIER, {});
}

}  // namespace rdmacc_torch
