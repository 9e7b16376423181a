#include "src/transport/registration_cache.hpp"

#include <fmt/format.h>

#include "rdmacc/error.hpp"

namespace rdmacc {

RegistrationCache::RegistrationCache(Registrar registrar, bool enabled, size_t pageBytes)
    : registrar_(std::move(registrar)), enabled_(enabled), pageBytes_(pageBytes) {}

void RegistrationCache::add(const void* ptr, size_t bytes) {
  auto p = reinterpret_cast<uintptr_t>(ptr);
  if (ptr == nullptr || bytes == 0 || p + bytes < p) {
    throw Error(ErrorKind::InvalidArgument,
                fmt::format("cannot register {} bytes at {}", bytes, ptr),
                "pass the start and size of a live buffer");
  }
  if (!enabled_) return;
  uintptr_t begin = p / pageBytes_ * pageBytes_;
  uintptr_t end = (p + bytes + pageBytes_ - 1) / pageBytes_ * pageBytes_;
  std::lock_guard lock(mutex_);
  auto it = byPointer_.find(p);
  if (it != byPointer_.end() && it->second.registration->end >= end) {
    ++it->second.count;
    return;
  }
  auto registration = std::make_shared<const Registration>(registrar_(begin, end - begin));
  if (it != byPointer_.end()) {  // grown: the new region replaces the old for later transfers
    it->second.registration = std::move(registration);
    ++it->second.count;
  } else {
    byPointer_.emplace(p, Entry{std::move(registration), 1});
  }
  longest_ = std::max(longest_, static_cast<size_t>(end - begin));
}

void RegistrationCache::remove(const void* ptr) {
  if (!enabled_) return;
  std::lock_guard lock(mutex_);
  auto it = byPointer_.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == byPointer_.end()) {
    throw Error(ErrorKind::InvalidArgument,
                fmt::format("{} was not registered (or was deregistered already)", ptr),
                "deregister exactly the pointers you registered, once per registration");
  }
  if (--it->second.count == 0) byPointer_.erase(it);
}

std::shared_ptr<const Registration> RegistrationCache::find(const void* ptr, size_t bytes) const {
  if (!enabled_) return nullptr;
  auto p = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard lock(mutex_);
  // Candidates were added at a pointer <= p and within the longest region of
  // it (a region starts at most one page before its pointer).
  for (auto it = byPointer_.upper_bound(p); it != byPointer_.begin();) {
    --it;
    if (it->first + longest_ + pageBytes_ < p) break;
    if (it->second.registration->covers(ptr, bytes)) return it->second.registration;
  }
  return nullptr;
}

size_t RegistrationCache::entries() const {
  std::lock_guard lock(mutex_);
  return byPointer_.size();
}

}  // namespace rdmacc
