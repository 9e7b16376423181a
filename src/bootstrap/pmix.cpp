#include "src/bootstrap/pmix.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include <fmt/format.h>

#include "rdmacc/error.hpp"
#include "rdmacc/log.hpp"

#ifdef RDMACC_HAVE_PMIX
#include <dlfcn.h>
#include <pmix.h>
#endif

namespace rdmacc::pmix {

bool launched() {
  const char* ns = std::getenv("PMIX_NAMESPACE");
  const char* rank = std::getenv("PMIX_RANK");
  return ns != nullptr && *ns != '\0' && rank != nullptr && *rank != '\0';
}

#ifndef RDMACC_HAVE_PMIX

bool compiledIn() {
  return false;
}

const Job& job() {
  throw Error(ErrorKind::InvalidArgument, "rdmacc was built without PMIx",
              "install libpmix-dev (tools/install-deps does) and rebuild, or set "
              "RDMACC_BOOTSTRAP=env and pass MASTER_ADDR/MASTER_PORT to the ranks");
}

std::vector<Bytes> allGather(const std::string&, const Bytes&, const std::vector<int>&,
                             const std::vector<int>&, std::chrono::milliseconds) {
  job();
  return {};
}

void publish(const std::string&, const Bytes&) {
  job();
}

Bytes lookup(int, const std::string&, std::chrono::milliseconds) {
  job();
  return {};
}

#else

bool compiledIn() {
  return true;
}

namespace {

// libpmix is opened on first use, not linked: a process no PMIx launcher
// started (torchrun, rdmacc-run, a plain environment) loads neither it nor
// what it pulls in (hwloc, libevent, munge), and a build made with
// libpmix-dev runs where libpmix is not installed. The calls are the
// functions the PMIx standard defines, so that no header macro reaches into
// the library behind the loader's back.
struct Api {
  decltype(&PMIx_Init) init;
  decltype(&PMIx_Finalize) finalize;
  decltype(&PMIx_Get) get;
  decltype(&PMIx_Put) put;
  decltype(&PMIx_Commit) commit;
  decltype(&PMIx_Fence) fence;
  decltype(&PMIx_Error_string) errorString;
  decltype(&PMIx_Info_load) infoLoad;
  decltype(&PMIx_Value_destruct) valueDestruct;
};

template <typename F>
void bindSymbol(void* library, const std::string& from, const char* name, F& out) {
  out = reinterpret_cast<F>(dlsym(library, name));
  if (out == nullptr) {
    throw Error(ErrorKind::InvalidArgument, fmt::format("{} has no {}", from, name),
                "install a PMIx of version 4 or later (Debian: libpmix2), or set "
                "RDMACC_BOOTSTRAP=env and pass MASTER_ADDR/MASTER_PORT to the ranks");
  }
}

Api loadApi() {
  // The soname first (LD_LIBRARY_PATH, the launcher's own PMIx), then the
  // one this build was made with.
  std::string tried;
  void* library = nullptr;
  std::string from;
  for (const char* name : {"libpmix.so.2", RDMACC_PMIX_LIBRARY}) {
    library = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (library != nullptr) {
      from = name;
      break;
    }
    const char* why = dlerror();
    tried += fmt::format("{}{}: {}", tried.empty() ? "" : "; ", name, why ? why : "not found");
  }
  if (library == nullptr) {
    throw Error(ErrorKind::InvalidArgument,
                fmt::format("a PMIx launcher started this process (PMIX_NAMESPACE is set), "
                            "but libpmix cannot be loaded ({})",
                            tried),
                "install libpmix (Debian: libpmix2) where the ranks run, add its directory to "
                "LD_LIBRARY_PATH, or set RDMACC_BOOTSTRAP=env and pass MASTER_ADDR/MASTER_PORT");
  }
  // Never closed: PMIx_Finalize runs at exit, and PMIx keeps threads.
  Api api{};
  bindSymbol(library, from, "PMIx_Init", api.init);
  bindSymbol(library, from, "PMIx_Finalize", api.finalize);
  bindSymbol(library, from, "PMIx_Get", api.get);
  bindSymbol(library, from, "PMIx_Put", api.put);
  bindSymbol(library, from, "PMIx_Commit", api.commit);
  bindSymbol(library, from, "PMIx_Fence", api.fence);
  bindSymbol(library, from, "PMIx_Error_string", api.errorString);
  bindSymbol(library, from, "PMIx_Info_load", api.infoLoad);
  bindSymbol(library, from, "PMIx_Value_destruct", api.valueDestruct);
  log(LogLevel::Debug, "PMIx: loaded {}", from);
  return api;
}

const Api& api() {
  static const Api loaded = loadApi();
  return loaded;
}

// PMIX_VALUE_RELEASE without the macro: the value and what it holds.
void release(pmix_value_t* v) {
  api().valueDestruct(v);
  std::free(v);
}

// A proc id (PMIX_LOAD_PROCID's memset and bounded copy).
void loadProc(pmix_proc_t& proc, const char* nspace, pmix_rank_t rank) {
  std::memset(&proc, 0, sizeof proc);
  std::memcpy(proc.nspace, nspace, strnlen(nspace, PMIX_MAX_NSLEN));
  proc.rank = rank;
}

[[noreturn]] void fail(const char* call, pmix_status_t status, const std::string& what) {
  const ErrorKind kind = status == PMIX_ERR_TIMEOUT ? ErrorKind::Timeout : ErrorKind::Store;
  throw Error(kind,
              fmt::format("{} failed{}: {} ({})", call, what, api().errorString(status), status),
              "the PMIx server is the launcher's (srun --mpi=pmix, mpirun): check that every "
              "rank was started by it and is alive, or set RDMACC_BOOTSTRAP=env");
}

// Finalised by the destructor of the function-local static at exit.
class Client {
 public:
  Client() {
    const auto start = std::chrono::steady_clock::now();
    pmix_status_t rc = api().init(&self_, nullptr, 0);
    if (rc != PMIX_SUCCESS) fail("PMIx_Init", rc, "");
    job_.nspace = self_.nspace;
    job_.rank = static_cast<int>(self_.rank);
    pmix_proc_t all;
    loadProc(all, self_.nspace, PMIX_RANK_WILDCARD);
    job_.size = static_cast<int>(number(all, PMIX_JOB_SIZE));
    job_.localSize = static_cast<int>(number(all, PMIX_LOCAL_SIZE));
    job_.localRank = static_cast<int>(number(self_, PMIX_LOCAL_RANK));
    if (job_.size < 1 || job_.rank < 0 || job_.rank >= job_.size || job_.localRank < 0 ||
        job_.localSize < 1 || job_.localRank >= job_.localSize) {
      throw Error(ErrorKind::Protocol,
                  fmt::format("PMIx reports rank {} of {}, local rank {} of {}: inconsistent",
                              job_.rank, job_.size, job_.localRank, job_.localSize));
    }
    log(LogLevel::Debug, "PMIx: namespace {} rank {}/{} local rank {}/{} in {:.1f} ms", job_.nspace,
        job_.rank, job_.size, job_.localRank, job_.localSize,
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
            .count());
  }
  ~Client() { api().finalize(nullptr, 0); }
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  const Job& job() const { return job_; }
  const pmix_proc_t& self() const { return self_; }
  std::mutex& mutex() { return mutex_; }

 private:
  // A job-level number; the servers differ in the integer type they use.
  static uint64_t number(const pmix_proc_t& proc, const char* key) {
    pmix_value_t* v = nullptr;
    pmix_status_t rc = api().get(&proc, key, nullptr, 0, &v);
    if (rc != PMIX_SUCCESS || v == nullptr) fail("PMIx_Get", rc, fmt::format(" of {}", key));
    uint64_t out = 0;
    bool ok = true;
    switch (v->type) {
      case PMIX_UINT32:
        out = v->data.uint32;
        break;
      case PMIX_UINT16:
        out = v->data.uint16;
        break;
      case PMIX_UINT64:
        out = v->data.uint64;
        break;
      case PMIX_UINT8:
        out = v->data.uint8;
        break;
      case PMIX_PROC_RANK:
        out = v->data.rank;
        break;
      case PMIX_INT:
        ok = v->data.integer >= 0;
        out = static_cast<uint64_t>(v->data.integer);
        break;
      default:
        ok = false;
    }
    const int type = v->type;
    release(v);
    if (!ok || out > (uint64_t{1} << 24)) {
      throw Error(ErrorKind::Protocol,
                  fmt::format("PMIx returned {} with type {} or out of range", key, type));
    }
    return out;
  }

  pmix_proc_t self_{};
  Job job_;
  std::mutex mutex_;
};

Client& client() {
  static Client c;
  return c;
}

}  // namespace

const Job& job() {
  return client().job();
}

namespace {

int wholeSeconds(std::chrono::milliseconds timeout) {
  return static_cast<int>(std::max<int64_t>(
      1, std::min<int64_t>(INT32_MAX, std::chrono::ceil<std::chrono::seconds>(timeout).count())));
}

void putAndCommit(const std::string& key, const Bytes& value) {
  if (key.size() >= PMIX_MAX_KEYLEN) {
    throw Error(ErrorKind::InvalidArgument, fmt::format("PMIx key '{}' is too long", key));
  }
  pmix_value_t v{};
  v.type = PMIX_BYTE_OBJECT;
  // PMIx_Put copies the bytes; `v` is not destructed (it does not own them).
  v.data.bo.bytes = reinterpret_cast<char*>(const_cast<uint8_t*>(value.data()));
  v.data.bo.size = value.size();
  if (pmix_status_t rc = api().put(PMIX_GLOBAL, key.c_str(), &v); rc != PMIX_SUCCESS) {
    fail("PMIx_Put", rc, fmt::format(" of {}", key));
  }
  if (pmix_status_t rc = api().commit(); rc != PMIX_SUCCESS) fail("PMIx_Commit", rc, "");
}

// A peer's bytes: checked for type, copied out.
// The PMIx name of a rank of this job, which it must be in.
pmix_proc_t procOf(const Job& job, int rank) {
  if (rank < 0 || rank >= job.size) {
    throw Error(ErrorKind::InvalidArgument,
                fmt::format("rank {} is outside the PMIx job of {}", rank, job.size));
  }
  pmix_proc_t proc;
  loadProc(proc, job.nspace.c_str(), static_cast<pmix_rank_t>(rank));
  return proc;
}

Bytes get(const Job& job, int rank, const std::string& key, std::chrono::milliseconds timeout) {
  const pmix_proc_t peer = procOf(job, rank);
  pmix_info_t info{};
  int seconds = wholeSeconds(timeout);
  api().infoLoad(&info, PMIX_TIMEOUT, &seconds, PMIX_INT);  // an int: nothing to destruct
  pmix_value_t* v = nullptr;
  const pmix_status_t rc = api().get(&peer, key.c_str(), &info, 1, &v);
  if (rc != PMIX_SUCCESS || v == nullptr) {
    throw Error(ErrorInfo{.kind = rc == PMIX_ERR_TIMEOUT ? ErrorKind::Timeout : ErrorKind::Protocol,
                          .message = fmt::format("rank {} published no '{}' through PMIx: {}", rank,
                                                 key, api().errorString(rc)),
                          .peerRank = rank});
  }
  if (v->type != PMIX_BYTE_OBJECT) {
    const int type = v->type;
    release(v);
    throw Error(ErrorInfo{
        .kind = ErrorKind::Protocol,
        .message = fmt::format("rank {}'s '{}' has PMIx type {}, not bytes", rank, key, type),
        .peerRank = rank});
  }
  const auto* bytes = reinterpret_cast<const uint8_t*>(v->data.bo.bytes);
  Bytes out(bytes, bytes + v->data.bo.size);
  release(v);
  return out;
}

}  // namespace

void publish(const std::string& key, const Bytes& value) {
  Client& c = client();
  std::lock_guard lock(c.mutex());
  putAndCommit(key, value);
}

Bytes lookup(int rank, const std::string& key, std::chrono::milliseconds timeout) {
  return get(client().job(), rank, key, timeout);
}

std::vector<Bytes> allGather(const std::string& key, const Bytes& mine,
                             const std::vector<int>& participants, const std::vector<int>& wanted,
                             std::chrono::milliseconds timeout) {
  Client& c = client();
  std::lock_guard lock(c.mutex());
  putAndCommit(key, mine);
  // The whole namespace as its wildcard (what servers optimise), else the
  // participants by name.
  std::vector<pmix_proc_t> procs;
  if (participants.size() == static_cast<size_t>(c.job().size)) {
    procs.resize(1);
    loadProc(procs[0], c.job().nspace.c_str(), PMIX_RANK_WILDCARD);
  } else {
    for (int rank : participants) procs.push_back(procOf(c.job(), rank));
  }
  pmix_info_t info[2]{};  // a bool and an int: nothing to destruct
  bool collect = true;
  api().infoLoad(&info[0], PMIX_COLLECT_DATA, &collect, PMIX_BOOL);
  int seconds = wholeSeconds(timeout);
  api().infoLoad(&info[1], PMIX_TIMEOUT, &seconds, PMIX_INT);
  const auto start = std::chrono::steady_clock::now();
  const pmix_status_t rc = api().fence(procs.data(), procs.size(), info, 2);
  log(LogLevel::Debug, "PMIx: fence '{}' over {} ranks in {:.1f} ms", key, participants.size(),
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  if (rc != PMIX_SUCCESS) {
    fail("PMIx_Fence", rc,
         fmt::format(" exchanging '{}' among {} ranks within {}s", key, participants.size(),
                     seconds));
  }
  std::vector<Bytes> out;
  out.reserve(wanted.size());
  for (int rank : wanted) out.push_back(get(c.job(), rank, key, timeout));
  return out;
}

#endif

}  // namespace rdmacc::pmix
