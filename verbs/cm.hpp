// librdmacm: event channel, ids, and the calls of the connection handshake.
#pragma once

#include <rdma/rdma_cma.h>

#include <chrono>
#include <cstdint>
#include <span>
#include <string>

#include "verbs/handles.hpp"

namespace rdmacc::verbs {

// A non-blocking event channel. Threading: one thread at a time.
class EventChannel {
 public:
  EventChannel();
  rdma_event_channel* get() const noexcept { return channel_.get(); }
  // Waits up to timeout for the next event; empty when none arrived.
  CmEventPtr next(std::chrono::milliseconds timeout);
  CmIdPtr createId();

 private:
  EventChannelPtr channel_;
};

// Binds to ipv4:port (port 0 = any) and returns the bound port.
uint16_t bindAndListen(rdma_cm_id* id, const std::string& ipv4, int backlog);
void resolveAddress(rdma_cm_id* id, const std::string& srcIpv4, const std::string& dstIpv4,
                    uint16_t dstPort, std::chrono::milliseconds timeout);
void resolveRoute(rdma_cm_id* id, std::chrono::milliseconds timeout);

struct ConnectParams {
  std::span<const uint8_t> privateData;
  uint32_t qpNum = 0;
  uint8_t retryCount = 7;
  uint8_t rnrRetry = 7;
};
void connect(rdma_cm_id* id, const ConnectParams& params);
void accept(rdma_cm_id* id, const ConnectParams& params);
void reject(rdma_cm_id* id, std::span<const uint8_t> privateData) noexcept;
void establish(rdma_cm_id* id);

std::span<const uint8_t> privateData(const rdma_cm_event* event);
std::string eventName(rdma_cm_event_type type);
std::string peerAddress(const rdma_cm_id* id);  // "ip:port" of the remote side

}  // namespace rdmacc::verbs
