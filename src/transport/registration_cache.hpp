// Memory the user registered for zero-copy transfers (like NCCL's
// ncclCommRegister): memory regions looked up by address (aligned to
// `pageBytes`: 1 in the backend, so that a region is exactly what the user
// registered and no neighbouring heap byte is remotely writable), shared
// by the transfers that read from them. A transfer holds its registration
// until its completion arrives, so deregistering (or the user freeing memory
// after deregistering it) never pulls a region out from under a write in
// flight; the region is deregistered when the last holder lets go.
//
// Memory that was not registered is copied through the engine's staging slots,
// which is always correct. Caching arbitrary user pointers without being told
// would be wrong: once freed memory is unmapped and the same addresses mapped
// again (glibc does this for large blocks), a cached region still points at the
// old pages, and neither rxe nor most NICs here offer on-demand paging to
// notice. So the cache only holds what the user registered, and forgets it when
// told.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>

namespace rdmacc {

struct Registration {
  uintptr_t begin = 0;  // aligned to the cache's pageBytes
  uintptr_t end = 0;    // the same, exclusive
  uint32_t lkey = 0;
  uint32_t rkey = 0;            // peers may write into it (direct receives)
  std::shared_ptr<void> owner;  // the memory region: released when the last holder goes

  bool covers(const void* ptr, size_t bytes) const noexcept {
    auto p = reinterpret_cast<uintptr_t>(ptr);
    return p >= begin && p + bytes <= end && p + bytes >= p;
  }
};

class RegistrationCache {
 public:
  // Registers [begin, begin + length) (aligned to pageBytes) with the device; throws
  // rdmacc::Error when it cannot.
  using Registrar = std::function<Registration(uintptr_t begin, size_t length)>;

  // enabled = false: add() and remove() only check their arguments, find()
  // finds nothing, so every transfer copies (RDMACC_REGISTRATION_CACHE=0).
  RegistrationCache(Registrar registrar, bool enabled, size_t pageBytes = 4096);

  // Registers the pages (of pageBytes) that hold [ptr, ptr + bytes). Adding the same pointer
  // again counts (each add needs a remove), growing the region if bytes grew.
  void add(const void* ptr, size_t bytes);
  // Undoes one add(ptr); throws Error(InvalidArgument) if ptr was not added.
  void remove(const void* ptr);
  // A registration that covers [ptr, ptr + bytes), or null.
  std::shared_ptr<const Registration> find(const void* ptr, size_t bytes) const;

  bool enabled() const noexcept { return enabled_; }
  size_t entries() const;

 private:
  struct Entry {
    std::shared_ptr<const Registration> registration;
    int count = 0;
  };
  Registrar registrar_;
  const bool enabled_;
  const size_t pageBytes_;
  mutable std::mutex mutex_;
  std::map<uintptr_t, Entry> byPointer_;  // key: the pointer given to add()
  size_t longest_ = 0;                    // the longest region, bounds find()'s search
};

}  // namespace rdmacc
