#include <sched.h>
#include <unistd.h>

#include "rdmacc/environment.hpp"
#include "rdmacc/version.hpp"
#include "src/backend/transports.hpp"
#include "src/backend/verbs_backend_impl.hpp"
#include "src/bootstrap/host_identity.hpp"
#include "src/engine/event_trace.hpp"
#include "src/transport/rdma/transport.hpp"
#include "src/transport/shm/transport.hpp"

namespace rdmacc {
namespace {

// RDMACC_TRACE_EVENTS keeps this many events (24 MiB; 7 per small
// operation, so about 150,000 of them); later ones are counted, not kept.
constexpr size_t kTraceCapacity = size_t{1} << 20;

// RDMACC_SPIN_YIELD: auto yields when this host runs more of the group's ranks
// than this process may use CPUs (each spinning rank would otherwise hold a
// CPU the rank it waits for needs).
bool spinYield(const std::string& setting, int local) {
  if (setting != "auto") return setting == "1";
  cpu_set_t set;
  CPU_ZERO(&set);
  int cpus = ::sched_getaffinity(0, sizeof set, &set) == 0
                 ? CPU_COUNT(&set)
                 : static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN));
  bool yield = local > cpus;
  log(LogLevel::Info, "{} of the group's ranks on this host, {} CPUs: {}", local, cpus,
      yield ? "spinning yields the CPU" : "pure spinning");
  return yield;
}

// RDMACC_SPIN_US (validated by Config): the spins for bandwidth-bound and
// latency-bound work, and for a caller blocked in wait() on latency-bound
// work (1 ms with auto: its thread has nothing else to do; Progress::drive
// yields between its polls past the first spin). auto: 50 us, and 1 ms for
// latency-bound work when spinning yields (more ranks than CPUs): a sleeping
// rank needs an interrupt and a reschedule to wake, while a yielding spinner
// hands its CPU to the rank it waits for anyway; large transfers keep the
// short spin, whose polls would take CPU from a software device (rxe).
// Measurements: docs/performance.md, "Numbers behind code comments".
struct SpinTimes {
  std::chrono::microseconds spin, latencyBound, waitLatencyBound;
};
SpinTimes spinTimes(const std::string& setting, bool yield) {
  using std::chrono::microseconds;
  if (setting != "auto") {
    microseconds us(std::stoll(setting));
    return {us, us, us};
  }
  return {microseconds(50), microseconds(yield ? 1000 : 50), microseconds(1000)};
}

// One line per rank at info level: what a cluster log needs to tell ranks,
// hosts, launches and devices apart.
void logStartup(const Config& config, int rank, int size, const std::string& group,
                const std::vector<Mesh*>& rails, size_t sharedMemoryPeers, size_t rdmaPeers) {
  if (!logEnabled(LogLevel::Info)) return;
  std::string device;
  for (const Mesh* mesh : rails) {
    const Endpoint& e = mesh->endpoint();
    device +=
        fmt::format("{} {} port {} GID {} ({}, index {}) MTU {}", device.empty() ? " on" : " and",
                    e.device, e.port, e.gid, e.gidType, e.gidIndex, e.activeMtu);
  }
  const auto launch = launcherVariables();
  const auto settings = config.nonDefault();
  log(LogLevel::Info,
      "rdmacc {} rank {} of {} (group '{}') on {} pid {}; launcher: {}; {} peer(s) through "
      "shared memory, {} through RDMA{}; settings: {}",
      version(), rank, size, group, hostName(), ::getpid(),
      launch.empty() ? std::string("none (the caller's store)")
                     : fmt::format("{}", fmt::join(launch, " ")),
      sharedMemoryPeers, rdmaPeers, device,
      settings.empty() ? std::string("defaults") : fmt::format("{}", fmt::join(settings, " ")));
}

}  // namespace

Backend::Backend(int rank, int size) : rank_(rank), size_(size) {}
Backend::~Backend() = default;

VerbsBackend::VerbsBackend(std::shared_ptr<Store> store, int rank, int size, Options options)
    : Backend(rank, size), impl_(std::make_unique<Impl>()) {
  checkGroup(rank, size);
  setDefaultLogPrefix(fmt::format("rank {}", rank));
  Impl& s = *impl_;
  s.store = std::move(store);
  s.rank = rank;
  s.size = size;
  s.group = options.groupName;
  s.config = Config::load(options.config);
  s.defaultTimeout =
      options.timeout.count() >= 0 ? options.timeout : s.config.getDuration("RDMACC_TIMEOUT");
  s.scratchPool = std::make_shared<ScratchPool>(
      static_cast<size_t>(s.config.getInt("RDMACC_SCRATCH_CACHE_BYTES")));
  TuningTable tuning;
  if (const std::string& file = s.config.getString("RDMACC_TUNE_FILE"); !file.empty()) {
    tuning = TuningTable::load(file);
  }
  if (!s.store) invalid("VerbsBackend needs a store", "pass a TCPStore, FileStore or HashStore");
  const Impl::Placement placement = s.placePeers(options);
  s.failFormationForTest("placed");
  s.choice = AlgorithmChoice(s.config, std::move(tuning), s.hosts, size);
  logStartup(s.config, rank, size, s.group, s.meshesUsed(),
             static_cast<size_t>(std::count(placement.shm.begin(), placement.shm.end(), true)),
             placement.rdmaPeers);
  s.makeRegistrations();
  s.startEngine(options, placement);
}

// registerMemory keeps its contract (deregistering twice, or memory never
// registered, is an error) in every group; only RDMA peers need a memory
// region behind it, so without a mesh a registration records the range.
void VerbsBackend::Impl::makeRegistrations() {
  const std::vector<Mesh*> meshes = meshesUsed();
  registrations = std::make_unique<RegistrationCache>(
      userMemoryRegistrar(meshes.empty() ? nullptr : meshes[0]->pd()),
      // Exactly [ptr, ptr + bytes): with whole pages, the heap bytes next to a
      // registered tensor would be remotely writable too.
      config.getBool("RDMACC_REGISTRATION_CACHE"), /*pageBytes=*/1);
}

// The transports (over the meshes and the local segments) and the engine
// that drives them.
void VerbsBackend::Impl::startEngine(const Options& options, const Placement& placement) {
  const bool yield =
      spinYield(config.getString("RDMACC_SPIN_YIELD"),
                static_cast<int>(hosts.members[static_cast<size_t>(hosts.host(rank))].size()));
  const auto spins = spinTimes(config.getString("RDMACC_SPIN_US"), yield);
  if (const std::string pattern = config.getString("RDMACC_TRACE_EVENTS"); !pattern.empty()) {
    trace = std::make_unique<EventTrace>(expandPathPattern(pattern, rank), kTraceCapacity);
  }
  std::vector<Mesh*> meshes;
  for (const auto& mesh : rails) meshes.push_back(mesh.get());
  // Zero-copy from registered memory exists on RDMA only: over the group's
  // own rails or the shared link it attached to (whose protection domain
  // its registrations are made in).
  const RegistrationCache* zeroCopyFrom =
      rails.empty() && !linkMesh ? nullptr : registrations.get();
  const auto zeroCopyMinBytes = static_cast<size_t>(config.getInt("RDMACC_ZERO_COPY_MIN_BYTES"));
  engine = std::make_unique<Engine>(
      makeTransports(
          meshes, *store,
          TransportOptions{
              .group = group,
              .rank = rank,
              .size = size,
              .sharedMemoryPeers = placement.shm,
              .allGather = options.allGather,
              .connectTimeout = config.getDuration("RDMACC_CONNECT_TIMEOUT"),
              .shmSegment = placement.segment,
              .shmSegmentFile = placement.segmentFile,
              .shmRecords = placement.shmRecords,
              .lazy = lazyConnections(),
              .slotsPerPeer = static_cast<int>(config.getInt("RDMACC_SLOTS_PER_PEER")),
              .slotBytes = static_cast<size_t>(config.getInt("RDMACC_SLOT_BYTES")),
              .zeroCopy = zeroCopyFrom != nullptr,
              .zeroCopyMinBytes = zeroCopyMinBytes,
              .shmSingleCopy = config.getBool("RDMACC_SHM_SINGLE_COPY"),
              .shmMembarrier = config.getBool("RDMACC_SHM_MEMBARRIER"),
              .shmOneShotBytes = static_cast<size_t>(config.getInt("RDMACC_SHM_ONE_SHOT_BYTES")),
              .rdmaOneShotBytes = static_cast<size_t>(config.getInt("RDMACC_RDMA_ONE_SHOT_BYTES"))},
          rdmaPath(placement)),
      EngineOptions{
          .group = group,
          .rank = rank,
          .size = size,
          .collectivesInFlight = static_cast<size_t>(config.getInt("RDMACC_COLLECTIVES_IN_FLIGHT")),
          .unexpectedBytes = static_cast<size_t>(config.getInt("RDMACC_UNEXPECTED_BYTES")),
          .spin = spins.spin,
          .spinLatencyBound = spins.latencyBound,
          .spinWaitLatencyBound = spins.waitLatencyBound,
          .spinYield = yield,
          .registrations = zeroCopyFrom,
          .zeroCopyMinBytes = zeroCopyMinBytes,
          .keepalive = std::chrono::duration_cast<std::chrono::milliseconds>(
              config.getDuration("RDMACC_KEEPALIVE_INTERVAL")),
          .trace = trace.get()});
  oneShotBytes = engine->oneShotBytes();
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

std::shared_ptr<Work> VerbsBackend::barrier(const BarrierOptions& opts) {
  Impl& s = *impl_;
  auto op = s.collective(OpType::Barrier, opts.timeout);
  op->schedule = s.planFor(
      Impl::Shape{.type = OpType::Barrier, .algorithm = opts.algorithm}, [&](Algorithm algo) {
        return algo == Algorithm::Hierarchical ? algorithms::hierarchicalBarrier(rank_, s.hosts)
                                               : algorithms::disseminationBarrier(rank_, size_);
      });
  op->describe("{}", toString(op->schedule->algorithm));
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
  if (rank_ == 0) {
    group.set("sequence", toBytes(std::to_string(s.engine->sequence())));
  } else {
    s.engine->setSequence(storeNumber(group.get("sequence"), UINT64_MAX, "sequence"));
  }
}

int VerbsBackend::queuePairs() const {
  int count = 0;
  for (const Mesh* mesh : impl_->meshesUsed()) count += mesh->queuePairs();
  return count;
}

size_t VerbsBackend::receivesPosted() const {
  size_t count = 0;
  for (const Mesh* mesh : impl_->meshesUsed()) count += mesh->receivesPosted();
  return count;
}

std::vector<std::string> VerbsBackend::rdmaPorts() const {
  std::vector<std::string> ports;
  for (const Mesh* mesh : impl_->meshesUsed()) {
    ports.push_back(fmt::format("{}:{}", mesh->endpoint().device, mesh->endpoint().port));
  }
  return ports;
}

uint64_t VerbsBackend::getSequenceNumberForGroup() {
  return impl_->engine->sequence();
}

std::shared_ptr<VerbsBackend> initFromEnvironment(VerbsBackend::Options options) {
  Config config = Config::load(options.config);
  GroupEnvironment env = groupFromEnvironment(config);
  setLogPrefix(fmt::format("rank {}", env.rank));
  if (!options.allGather) options.allGather = env.allGather;
  return std::make_shared<VerbsBackend>(env.store, env.rank, env.size, std::move(options));
}

}  // namespace rdmacc
