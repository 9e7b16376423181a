// Single-copy writes into a local peer's memory (cross-memory attach,
// process_vm_writev): the shared-memory transport's direct writes. The
// kernel copies from this process straight into the peer's destination, so
// a large receive costs one copy instead of two (into a slot, out of it).
// Permitted between processes of the same user unless a security module
// says otherwise (Yama's ptrace_scope >= 1 without PR_SET_PTRACER, a
// container's seccomp profile): the transport tries once per peer at setup.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace rdmacc::cma {

// Writes `bytes` from `from` to `to` in process `pid`. True when all of it
// was written; else false with the reason in `why` ("process_vm_writev:
// Operation not permitted", or the short count). Nothing is half-done that
// matters: a caller that gets false sends the payload another way, and the
// receiver takes that copy over whatever landed.
bool write(pid_t pid, const void* from, uint64_t to, size_t bytes, std::string& why);

// Reads `bytes` at `from` in process `pid` into `to`; the same contract.
// The setup's check that `pid` is the peer (and not another process of the
// same user under that number, e.g. in another pid namespace): a word of its
// segment read through the kernel equals the word read through the mapping.
bool read(pid_t pid, uint64_t from, void* to, size_t bytes, std::string& why);

}  // namespace rdmacc::cma
