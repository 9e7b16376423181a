#include "src/transport/shm/cma.hpp"

#include <sys/uio.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

namespace rdmacc::cma {
namespace {

// One process_vm_{readv,writev} of `bytes` between `local` here and `remote`
// in pid.
bool transfer(bool writing, pid_t pid, void* local, uint64_t remote, size_t bytes,
              std::string& why) {
  iovec here{local, bytes};
  iovec there{reinterpret_cast<void*>(static_cast<uintptr_t>(remote)), bytes};
  const ssize_t n = writing ? ::process_vm_writev(pid, &here, 1, &there, 1, 0)
                            : ::process_vm_readv(pid, &here, 1, &there, 1, 0);
  if (n == static_cast<ssize_t>(bytes)) return true;
  const char* call = writing ? "process_vm_writev" : "process_vm_readv";
  why = n < 0 ? fmt::format("{}: {}", call, std::strerror(errno))
              : fmt::format("{} moved {} of {} bytes", call, n, bytes);
  return false;
}

}  // namespace

bool write(pid_t pid, const void* from, uint64_t to, size_t bytes, std::string& why) {
  return transfer(true, pid, const_cast<void*>(from), to, bytes, why);
}

bool read(pid_t pid, uint64_t from, void* to, size_t bytes, std::string& why) {
  return transfer(false, pid, to, from, bytes, why);
}

}  // namespace rdmacc::cma
