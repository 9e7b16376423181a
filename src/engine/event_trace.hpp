// When each stage of every operation happened (RDMACC_TRACE_EVENTS): the
// caller submitted it, the engine started it, each of its messages went to
// the transport (the post, from call to return) and each arrived, its last
// step was done, and its Work finished (the waiter told). Written to a file
// when the backend goes away and summarised by tools/trace-stages (time per
// stage, per operation, over many operations: where a small operation's
// time goes). Off by default; then each stage costs one test of a null
// pointer.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace rdmacc {

class EventTrace {
 public:
  enum class Stage : uint8_t { Submit, Start, PostBegin, PostEnd, Arrival, Done, Finish };
  static std::string_view name(Stage stage) noexcept;

  // Keeps the first `capacity` events (the rest are counted, not kept) and
  // writes them to `path` when destroyed (when nothing records any more: the
  // backend destroys it after its engine), or logs why it cannot.
  EventTrace(std::string path, size_t capacity);
  ~EventTrace();
  EventTrace(const EventTrace&) = delete;
  EventTrace& operator=(const EventTrace&) = delete;

  // From any thread. `sequence`: the collective's sequence number, or a
  // point-to-point operation's tag; `peer`: the message's peer, else -1.
  void record(Stage stage, bool pointToPoint, uint64_t sequence, int peer) noexcept;
  // A message the transport took: PostBegin at `beginNs` (now() before the
  // call) and PostEnd now. (A send the transport refused, for want of
  // credits, is not recorded: a starved sender retries on every round.)
  void recordPost(bool pointToPoint, uint64_t sequence, int peer, int64_t beginNs) noexcept;
  static int64_t now() noexcept {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

 private:
  void write() const noexcept;
  void put(Stage stage, bool pointToPoint, uint64_t sequence, int peer, int64_t ns) noexcept;
  struct Event {
    int64_t ns;  // steady clock
    uint64_t sequence;
    int32_t peer;
    Stage stage;
    bool pointToPoint;
    uint8_t thread;  // 1, 2, ... in the order threads first recorded
  };
  std::string path_;
  std::vector<Event> events_;
  std::atomic<size_t> next_{0};
  std::atomic<uint8_t> threads_{0};
};

// One stage, when tracing is on.
inline void traceStage(EventTrace* trace, EventTrace::Stage stage, bool pointToPoint,
                       uint64_t sequence, int peer = -1) noexcept {
  if (trace != nullptr) [[unlikely]]
    trace->record(stage, pointToPoint, sequence, peer);
}

// Before a send: the time, when tracing is on (else 0, and no clock read).
inline int64_t traceClock(const EventTrace* trace) noexcept {
  return trace != nullptr ? EventTrace::now() : 0;
}

// After a send the transport took, begun at traceClock()'s time.
inline void tracePost(EventTrace* trace, bool pointToPoint, uint64_t sequence, int peer,
                      int64_t beginNs) noexcept {
  if (trace != nullptr) [[unlikely]]
    trace->recordPost(pointToPoint, sequence, peer, beginNs);
}

}  // namespace rdmacc
