// RdmaTransport: the device's asynchronous events (ibv_get_async_event).
#include <algorithm>
#include <chrono>

#include <fmt/format.h>

#include "rdmacc/log.hpp"
#include "src/transport/rdma/transport_impl.hpp"
#include "verbs/device.hpp"

namespace rdmacc::rdma {

void RdmaTransport::takeAsyncEvents() {
  pollsSinceAsync_ = 0;
  checkStalls();
  const Endpoint& where = mesh_.endpoint();
  for (const verbs::AsyncEvent& e : mesh_.takeAsyncEvents()) {
    switch (e.type) {
      case IBV_EVENT_QP_FATAL:
      case IBV_EVENT_QP_REQ_ERR:
      case IBV_EVENT_QP_ACCESS_ERR:
      case IBV_EVENT_PATH_MIG_ERR: {
        int owner = -1;
        for (int rank = 0; rank < size_ && owner < 0; ++rank) {
          if (rank == rank_) continue;
          for (const Lane& lane : peer(rank).lanes) {
            if (lane.qp == e.qp) owner = rank;
          }
        }
        if (owner < 0) {  // another group's (the device is shared) or a connection being made
          log(LogLevel::Debug, "asynchronous event {} on {} port {} for a queue pair of no peer",
              e.name, where.device, where.port);
          break;
        }
        log(LogLevel::Warn, "asynchronous event {} on {} port {} (queue pair to rank {})", e.name,
            where.device, where.port, owner);
        asyncFailures_.emplace_back(
            owner,
            Error(ErrorInfo{
                .kind = ErrorKind::PeerFailure,
                .message = fmt::format("the queue pair to rank {} failed: asynchronous event "
                                       "{} on {} port {}",
                                       owner, e.name, where.device, where.port),
                .peerRank = owner,
                .peerAddress = mesh_.peerAddress(owner),
                .hint = "the device or the peer broke the connection; see the kernel log "
                        "(dmesg) on both hosts"}));
        break;
      }
      case IBV_EVENT_CQ_ERR:
      case IBV_EVENT_SRQ_ERR:  // every queue pair's receives came from it
        if (!mesh_.owns(e)) {  // another group's: its failure is that group's alone
          log(LogLevel::Debug, "asynchronous event {} on {} for another group's queue", e.name,
              where.device);
          break;
        }
        [[fallthrough]];
      case IBV_EVENT_DEVICE_FATAL: {  // every group's: each fails, one reports it
        if (e.type != IBV_EVENT_DEVICE_FATAL || e.first) {
          log(LogLevel::Error, "asynchronous event {} on {}: every transfer through it fails",
              e.name, where.device);
        }
        for (int rank = 0; rank < size_; ++rank) {
          if (rank == rank_ || peer(rank).lanes.empty()) continue;
          asyncFailures_.emplace_back(
              rank, Error(ErrorInfo{
                        .kind = ErrorKind::PeerFailure,
                        .message = fmt::format("RDMA device {} failed (asynchronous event {}): "
                                               "the transfers to rank {} are lost",
                                               where.device, e.name, rank),
                        .peerRank = rank,
                        .peerAddress = mesh_.peerAddress(rank),
                        .hint = "see the kernel log (dmesg); the device may need a reset"}));
        }
        break;
      }
      // The port is every group's: the group that read the event reports it.
      case IBV_EVENT_PORT_ERR:
        if (!e.first) break;
        log(LogLevel::Warn,
            "port {} of {} went down ({}): transfers retry until the retry budget "
            "(RDMACC_IB_TIMEOUT x RDMACC_IB_RETRY_CNT) is spent",
            e.port, where.device, e.name);
        break;
      case IBV_EVENT_PORT_ACTIVE:
        if (!e.first) break;
        log(LogLevel::Info, "port {} of {} is active again ({})", e.port, where.device, e.name);
        break;
      default:
        log(LogLevel::Debug, "asynchronous event {} on {} (port {})", e.name, where.device, e.port);
        break;
    }
  }
}

// Seen with soft-RoCE on Debian 12's kernel (6.1) after retransmissions on an
// overloaded host: both queue pairs of a connection keep their writes
// forever, with no completion and no retry error (probes posted behind them
// do not move them either). A connection that works completes a write or
// fails it within the retry budget (ACK timeout x (retry count + 1)); twice
// that without either is a stall.
void RdmaTransport::checkStalls() {
  using Clock = std::chrono::steady_clock;
  const auto now = Clock::now();
  // Time only counts while this rank looks: after a gap (the process was
  // stopped, or nothing polled) a completion may be waiting unread in the
  // completion queue, so every watch starts again.
  const bool gap = now - lastStallCheck_ > std::chrono::seconds(1);
  lastStallCheck_ = now;
  for (int rank = 0; rank < size_; ++rank) {
    if (rank == rank_) continue;
    PeerState& p = peer(rank);
    for (size_t i = 0; i < p.lanes.size(); ++i) {
      Lane& lane = p.lanes[i];
      // Only a signaled write owes a completion (unsignaled ones at the back
      // complete silently, e.g. the last ones to a peer that left since).
      const bool owed = lane.posted.size() > static_cast<size_t>(lane.unsignaledRun);
      // (The first check is always a gap: every mark is set before it counts.)
      if (gap || !owed || lane.completions != lane.completionsAtMark) {
        lane.completionsAtMark = lane.completions;
        lane.mark = now;
        continue;
      }
      if (lane.stallReported || now - lane.mark < stallLimit_) continue;
      lane.stallReported = true;
      const double stalled = std::chrono::duration<double>(now - lane.mark).count();
      asyncFailures_.emplace_back(
          rank,
          Error(ErrorInfo{
              .kind = ErrorKind::PeerFailure,
              .message = fmt::format(
                  "the connection to rank {} stalled: {} write(s) on queue pair {} completed "
                  "neither with success nor with an error in {:.1f} s (the retry budget is "
                  "{:.1f} s) on {} port {}",
                  rank, lane.sendQueueUsed(), i, stalled, retryBudget_, mesh_.endpoint().device,
                  mesh_.endpoint().port),
              .peerRank = rank,
              .peerAddress = mesh_.peerAddress(rank),
              .hint = "the device lost the connection's state; seen with soft-RoCE (rdma_rxe) "
                      "after retransmissions on an overloaded host, whose acknowledgements can "
                      "take longer than the ACK timeout: a larger RDMACC_IB_TIMEOUT (19 = 2.1 s "
                      "ended them on the project's test bed), fewer ranks per CPU or a newer "
                      "kernel avoid it (docs/troubleshooting.md)"}));
    }
  }
}

void RdmaTransport::deliverAsyncFailures(TransportSink& sink) {
  auto failures = std::move(asyncFailures_);
  asyncFailures_.clear();
  for (auto& [rank, error] : failures) sink.failed(rank, std::move(error));
}

}  // namespace rdmacc::rdma
