#include "src/peer_errors.hpp"

#include <fmt/format.h>

namespace rdmacc {

Error peerGone(int peer, const std::string& address) {
  return Error(ErrorInfo{
      .kind = ErrorKind::PeerFailure,
      .message = fmt::format("rank {} disconnected", peer),
      .call = "rdma_get_cm_event",
      .status = "RDMA_CM_EVENT_DISCONNECTED",
      .peerRank = peer,
      .peerAddress = address,
      .hint = "its process exited or crashed, or destroyed its backend early; see its output"});
}

Error protocolViolation(int peer, const std::string& address, const wire::Violation& v) {
  return Error(ErrorInfo{
      .kind = ErrorKind::Protocol,
      .message = fmt::format("rank {} sent {}", peer, v.what),
      .peerRank = peer,
      .peerAddress = address,
      .hint = "every rank must run the same rdmacc version with the same RDMACC_SLOTS_PER_PEER "
              "and RDMACC_SLOT_BYTES; anything else is a bug or a stranger on the network"});
}

}  // namespace rdmacc
