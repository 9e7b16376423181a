#include "rdmacc/environment.hpp"

#include <unistd.h>

#include <cstdlib>
#include <functional>
#include <mutex>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "rdmacc/error.hpp"
#include "rdmacc/log.hpp"
#include "src/bootstrap/pmix.hpp"
#include "src/store/auth.hpp"

namespace rdmacc {
namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}

int envInt(const char* name, int min, int max) {
  const char* v = env(name);
  int64_t n = parseInt(v, name);
  if (n < min || n > max) {
    throw Error(ErrorKind::InvalidArgument,
                fmt::format("{}={} is out of range [{}, {}]", name, v, min, max),
                "the launcher sets it; check the launch command");
  }
  return static_cast<int>(n);
}

}  // namespace

std::vector<std::string> launcherVariables() {
  constexpr const char* kNames[] = {"RANK",
                                    "WORLD_SIZE",
                                    "LOCAL_RANK",
                                    "LOCAL_WORLD_SIZE",
                                    "MASTER_ADDR",
                                    "MASTER_PORT",
                                    "OMPI_COMM_WORLD_RANK",
                                    "OMPI_COMM_WORLD_SIZE",
                                    "OMPI_COMM_WORLD_LOCAL_RANK",
                                    "OMPI_COMM_WORLD_LOCAL_SIZE",
                                    "MPI_LOCALNRANKS",
                                    "PMI_RANK",
                                    "PMI_SIZE",
                                    "MPI_LOCALRANKID",
                                    "SLURM_PROCID",
                                    "SLURM_NTASKS",
                                    "SLURM_LOCALID",
                                    "SLURM_NODEID",
                                    "SLURM_STEP_TASKS_PER_NODE",
                                    "SLURM_JOB_ID",
                                    "PMIX_NAMESPACE",
                                    "PMIX_RANK"};
  std::vector<std::string> out;
  for (const char* name : kNames) {
    if (const char* value = env(name)) out.push_back(fmt::format("{}={}", name, value));
  }
  return out;
}

namespace {

// Under sbatch (or salloc) without srun, the batch script's one process sees
// the allocation's SLURM_NTASKS (and SLURM_PROCID=0): as rank 0 of N it
// would wait for N - 1 ranks nobody starts. Only srun's tasks run in a job
// step of their own (SLURM_STEP_ID a step number; the batch step is
// 4294967294, the extern step 4294967295).
void checkSrunStep() {
  const char* tasks = env("SLURM_NTASKS");
  const char* step = env("SLURM_STEP_ID");
  if (tasks == nullptr || std::string_view(tasks) == "1") return;
  const bool noTask = step == nullptr || std::string_view(step) == "4294967294" ||
                      std::string_view(step) == "4294967295";
  if (!noTask) return;
  throw Error(ErrorKind::InvalidArgument,
              fmt::format("SLURM_NTASKS={} but this process is not a task of an srun step "
                          "(SLURM_STEP_ID {}): it runs the batch script, and as one rank of {} "
                          "it would wait for ranks that nobody starts",
                          tasks, step == nullptr ? "unset" : step, tasks),
              "start the ranks with srun (`srun python3 train.py`), or with torchrun or mpirun "
              "inside the allocation; see docs/multi-node.md");
}

}  // namespace

namespace {

struct Scheme {
  const char* rank;
  const char* size;
  const char* localRank;
  const char* localSize;  // nullptr: the launcher does not say
  const char* launcher;
};
constexpr Scheme kSchemes[] = {
    {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "torchrun/rdmacc-run"},
    {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE", "mpirun"},
    {"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "mpirun"},
    // srun's count per node is a list: slurmLocalSize.
    {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nullptr, "srun"},
};

// The launcher that set this process's rank, if any.
const Scheme* launcherScheme() {
  for (const auto& s : kSchemes) {
    if (env(s.rank) != nullptr || env(s.size) != nullptr) return &s;
  }
  return nullptr;
}

}  // namespace

std::string authKey(const Config& config) {
  return auth::loadKey(config);
}

TCPStoreServerLimits storeServerLimits(const Config& config) {
  return TCPStoreServerLimits{.memoryBudget =
                                  static_cast<size_t>(config.getInt("RDMACC_STORE_MEMORY"))};
}

int localRankFromEnvironment() {
  const Scheme* s = launcherScheme();
  if (s == nullptr || env(s->localRank) == nullptr) return 0;
  return envInt(s->localRank, 0, 1 << 20);
}

namespace {

// srun says how many tasks each node of the step runs as a compressed list
// ("4(x2),3": four on each of the first two nodes, three on the third) and
// which node this is (SLURM_NODEID, counted within the step).
int slurmLocalSize() {
  constexpr const char* kList = "SLURM_STEP_TASKS_PER_NODE";
  const char* list = env(kList);
  if (list == nullptr || env("SLURM_NODEID") == nullptr) return 0;
  const int node = envInt("SLURM_NODEID", 0, 1 << 20);
  const auto malformed = [&](std::string_view why) {
    return Error(
        ErrorKind::InvalidArgument,
        fmt::format("{}={} {} (Slurm writes counts per node, such as 4(x2),3)", kList, list, why),
        "srun sets it; check the launch command, or set LOCAL_WORLD_SIZE");
  };
  const auto number = [&](std::string_view& rest) {
    int64_t n = 0;
    size_t digits = 0;
    while (digits < rest.size() && rest[digits] >= '0' && rest[digits] <= '9' && n <= (1 << 20)) {
      n = n * 10 + (rest[digits++] - '0');
    }
    if (digits == 0 || n < 1 || n > (1 << 20)) throw malformed("is not a list of counts");
    rest.remove_prefix(digits);
    return static_cast<int>(n);
  };
  // The whole list is read (and checked) whichever node this is.
  std::string_view rest(list);
  int64_t first = 0;  // the first node of the current item
  int mine = 0;
  while (true) {
    const int count = number(rest);
    int repeat = 1;
    if (rest.starts_with("(x")) {
      rest.remove_prefix(2);
      repeat = number(rest);
      if (!rest.starts_with(")")) throw malformed("is not a list of counts");
      rest.remove_prefix(1);
    }
    if (mine == 0 && node < first + repeat) mine = count;
    first += repeat;
    if (rest.empty()) break;
    if (!rest.starts_with(",")) throw malformed("is not a list of counts");
    rest.remove_prefix(1);
  }
  if (mine > 0) return mine;
  throw malformed(fmt::format("has no count for this node (SLURM_NODEID={})", node));
}

}  // namespace

int localSizeFromEnvironment() {
  const Scheme* s = launcherScheme();
  if (s == nullptr) return 0;
  if (s->localSize == nullptr) return slurmLocalSize();
  if (env(s->localSize) == nullptr) return 0;
  return envInt(s->localSize, 1, 1 << 20);
}

namespace {

// Whether to bootstrap through PMIx (RDMACC_BOOTSTRAP). torchrun's and
// rdmacc-run's RANK/WORLD_SIZE win under auto: a torchrun inside an srun step
// inherits PMIX_* variables that describe srun's tasks, not torchrun's.
bool usePmix(const Config& config) {
  const std::string& mode = config.getString("RDMACC_BOOTSTRAP");
  if (mode == "env") return false;
  if (mode == "pmix") {
    if (!pmix::launched()) {
      throw Error(ErrorKind::InvalidArgument,
                  "RDMACC_BOOTSTRAP=pmix but no PMIx server started this process "
                  "(PMIX_NAMESPACE/PMIX_RANK are not set)",
                  "launch with `srun --mpi=pmix` or Open MPI's mpirun, or set "
                  "RDMACC_BOOTSTRAP=auto");
    }
    return true;  // pmix::job() names a build without PMIx
  }
  if (!pmix::launched() || env("RANK") != nullptr) return false;
  if (!pmix::compiledIn()) {
    log(LogLevel::Info,
        "a PMIx launcher started this process but rdmacc was built without libpmix-dev: "
        "using the launcher's environment and MASTER_ADDR/MASTER_PORT");
    return false;
  }
  return true;
}

const char* pmixLauncher() {
  if (env("SLURM_STEP_ID") != nullptr) return "srun (PMIx)";
  if (env("OMPI_COMM_WORLD_RANK") != nullptr) return "mpirun (PMIx)";
  return "PMIx";
}

// A store made at its first use: under PMIx the other ranks learn rank 0's
// store address from rank 0's PMIx record, which the first fence of
// formation brings along, and a group that never asks the store never
// connects to it.
class DeferredStore final : public Store {
 public:
  DeferredStore(std::chrono::milliseconds timeout, std::function<std::shared_ptr<Store>()> make)
      : Store(timeout), make_(std::move(make)) {}
  void set(const std::string& key, const Bytes& value) override { inner().set(key, value); }
  Bytes get(const std::string& key) override { return inner().get(key); }
  int64_t add(const std::string& key, int64_t delta) override { return inner().add(key, delta); }
  bool check(const std::vector<std::string>& keys) override { return inner().check(keys); }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    inner().wait(keys, timeout);
  }
  bool deleteKey(const std::string& key) override { return inner().deleteKey(key); }
  std::vector<Bytes> multiGet(const std::vector<std::string>& keys,
                              std::chrono::milliseconds timeout) override {
    return inner().multiGet(keys, timeout);
  }
  using Store::multiGet;
  using Store::wait;

 private:
  Store& inner() {
    std::lock_guard lock(mutex_);
    if (!store_) store_ = make_();  // a failure is retried by the next call
    store_->setTimeout(timeout());
    return *store_;
  }
  std::mutex mutex_;
  std::function<std::shared_ptr<Store>()> make_;
  std::shared_ptr<Store> store_;
};

// Rank 0's store address as it published it through PMIx, checked.
std::pair<std::string, uint16_t> storeAddress(const Bytes& published) {
  const std::string text = toString(published);
  const auto newline = text.find('\n');
  if (newline == std::string::npos || newline == 0 || text.size() > 300) {
    throw Error(ErrorInfo{.kind = ErrorKind::Protocol,
                          .message = fmt::format("rank 0 published a malformed store address "
                                                 "through PMIx ({} bytes)",
                                                 text.size()),
                          .peerRank = 0});
  }
  const int64_t port = parseInt(text.substr(newline + 1), "rank 0's store port");
  if (port < 1 || port > 65535) {
    throw Error(ErrorInfo{.kind = ErrorKind::Protocol,
                          .message = fmt::format("rank 0 published store port {}", port),
                          .peerRank = 0});
  }
  return {text.substr(0, newline), static_cast<uint16_t>(port)};
}

// Rank 0 hosts the store on a port of its own choosing and publishes where
// through PMIx: no MASTER_ADDR or MASTER_PORT to agree on. On one node it
// listens on loopback only; else on MASTER_ADDR if the user set it, or on
// this host's name.
GroupEnvironment groupFromPmix(const Config& config) {
  const pmix::Job& job = pmix::job();
  GroupEnvironment g;
  g.launcher = pmixLauncher();
  g.rank = job.rank;
  g.size = job.size;
  g.localRank = job.localRank;
  const auto timeout = config.getDuration("RDMACC_STORE_TIMEOUT");
  if (g.size == 1) {
    g.store = std::make_shared<HashStore>(timeout);
    return g;
  }
  const TCPStoreOptions options{.isServer = g.rank == 0,
                                .timeout = timeout,
                                .connectTimeout = timeout,
                                .authKey = authKey(config),
                                .serverLimits = storeServerLimits(config),
                                .connectLazily = true};
  constexpr const char* kKey = "rdmacc.store";
  if (g.rank == 0) {
    const std::string host = env("MASTER_ADDR") != nullptr ? env("MASTER_ADDR")
                             : job.localSize == job.size   ? "127.0.0.1"
                                                           : hostName();
    const auto port = static_cast<uint16_t>(config.getInt("RDMACC_STORE_PORT"));
    auto store = std::make_shared<TCPStore>(host, port, options);
    pmix::publish(kKey, toBytes(fmt::format("{}\n{}", host, store->port())));
    log(LogLevel::Info, "rank 0 of {} bootstrapped through PMIx, {}; store at {}:{}", g.size,
        g.launcher, host, store->port());
    g.store = std::move(store);
  } else {
    log(LogLevel::Info, "rank {} of {} (local rank {}) bootstrapped through PMIx, {}", g.rank,
        g.size, g.localRank, g.launcher);
    g.store = std::make_shared<DeferredStore>(timeout, [timeout, options] {
      const auto [host, port] = storeAddress(pmix::lookup(0, kKey, timeout));
      return std::make_shared<TCPStore>(host, port, options);
    });
  }
  // Formation's records through fences too (host identities, slot tables,
  // shared-memory segments), within the store's timeout.
  g.allGather = [timeout](const std::string& key, const Bytes& record,
                          const std::vector<int>& participants, const std::vector<int>& wanted) {
    return pmix::allGather(key, record, participants, wanted, timeout);
  };
  return g;
}

// The fix for a launch without a store address: PMIx when this build has it.
std::string pmixHint(const char* pmix, const char* otherwise) {
  if (!pmix::compiledIn()) {
    return fmt::format("{} (a build with libpmix-dev needs none of it: {})", otherwise, pmix);
  }
  return fmt::format("{}, and rdmacc needs no MASTER_ADDR; or {}", pmix, otherwise);
}

}  // namespace

GroupEnvironment groupFromEnvironment(const Config& config) {
  if (usePmix(config)) return groupFromPmix(config);
  GroupEnvironment g;
  const Scheme* found = launcherScheme();
  if (found == nullptr) {
    g.launcher = "single process";
    g.store = std::make_shared<HashStore>(config.getDuration("RDMACC_STORE_TIMEOUT"));
    return g;
  }
  if (env(found->rank) == nullptr || env(found->size) == nullptr) {
    throw Error(ErrorKind::InvalidArgument,
                fmt::format("{} and {} must be set together", found->rank, found->size),
                "launch with rdmacc-run, torchrun, mpirun or srun, or set both");
  }
  if (std::string_view(found->launcher) == "srun") checkSrunStep();
  g.launcher = found->launcher;
  g.size = envInt(found->size, 1, 1 << 20);
  g.rank = envInt(found->rank, 0, g.size - 1);
  g.localRank = localRankFromEnvironment();  // one definition (0 when unset), as the NIC choice
  auto timeout = config.getDuration("RDMACC_STORE_TIMEOUT");
  if (g.size == 1 && env("MASTER_ADDR") == nullptr) {
    g.store = std::make_shared<HashStore>(timeout);
    return g;
  }
  const char* addr = env("MASTER_ADDR");
  const char* port = env("MASTER_PORT");
  if (addr == nullptr || port == nullptr) {
    throw Error(
        ErrorKind::InvalidArgument,
        fmt::format("{} ranks need a rendezvous store, but MASTER_ADDR/MASTER_PORT are not set",
                    g.size),
        std::string_view(g.launcher) == "mpirun"
            ? pmixHint("Open MPI's mpirun starts ranks through PMIx",
                       "export MASTER_ADDR=<host of rank 0> MASTER_PORT=<free TCP port> and pass "
                       "them to the ranks: Open MPI forwards only OMPI_* variables (mpirun -x "
                       "MASTER_ADDR -x MASTER_PORT ...); see docs/multi-node.md")
        : std::string_view(g.launcher) == "srun"
            ? pmixHint("launch with `srun --mpi=pmix` (or MpiDefault=pmix in slurm.conf)",
                       "export MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" "
                       "| head -n 1) MASTER_PORT=<free TCP port> before srun; see "
                       "docs/multi-node.md")
            : "export MASTER_ADDR=<host of rank 0> MASTER_PORT=<free TCP port> (torchrun and "
              "rdmacc-run set them for you); see docs/multi-node.md");
  }
  int portNumber = envInt("MASTER_PORT", 1, 65535);
  bool agentHosts = config.getBool("RDMACC_AGENT_STORE");
  // rdmacc-run hosts its store on a port of its own and leaves MASTER_PORT
  // free for torch.distributed's store (rank 0 binds it).
  if (int storePort = static_cast<int>(config.getInt("RDMACC_STORE_PORT"));
      agentHosts && storePort > 0) {
    portNumber = storePort;
  }
  // torchrun's agent serves torch's own store (another wire protocol) at
  // MASTER_PORT: rank 0 hosts rdmacc's on the next port.
  if (const char* torchAgent = env("TORCHELASTIC_USE_AGENT_STORE");
      !agentHosts && torchAgent != nullptr && std::string_view(torchAgent) == "True") {
    if (portNumber == 65535) {
      throw Error(
          ErrorKind::InvalidArgument, "MASTER_PORT 65535 leaves no port for rdmacc's store",
          "under torchrun, rank 0 hosts rdmacc's store at MASTER_PORT+1: pick a lower port");
    }
    ++portNumber;
  }
  g.store = std::make_shared<TCPStore>(addr, static_cast<uint16_t>(portNumber),
                                       TCPStoreOptions{.isServer = g.rank == 0 && !agentHosts,
                                                       .timeout = timeout,
                                                       .connectTimeout = timeout,
                                                       .authKey = authKey(config),
                                                       .serverLimits = storeServerLimits(config)});
  return g;
}

}  // namespace rdmacc
