// Devices, ports and GID tables.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "rdmacc/topology.hpp"
#include "verbs/handles.hpp"

namespace rdmacc::verbs {

// Opens the device by name; throws Error(NoDevice) listing the devices there are.
ContextPtr openDevice(const std::string& name);
PortInfo queryPort(ibv_context* context, int port);

int mtuBytes(ibv_mtu mtu) noexcept;
// Largest enum not above bytes (bytes >= 256).
ibv_mtu mtuFromBytes(int bytes) noexcept;

// The device's asynchronous events (port up/down, a queue pair or the CQ in
// error, the device failed). makeAsyncNonBlocking once, after opening;
// takeAsyncEvents returns (and acknowledges) every event pending, never
// blocking.
struct AsyncEvent {
  ibv_event_type type;
  const char* name;        // ibv_event_type_str
  ibv_qp* qp = nullptr;    // the queue pair, for QP events
  ibv_cq* cq = nullptr;    // the completion queue, for IBV_EVENT_CQ_ERR
  ibv_srq* srq = nullptr;  // the shared receive queue, for SRQ events
  int port = 0;            // the port, for port events
  // This user read it from the device (SharedDevice): the one that reports
  // what concerns every user alike, such as a port going down, so that it
  // is reported once per process, not once per group.
  bool first = true;
};
void makeAsyncNonBlocking(ibv_context* context);
std::vector<AsyncEvent> takeAsyncEvents(ibv_context* context);

// The process's open context of one device, shared by every group that uses
// it (NCCL and UCX likewise open a device once per process): a DeviceMesh's
// groups do not open the device once each. Each group keeps its own
// protection domain, queues and connections (its failure domain). The
// device's asynchronous events go to every user: whichever asks first reads
// them from the device (AsyncEvent::first) and the others find them in
// their own mailbox at their next look (each acts on those about its own
// queue pairs, completion queue and shared receive queues).
// Thread-safe; a process forked after opening opens its own.
class SharedDevice {
 public:
  // The process's context of device `name`, opened (non-blocking events) on
  // first use and closed with its last user. Throws as openDevice does.
  static std::shared_ptr<SharedDevice> open(const std::string& name);
  ~SharedDevice();
  SharedDevice(const SharedDevice&) = delete;
  SharedDevice& operator=(const SharedDevice&) = delete;

  ibv_context* context() const noexcept { return context_.get(); }
  // A mailbox for one user's events, from now on; dropped by unsubscribe.
  int subscribe();
  void unsubscribe(int mailbox);
  // Every event the device reported since the mailbox's last look.
  std::vector<AsyncEvent> takeAsyncEvents(int mailbox);

 private:
  explicit SharedDevice(ContextPtr context) : context_(std::move(context)) {}
  ContextPtr context_;
  std::mutex mutex_;
  int nextMailbox_ = 0;
  std::map<int, std::vector<AsyncEvent>> mailboxes_;
};

// The text that tells a user with no device how to get one.
std::string noDeviceHint();

// The IPv4 address (host byte order) of a network interface, or of the
// IPoIB interface of an InfiniBand port; none when it has none.
std::optional<uint32_t> interfaceIpv4(const std::string& ifname);
std::optional<uint32_t> ipoibAddress(const std::string& device, int port);

}  // namespace rdmacc::verbs
