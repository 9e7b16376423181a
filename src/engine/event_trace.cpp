#include "src/engine/event_trace.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "rdmacc/log.hpp"

namespace rdmacc {

std::string_view EventTrace::name(Stage stage) noexcept {
  switch (stage) {
    case Stage::Submit:
      return "submit";
    case Stage::Start:
      return "start";
    case Stage::PostBegin:
      return "post_begin";
    case Stage::PostEnd:
      return "post_end";
    case Stage::Arrival:
      return "arrival";
    case Stage::Done:
      return "done";
    case Stage::Finish:
      return "finish";
  }
  return "?";
}

EventTrace::EventTrace(std::string path, size_t capacity)
    : path_(std::move(path)), events_(capacity) {}

EventTrace::~EventTrace() {
  write();
}

void EventTrace::record(Stage stage, bool pointToPoint, uint64_t sequence, int peer) noexcept {
  put(stage, pointToPoint, sequence, peer, now());
}

void EventTrace::recordPost(bool pointToPoint, uint64_t sequence, int peer,
                            int64_t beginNs) noexcept {
  put(Stage::PostBegin, pointToPoint, sequence, peer, beginNs);
  put(Stage::PostEnd, pointToPoint, sequence, peer, now());
}

void EventTrace::put(Stage stage, bool pointToPoint, uint64_t sequence, int peer,
                     int64_t ns) noexcept {
  thread_local const EventTrace* owner = nullptr;
  thread_local uint8_t thread = 0;
  if (owner != this) {  // this thread's first event here
    owner = this;
    thread = static_cast<uint8_t>(threads_.fetch_add(1, std::memory_order_relaxed) + 1);
  }
  const size_t i = next_.fetch_add(1, std::memory_order_relaxed);
  if (i >= events_.size()) return;
  events_[i] = Event{.ns = ns,
                     .sequence = sequence,
                     .peer = peer,
                     .stage = stage,
                     .pointToPoint = pointToPoint,
                     .thread = thread};
}

void EventTrace::write() const noexcept {
  // Not through a symbolic link (a name in /tmp another user planted), and
  // readable by this user's group at most, as RDMACC_LOG_FILE's.
  const int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0640);
  std::unique_ptr<FILE, int (*)(FILE*)> f(fd >= 0 ? ::fdopen(fd, "w") : nullptr, &std::fclose);
  if (!f) {
    if (fd >= 0) ::close(fd);
    log(LogLevel::Error, "RDMACC_TRACE_EVENTS: cannot write {}: {}", path_, std::strerror(errno));
    return;
  }
  const size_t total = next_.load();
  const size_t kept = std::min(total, events_.size());
  std::fprintf(f.get(), "# rdmacc event trace: %zu events, %zu not kept (capacity %zu)\n", kept,
               total - kept, events_.size());
  std::fprintf(f.get(), "time_ns,stage,kind,sequence,peer,thread\n");
  for (size_t i = 0; i < kept; ++i) {
    const Event& e = events_[i];
    const std::string_view stage = name(e.stage);
    std::fprintf(f.get(), "%lld,%.*s,%s,%llu,%d,%u\n", static_cast<long long>(e.ns),
                 static_cast<int>(stage.size()), stage.data(),
                 e.pointToPoint ? "p2p" : "collective", static_cast<unsigned long long>(e.sequence),
                 e.peer, e.thread);
  }
  if (std::fflush(f.get()) != 0) {
    log(LogLevel::Error, "RDMACC_TRACE_EVENTS: writing {} failed: {}", path_, std::strerror(errno));
  }
}

}  // namespace rdmacc
