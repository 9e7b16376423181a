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
// RDMACC_CONNECT=auto: groups up to this size connect every pair at formation
// (a few queue pairs, and the RDMA one-shot board needs them all); larger
// ones connect a pair when an operation first needs it.
constexpr int kEagerConnectRanks = 8;

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
                const std::vector<std::unique_ptr<Mesh>>& rails, size_t sharedMemoryPeers,
                size_t rdmaPeers) {
  if (!logEnabled(LogLevel::Info)) return;
  std::string device;
  for (const auto& mesh : rails) {
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
  s.choice = AlgorithmChoice(s.config, std::move(tuning), s.hosts, size);
  logStartup(s.config, rank, size, s.group, s.rails,
             static_cast<size_t>(std::count(placement.shm.begin(), placement.shm.end(), true)),
             placement.rdmaPeers);
  s.makeRegistrations();
  s.startEngine(options, placement);
}

// One mesh per rail (RDMACC_IB_RAILS), each on its own port; the first
// keeps the group's name, so one rail is what it always was. Connections on
// first use above a handful of ranks (docs/decisions/010).
void VerbsBackend::Impl::makeRails(const Options& options, const std::vector<bool>& skip,
                                   bool defer) {
  const int railCount = static_cast<int>(config.getInt("RDMACC_IB_RAILS"));
  std::vector<std::optional<Endpoint>> endpoints(1);
  if (railCount > 1) {
    auto chosen = selectEndpoints(config, localRankFromEnvironment(), railCount);
    endpoints.assign(chosen.begin(), chosen.end());
  }
  for (size_t i = 0; i < endpoints.size(); ++i) {
    rails.push_back(std::make_unique<Mesh>(
        *store, rank, size, config,
        MeshOptions{.group = i == 0 ? group : fmt::format("{}/rail{}", group, i),
                    .skip = skip,
                    .endpoint = endpoints[i],
                    .lazy = lazyConnections(),
                    .allGather = options.allGather,
                    .deferStart = defer,
                    .transportConnects = true}));
  }
}

bool VerbsBackend::Impl::lazyConnections() const {
  const std::string& connect = config.getString("RDMACC_CONNECT");
  return connect == "lazy" || (connect == "auto" && size > kEagerConnectRanks);
}

// Shared memory to the ranks on this host, RDMA to the others
// (RDMACC_TRANSPORT=auto); the meshes only when some peer needs RDMA. One
// record per rank says all of it (docs/decisions/009 and 011).
VerbsBackend::Impl::Placement VerbsBackend::Impl::placePeers(const Options& options) {
  const std::string& transport = config.getString("RDMACC_TRANSPORT");
  // When the group surely needs RDMA (RDMACC_TRANSPORT=rdma, or more ranks
  // than the launcher put on this host), the meshes listen before the host
  // exchange and their addresses travel with the host records.
  const int localSize = localSizeFromEnvironment();
  if (transport == "rdma" || (transport == "auto" && localSize > 0 && size > localSize)) {
    makeRails(options, {}, /*defer=*/true);
  }
  std::string rdmaRecord;
  for (const auto& mesh : rails) {
    const std::string r = mesh->record();
    rdmaRecord += (rdmaRecord.empty() ? "" : " ") + (r.empty() ? "-" : r);
  }
  Placement p;
  // The shared-memory segment's name is drawn now and travels with the
  // host record too.
  p.segment = newSegmentName();
  p.segmentFile = std::make_shared<net::Fd>(createSegmentFile(p.segment));
  std::vector<std::vector<std::string>> carried;
  hosts = algorithms::Hosts(hostNumbers(
      *store, options.allGather, group, rank, size,
      hostIdentity(config.getString("RDMACC_HOST_ID")),
      fmt::format("RDMACC_TRANSPORT={} RDMACC_IB_RAILS={} RDMACC_CONNECT={}", transport,
                  config.getInt("RDMACC_IB_RAILS"), lazyConnections() ? "lazy" : "eager"),
      {segmentRecord(p.segment, p.segmentFile->get()), rdmaRecord.empty() ? "-" : rdmaRecord},
      &carried));
  for (const auto& lines : carried) p.shmRecords.push_back(lines[0]);
  p.shm.assign(static_cast<size_t>(size), false);
  std::vector<int> remote;
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    p.shm[static_cast<size_t>(peer)] = transport != "rdma" && hosts.host(peer) == hosts.host(rank);
    if (!p.shm[static_cast<size_t>(peer)]) remote.push_back(peer);
  }
  p.rdmaPeers = remote.size();
  if (transport == "shm" && !remote.empty()) {
    invalid(fmt::format("RDMACC_TRANSPORT=shm, but rank(s) {} are on other hosts",
                        fmt::join(remote, ", ")),
            "use RDMACC_TRANSPORT=auto (shared memory inside a host, RDMA between hosts)");
  }
  // Every rank reads the same records, so all take the same branch: RDMA is
  // needed by all or by none (auto: several hosts), and the addresses came
  // with the records only if every rank published them.
  if (remote.empty() && transport != "rdma") {
    rails.clear();
  } else if (rails.empty()) {
    makeRails(options, p.shm, /*defer=*/false);
  } else {
    startRails(p.shm, carried);
  }
  return p;
}

// The deferred meshes, with every rank's addresses from the host records
// (line 2 of the carried lines: one field per rail, "-" for none), or
// through the store when some rank published none.
void VerbsBackend::Impl::startRails(const std::vector<bool>& shm,
                                    const std::vector<std::vector<std::string>>& carried) {
  std::vector<std::vector<std::string>> published(rails.size());
  for (int peer = 0; peer < size; ++peer) {
    const auto fields = splitFields(carried[static_cast<size_t>(peer)][1], ' ');
    for (size_t i = 0; i < published.size(); ++i) {
      if (fields.size() == published.size() && fields[i] != "-") {
        published[i].emplace_back(fields[i]);
      }
    }
  }
  for (size_t i = 0; i < rails.size(); ++i) {
    if (published[i].size() != static_cast<size_t>(size)) published[i].clear();
    rails[i]->start(*store, shm, published[i]);
  }
}

// registerMemory keeps its contract (deregistering twice, or memory never
// registered, is an error) in every group; only RDMA peers need a memory
// region behind it, so without a mesh a registration records the range.
void VerbsBackend::Impl::makeRegistrations() {
  registrations = std::make_unique<RegistrationCache>(
      userMemoryRegistrar(rails.empty() ? nullptr : rails[0]->pd()),
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
  // Zero-copy from registered memory exists on RDMA only.
  const RegistrationCache* zeroCopyFrom = rails.empty() ? nullptr : registrations.get();
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
              .registrations = zeroCopyFrom,
              .zeroCopyMinBytes = zeroCopyMinBytes,
              .shmSingleCopy = config.getBool("RDMACC_SHM_SINGLE_COPY"),
              .shmMembarrier = config.getBool("RDMACC_SHM_MEMBARRIER"),
              .shmOneShotBytes = static_cast<size_t>(config.getInt("RDMACC_SHM_ONE_SHOT_BYTES")),
              .rdmaOneShotBytes =
                  static_cast<size_t>(config.getInt("RDMACC_RDMA_ONE_SHOT_BYTES"))}),
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
  for (const auto& mesh : impl_->rails) count += mesh->queuePairs();
  return count;
}

size_t VerbsBackend::receivesPosted() const {
  size_t count = 0;
  for (const auto& mesh : impl_->rails) count += mesh->receivesPosted();
  return count;
}

std::vector<std::string> VerbsBackend::rdmaPorts() const {
  std::vector<std::string> ports;
  for (const auto& mesh : impl_->rails) {
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
