#include "src/transport/peer_errors.hpp"

#include <fmt/format.h>

namespace rdmacc {

Error peerGone(int peer, const std::string& address, const Departure& how) {
  return Error(ErrorInfo{
      .kind = ErrorKind::PeerFailure,
      .message = fmt::format("rank {} disconnected", peer),
      .call = how.call,
      .status = how.status,
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

Error boardMismatch(int peer, const std::string& address, uint64_t sequence,
                    uint64_t postedSequence, uint64_t postedBytes, uint64_t postedCheck,
                    uint64_t bytes, uint64_t check) {
  return Error(ErrorInfo{
      .kind = ErrorKind::Protocol,
      .message = fmt::format(
          "collective #{} does not match on rank {}: it posted {} bytes (check {:#x}){} to its "
          "one-shot board, this rank {} bytes (check {:#x})",
          sequence, peer, postedBytes, postedCheck,
          postedSequence == sequence ? "" : fmt::format(" for collective #{}", postedSequence),
          bytes, check),
      .peerRank = peer,
      .peerAddress = address,
      .hint = "every rank must call the same collectives in the same order with the same sizes, "
              "types and options"});
}

}  // namespace rdmacc
