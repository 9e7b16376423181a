// An operation while the engine runs it: its progress through its schedule
// (or its point-to-point chunks), its deadline, its zero-copy writes and
// direct receives in flight, and what memory it touches (which decides
// whether it may run alongside earlier collectives).
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <utility>
#include <vector>

#include "src/engine/engine.hpp"
#include "src/transport/transport.hpp"

namespace rdmacc {

struct Registration;

// Messages a transfer of `bytes` takes with `chunk` payload bytes each (an
// empty transfer is one message).
inline size_t messageCount(size_t bytes, size_t chunk) {
  return bytes == 0 ? 1 : (bytes + chunk - 1) / chunk;
}

struct Active {
  std::unique_ptr<Operation> op;
  // Collectives: what the operation reads and writes (send buffer, receive
  // buffer, the copy-in's source, the output buffer), unless `opaque`: a prologue or epilogue
  // touches memory the engine cannot see. Decides whether it may run while
  // earlier collectives do.
  bool opaque = true;
  std::array<Span, 4> footprint{};
  bool latencyBound = false;  // every message fits one slot
  std::shared_ptr<ZeroCopyWrites> zeroCopy = std::make_shared<ZeroCopyWrites>();
  // Direct receives: the adverts still to send, which receives ([step][recv])
  // peers may write directly, and the registrations that keep those
  // destinations writable until the operation ends.
  std::vector<std::pair<int, wire::Header>> advertsToSend;
  size_t advertsSent = 0;
  std::vector<std::vector<char>> advertised;  // empty: nothing advertised
  std::vector<std::shared_ptr<const Registration>> exposed;
  bool started = false;
  bool finished = false;  // collectives: every step and the epilogue done
  size_t step = 0;
  std::vector<size_t> sent, sentMessages, received, receivedMessages;
  std::chrono::steady_clock::time_point deadline{};
  // point to point
  int source = -1;
  size_t done = 0;
  uint32_t chunks = 0;

  // For the next operation: the vectors keep their capacity, so a finished
  // Active is reused without allocating.
  void reset();
};

// Finished Actives kept for reuse: the steady state allocates none.
class ActivePool {
 public:
  // `registrations`: the group's (EngineOptions), which its operations'
  // zero-copy sends are found in.
  explicit ActivePool(const RegistrationCache* registrations = nullptr)
      : registrations_(registrations) {}
  std::unique_ptr<Active> take(std::unique_ptr<Operation> op);
  // A few are enough: operations finish about as fast as they start.
  void give(std::unique_ptr<Active> a);

 private:
  const RegistrationCache* registrations_;
  std::vector<std::unique_ptr<Active>> spare_;
};

// Sets a collective's footprint, opacity and latencyBound from its schedule.
void computeFootprint(Active& a, size_t chunk);

// Whether collectives[i] may start while the ones before it still run:
// neither it nor any of them has opaque copies, and its memory does not
// overlap theirs (a collective on the result of the previous one waits for
// it, as it would on a stream).
bool mayStartAhead(const std::deque<std::unique_ptr<Active>>& collectives, size_t i);

class Matching;

// Whether the operation still has to exchange messages with peer: a send it
// has not made, or a receive whose messages are not all in the inbox
// already (a peer that left after sending delivered them).
bool needs(const Active& a, int peer, size_t chunk, const Matching& matching);

// The peers the operation waits for in its current step (for errors).
std::vector<int> awaited(const Active& a, size_t chunk);
// The same into `out` (cleared first; no allocation once it has capacity
// for the group: the engine's keep-alive calls it on the data path).
void awaitedInto(const Active& a, size_t chunk, std::vector<int>& out);

}  // namespace rdmacc
