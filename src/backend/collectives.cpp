// The collective calls of VerbsBackend: each checks its arguments on the
// caller's thread and becomes an Operation (schedule, buffers, check value)
// for the engine.
#include "src/backend/tensor_lists.hpp"
#include "src/backend/verbs_backend_impl.hpp"
#include "src/core/buffer.hpp"

namespace rdmacc {

std::shared_ptr<Work> VerbsBackend::broadcast(std::vector<Tensor>& tensors,
                                              const BroadcastOptions& opts) {
  Impl& s = *impl_;
  Tensor& t = single(tensors, "broadcast");
  int root = checkRoot(opts.rootRank, size_, "broadcast");
  if (opts.rootTensor != 0) invalid("broadcast: rootTensor must be 0 (one tensor per rank)");
  auto op = s.collective(OpType::Broadcast, opts.timeout);
  op->schedule = s.planFor(
      Impl::Shape{
          .type = OpType::Broadcast, .algorithm = opts.algorithm, .root = root, .bytes = t.bytes()},
      [&](Algorithm algo) {
        return algo == Algorithm::Ring ? algorithms::chainBroadcast(rank_, size_, root, t.bytes())
               : algo == Algorithm::Tree
                   ? algorithms::treeBroadcast(rank_, size_, root, t.bytes())
                   : algorithms::hierarchicalBroadcast(rank_, s.hosts, root, t.bytes(),
                                                       t.bytes() > s.choice.treeMaxBytes());
      });
  const Algorithm algo = op->schedule->algorithm;
  op->sendBase = op->recvBase = bytesOf(t);
  op->checkValue = checkValue(t.bytes(), static_cast<uint64_t>(root),
                              static_cast<uint64_t>(t.dtype), static_cast<uint64_t>(algo));
  op->describe("{} x {}, root {}, {}", t.numel, toString(t.dtype), root, toString(algo));
  return s.submit(std::move(op));
}

std::shared_ptr<Work> VerbsBackend::allreduce(std::vector<Tensor>& tensors,
                                              const AllreduceOptions& opts) {
  Impl& s = *impl_;
  Tensor& t = single(tensors, "allreduce");
  checkReduce(opts.reduceOp, t.dtype, opts.preMulFactor, "allreduce");
  // What the operation is, built only when the engine runs it.
  struct Build final : OperationFactory {
    Impl& s;
    Tensor& t;
    const AllreduceOptions& opts;
    Build(Impl& impl, Tensor& tensor, const AllreduceOptions& options)
        : s(impl), t(tensor), opts(options) {}
    std::unique_ptr<Operation> make() override {
      auto op = s.collective(OpType::Allreduce, opts.timeout);
      s.buildAllreduce(*op, bytesOf(t), t.numel, t.dtype, opts.reduceOp, opts.preMulFactor,
                       opts.algorithm);
      return op;
    }
  } build(s, t, opts);
  // Small, every rank on this host, nothing pending: on this thread, through
  // the board (PreMulSum scales its input first: the engine's prologue).
  if (opts.reduceOp != ReduceOp::PreMulSum && s.isOneShot(opts.algorithm, t.bytes())) {
    const OneShotCall call{
        .data = bytesOf(t),
        .bytes = t.bytes(),
        .dtype = t.dtype,
        .reduceOp = opts.reduceOp,
        .avgDivisor = opts.reduceOp == ReduceOp::Avg ? s.size : 0,
        .checkValue = s.allreduceCheck(t.bytes(), opts.reduceOp, t.dtype, Algorithm::Auto)};
    if (auto work = s.engine->tryOneShot(call, build)) return work;
  }
  return s.submit(build.make());
}

std::shared_ptr<Work> VerbsBackend::allreduce_coalesced(std::vector<Tensor>& tensors,
                                                        const AllreduceCoalescedOptions& opts) {
  Impl& s = *impl_;
  if (tensors.empty()) invalid("allreduce_coalesced needs at least one tensor");
  size_t total = 0;
  for (const auto& t : tensors) {
    checkTensor(t, "allreduce_coalesced", "a tensor");
    if (t.dtype != tensors[0].dtype) {
      invalid(fmt::format("allreduce_coalesced: tensors mix {} and {}", toString(tensors[0].dtype),
                          toString(t.dtype)),
              "coalesce tensors of one dtype per call");
    }
    total += t.numel;
  }
  DataType dtype = tensors[0].dtype;
  checkReduce(opts.reduceOp, dtype, opts.preMulFactor, "allreduce_coalesced");
  auto op = s.collective(OpType::AllreduceCoalesced, opts.timeout);
  uint8_t* flat = op->scratch.allocate(total * elementSize(dtype), s.scratchPool);
  std::vector<Tensor> views = tensors;
  const Algorithm algo =
      s.buildAllreduce(*op, flat, total, dtype, opts.reduceOp, opts.preMulFactor, opts.algorithm);
  auto scale = std::move(op->prologue);  // PreMulSum's scaling, after the copy in
  op->prologue = [flat, views, scale] {
    packTensors(flat, views);
    if (scale) scale();
  };
  op->epilogue = [flat, views] { unpackTensors(flat, views); };
  op->describe("{} tensors, {} x {}, {}, {}", tensors.size(), total, toString(dtype),
               toString(opts.reduceOp), toString(algo));
  return s.submit(std::move(op));
}

std::shared_ptr<Work> VerbsBackend::reduce(std::vector<Tensor>& tensors,
                                           const ReduceOptions& opts) {
  Impl& s = *impl_;
  Tensor& t = single(tensors, "reduce");
  int root = checkRoot(opts.rootRank, size_, "reduce");
  if (opts.rootTensor != 0) invalid("reduce: rootTensor must be 0 (one tensor per rank)");
  checkReduce(opts.reduceOp, t.dtype, opts.preMulFactor, "reduce");
  auto op = s.collective(OpType::Reduce, opts.timeout);
  op->schedule = s.planFor(
      Impl::Shape{
          .type = OpType::Reduce, .algorithm = opts.algorithm, .root = root, .bytes = t.bytes()},
      [&](Algorithm algo) {
        return algo == Algorithm::Tree
                   ? algorithms::treeReduce(rank_, size_, root, t.bytes())
                   : algorithms::hierarchicalReduce(rank_, s.hosts, root, t.bytes(),
                                                    t.bytes() > s.choice.treeMaxBytes());
      });
  uint8_t* acc = bytesOf(t);
  if (rank_ != root) {  // non-roots keep their input: accumulate in scratch
    acc = op->scratch.allocate(t.bytes(), s.scratchPool);
  }
  op->sendBase = op->recvBase = acc;
  op->dtype = t.dtype;
  op->reduceOp = opts.reduceOp;
  uint8_t* input = bytesOf(t);
  size_t count = t.numel, bytes = t.bytes();
  DataType dtype = t.dtype;
  ReduceOp reduceOp = opts.reduceOp;
  double factor = opts.preMulFactor;
  op->prologue = [acc, input, count, bytes, dtype, reduceOp, factor] {
    if (acc != input) copyBytes(acc, input, bytes);
    if (reduceOp == ReduceOp::PreMulSum) scaleBy(acc, count, dtype, factor);
  };
  if (reduceOp == ReduceOp::Avg && rank_ == root) {
    int64_t n = size_;
    op->epilogue = [acc, count, dtype, n] { divideBy(acc, count, dtype, n); };
  }
  op->checkValue = checkValue(t.bytes(), static_cast<uint64_t>(reduceOp),
                              static_cast<uint64_t>(dtype), static_cast<uint64_t>(root));
  op->describe("{} x {}, {}, root {}, {}", t.numel, toString(dtype), toString(reduceOp), root,
               toString(op->schedule->algorithm));
  return s.submit(std::move(op));
}

std::shared_ptr<Work> VerbsBackend::_allgather_base(Tensor& output, Tensor& input,
                                                    const AllgatherOptions& opts) {
  Impl& s = *impl_;
  checkTensor(input, "_allgather_base", "the input");
  checkTensor(output, "_allgather_base", "the output");
  if (output.dtype != input.dtype || output.numel != input.numel * static_cast<size_t>(size_)) {
    invalid(fmt::format(
        "_allgather_base: the output must be {} x {} ({} ranks x the input), got {} x {}",
        input.numel * static_cast<size_t>(size_), toString(input.dtype), size_, output.numel,
        toString(output.dtype)));
  }
  auto op = s.collective(OpType::AllgatherBase, opts.timeout);
  // Every block is the input's size: block r at r x input bytes.
  op->schedule = s.allgatherPlan(Impl::Shape{
      .type = OpType::AllgatherBase, .algorithm = opts.algorithm, .bytes = output.bytes()});
  op->sendBase = op->recvBase = bytesOf(output);
  op->copyIn = {.to = bytesOf(output) + static_cast<size_t>(rank_) * input.bytes(),
                .from = bytesOf(input),
                .bytes = input.bytes()};
  op->checkValue = checkValue(input.bytes(), static_cast<uint64_t>(input.dtype));
  op->describe("{} x {} per rank", input.numel, toString(input.dtype));
  return s.submit(std::move(op));
}

std::shared_ptr<Work> VerbsBackend::allgather(std::vector<std::vector<Tensor>>& outputs,
                                              std::vector<Tensor>& inputs,
                                              const AllgatherOptions& opts) {
  Tensor& in = single(inputs, "allgather");
  if (outputs.size() != 1 || outputs[0].size() != static_cast<size_t>(size_)) {
    invalid(fmt::format("allgather needs one list of {} output tensors", size_));
  }
  for (const auto& o : outputs[0]) checkSame(in, o, "allgather", "an output tensor");
  std::vector<std::vector<Tensor>> lists(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r)
    lists[static_cast<size_t>(r)] = {outputs[0][static_cast<size_t>(r)]};
  return impl_->allgatherPacked(OpType::Allgather, lists, inputs, opts);
}

std::shared_ptr<Work> VerbsBackend::allgather_coalesced(
    std::vector<std::vector<Tensor>>& outputLists, std::vector<Tensor>& inputs,
    const AllgatherOptions& opts) {
  return impl_->allgatherPacked(OpType::AllgatherCoalesced, outputLists, inputs, opts);
}

std::shared_ptr<Work> VerbsBackend::gather(std::vector<std::vector<Tensor>>& outputs,
                                           std::vector<Tensor>& inputs, const GatherOptions& opts) {
  Impl& s = *impl_;
  Tensor& in = single(inputs, "gather");
  int root = checkRoot(opts.rootRank, size_, "gather");
  if (rank_ == root) {
    if (outputs.size() != 1 || outputs[0].size() != static_cast<size_t>(size_)) {
      invalid(fmt::format("gather: the root needs one list of {} output tensors", size_));
    }
    for (const auto& o : outputs[0]) checkSame(in, o, "gather", "an output tensor");
  } else if (!outputs.empty() && !(outputs.size() == 1 && outputs[0].empty())) {
    invalid("gather: only the root passes output tensors", "pass an empty list on the other ranks");
  }
  auto op = s.collective(OpType::Gather, opts.timeout);
  size_t bytes = in.bytes();
  std::vector<Range> blocks = uniformBlocks(bytes, size_);
  op->schedule = std::make_shared<const Plan>(
      algorithms::linearGather(rank_, size_, root, Range{0, bytes}, blocks));
  op->sendBase = bytesOf(in);
  if (rank_ == root) {
    uint8_t* flat = op->scratch.allocate(bytes * static_cast<size_t>(size_), s.scratchPool);
    op->recvBase = flat;
    std::vector<Tensor> outs = outputs[0];
    int me = rank_;
    Tensor input = in;
    op->epilogue = [flat, outs, bytes, me, input] {
      for (size_t r = 0; r < outs.size(); ++r) {
        const void* from = static_cast<int>(r) == me ? input.data : flat + r * bytes;
        copyBytes(outs[r].data, from, bytes);
      }
    };
  }
  op->checkValue = checkValue(bytes, static_cast<uint64_t>(root), static_cast<uint64_t>(in.dtype));
  op->describe("{} x {}, root {}", in.numel, toString(in.dtype), root);
  return s.submit(std::move(op));
}

std::shared_ptr<Work> VerbsBackend::scatter(std::vector<Tensor>& outputs,
                                            std::vector<std::vector<Tensor>>& inputs,
                                            const ScatterOptions& opts) {
  Impl& s = *impl_;
  Tensor& out = single(outputs, "scatter");
  int root = checkRoot(opts.rootRank, size_, "scatter");
  if (rank_ == root) {
    if (inputs.size() != 1 || inputs[0].size() != static_cast<size_t>(size_)) {
      invalid(fmt::format("scatter: the root needs one list of {} input tensors", size_));
    }
    for (const auto& i : inputs[0]) checkSame(out, i, "scatter", "an input tensor");
  } else if (!inputs.empty() && !(inputs.size() == 1 && inputs[0].empty())) {
    invalid("scatter: only the root passes input tensors", "pass an empty list on the other ranks");
  }
  auto op = s.collective(OpType::Scatter, opts.timeout);
  size_t bytes = out.bytes();
  std::vector<Range> blocks = uniformBlocks(bytes, size_);
  op->schedule = std::make_shared<const Plan>(
      algorithms::linearScatter(rank_, size_, root, blocks, Range{0, bytes}));
  op->recvBase = bytesOf(out);
  if (rank_ == root) {
    uint8_t* flat = op->scratch.allocate(bytes * static_cast<size_t>(size_), s.scratchPool);
    op->sendBase = flat;
    std::vector<Tensor> ins = inputs[0];
    Tensor output = out;
    int me = rank_;
    op->prologue = [flat, ins, bytes, output, me] {
      for (size_t r = 0; r < ins.size(); ++r) {
        copyBytes(flat + r * bytes, ins[r].data, bytes);
      }
      copyBytes(output.data, flat + static_cast<size_t>(me) * bytes, bytes);
    };
  }
  op->checkValue = checkValue(bytes, static_cast<uint64_t>(root), static_cast<uint64_t>(out.dtype));
  op->describe("{} x {}, root {}", out.numel, toString(out.dtype), root);
  return s.submit(std::move(op));
}

std::shared_ptr<Work> VerbsBackend::_reduce_scatter_base(Tensor& output, Tensor& input,
                                                         const ReduceScatterOptions& opts) {
  Impl& s = *impl_;
  checkTensor(input, "_reduce_scatter_base", "the input");
  checkTensor(output, "_reduce_scatter_base", "the output");
  if (output.dtype != input.dtype || input.numel != output.numel * static_cast<size_t>(size_)) {
    invalid(fmt::format(
        "_reduce_scatter_base: the input must be {} x {} ({} ranks x the output), got {} x {}",
        output.numel * static_cast<size_t>(size_), toString(output.dtype), size_, input.numel,
        toString(input.dtype)));
  }
  checkReduce(opts.reduceOp, input.dtype, opts.preMulFactor, "reduce_scatter");
  auto op = s.collective(OpType::ReduceScatterBase, opts.timeout);
  size_t es = elementSize(input.dtype);
  auto blocks = evenBlocks(input.numel, size_, es);
  Tensor in = input;
  ReduceOp reduceOp = opts.reduceOp;
  double factor = opts.preMulFactor;
  // The ring reads the input where it is, unless PreMulSum scales a copy
  // first or the output lies inside the input other than as this rank's own
  // block (NCCL's in-place form): the ring's last receive writes the output
  // while other blocks of the input may still be read.
  Span inputSpan, outputSpan;
  inputSpan.cover(bytesOf(input), 0, input.bytes());
  outputSpan.cover(bytesOf(output), 0, output.bytes());
  const bool ownBlock =
      bytesOf(output) == bytesOf(input) + blocks[static_cast<size_t>(rank_)].offset;
  const bool readInput =
      reduceOp != ReduceOp::PreMulSum && (!outputSpan.overlaps(inputSpan) || ownBlock);
  uint8_t* flat = s.planReduceScatter(*op, opts.algorithm, blocks, input.bytes(), output, reduceOp,
                                      readInput ? bytesOf(input) : nullptr);
  if (flat != nullptr) {
    op->prologue = [flat, in, reduceOp, factor] {
      copyBytes(flat, in.data, in.bytes());
      if (reduceOp == ReduceOp::PreMulSum) scaleBy(flat, in.numel, in.dtype, factor);
    };
  }
  op->checkValue = checkValue(input.bytes(), static_cast<uint64_t>(reduceOp),
                              static_cast<uint64_t>(input.dtype));
  op->describe("{} x {} per rank, {}", output.numel, toString(input.dtype), toString(reduceOp));
  return s.submit(std::move(op));
}

std::shared_ptr<Work> VerbsBackend::reduce_scatter(std::vector<Tensor>& outputs,
                                                   std::vector<std::vector<Tensor>>& inputs,
                                                   const ReduceScatterOptions& opts) {
  Impl& s = *impl_;
  Tensor& out = single(outputs, "reduce_scatter");
  if (inputs.size() != 1 || inputs[0].size() != static_cast<size_t>(size_)) {
    invalid(fmt::format("reduce_scatter needs one list of {} input tensors", size_));
  }
  for (const auto& t : inputs[0]) checkSame(out, t, "reduce_scatter", "an input tensor");
  checkReduce(opts.reduceOp, out.dtype, opts.preMulFactor, "reduce_scatter");
  auto op = s.collective(OpType::ReduceScatter, opts.timeout);
  size_t bytes = out.bytes();
  std::vector<Range> blocks = uniformBlocks(bytes, size_);
  uint8_t* flat = s.planReduceScatter(*op, opts.algorithm, blocks,
                                      bytes * static_cast<size_t>(size_), out, opts.reduceOp);
  std::vector<Tensor> ins = inputs[0];
  Tensor output = out;
  ReduceOp reduceOp = opts.reduceOp;
  double factor = opts.preMulFactor;
  size_t count = out.numel * static_cast<size_t>(size_);
  op->prologue = [flat, ins, bytes, reduceOp, factor, count, output] {
    for (size_t r = 0; r < ins.size(); ++r) {
      copyBytes(flat + r * bytes, ins[r].data, bytes);
    }
    if (reduceOp == ReduceOp::PreMulSum) scaleBy(flat, count, output.dtype, factor);
  };
  op->checkValue =
      checkValue(bytes, static_cast<uint64_t>(reduceOp), static_cast<uint64_t>(out.dtype));
  op->describe("{} x {} per rank, {}", out.numel, toString(out.dtype), toString(reduceOp));
  return s.submit(std::move(op));
}

std::shared_ptr<Work> VerbsBackend::alltoall_base(Tensor& output, Tensor& input,
                                                  std::vector<int64_t>& outputSplits,
                                                  std::vector<int64_t>& inputSplits,
                                                  const AllToAllOptions& opts) {
  Impl& s = *impl_;
  checkTensor(input, "alltoall_base", "the input");
  checkTensor(output, "alltoall_base", "the output");
  if (input.dtype != output.dtype) invalid("alltoall_base: input and output dtypes differ");
  auto inCounts = splitCounts(inputSplits, input.numel, size_, "input");
  auto outCounts = splitCounts(outputSplits, output.numel, size_, "output");
  if (inCounts[static_cast<size_t>(rank_)] != outCounts[static_cast<size_t>(rank_)]) {
    invalid(
        "alltoall_base: what this rank sends to itself must equal what it receives from itself");
  }
  auto op = s.collective(OpType::AlltoallBase, opts.timeout);
  size_t es = elementSize(input.dtype);
  auto sendBlocks = blocksOf(inCounts, es);
  auto recvBlocks = blocksOf(outCounts, es);
  op->schedule = s.alltoallPlan(op->type, opts.algorithm, sendBlocks, recvBlocks);
  uint8_t* src = bytesOf(input);
  uint8_t* dst = bytesOf(output);
  const Range self = sendBlocks[static_cast<size_t>(rank_)];
  const Range selfOut = recvBlocks[static_cast<size_t>(rank_)];
  if (input.data == output.data && input.bytes() > 0) {
    // In place: the sends read a copy of the input, made when the operation
    // starts (after the operations before it wrote the tensor, as on a
    // stream; made here, it sent what the tensor held before them), and
    // this rank's own block then moves from the copy to its place.
    uint8_t* copy = op->scratch.allocate(input.bytes(), s.scratchPool);
    op->copyIn = {.to = copy, .from = src, .bytes = input.bytes()};
    src = copy;
    op->prologue = [src, dst, self, selfOut] {
      if (self.bytes > 0) std::memmove(dst + selfOut.offset, src + self.offset, self.bytes);
    };
  } else {
    // This rank's own block, copied when the operation starts (no prologue:
    // the engine sees the memory it touches and may run it alongside
    // independent collectives).
    op->copyIn = {.to = dst + selfOut.offset, .from = src + self.offset, .bytes = self.bytes};
  }
  op->sendBase = src;
  op->recvBase = dst;
  op->checkValue = checkValue(0, static_cast<uint64_t>(input.dtype));
  op->describe("{} -> {} x {}", input.numel, output.numel, toString(input.dtype));
  return s.submit(std::move(op));
}

std::shared_ptr<Work> VerbsBackend::alltoall(std::vector<Tensor>& outputs,
                                             std::vector<Tensor>& inputs,
                                             const AllToAllOptions& opts) {
  Impl& s = *impl_;
  if (outputs.size() != static_cast<size_t>(size_) || inputs.size() != static_cast<size_t>(size_)) {
    invalid(fmt::format("alltoall needs {} input and {} output tensors, got {} and {}", size_,
                        size_, inputs.size(), outputs.size()));
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    checkTensor(inputs[i], "alltoall", "an input");
    checkTensor(outputs[i], "alltoall", "an output");
    if (inputs[i].dtype != inputs[0].dtype || outputs[i].dtype != inputs[0].dtype) {
      invalid("alltoall: all tensors must have one dtype");
    }
  }
  if (inputs[static_cast<size_t>(rank_)].numel != outputs[static_cast<size_t>(rank_)].numel) {
    invalid("alltoall: the tensor this rank sends to itself must match the one it receives");
  }
  auto op = s.collective(OpType::Alltoall, opts.timeout);
  size_t es = elementSize(inputs[0].dtype);
  std::vector<size_t> inCounts, outCounts;
  size_t inTotal = 0, outTotal = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    inCounts.push_back(inputs[i].numel);
    outCounts.push_back(outputs[i].numel);
    inTotal += inputs[i].bytes();
    outTotal += outputs[i].bytes();
  }
  auto sendBlocks = blocksOf(inCounts, es);
  auto recvBlocks = blocksOf(outCounts, es);
  uint8_t* in = op->scratch.allocate(inTotal + outTotal, s.scratchPool);
  uint8_t* out = in + inTotal;
  op->schedule = s.alltoallPlan(op->type, opts.algorithm, sendBlocks, recvBlocks);
  op->sendBase = in;
  op->recvBase = out;
  std::vector<Tensor> ins = inputs, outs = outputs;
  int me = rank_;
  op->prologue = [in, out, ins, sendBlocks, recvBlocks, me] {
    for (size_t i = 0; i < ins.size(); ++i) {
      copyBytes(in + sendBlocks[i].offset, ins[i].data, ins[i].bytes());
    }
    const Range& self = sendBlocks[static_cast<size_t>(me)];
    if (self.bytes > 0)
      std::memcpy(out + recvBlocks[static_cast<size_t>(me)].offset, in + self.offset, self.bytes);
  };
  op->epilogue = [out, outs, recvBlocks] {
    for (size_t i = 0; i < outs.size(); ++i) {
      if (outs[i].bytes() > 0)
        std::memcpy(outs[i].data, out + recvBlocks[i].offset, outs[i].bytes());
    }
  };
  op->checkValue = checkValue(0, static_cast<uint64_t>(inputs[0].dtype));
  op->describe("{} tensors of {}", inputs.size(), toString(inputs[0].dtype));
  return s.submit(std::move(op));
}

}  // namespace rdmacc
