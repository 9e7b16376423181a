// The progress engine: executes collective schedules in submission order and
// point-to-point operations alongside, over a transport (RDMA: WRITE_WITH_IMM
// into per-peer staging slots under credit-based flow control), and turns
// arrivals, peer disconnects and timeouts into Work status. Its parts, each in
// its own file: wire (the header and its validation), transport /
// rdma_transport (moving one message), matching (inbox and adverts), active
// and executor (running an operation), progress (who drives and when), and
// engine/engine.cpp (intake, admission, completion, failure).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

#include <fmt/args.h>
#include <fmt/format.h>

#include "rdmacc/store.hpp"
#include "rdmacc/types.hpp"
#include "rdmacc/work.hpp"
#include "src/engine/scratch.hpp"
#include "src/schedule/schedule.hpp"

namespace rdmacc {

class EventTrace;
class RegistrationCache;
class Transport;

// One operation as the engine runs it. Built by VerbsBackend on the caller's
// thread, owned by the engine afterwards.
struct Operation {
  OpType type = OpType::Barrier;
  uint64_t sequence = 0;  // collectives: the group's sequence number
  std::shared_ptr<Work> work;
  std::chrono::milliseconds timeout{0};
  // What the operation is, for errors and traces: the details ("4099 x
  // float32, sum, ring") as a format string (a literal, checked at compile
  // time) and its arguments (numbers and static strings such as toString's),
  // formatted only when a message needs them (description(), which adds the
  // name and sequence: "allreduce #12 (...)"): formatting them for every
  // operation was a large share of a small allreduce's instructions.
  static constexpr size_t kDetailArgs = 6;
  using DetailArg = std::variant<uint64_t, int64_t, const char*>;
  std::string_view detailFormat;
  std::array<DetailArg, kDetailArgs> detailArgs{};
  size_t detailArgCount = 0;
  template <typename... Args>
  void describe(fmt::format_string<Args...> format, Args... args) {
    static_assert(sizeof...(Args) <= kDetailArgs, "describe() keeps at most kDetailArgs values");
    static_assert(((std::is_integral_v<Args> || std::is_same_v<Args, const char*>)&&...),
                  "describe() keeps numbers and static strings only");
    const fmt::string_view text = format;  // fmt 9 and 10 both convert
    detailFormat = std::string_view(text.data(), text.size());
    detailArgCount = 0;
    ((detailArgs[detailArgCount++] = detailArg(args)), ...);
  }
  template <typename T>
  static DetailArg detailArg(T v) {
    if constexpr (std::is_same_v<T, const char*>) {
      return v;
    } else if constexpr (std::is_signed_v<T>) {
      return static_cast<int64_t>(v);
    } else {
      return static_cast<uint64_t>(v);
    }
  }
  std::string description() const;

  // Collectives. Plans are immutable and shared between operations of the
  // same shape (VerbsBackend keeps the recent ones).
  std::shared_ptr<const Plan> schedule;
  const Schedule& steps() const {
    static const Schedule none;
    return schedule ? schedule->steps : none;
  }
  uint8_t* sendBase = nullptr;
  uint8_t* recvBase = nullptr;
  // Receives toOutput write here: outBase holds what starts at outOrigin of
  // the receive buffer's layout (RecvSpec::toOutput).
  uint8_t* outBase = nullptr;
  size_t outOrigin = 0;
  DataType dtype = DataType::UInt8;
  ReduceOp reduceOp = ReduceOp::Sum;
  int64_t avgDivisor = 0;   // finalize ranges are divided by it (Avg)
  uint64_t checkValue = 0;  // every rank of the op must present the same value
  // Copied (memmove) when the op starts, before the prologue: the common
  // prologue without a std::function's allocation.
  struct CopyIn {
    uint8_t* to = nullptr;
    const uint8_t* from = nullptr;
    size_t bytes = 0;
  } copyIn;
  std::function<void()> prologue;  // on the engine thread, when the op starts
  std::function<void()> epilogue;  // after the last step, before completion
  Scratch scratch;                 // memory the operation owns

  // A one-shot collective whose contribution the caller posted already
  // (Engine::tryOneShot handed it over).
  bool boardPosted = false;

  // Point to point.
  bool pointToPoint = false;
  bool isSend = false;
  int peer = -1;  // -1: any source
  uint32_t tag = 0;
  uint8_t* buffer = nullptr;
  size_t bytes = 0;
};

struct EngineOptions {
  std::string group;
  int rank = 0;
  int size = 1;
  // Collectives run at once (RDMACC_COLLECTIVES_IN_FLIGHT): the oldest, and
  // later ones whose buffers are independent of every earlier one's.
  size_t collectivesInFlight = 8;
  // What the group may copy out of its slots for messages no started
  // operation takes (RDMACC_UNEXPECTED_BYTES; Matching::park). 0: none.
  size_t unexpectedBytes = size_t{64} << 20;
  std::chrono::microseconds spin{50};  // busy-poll this long before sleeping
  // The same while the oldest operation is latency-bound (each of its
  // messages fits one slot): waits are short, a wake-up from sleep costs more.
  std::chrono::microseconds spinLatencyBound{50};
  // The same for a caller blocked in wait() (a driver) on latency-bound
  // work: its thread has nothing else to do, and a peer that is late by more
  // than the engine thread's spin (a post that took long, a rank descheduled
  // for a moment) would otherwise cost it a sleep and a wake-up.
  std::chrono::microseconds spinWaitLatencyBound{50};
  // sched_yield() between polls while spinning: with more ranks than CPUs the
  // rank being waited for gets the CPU instead of waiting for a time slice.
  bool spinYield = false;
  // Memory the user registered: receives of at least zeroCopyMinBytes in it
  // are advertised for direct writes, sends from it skip the staging copy.
  // Null: always copy. (The transports get the same from TransportOptions.)
  const RegistrationCache* registrations = nullptr;
  size_t zeroCopyMinBytes = 16384;
  // Keep-alive (RDMACC_KEEPALIVE_INTERVAL): the peers a pending operation
  // waits for are probed this often (Transport::probe), so a dead link or
  // host fails the operation within the retry budget instead of its
  // timeout. 0: never.
  std::chrono::milliseconds keepalive{1000};
  // RDMACC_TRACE_EVENTS: every operation's stages are recorded here (it
  // outlives the engine). Null: not traced.
  EventTrace* trace = nullptr;
};

// A one-shot allreduce (Plan::board) as Engine::tryOneShot runs it on the
// caller's thread: `data` (in place), reduced with every rank's.
struct OneShotCall {
  uint8_t* data = nullptr;
  size_t bytes = 0;
  DataType dtype = DataType::UInt8;
  ReduceOp reduceOp = ReduceOp::Sum;
  int64_t avgDivisor = 0;
  uint64_t checkValue = 0;
};
// Builds the Operation a one-shot call becomes when the peers are late.
class OperationFactory {
 public:
  virtual std::unique_ptr<Operation> make() = 0;

 protected:
  ~OperationFactory() = default;
};

// Threading: submit(), tryOneShot() and abort() from any thread; everything
// else belongs to the engine's own thread.
class Engine {
 public:
  // Runs the group's operations over `transport` (backend/transports.cpp
  // makes the real ones; tests may pass any Transport), which it owns.
  Engine(std::unique_ptr<Transport> transport, EngineOptions options);
  ~Engine();  // fails what is still pending with Error(Aborted), then stops
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Numbers the operation (collectives and point-to-point each in
  // submission order), gives it its Work (abort breaks the group; wait()
  // drives progress) and queues it, all under one lock.
  std::shared_ptr<Work> submit(std::unique_ptr<Operation> op);
  // The small-allreduce fast path (engine/one_shot.cpp): when nothing is
  // pending (so nothing the call's buffer may depend on) and the board has
  // room, numbers the call, posts its contribution and waits up to
  // spinLatencyBound (a board that posts through the engine's queues, RDMA:
  // spinWaitLatencyBound, under the progress lock) for the peers': then
  // reduces and returns completed Work, without an Operation or the
  // engine. Peers still late: submits
  // factory.make()'s operation as already posted and returns its Work.
  // Null when the fast path does not apply (submit as usual).
  std::shared_ptr<Work> tryOneShot(const OneShotCall& call, OperationFactory& factory);
  // The last collective sequence number given, and setting it (c10d's
  // sequence number for the group: every rank takes rank 0's).
  uint64_t sequence() const;
  void setSequence(uint64_t value);
  // Breaks the group: every pending and future operation fails with reason,
  // and the peers are told.
  void abort(const std::string& reason);
  // Payload bytes per message (slot size minus the header).
  size_t chunkBytes() const noexcept;
  // The largest one-shot collective (Plan::board) the transport takes; 0:
  // it has no board.
  size_t oneShotBytes() const noexcept;
  // For Work's progress driver: lets a waiting caller make progress itself.
  // Safe to call after the engine is gone (it then does nothing).
  std::shared_ptr<const Work::ProgressDriver> driver();

 private:
  struct Impl;
  struct DriverGate {
    std::shared_mutex mutex;  // shared: a driver is inside; unique: the engine goes away
    Impl* impl = nullptr;
  };
  std::unique_ptr<Impl> impl_;
  std::shared_ptr<DriverGate> gate_;
};

}  // namespace rdmacc
