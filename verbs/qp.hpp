// Queue pairs, completion queues and memory registration.
#pragma once

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "verbs/handles.hpp"

namespace rdmacc::verbs {

// QP attributes that come from the config table, never from literals.
struct QpParams {
  uint8_t ackTimeout = 14;  // 4.096 us * 2^n
  uint8_t retryCount = 7;
  uint8_t rnrRetry = 7;
  uint8_t minRnrTimer = 12;
  uint8_t trafficClass = 0;
  uint8_t serviceLevel = 0;
  int gidIndex = 0;
  ibv_mtu pathMtu = IBV_MTU_1024;  // already the min of both ends and the cap
  uint32_t sendDepth = 256;
  uint32_t recvDepth = 256;
  uint32_t maxInline = 256;  // asked for; devices that grant less get 64, then 0
};

// A completion queue with its completion channel.
// Threading: one thread at a time (the progress engine).
class CompletionQueue {
 public:
  CompletionQueue(ibv_context* context, int entries);
  ibv_cq* get() const noexcept { return cq_.get(); }
  int entries() const noexcept { return cq_->cqe; }
  // Grows the queue towards `entries` (never shrinks it), up to the
  // device's max_cqe: queue pairs made after formation (connections on
  // first use) need room for their completions.
  void reserve(int entries);
  // Returns the number of completions written to wcs; throws on a poll error.
  int poll(std::span<ibv_wc> wcs);
  // Sleeping on completions: arm(), poll once more (a completion may have
  // landed before the arm), then wait for fd() to become readable and call
  // drainEvents(). The channel is non-blocking.
  void arm();
  int fd() const noexcept { return channel_->fd; }
  void drainEvents();

 private:
  CompChannelPtr channel_;
  CqPtr cq_;            // after its channel: destroyed first
  int maxEntries_ = 0;  // the device's max_cqe
};

PdPtr allocatePd(ibv_context* context);
// Throws Error(Registration) naming the locked-memory limit on failure.
MrPtr registerMemory(ibv_pd* pd, void* addr, size_t length, int access);
// Peers write into registered memory, never read it: no IBV_ACCESS_REMOTE_READ
// (a peer holding the rkey could otherwise read the region, and on whole-page
// registrations its neighbours).
constexpr int kRemoteWriteAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;

// Memory windows of type 2, bound to one queue pair: the window's rkey
// works only for writes that arrive on that queue pair, so a peer that
// learns the rkey meant for another peer cannot use it through its own
// connection (docs/security.md). The registration under a window has no
// remote access of its own.
constexpr int kWindowedAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND;
// Whether the device binds type-2 windows (IBV_DEVICE_MEM_WINDOW_TYPE_2A/2B).
bool supportsBoundWindows(ibv_context* context);
// A type-2 window on pd, and the rkey it will have once bound (the key byte
// advanced, as binds require): known before the bind, so a hello can carry it
// while its queue pair is still connecting.
struct Window {
  MwPtr mw;
  uint32_t rkey = 0;
};
Window allocateWindow(ibv_pd* pd);
// Posts a signaled bind of window to [addr, addr + length) of mr, writable
// remotely, on qp (in RTS); the window's rkey is then Window::rkey, and the
// completion carries wrId. Throws Error naming ibv_post_send and `forWhom`
// ("rank 3") when the post fails.
void bindWindow(ibv_qp* qp, const Window& window, ibv_mr* mr, const void* addr, size_t length,
                uint64_t wrId, const std::string& forWhom);
// Send-queue entries beyond QpParams::sendDepth for window binds (the
// slots' window, and the one-shot board's on the first queue pair), which
// the transport does not count among its writes.
constexpr uint32_t kBindEntries = 2;

// An RC QP on pd whose send and receive completions go to cq; its receives
// come from srq when given (then it has no receive queue of its own).
QpPtr createRcQp(ibv_pd* pd, ibv_cq* cq, const QpParams& params, ibv_srq* srq = nullptr);
// A shared receive queue on pd with room for `entries` receives (at most the
// device's max_srq_wr); null when the device has none (max_srq 0) or
// refuses one: the queue pairs then keep receive queues of their own.
SrqPtr createSrq(ibv_pd* pd, uint32_t entries);
// The receives srq holds (what the device granted; 0 if it cannot say).
uint32_t srqCapacity(ibv_srq* srq);
// State transitions with the attributes rdma_cm computed for id (port, P_Key,
// path), overridden by params (GID index, MTU, timeouts, retries).
void moveToInit(ibv_qp* qp, rdma_cm_id* id);
void moveToRtr(ibv_qp* qp, rdma_cm_id* id, const QpParams& params);
void moveToRts(ibv_qp* qp, rdma_cm_id* id, const QpParams& params);

// One RDMA WRITE (optionally WITH_IMM). Returns ibv_post_send's errno (0 = ok).
struct WriteRequest {
  uint64_t wrId = 0;
  const void* local = nullptr;
  uint32_t lkey = 0;
  uint32_t length = 0;
  uint64_t remoteAddr = 0;
  uint32_t rkey = 0;
  std::optional<uint32_t> imm;  // host order
  bool signaled = true;
  bool inlineData = false;
  // A second piece gathered after the first (zero-copy payloads: the header
  // from a staging slot, the data from the user's registered memory).
  const void* local2 = nullptr;
  uint32_t lkey2 = 0;
  uint32_t length2 = 0;
};
int postWrite(ibv_qp* qp, const WriteRequest& request);
// Posts the requests as one chain (one doorbell), in order.
int postWrites(ibv_qp* qp, std::span<const WriteRequest> requests);
// Posts count receive WRs with no scatter entries (for WRITE_WITH_IMM), to
// the queue pair's own receive queue or to a shared one.
int postEmptyRecvs(ibv_qp* qp, uint64_t wrId, uint32_t count);
int postEmptyRecvs(ibv_srq* srq, uint64_t wrId, uint32_t count);

}  // namespace rdmacc::verbs

namespace rdmacc::verbs {
// The inline-data capacity the device actually granted the QP.
uint32_t maxInlineData(ibv_qp* qp);
}  // namespace rdmacc::verbs
