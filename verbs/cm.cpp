#include "verbs/cm.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>

#include <cerrno>

#include <fmt/format.h>

#include "verbs/error.hpp"

namespace rdmacc::verbs {
namespace {

sockaddr_in makeAddress(const std::string& ipv4, uint16_t port) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  if (::inet_pton(AF_INET, ipv4.c_str(), &sa.sin_addr) != 1) {
    throw Error(ErrorKind::InvalidArgument, fmt::format("'{}' is not an IPv4 address", ipv4));
  }
  return sa;
}

rdma_conn_param connParam(const ConnectParams& p) {
  rdma_conn_param param{};
  param.private_data = p.privateData.data();
  param.private_data_len = static_cast<uint8_t>(p.privateData.size());
  param.responder_resources = 1;
  param.initiator_depth = 1;
  param.retry_count = p.retryCount;
  param.rnr_retry_count = p.rnrRetry;
  param.qp_num = p.qpNum;
  return param;
}

}  // namespace

EventChannel::EventChannel() {
  channel_.reset(rdma_create_event_channel());
  if (!channel_) {
    throw cmError("rdma_create_event_channel", errno, "cannot open the rdma_cm event channel",
                  "is the rdma_ucm kernel module loaded (modprobe rdma_ucm) and "
                  "/dev/infiniband/rdma_cm accessible?");
  }
  int flags = ::fcntl(channel_->fd, F_GETFL);
  if (flags < 0 || ::fcntl(channel_->fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    throw cmError("fcntl", errno, "cannot make the rdma_cm event channel non-blocking");
  }
}

CmEventPtr EventChannel::next(std::chrono::milliseconds timeout) {
  rdma_cm_event* event = nullptr;
  if (rdma_get_cm_event(channel_.get(), &event) == 0) return CmEventPtr(event);
  if (errno != EAGAIN && errno != EWOULDBLOCK) {
    throw cmError("rdma_get_cm_event", errno, "reading the rdma_cm event channel failed");
  }
  pollfd p{channel_->fd, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(std::max<int64_t>(timeout.count(), 0))) <= 0) return nullptr;
  if (rdma_get_cm_event(channel_.get(), &event) == 0) return CmEventPtr(event);
  if (errno == EAGAIN || errno == EWOULDBLOCK) return nullptr;
  throw cmError("rdma_get_cm_event", errno, "reading the rdma_cm event channel failed");
}

CmIdPtr EventChannel::createId() {
  rdma_cm_id* id = nullptr;
  if (rdma_create_id(channel_.get(), &id, nullptr, RDMA_PS_TCP) != 0) {
    throw cmError("rdma_create_id", errno, "cannot create an rdma_cm id");
  }
  return CmIdPtr(id);
}

uint16_t bindAndListen(rdma_cm_id* id, const std::string& ipv4, int backlog) {
  sockaddr_in sa = makeAddress(ipv4, 0);
  if (rdma_bind_addr(id, reinterpret_cast<sockaddr*>(&sa)) != 0) {
    throw cmError("rdma_bind_addr", errno, fmt::format("cannot bind rdma_cm to {}", ipv4));
  }
  if (rdma_listen(id, backlog) != 0) {
    throw cmError("rdma_listen", errno, fmt::format("cannot listen on {}", ipv4));
  }
  return ntohs(rdma_get_src_port(id));
}

void resolveAddress(rdma_cm_id* id, const std::string& srcIpv4, const std::string& dstIpv4,
                    uint16_t dstPort, std::chrono::milliseconds timeout) {
  sockaddr_in src = makeAddress(srcIpv4, 0);
  sockaddr_in dst = makeAddress(dstIpv4, dstPort);
  if (rdma_resolve_addr(id, reinterpret_cast<sockaddr*>(&src), reinterpret_cast<sockaddr*>(&dst),
                        static_cast<int>(timeout.count())) != 0) {
    throw cmError("rdma_resolve_addr", errno,
                  fmt::format("cannot resolve {}:{}", dstIpv4, dstPort));
  }
}

void resolveRoute(rdma_cm_id* id, std::chrono::milliseconds timeout) {
  if (rdma_resolve_route(id, static_cast<int>(timeout.count())) != 0) {
    throw cmError("rdma_resolve_route", errno,
                  fmt::format("cannot resolve the route to {}", peerAddress(id)));
  }
}

void connect(rdma_cm_id* id, const ConnectParams& params) {
  rdma_conn_param param = connParam(params);
  if (rdma_connect(id, &param) != 0) {
    throw cmError("rdma_connect", errno, fmt::format("cannot connect to {}", peerAddress(id)));
  }
}

void accept(rdma_cm_id* id, const ConnectParams& params) {
  rdma_conn_param param = connParam(params);
  if (rdma_accept(id, &param) != 0) {
    throw cmError("rdma_accept", errno,
                  fmt::format("cannot accept a connection from {}", peerAddress(id)));
  }
}

void reject(rdma_cm_id* id, std::span<const uint8_t> data) noexcept {
  if (rdma_reject(id, data.data(), static_cast<uint8_t>(data.size())) != 0) {
    // EINVAL: the request is no longer pending - its sender withdrew it
    // (two ranks that connect to each other at once each drop the attempt
    // that loses, and the loser's withdrawal may arrive first): nothing to
    // reject, nothing wrong.
    const int error = errno;
    log(error == EINVAL ? LogLevel::Debug : LogLevel::Warn, "rdma_reject failed: {}",
        std::strerror(error));
  }
}

void establish(rdma_cm_id* id) {
  if (rdma_establish(id) != 0) {
    throw cmError("rdma_establish", errno,
                  fmt::format("cannot complete the connection to {}", peerAddress(id)));
  }
}

std::span<const uint8_t> privateData(const rdma_cm_event* event) {
  const auto& conn = event->param.conn;
  if (conn.private_data == nullptr) return {};
  return {static_cast<const uint8_t*>(conn.private_data), conn.private_data_len};
}

std::string eventName(rdma_cm_event_type type) {
  return rdma_event_str(type);
}

std::string peerAddress(const rdma_cm_id* id) {
  const sockaddr* sa = &const_cast<rdma_cm_id*>(id)->route.addr.dst_addr;
  if (sa->sa_family != AF_INET) return "?";
  const auto* in = reinterpret_cast<const sockaddr_in*>(sa);
  char text[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &in->sin_addr, text, sizeof text);
  return fmt::format("{}:{}", text, ntohs(in->sin_port));
}

}  // namespace rdmacc::verbs
