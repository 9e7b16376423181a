// VerbsBackend's state and the argument checks its calls share: private to
// backend/verbs_backend.cpp (construction, point-to-point, barriers, sequence
// numbers) and backend/collectives.cpp (the collective calls, each turned into an
// Operation with its schedule).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>

#include <fmt/format.h>

#include "rdmacc/backend.hpp"
#include "rdmacc/config.hpp"
#include "rdmacc/environment.hpp"
#include "rdmacc/error.hpp"
#include "rdmacc/log.hpp"
#include "src/backend/algorithm_choice.hpp"
#include "src/backend/arguments.hpp"
#include "src/backend/tensor_lists.hpp"
#include "src/backend/transports.hpp"
#include "src/core/buffer.hpp"
#include "src/engine/engine.hpp"
#include "src/engine/event_trace.hpp"
#include "src/reduce/reduce.hpp"
#include "src/schedule/algorithms/algorithms.hpp"
#include "src/store/socket.hpp"
#include "src/store/store_util.hpp"
#include "src/transport/link.hpp"
#include "src/transport/rdma/mesh.hpp"
#include "src/transport/registration_cache.hpp"
#include "verbs/qp.hpp"

namespace rdmacc {

class ChannelClaim;  // src/backend/shared_links.hpp

constexpr uint32_t kInternalTagBase = 0x80000000u;  // user tags are non-negative ints

inline Tensor& single(std::vector<Tensor>& tensors, const char* op) {
  if (tensors.size() != 1) {
    invalid(fmt::format("{} takes exactly one tensor per rank, got {}", op, tensors.size()),
            "rdmacc drives one CPU tensor per call; use allreduce_coalesced for many");
  }
  checkTensor(tensors[0], op, "the tensor");
  return tensors[0];
}

inline void checkReduce(ReduceOp op, DataType dtype, double factor, const char* name) {
  if (!supports(op, dtype)) {
    invalid(
        fmt::format("{}: reduce op {} is not defined for {}", name, toString(op), toString(dtype)),
        isFloatingPoint(dtype) ? "band/bor/bxor need an integer or bool tensor"
                               : "avg and premulsum need a numeric (non-bool) tensor");
  }
  if (op == ReduceOp::PreMulSum && !std::isfinite(factor)) {
    invalid(fmt::format("{}: the PreMulSum factor {} is not finite", name, factor));
  }
}

inline int checkRoot(int64_t root, int size, const char* op) {
  if (root < 0 || root >= size)
    invalid(fmt::format("{}: root rank {} is not in [0, {})", op, root, size));
  return static_cast<int>(root);
}

inline void checkSame(const Tensor& a, const Tensor& b, const char* op, const char* what) {
  checkTensor(b, op, what);
  if (a.dtype != b.dtype || a.numel != b.numel) {
    invalid(fmt::format("{}: {} is {} x {}, but the input is {} x {}", op, what, b.numel,
                        toString(b.dtype), a.numel, toString(a.dtype)),
            "every tensor of the call must match the input's size and dtype");
  }
}

inline uint64_t checkValue(uint64_t bytes, uint64_t a = 0, uint64_t b = 0, uint64_t c = 0) {
  return bytes ^ (a << 40) ^ (b << 48) ^ (c << 56);
}

inline uint8_t* bytesOf(const Tensor& t) {
  return static_cast<uint8_t*>(t.data);
}

struct VerbsBackend::Impl {
  std::shared_ptr<Store> store;
  int rank;
  int size;
  Config config;
  std::chrono::milliseconds defaultTimeout;
  size_t oneShotBytes = 0;  // the engine's (Engine::oneShotBytes), once it exists
  AlgorithmChoice choice;   // which algorithm each collective runs
  algorithms::Hosts hosts;  // which ranks share a host: hierarchical algorithms
  std::string group;
  // One mesh per NIC; empty: no RDMA peer, or all through `link`. Shared
  // with the link the group founds (later groups use them through it).
  std::vector<std::shared_ptr<Mesh>> rails;
  // Connections of an earlier group this one attached to (decision 019):
  // its RDMA peers go through a channel of `link`, over `linkMesh`.
  std::shared_ptr<Link> link;
  std::shared_ptr<Mesh> linkMesh;
  std::unique_ptr<RegistrationCache> registrations;  // after the meshes (their PD)
  // Operations' large scratch buffers, kept for the next ones
  // (RDMACC_SCRATCH_CACHE_BYTES); shared with the operations that hold one.
  std::shared_ptr<ScratchPool> scratchPool;
  std::unique_ptr<EventTrace> trace;  // RDMACC_TRACE_EVENTS; outlives the engine, which records
  std::unique_ptr<Engine> engine;     // after all of these: stopped first
  uint32_t monitoredBarriers = 0;

  // Construction, in steps (verbs_backend.cpp). Which peers go through
  // which transport, and what the shared-memory transport needs to attach.
  struct Placement {
    std::vector<bool> shm;  // by rank: a peer on this host, through shared memory
    size_t rdmaPeers = 0;
    std::string segment;                      // this rank's segment name
    std::shared_ptr<net::Fd> segmentFile;     // and its file (shm/transport.hpp)
    std::vector<std::string> shmRecords;      // every rank's "name:pid:fd", by rank
    uint32_t channel = 0;                     // of `link`, when the group attached to one
    std::vector<int> toBase;                  // group rank -> link rank, then
    std::optional<Link::ChannelBoard> board;  // its one-shot board over the link
    std::shared_ptr<ChannelClaim> claim;      // until the channel opens
    std::string linkId;                       // else: the link this group founds ("": none)
    std::string suits;                        // the settings its connections are made with
  };
  Placement placePeers(const Options& options);
  void failFormationForTest(std::string_view step) const;
  bool lazyConnections() const;
  void makeRails(const Options& options, const std::vector<bool>& skip, bool defer);
  void startRails(const std::vector<bool>& shm,
                  const std::vector<std::vector<std::string>>& carried);
  void makeRegistrations();
  void startEngine(const Options& options, const Placement& placement);
  RdmaPath rdmaPath(const Placement& placement);
  // The meshes whose queue pairs this group uses: its rails, or the link's.
  std::vector<Mesh*> meshesUsed() const;

  // A plan (the algorithm chosen and its schedule) depends only on the
  // collective's shape (and this rank and group, the configuration and the
  // tuning table, fixed for the backend's life): the most recent ones are
  // shared by the operations that repeat them, as a training loop does,
  // instead of chosen and built (and allocated) for every call.
  struct Shape {
    OpType type = OpType::Barrier;
    Algorithm algorithm = Algorithm::Auto;  // the call's request
    int root = -1;
    size_t bytes = 0;
    size_t elementSize = 0;
    bool avg = false;
    int variant = 0;  // a builder's own case (reduce_scatter: the ring reads the input in place)
    friend bool operator==(const Shape&, const Shape&) = default;
  };
  struct CachedPlan {
    Shape shape;
    std::shared_ptr<const Plan> plan;
    uint64_t lastUse = 0;
  };
  static constexpr size_t kCachedPlans = 32;
  std::mutex plansMutex;
  std::vector<CachedPlan> plans;
  uint64_t planUses = 0;

  // The plan for `shape`: cached, or chosen (choice, for shape.type) and
  // built (build(algorithm) returns the Schedule). A request the choice
  // refuses throws and is not cached, so it throws again on every call.
  template <typename Build>
  std::shared_ptr<const Plan> planFor(const Shape& shape, Build&& build) {
    if (auto cached = cachedPlan(shape)) return cached;
    const Algorithm algo = choice.choose(shape.algorithm, shape.type, shape.bytes);
    return keepPlan(shape, std::make_shared<const Plan>(build(algo), algo));
  }
  std::shared_ptr<const Plan> cachedPlan(const Shape& shape) {
    std::lock_guard lock(plansMutex);
    for (CachedPlan& c : plans) {
      if (c.shape == shape) {
        c.lastUse = ++planUses;
        return c.plan;
      }
    }
    return nullptr;
  }
  std::shared_ptr<const Plan> keepPlan(const Shape& shape, std::shared_ptr<const Plan> built) {
    std::lock_guard lock(plansMutex);
    if (plans.size() < kCachedPlans) {
      plans.push_back({shape, built, ++planUses});
    } else {
      auto oldest = std::min_element(
          plans.begin(), plans.end(),
          [](const CachedPlan& a, const CachedPlan& b) { return a.lastUse < b.lastUse; });
      *oldest = {shape, built, ++planUses};
    }
    return built;
  }

  std::chrono::milliseconds timeoutOf(std::chrono::milliseconds t) const {
    return t.count() < 0 ? defaultTimeout : t;
  }

  // The allgather plan of equal blocks that add up to shape.bytes (the
  // gathered size).
  std::shared_ptr<const Plan> allgatherPlan(const Shape& shape) {
    return planFor(shape, [&](Algorithm algo) {
      const auto blocks = uniformBlocks(shape.bytes / static_cast<size_t>(size), size);
      return algo == Algorithm::Ring ? algorithms::ringAllgather(rank, size, blocks)
                                     : algorithms::linearAllgather(rank, size, blocks);
    });
  }

  // Reduce-scatter of every rank's whole input, laid out in `blocks` in the
  // returned scratch (the caller's prologue fills it), into `out`: around the
  // ring, or for latency-bound sizes (the total is the same on every rank) in
  // one step: rank p gets block p from everyone and combines the
  // contributions in rank order (the same sums whatever arrives first).
  // With `input` (contiguous, laid out like `blocks`) the ring reads it where
  // it is and nullptr is returned: no prologue (ringReduceScatterToOutput).
  // The blocks follow from op.type and totalBytes (even blocks of the
  // elements, or of the bytes of the list form), so the plan is cached by them.
  uint8_t* planReduceScatter(Operation& op, Algorithm requested, const std::vector<Range>& blocks,
                             size_t totalBytes, const Tensor& out, ReduceOp reduceOp,
                             const uint8_t* input = nullptr) {
    const bool fromInput = input != nullptr && size > 1;
    op.schedule =
        planFor(Shape{.type = op.type,
                      .algorithm = requested,
                      .bytes = totalBytes,
                      .elementSize = elementSize(out.dtype),
                      .variant = fromInput ? 1 : 0},
                [&](Algorithm algo) {
                  return algo == Algorithm::Ring
                             ? algorithms::ringReduceScatterToOutput(rank, size, blocks, fromInput)
                             : algorithms::linearReduceScatter(rank, size, blocks);
                });
    const Algorithm algo = op.schedule->algorithm;
    const bool avg = reduceOp == ReduceOp::Avg;
    const Range mine = blocks[static_cast<size_t>(rank)];
    op.dtype = out.dtype;
    op.reduceOp = reduceOp;
    if (algo == Algorithm::Ring) {
      // The last receive writes block `rank` into `out` (toOutput); the
      // scratch holds the partial sums forwarded before it (and without
      // `input`, the packed inputs).
      uint8_t* flat = op.scratch.allocate(totalBytes, scratchPool);
      op.sendBase = fromInput ? const_cast<uint8_t*>(input) : flat;
      op.recvBase = flat;
      op.outBase = static_cast<uint8_t*>(out.data);
      op.outOrigin = mine.offset;
      const size_t count = mine.bytes / elementSize(out.dtype);
      if (size == 1) {  // no steps: its own block is the result
        op.epilogue = [flat, out, mine] { copyBytes(out.data, flat + mine.offset, mine.bytes); };
      } else if (avg) {
        op.epilogue = [out, count, n = size] { divideBy(out.data, count, out.dtype, n); };
      }
      return fromInput ? nullptr : flat;
    }
    uint8_t* flat =
        op.scratch.allocate(totalBytes + static_cast<size_t>(size - 1) * mine.bytes, scratchPool);
    uint8_t* gathered = flat + totalBytes;
    op.sendBase = flat;
    op.recvBase = gathered;
    op.epilogue = [flat, gathered, out, mine, me = rank, n = size, reduceOp, avg] {
      if (mine.bytes == 0) return;
      auto part = [&](int r) -> const uint8_t* {
        if (r == me) return flat + mine.offset;
        return gathered + static_cast<size_t>(r < me ? r : r - 1) * mine.bytes;
      };
      size_t count = mine.bytes / elementSize(out.dtype);
      if (n == 1) {
        std::memcpy(out.data, part(0), mine.bytes);
      } else {  // in rank order, the first two in one pass
        reduceTo(out.data, part(0), part(1), count, out.dtype, reduceOp);
      }
      for (int r = 2; r < n; ++r) reduceInto(out.data, part(r), count, out.dtype, reduceOp);
      if (avg) divideBy(out.data, count, out.dtype, n);
    };
    return flat;
  }

  // Cached when every block has one size (no splits, or even ones): the
  // blocks then follow from the total (the callers checked that this rank's
  // own block is as large sent as received, so then all are); uneven splits
  // are chosen and built per call.
  std::shared_ptr<const Plan> alltoallPlan(OpType type, Algorithm requested,
                                           const std::vector<Range>& sendBlocks,
                                           const std::vector<Range>& recvBlocks) {
    auto build = [&](Algorithm algo) {
      return algo == Algorithm::Pairwise
                 ? algorithms::pairwiseAlltoall(rank, size, sendBlocks, recvBlocks)
                 : algorithms::linearAlltoall(rank, size, sendBlocks, recvBlocks);
    };
    auto even = [](const std::vector<Range>& blocks) {
      return std::all_of(blocks.begin(), blocks.end(),
                         [&](const Range& b) { return b.bytes == blocks.front().bytes; });
    };
    if (!sendBlocks.empty() && even(sendBlocks) && even(recvBlocks)) {
      return planFor(Shape{.type = type,
                           .algorithm = requested,
                           .bytes = sendBlocks.front().bytes * sendBlocks.size()},
                     build);
    }
    const Algorithm algo = choice.choose(requested, type, 0);
    return std::make_shared<const Plan>(build(algo), algo);
  }

  std::shared_ptr<Work> submit(std::unique_ptr<Operation> op) {
    return engine->submit(std::move(op));
  }

  std::unique_ptr<Operation> collective(OpType type, std::chrono::milliseconds timeout) {
    auto op = std::make_unique<Operation>();
    op->type = type;
    op->timeout = timeoutOf(timeout);
    return op;
  }

  // An allreduce over one contiguous buffer (used by allreduce and allreduce_coalesced).
  // Returns the algorithm chosen.
  Algorithm buildAllreduce(Operation& op, uint8_t* data, size_t count, DataType dtype,
                           ReduceOp reduceOp, double factor, Algorithm algorithm) {
    size_t es = elementSize(dtype);
    size_t bytes = count * es;
    bool avg = reduceOp == ReduceOp::Avg;
    // Every rank on this host, small, auto: one-shot through the shared
    // memory board (the same choice on every rank: the group's layout, the
    // size and settings that must agree).
    const bool oneShot = isOneShot(algorithm, bytes);
    const Shape shape{.type = OpType::Allreduce,
                      .algorithm = algorithm,
                      .bytes = bytes,
                      .elementSize = es,
                      .avg = avg,
                      .variant = oneShot ? 1 : 0};
    if (oneShot) {
      op.schedule = cachedPlan(shape);
      if (!op.schedule) op.schedule = keepPlan(shape, boardPlan(rank, size, bytes));
    } else {
      op.schedule = planFor(shape, [&](Algorithm algo) {
        switch (algo) {
          case Algorithm::Ring:
            return algorithms::ringAllreduce(rank, size, evenBlocks(count, size, es), avg);
          case Algorithm::Tree:
            return algorithms::treeAllreduce(rank, size, bytes, avg);
          case Algorithm::Hierarchical:  // split the data over every rank when bandwidth-bound
            return algorithms::hierarchicalAllreduce(rank, hosts, count, es, avg,
                                                     bytes > choice.treeMaxBytes());
          default:
            return algorithms::recursiveDoublingAllreduce(rank, size, bytes, avg);
        }
      });
    }
    const Algorithm algo = op.schedule->algorithm;
    op.sendBase = op.recvBase = data;
    op.dtype = dtype;
    op.reduceOp = reduceOp;
    op.avgDivisor = avg ? size : 0;
    op.checkValue = allreduceCheck(bytes, reduceOp, dtype, algo);
    if (reduceOp == ReduceOp::PreMulSum) {
      op.prologue = [data, count, dtype, factor] { scaleBy(data, count, dtype, factor); };
    }
    op.describe("{} x {}, {}, {}", count, toString(dtype), toString(reduceOp),
                oneShot ? "one-shot" : toString(algo));
    return algo;
  }

  static uint64_t allreduceCheck(size_t bytes, ReduceOp reduceOp, DataType dtype, Algorithm algo) {
    return checkValue(bytes, static_cast<uint64_t>(reduceOp), static_cast<uint64_t>(dtype),
                      static_cast<uint64_t>(algo));
  }

  bool isOneShot(Algorithm algorithm, size_t bytes) const {
    return algorithm == Algorithm::Auto && choice.forced(OpType::Allreduce) == Algorithm::Auto &&
           size > 1 && bytes > 0 && bytes <= oneShotBytes;
  }

  // allgather and allgather_coalesced: every rank's inputs packed into one block.
  std::shared_ptr<Work> allgatherPacked(OpType type, std::vector<std::vector<Tensor>>& outputLists,
                                        std::vector<Tensor>& inputs, const AllgatherOptions& opts) {
    if (outputLists.size() != static_cast<size_t>(size)) {
      invalid(fmt::format("allgather_coalesced needs {} output lists (one per rank), got {}", size,
                          outputLists.size()));
    }
    size_t perRank = 0;
    for (const auto& t : inputs) {
      checkTensor(t, "allgather_coalesced", "an input");
      perRank += t.bytes();
    }
    for (const auto& list : outputLists) {
      if (list.size() != inputs.size())
        invalid("allgather_coalesced: every output list must match the input list");
      for (size_t i = 0; i < list.size(); ++i)
        checkSame(inputs[i], list[i], "allgather_coalesced", "an output");
    }
    auto op = collective(type, opts.timeout);
    uint8_t* flat = op->scratch.allocate(perRank * static_cast<size_t>(size), scratchPool);
    op->schedule = allgatherPlan(Shape{
        .type = type, .algorithm = opts.algorithm, .bytes = perRank * static_cast<size_t>(size)});
    op->sendBase = op->recvBase = flat;
    std::vector<Tensor> ins = inputs;
    std::vector<std::vector<Tensor>> outs = outputLists;
    int me = rank;
    op->prologue = [flat, ins, perRank, me] {
      packTensors(flat + perRank * static_cast<size_t>(me), ins);
    };
    op->epilogue = [flat, outs] {
      size_t at = 0;
      for (const auto& list : outs) at += unpackTensors(flat + at, list);
    };
    op->checkValue = checkValue(perRank, inputs.size());
    op->describe("{} tensor(s), {} bytes per rank", inputs.size(), perRank);
    return submit(std::move(op));
  }
};

}  // namespace rdmacc
