// RdmaTransport: the device's asynchronous events (ibv_get_async_event).
#include <fmt/format.h>

#include "rdmacc/log.hpp"
#include "src/rdma_transport_impl.hpp"
#include "verbs/device.hpp"

namespace rdmacc {
namespace rdma {

void RdmaTransport::takeAsyncEvents() {
  pollsSinceAsync_ = 0;
  const Endpoint& where = mesh_.endpoint();
  for (const verbs::AsyncEvent& e : verbs::takeAsyncEvents(mesh_.context())) {
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
        log(LogLevel::Warn, "asynchronous event {} on {} port {} (queue pair to rank {})", e.name,
            where.device, where.port, owner);
        if (owner < 0) break;
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
      case IBV_EVENT_DEVICE_FATAL: {
        log(LogLevel::Error, "asynchronous event {} on {}: every transfer through it fails", e.name,
            where.device);
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
      case IBV_EVENT_PORT_ERR:
        log(LogLevel::Warn,
            "port {} of {} went down ({}): transfers retry until the retry budget "
            "(RDMACC_IB_TIMEOUT x RDMACC_IB_RETRY_CNT) is spent",
            e.port, where.device, e.name);
        break;
      case IBV_EVENT_PORT_ACTIVE:
        log(LogLevel::Info, "port {} of {} is active again ({})", e.port, where.device, e.name);
        break;
      default:
        log(LogLevel::Debug, "asynchronous event {} on {} (port {})", e.name, where.device, e.port);
        break;
    }
  }
}

void RdmaTransport::deliverAsyncFailures(TransportSink& sink) {
  auto failures = std::move(asyncFailures_);
  asyncFailures_.clear();
  for (auto& [rank, error] : failures) sink.failed(rank, std::move(error));
}

}  // namespace rdma
}  // namespace rdmacc
