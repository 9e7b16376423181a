#include <sched.h>
#include <unistd.h>

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
#include "rdmacc/tuning.hpp"
#include "src/algorithms/algorithms.hpp"
#include "src/arguments.hpp"
#include "src/engine.hpp"
#include "src/host_identity.hpp"
#include "src/mesh.hpp"
#include "src/reduce.hpp"
#include "src/registration_cache.hpp"
#include "src/store_util.hpp"
#include "verbs/qp.hpp"

namespace rdmacc {
namespace {

// RDMACC_SPIN_YIELD: auto yields when this host runs more of the group's ranks
// than this process may use CPUs (each spinning rank would otherwise hold a
// CPU the rank it waits for needs).
bool spinYield(const std::string& setting, int rank, int local) {
  if (setting != "auto") return setting == "1";
  cpu_set_t set;
  CPU_ZERO(&set);
  int cpus = ::sched_getaffinity(0, sizeof set, &set) == 0
                 ? CPU_COUNT(&set)
                 : static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN));
  bool yield = local > cpus;
  log(LogLevel::Info, "rank {}: {} ranks on this host, {} CPUs: {}", rank, local, cpus,
      yield ? "spinning yields the CPU" : "pure spinning");
  return yield;
}

// RDMACC_SPIN_US (validated by Config): {bandwidth-bound, latency-bound}
// spin. auto: 50 us, and 1 ms for latency-bound work when spinning yields
// (more ranks than CPUs): a sleeping rank needs an interrupt and a
// reschedule to wake, while a yielding spinner hands its CPU to the rank it
// waits for anyway; for large transfers the spinner's polls take CPU from
// the device's software (rxe), so they keep the short spin. Measured in the
// VM (4 ranks, 2 vCPUs, A/B 1 ms vs 50 us, 3 rounds): 8-byte allreduce
// 425-644 vs 648-1160 us, broadcast 162-220 vs 554-786 us; 16 MiB allreduce
// busbw 0.043-0.049 vs 0.044-0.052 GB/s.
std::pair<std::chrono::microseconds, std::chrono::microseconds> spinTimes(
    const std::string& setting, bool yield) {
  using std::chrono::microseconds;
  if (setting != "auto") {
    microseconds us(std::stoll(setting));
    return {us, us};
  }
  return {microseconds(50), microseconds(yield ? 1000 : 50)};
}

constexpr int kLinearAlltoallMaxRanks = 8;          // Auto alltoall: every pair at once up to here
constexpr uint32_t kInternalTagBase = 0x80000000u;  // user tags are non-negative ints

Tensor& single(std::vector<Tensor>& tensors, const char* op) {
  if (tensors.size() != 1) {
    invalid(fmt::format("{} takes exactly one tensor per rank, got {}", op, tensors.size()),
            "rdmacc drives one CPU tensor per call; use allreduce_coalesced for many");
  }
  checkTensor(tensors[0], op, "the tensor");
  return tensors[0];
}

void checkReduce(ReduceOp op, DataType dtype, double factor, const char* name) {
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

int checkRoot(int64_t root, int size, const char* op) {
  if (root < 0 || root >= size)
    invalid(fmt::format("{}: root rank {} is not in [0, {})", op, root, size));
  return static_cast<int>(root);
}

void checkSame(const Tensor& a, const Tensor& b, const char* op, const char* what) {
  checkTensor(b, op, what);
  if (a.dtype != b.dtype || a.numel != b.numel) {
    invalid(fmt::format("{}: {} is {} x {}, but the input is {} x {}", op, what, b.numel,
                        toString(b.dtype), a.numel, toString(a.dtype)),
            "every tensor of the call must match the input's size and dtype");
  }
}

uint64_t checkValue(uint64_t bytes, uint64_t a = 0, uint64_t b = 0, uint64_t c = 0) {
  return bytes ^ (a << 40) ^ (b << 48) ^ (c << 56);
}

uint8_t* bytesOf(const Tensor& t) {
  return static_cast<uint8_t*>(t.data);
}

}  // namespace

Backend::Backend(int rank, int size) : rank_(rank), size_(size) {}
Backend::~Backend() = default;

struct VerbsBackend::Impl {
  std::shared_ptr<Store> store;
  int rank;
  int size;
  Config config;
  std::chrono::milliseconds defaultTimeout;
  size_t treeMaxBytes;
  TuningTable tuning;
  std::string group;
  std::unique_ptr<Mesh> mesh;
  std::unique_ptr<RegistrationCache> registrations;    // after the mesh (its PD)
  std::unique_ptr<Engine> engine;                      // after both: stopped first
  std::shared_ptr<const Work::ProgressDriver> driver;  // the engine's, for every Work
  std::mutex submitMutex;                              // sequence numbers follow submission order
  uint64_t sequence = 0;
  uint64_t pointToPointCount = 0;
  uint32_t monitoredBarriers = 0;

  // A schedule depends only on the collective's shape (and this rank and
  // group): the most recent ones are shared by the operations that repeat
  // them, as a training loop does, instead of rebuilt (and allocated) for
  // every call.
  struct Shape {
    OpType type = OpType::Barrier;
    Algorithm algorithm = Algorithm::Auto;
    int root = -1;
    size_t bytes = 0;
    size_t elementSize = 0;
    bool avg = false;
    friend bool operator==(const Shape&, const Shape&) = default;
  };
  struct CachedSchedule {
    Shape shape;
    std::shared_ptr<const Schedule> schedule;
    uint64_t lastUse = 0;
  };
  static constexpr size_t kCachedSchedules = 32;
  std::mutex schedulesMutex;
  std::vector<CachedSchedule> schedules;
  uint64_t scheduleUses = 0;

  template <typename Build>
  std::shared_ptr<const Schedule> scheduleFor(const Shape& shape, Build&& build) {
    {
      std::lock_guard lock(schedulesMutex);
      for (CachedSchedule& c : schedules) {
        if (c.shape == shape) {
          c.lastUse = ++scheduleUses;
          return c.schedule;
        }
      }
    }
    auto built = std::make_shared<const Schedule>(build());
    std::lock_guard lock(schedulesMutex);
    if (schedules.size() < kCachedSchedules) {
      schedules.push_back({shape, built, ++scheduleUses});
    } else {
      auto oldest = std::min_element(
          schedules.begin(), schedules.end(),
          [](const CachedSchedule& a, const CachedSchedule& b) { return a.lastUse < b.lastUse; });
      *oldest = {shape, built, ++scheduleUses};
    }
    return built;
  }

  std::chrono::milliseconds timeoutOf(std::chrono::milliseconds t) const {
    return t.count() < 0 ? defaultTimeout : t;
  }

  // The call's choice, else RDMACC_ALGO_<OP>, else the tuning table
  // (RDMACC_TUNE_FILE), else trees up to RDMACC_TREE_MAX_BYTES.
  Algorithm choose(Algorithm requested, const char* collective, const char* envName,
                   size_t bytes) const {
    if (requested != Algorithm::Auto) return requested;
    const std::string& env = config.getString(envName);
    if (env == "ring") return Algorithm::Ring;
    if (env == "tree") return Algorithm::Tree;
    if (env == "recursive_doubling" && std::string_view(collective) == "allreduce") {
      return Algorithm::RecursiveDoubling;
    }
    if (auto tuned = tuning.lookup(collective, size, bytes)) return *tuned;
    if (bytes > treeMaxBytes) return Algorithm::Ring;
    // Small allreduces in power-of-two groups: log2 n exchanges instead of a
    // tree's 2 log2 n hops.
    return std::string_view(collective) == "allreduce" && size > 1 && algorithms::isPowerOfTwo(size)
               ? Algorithm::RecursiveDoubling
               : Algorithm::Tree;
  }

  // Latency-bound allgathers (by the gathered size, the same on every rank)
  // go to every rank at once; larger ones around the ring.
  Schedule allgatherSchedule(Algorithm requested, const std::vector<Range>& blocks,
                             size_t gatheredBytes) const {
    Algorithm algo = requested;
    if (algo == Algorithm::Auto) {
      if (auto tuned = tuning.lookup("allgather", size, gatheredBytes)) {
        algo = *tuned;
      } else {
        algo = gatheredBytes <= treeMaxBytes ? Algorithm::Linear : Algorithm::Ring;
      }
    }
    if (algo == Algorithm::Ring) return algorithms::ringAllgather(rank, size, blocks);
    if (algo == Algorithm::Linear) return algorithms::linearAllgather(rank, size, blocks);
    invalid(fmt::format("allgather has no {} algorithm", toString(algo)), "use ring or linear");
  }

  // Reduce-scatter of every rank's whole input, laid out in `blocks` in the
  // returned scratch (the caller's prologue fills it), into `out`: around the
  // ring, or for latency-bound sizes (the total is the same on every rank) in
  // one step: rank p gets block p from everyone and combines the
  // contributions in rank order (the same sums whatever arrives first).
  uint8_t* planReduceScatter(Operation& op, Algorithm requested, const std::vector<Range>& blocks,
                             size_t totalBytes, const Tensor& out, ReduceOp reduceOp) const {
    Algorithm algo = requested;
    if (algo == Algorithm::Auto) {
      algo = totalBytes <= treeMaxBytes ? Algorithm::Linear : Algorithm::Ring;
    }
    if (algo != Algorithm::Ring && algo != Algorithm::Linear) {
      invalid(fmt::format("reduce_scatter has no {} algorithm", toString(algo)),
              "use ring or linear");
    }
    const bool avg = reduceOp == ReduceOp::Avg;
    const Range mine = blocks[static_cast<size_t>(rank)];
    op.dtype = out.dtype;
    op.reduceOp = reduceOp;
    if (algo == Algorithm::Ring) {
      op.scratch.resize(totalBytes);
      uint8_t* flat = op.scratch.data();
      op.schedule =
          std::make_shared<const Schedule>(algorithms::ringReduceScatter(rank, size, blocks, avg));
      op.sendBase = op.recvBase = flat;
      op.avgDivisor = avg ? size : 0;
      op.epilogue = [flat, out, mine] {
        if (mine.bytes > 0) std::memcpy(out.data, flat + mine.offset, mine.bytes);
      };
      return flat;
    }
    op.scratch.resize(totalBytes + static_cast<size_t>(size - 1) * mine.bytes);
    uint8_t* flat = op.scratch.data();
    uint8_t* gathered = flat + totalBytes;
    op.schedule =
        std::make_shared<const Schedule>(algorithms::linearReduceScatter(rank, size, blocks));
    op.sendBase = flat;
    op.recvBase = gathered;
    op.epilogue = [flat, gathered, out, mine, me = rank, n = size, reduceOp, avg] {
      if (mine.bytes == 0) return;
      auto part = [&](int r) -> const uint8_t* {
        if (r == me) return flat + mine.offset;
        return gathered + static_cast<size_t>(r < me ? r : r - 1) * mine.bytes;
      };
      size_t count = mine.bytes / elementSize(out.dtype);
      std::memcpy(out.data, part(0), mine.bytes);
      for (int r = 1; r < n; ++r) reduceInto(out.data, part(r), count, out.dtype, reduceOp);
      if (avg) divideBy(out.data, count, out.dtype, n);
    };
    return flat;
  }

  // Sizes may differ between ranks, so only the group decides: every pair at
  // once in small groups, pairwise steps (no incast) in larger ones.
  Schedule alltoallSchedule(Algorithm requested, const std::vector<Range>& sendBlocks,
                            const std::vector<Range>& recvBlocks) const {
    Algorithm algo = requested;
    if (algo == Algorithm::Auto) {
      algo = size <= kLinearAlltoallMaxRanks ? Algorithm::Linear : Algorithm::Pairwise;
    }
    if (algo == Algorithm::Pairwise) {
      return algorithms::pairwiseAlltoall(rank, size, sendBlocks, recvBlocks);
    }
    if (algo == Algorithm::Linear) {
      return algorithms::linearAlltoall(rank, size, sendBlocks, recvBlocks);
    }
    invalid(fmt::format("alltoall has no {} algorithm", toString(algo)), "use pairwise or linear");
  }

  std::shared_ptr<Work> submit(std::unique_ptr<Operation> op) {
    std::lock_guard lock(submitMutex);
    if (op->pointToPoint) {
      op->sequence = ++pointToPointCount;
    } else {
      op->sequence = ++sequence;
    }
    op->work = std::make_shared<Work>(op->type, op->sequence);
    auto work = op->work;
    Engine* e = engine.get();
    work->setAbortHandler([e](const Work& w) {
      e->abort(
          fmt::format("{} #{} was aborted by the user", toString(w.opType()), w.sequenceNumber()));
    });
    work->setProgressDriver(driver);
    engine->submit(std::move(op));
    return work;
  }

  std::unique_ptr<Operation> collective(OpType type, std::chrono::milliseconds timeout) {
    auto op = std::make_unique<Operation>();
    op->type = type;
    op->timeout = timeoutOf(timeout);
    return op;
  }

  // An allreduce over one contiguous buffer (used by allreduce and allreduce_coalesced).
  void buildAllreduce(Operation& op, uint8_t* data, size_t count, DataType dtype, ReduceOp reduceOp,
                      double factor, Algorithm algorithm) {
    size_t es = elementSize(dtype);
    size_t bytes = count * es;
    Algorithm algo = choose(algorithm, "allreduce", "RDMACC_ALGO_ALLREDUCE", bytes);
    if (algo != Algorithm::Ring && algo != Algorithm::Tree &&
        algo != Algorithm::RecursiveDoubling) {
      invalid(fmt::format("allreduce has no {} algorithm", toString(algo)),
              "use ring, tree or recursive_doubling");
    }
    if (algo == Algorithm::RecursiveDoubling && !algorithms::isPowerOfTwo(size)) {
      invalid(fmt::format("recursive doubling needs a power-of-two group, not {} ranks", size),
              "use ring or tree (or auto) for this group");
    }
    bool avg = reduceOp == ReduceOp::Avg;
    op.schedule = scheduleFor(
        Shape{.type = OpType::Allreduce,
              .algorithm = algo,
              .bytes = bytes,
              .elementSize = es,
              .avg = avg},
        [&] {
          return algo == Algorithm::Ring
                     ? algorithms::ringAllreduce(rank, size, evenBlocks(count, size, es), avg)
                 : algo == Algorithm::Tree
                     ? algorithms::treeAllreduce(rank, size, bytes, avg)
                     : algorithms::recursiveDoublingAllreduce(rank, size, bytes, avg);
        });
    op.sendBase = op.recvBase = data;
    op.dtype = dtype;
    op.reduceOp = reduceOp;
    op.avgDivisor = avg ? size : 0;
    op.checkValue = checkValue(bytes, static_cast<uint64_t>(reduceOp), static_cast<uint64_t>(dtype),
                               static_cast<uint64_t>(algo));
    if (reduceOp == ReduceOp::PreMulSum) {
      op.prologue = [data, count, dtype, factor] { scaleBy(data, count, dtype, factor); };
    }
    op.describe("{} x {}, {}, {}", count, toString(dtype), toString(reduceOp), toString(algo));
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
    op->scratch.resize(perRank * static_cast<size_t>(size));
    uint8_t* flat = op->scratch.data();
    op->schedule = std::make_shared<const Schedule>(allgatherSchedule(
        opts.algorithm, uniformBlocks(perRank, size), perRank * static_cast<size_t>(size)));
    op->sendBase = op->recvBase = flat;
    std::vector<Tensor> ins = inputs;
    std::vector<std::vector<Tensor>> outs = outputLists;
    int me = rank;
    op->prologue = [flat, ins, perRank, me] {
      size_t at = perRank * static_cast<size_t>(me);
      for (const auto& t : ins) {
        if (t.bytes() > 0) std::memcpy(flat + at, t.data, t.bytes());
        at += t.bytes();
      }
    };
    op->epilogue = [flat, outs] {
      size_t at = 0;
      for (const auto& list : outs) {
        for (const auto& t : list) {
          if (t.bytes() > 0) std::memcpy(t.data, flat + at, t.bytes());
          at += t.bytes();
        }
      }
    };
    op->checkValue = checkValue(perRank, inputs.size());
    op->describe("{} tensor(s), {} bytes per rank", inputs.size(), perRank);
    return submit(std::move(op));
  }
};

VerbsBackend::VerbsBackend(std::shared_ptr<Store> store, int rank, int size, Options options)
    : Backend(rank, size), impl_(std::make_unique<Impl>()) {
  checkGroup(rank, size);
  Impl& s = *impl_;
  s.store = std::move(store);
  s.rank = rank;
  s.size = size;
  s.group = options.groupName;
  s.config = Config::load(options.config);
  s.defaultTimeout =
      options.timeout.count() >= 0 ? options.timeout : s.config.getDuration("RDMACC_TIMEOUT");
  s.treeMaxBytes = static_cast<size_t>(s.config.getInt("RDMACC_TREE_MAX_BYTES"));
  if (const std::string& file = s.config.getString("RDMACC_TUNE_FILE"); !file.empty()) {
    s.tuning = TuningTable::load(file);
  }
  if (!s.store) invalid("VerbsBackend needs a store", "pass a TCPStore, FileStore or HashStore");
  // Shared memory to the ranks on this host, RDMA to the others
  // (RDMACC_TRANSPORT=auto); the mesh only when some peer needs RDMA.
  const std::string& transport = s.config.getString("RDMACC_TRANSPORT");
  const auto local = sameHost(*s.store, options.groupName, rank, size,
                              hostIdentity(s.config.getString("RDMACC_HOST_ID")), transport);
  std::vector<bool> shm(static_cast<size_t>(size), false);
  std::vector<int> remote;
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    shm[static_cast<size_t>(peer)] = transport != "rdma" && local[static_cast<size_t>(peer)];
    if (!shm[static_cast<size_t>(peer)]) remote.push_back(peer);
  }
  if (transport == "shm" && !remote.empty()) {
    invalid(fmt::format("RDMACC_TRANSPORT=shm, but rank(s) {} are on other hosts",
                        fmt::join(remote, ", ")),
            "use RDMACC_TRANSPORT=auto (shared memory inside a host, RDMA between hosts)");
  }
  log(LogLevel::Info,
      "rank {}: {} peer(s) through shared memory, {} through RDMA (RDMACC_TRANSPORT={})", rank,
      std::count(shm.begin(), shm.end(), true), remote.size(), transport);
  if (!remote.empty() || transport == "rdma") {
    s.mesh = std::make_unique<Mesh>(*s.store, rank, size, s.config,
                                    MeshOptions{.group = options.groupName});
  }
  // registerMemory keeps its contract (deregistering twice, or memory never
  // registered, is an error) in every group; only RDMA peers need a memory
  // region behind it, so without a mesh a registration records the range.
  s.registrations = std::make_unique<RegistrationCache>(
      [pd = s.mesh ? s.mesh->pd() : nullptr](uintptr_t begin, size_t length) {
        if (pd == nullptr) return Registration{.begin = begin, .end = begin + length};
        // Remote write: peers write large receives straight into it.
        std::shared_ptr<ibv_mr> mr = verbs::registerMemory(pd, reinterpret_cast<void*>(begin),
                                                           length, verbs::kRemoteWriteAccess);
        return Registration{.begin = begin,
                            .end = begin + length,
                            .lkey = mr->lkey,
                            .rkey = mr->rkey,
                            .owner = std::move(mr)};
      },
      // Exactly [ptr, ptr + bytes): with whole pages, the heap bytes next to a
      // registered tensor would be remotely writable too.
      s.config.getBool("RDMACC_REGISTRATION_CACHE"), /*pageBytes=*/1);
  const bool yield = spinYield(s.config.getString("RDMACC_SPIN_YIELD"), rank,
                               static_cast<int>(std::count(local.begin(), local.end(), true)));
  const auto spins = spinTimes(s.config.getString("RDMACC_SPIN_US"), yield);
  s.engine = std::make_unique<Engine>(
      s.mesh.get(), *s.store,
      EngineOptions{
          .group = options.groupName,
          .rank = rank,
          .size = size,
          .sharedMemoryPeers = shm,
          .slotsPerPeer = static_cast<int>(s.config.getInt("RDMACC_SLOTS_PER_PEER")),
          .slotBytes = static_cast<size_t>(s.config.getInt("RDMACC_SLOT_BYTES")),
          .collectivesInFlight =
              static_cast<size_t>(s.config.getInt("RDMACC_COLLECTIVES_IN_FLIGHT")),
          .spin = spins.first,
          .spinLatencyBound = spins.second,
          .spinYield = yield,
          // Zero-copy sends and direct receives exist on RDMA only.
          .registrations = s.mesh ? s.registrations.get() : nullptr,
          .zeroCopyMinBytes = static_cast<size_t>(s.config.getInt("RDMACC_ZERO_COPY_MIN_BYTES"))});
  s.driver = s.engine->driver();
}

VerbsBackend::~VerbsBackend() = default;

void VerbsBackend::registerMemory(void* ptr, size_t bytes) {
  impl_->registrations->add(ptr, bytes);
}

void VerbsBackend::deregisterMemory(void* ptr) {
  impl_->registrations->remove(ptr);
}

size_t VerbsBackend::chunkBytes() const noexcept {
  return impl_->engine->chunkBytes();
}

std::shared_ptr<Work> VerbsBackend::broadcast(std::vector<Tensor>& tensors,
                                              const BroadcastOptions& opts) {
  Impl& s = *impl_;
  Tensor& t = single(tensors, "broadcast");
  int root = checkRoot(opts.rootRank, size_, "broadcast");
  if (opts.rootTensor != 0) invalid("broadcast: rootTensor must be 0 (one tensor per rank)");
  Algorithm algo = s.choose(opts.algorithm, "broadcast", "RDMACC_ALGO_BROADCAST", t.bytes());
  if (algo != Algorithm::Ring && algo != Algorithm::Tree)
    invalid("broadcast has ring and tree algorithms only");
  auto op = s.collective(OpType::Broadcast, opts.timeout);
  op->schedule = s.scheduleFor(
      Impl::Shape{.type = OpType::Broadcast, .algorithm = algo, .root = root, .bytes = t.bytes()},
      [&] {
        return algo == Algorithm::Ring ? algorithms::chainBroadcast(rank_, size_, root, t.bytes())
                                       : algorithms::treeBroadcast(rank_, size_, root, t.bytes());
      });
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
  auto op = s.collective(OpType::Allreduce, opts.timeout);
  s.buildAllreduce(*op, bytesOf(t), t.numel, t.dtype, opts.reduceOp, opts.preMulFactor,
                   opts.algorithm);
  return s.submit(std::move(op));
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
  op->scratch.resize(total * elementSize(dtype));
  uint8_t* flat = op->scratch.data();
  std::vector<Tensor> views = tensors;
  s.buildAllreduce(*op, flat, total, dtype, opts.reduceOp, opts.preMulFactor, opts.algorithm);
  auto scale = std::move(op->prologue);  // PreMulSum's scaling, after the copy in
  op->prologue = [flat, views, scale] {
    size_t at = 0;
    for (const auto& t : views) {
      if (t.bytes() > 0) std::memcpy(flat + at, t.data, t.bytes());
      at += t.bytes();
    }
    if (scale) scale();
  };
  op->epilogue = [flat, views] {
    size_t at = 0;
    for (const auto& t : views) {
      if (t.bytes() > 0) std::memcpy(t.data, flat + at, t.bytes());
      at += t.bytes();
    }
  };
  const auto inner = op->detail;  // describe() writes over it
  op->describe("{} tensors, {}", tensors.size(), inner.data());
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
  op->schedule =
      s.scheduleFor(Impl::Shape{.type = OpType::Reduce, .root = root, .bytes = t.bytes()},
                    [&] { return algorithms::treeReduce(rank_, size_, root, t.bytes()); });
  uint8_t* acc = bytesOf(t);
  if (rank_ != root) {  // non-roots keep their input: accumulate in scratch
    op->scratch.resize(t.bytes());
    acc = op->scratch.data();
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
    if (acc != input && bytes > 0) std::memcpy(acc, input, bytes);
    if (reduceOp == ReduceOp::PreMulSum) scaleBy(acc, count, dtype, factor);
  };
  if (reduceOp == ReduceOp::Avg && rank_ == root) {
    int64_t n = size_;
    op->epilogue = [acc, count, dtype, n] { divideBy(acc, count, dtype, n); };
  }
  op->checkValue = checkValue(t.bytes(), static_cast<uint64_t>(reduceOp),
                              static_cast<uint64_t>(dtype), static_cast<uint64_t>(root));
  op->describe("{} x {}, {}, root {}", t.numel, toString(dtype), toString(reduceOp), root);
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
  op->schedule = s.scheduleFor(
      Impl::Shape{
          .type = OpType::AllgatherBase, .algorithm = opts.algorithm, .bytes = input.bytes()},
      [&] {
        return s.allgatherSchedule(opts.algorithm, uniformBlocks(input.bytes(), size_),
                                   output.bytes());
      });
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
  op->schedule = std::make_shared<const Schedule>(
      algorithms::linearGather(rank_, size_, root, Range{0, bytes}, blocks));
  op->sendBase = bytesOf(in);
  if (rank_ == root) {
    op->scratch.resize(bytes * static_cast<size_t>(size_));
    uint8_t* flat = op->scratch.data();
    op->recvBase = flat;
    std::vector<Tensor> outs = outputs[0];
    int me = rank_;
    Tensor input = in;
    op->epilogue = [flat, outs, bytes, me, input] {
      for (size_t r = 0; r < outs.size(); ++r) {
        const void* from = static_cast<int>(r) == me ? input.data : flat + r * bytes;
        if (bytes > 0) std::memcpy(outs[r].data, from, bytes);
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
  op->schedule = std::make_shared<const Schedule>(
      algorithms::linearScatter(rank_, size_, root, blocks, Range{0, bytes}));
  op->recvBase = bytesOf(out);
  if (rank_ == root) {
    op->scratch.resize(bytes * static_cast<size_t>(size_));
    uint8_t* flat = op->scratch.data();
    op->sendBase = flat;
    std::vector<Tensor> ins = inputs[0];
    Tensor output = out;
    int me = rank_;
    op->prologue = [flat, ins, bytes, output, me] {
      for (size_t r = 0; r < ins.size(); ++r) {
        if (bytes > 0) std::memcpy(flat + r * bytes, ins[r].data, bytes);
      }
      if (bytes > 0) std::memcpy(output.data, flat + static_cast<size_t>(me) * bytes, bytes);
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
  uint8_t* flat = s.planReduceScatter(*op, opts.algorithm, blocks, input.bytes(), output, reduceOp);
  op->prologue = [flat, in, reduceOp, factor] {
    if (in.bytes() > 0) std::memcpy(flat, in.data, in.bytes());
    if (reduceOp == ReduceOp::PreMulSum) scaleBy(flat, in.numel, in.dtype, factor);
  };
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
      if (bytes > 0) std::memcpy(flat + r * bytes, ins[r].data, bytes);
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
  op->schedule =
      std::make_shared<const Schedule>(s.alltoallSchedule(opts.algorithm, sendBlocks, recvBlocks));
  uint8_t* src = bytesOf(input);
  if (input.data == output.data && input.bytes() > 0) {  // in place: send from a copy
    op->scratch.assign(src, src + input.bytes());
    src = op->scratch.data();
  }
  op->sendBase = src;
  op->recvBase = bytesOf(output);
  Range self = sendBlocks[static_cast<size_t>(rank_)];
  Range selfOut = recvBlocks[static_cast<size_t>(rank_)];
  uint8_t* dst = bytesOf(output);
  op->prologue = [src, dst, self, selfOut] {
    if (self.bytes > 0) std::memmove(dst + selfOut.offset, src + self.offset, self.bytes);
  };
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
  op->scratch.resize(inTotal + outTotal);
  uint8_t* in = op->scratch.data();
  uint8_t* out = in + inTotal;
  op->schedule =
      std::make_shared<const Schedule>(s.alltoallSchedule(opts.algorithm, sendBlocks, recvBlocks));
  op->sendBase = in;
  op->recvBase = out;
  std::vector<Tensor> ins = inputs, outs = outputs;
  int me = rank_;
  op->prologue = [in, out, ins, sendBlocks, recvBlocks, me] {
    for (size_t i = 0; i < ins.size(); ++i) {
      if (ins[i].bytes() > 0) std::memcpy(in + sendBlocks[i].offset, ins[i].data, ins[i].bytes());
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

std::shared_ptr<Work> VerbsBackend::barrier(const BarrierOptions& opts) {
  Impl& s = *impl_;
  auto op = s.collective(OpType::Barrier, opts.timeout);
  op->schedule = s.scheduleFor(Impl::Shape{.type = OpType::Barrier},
                               [&] { return algorithms::disseminationBarrier(rank_, size_); });
  return s.submit(std::move(op));
}

namespace {

std::unique_ptr<Operation> pointToPointOp(OpType type, Tensor& t, int peer, uint32_t tag,
                                          std::chrono::milliseconds timeout) {
  auto op = std::make_unique<Operation>();
  op->type = type;
  op->pointToPoint = true;
  op->isSend = type == OpType::Send;
  op->peer = peer;
  op->tag = tag;
  op->buffer = static_cast<uint8_t*>(t.data);
  op->bytes = t.bytes();
  op->timeout = timeout;
  const char* direction = type == OpType::Send ? "to" : "from";
  if (peer < 0) {
    op->describe("{} x {}, from any rank, tag {}", t.numel, toString(t.dtype), tag);
  } else {
    op->describe("{} x {}, {} rank {}, tag {}", t.numel, toString(t.dtype), direction, peer, tag);
  }
  return op;
}

void checkPeer(int peer, int rank, int size, const char* op) {
  if (peer < 0 || peer >= size || peer == rank) {
    invalid(
        fmt::format("{}: peer rank {} is not another rank of this group of {} (this is rank {})",
                    op, peer, size, rank));
  }
}

void checkTag(int tag, const char* op) {
  if (tag < 0)
    invalid(fmt::format("{}: tag {} is negative", op, tag), "tags are non-negative integers");
}

}  // namespace

std::shared_ptr<Work> VerbsBackend::send(std::vector<Tensor>& tensors, int dstRank, int tag) {
  Tensor& t = single(tensors, "send");
  checkPeer(dstRank, rank_, size_, "send");
  checkTag(tag, "send");
  return impl_->submit(
      pointToPointOp(OpType::Send, t, dstRank, static_cast<uint32_t>(tag), impl_->defaultTimeout));
}

std::shared_ptr<Work> VerbsBackend::recv(std::vector<Tensor>& tensors, int srcRank, int tag) {
  Tensor& t = single(tensors, "recv");
  checkPeer(srcRank, rank_, size_, "recv");
  checkTag(tag, "recv");
  return impl_->submit(
      pointToPointOp(OpType::Recv, t, srcRank, static_cast<uint32_t>(tag), impl_->defaultTimeout));
}

std::shared_ptr<Work> VerbsBackend::recvAnysource(std::vector<Tensor>& tensors, int tag) {
  Tensor& t = single(tensors, "recvAnysource");
  checkTag(tag, "recvAnysource");
  if (size_ == 1) invalid("recvAnysource in a group of one: there is nobody to receive from");
  return impl_->submit(pointToPointOp(OpType::RecvAnysource, t, -1, static_cast<uint32_t>(tag),
                                      impl_->defaultTimeout));
}

void VerbsBackend::monitoredBarrier(const BarrierOptions& opts, bool waitAllRanks) {
  Impl& s = *impl_;
  auto timeout = s.timeoutOf(opts.timeout);
  uint32_t round = ++s.monitoredBarriers;
  uint32_t arriveTag = kInternalTagBase | ((round & 0x3fffffffu) << 1);
  uint32_t releaseTag = arriveTag | 1;
  Tensor empty{nullptr, 0, DataType::UInt8};
  // The messages are gloo's (c10d's tests and users' log searches match them).
  if (rank_ != 0) {
    s.submit(pointToPointOp(OpType::Send, empty, 0, arriveTag, timeout));
    auto released = s.submit(pointToPointOp(OpType::Recv, empty, 0, releaseTag, timeout));
    try {
      released->wait();
    } catch (const Error& e) {
      ErrorInfo info = e.info();
      info.message = fmt::format(
          "Rank {} successfully reached monitoredBarrier, but received errors while waiting for "
          "send/recv from rank 0. Please check rank 0 logs for faulty rank. ({})",
          rank_, info.message);
      throw Error(std::move(info));
    }
    return;
  }
  if (timeout.count() == 0 && size_ > 1) {
    throw Error(ErrorKind::Timeout, "Rank 0 timed out in monitoredBarrier after 0 ms",
                "give monitored_barrier a timeout long enough for every rank to arrive");
  }
  std::vector<std::shared_ptr<Work>> arrivals(static_cast<size_t>(size_));
  for (int r = 1; r < size_; ++r) {
    arrivals[static_cast<size_t>(r)] =
        s.submit(pointToPointOp(OpType::Recv, empty, r, arriveTag, timeout));
  }
  std::vector<int> missing;
  for (int r = 1; r < size_; ++r) {
    auto& w = arrivals[static_cast<size_t>(r)];
    try {
      w->wait();
    } catch (const Error&) {
      missing.push_back(r);
    }
  }
  if (!missing.empty()) {
    std::vector<int> named = waitAllRanks ? missing : std::vector<int>{missing.front()};
    throw Error(ErrorInfo{
        .kind = ErrorKind::Timeout,
        .message = fmt::format("Rank{} {} failed to pass monitoredBarrier in {} ms",
                               waitAllRanks ? "s" : "", fmt::join(named, ", "), timeout.count()),
        .peerRank = named.front(),
        .hint = "those ranks are stuck, slower, or failed; see their output"});
  }
  std::vector<std::shared_ptr<Work>> releases;
  for (int r = 1; r < size_; ++r)
    releases.push_back(s.submit(pointToPointOp(OpType::Send, empty, r, releaseTag, timeout)));
  for (auto& w : releases) w->wait();
}

void VerbsBackend::setSequenceNumberForGroup() {
  Impl& s = *impl_;
  PrefixStore group("rdmacc/backend/" + s.group, s.store);
  std::lock_guard lock(s.submitMutex);
  if (rank_ == 0) {
    group.set("sequence", toBytes(std::to_string(s.sequence)));
  } else {
    s.sequence = storeNumber(group.get("sequence"), UINT64_MAX, "sequence");
  }
}

uint64_t VerbsBackend::getSequenceNumberForGroup() {
  std::lock_guard lock(impl_->submitMutex);
  return impl_->sequence;
}

std::shared_ptr<VerbsBackend> initFromEnvironment(VerbsBackend::Options options) {
  Config config = Config::load(options.config);
  GroupEnvironment env = groupFromEnvironment(config);
  setLogPrefix(fmt::format("rank {}", env.rank));
  return std::make_shared<VerbsBackend>(env.store, env.rank, env.size, std::move(options));
}

}  // namespace rdmacc
