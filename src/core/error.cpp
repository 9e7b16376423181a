#include "rdmacc/error.hpp"

#include <fmt/format.h>

#include <cstring>
#include <utility>

namespace rdmacc {

const char* toString(ErrorKind kind) noexcept {
  switch (kind) {
    case ErrorKind::InvalidArgument:
      return "invalid argument";
    case ErrorKind::NoDevice:
      return "no RDMA device";
    case ErrorKind::Verbs:
      return "verbs error";
    case ErrorKind::ConnectionManager:
      return "connection manager error";
    case ErrorKind::Completion:
      return "work completion error";
    case ErrorKind::Registration:
      return "memory registration error";
    case ErrorKind::Timeout:
      return "timeout";
    case ErrorKind::Store:
      return "store error";
    case ErrorKind::Protocol:
      return "protocol error";
    case ErrorKind::PeerFailure:
      return "peer failure";
    case ErrorKind::Aborted:
      return "aborted";
    case ErrorKind::Internal:
      return "internal error";
  }
  return "unknown error";
}

std::string Error::format(const ErrorInfo& info) {
  std::string out = fmt::format("rdmacc: {}: {}", toString(info.kind), info.message);
  if (!info.call.empty()) {
    out += fmt::format(" [{} failed", info.call);
    if (info.errnum != 0 || !info.status.empty()) {
      out += fmt::format(": {} ({})", info.status.empty() ? "?" : info.status, info.errnum);
    }
    out += "]";
  }
  if (info.peerRank >= 0) {
    out += fmt::format(" [peer rank {}", info.peerRank);
    if (!info.peerAddress.empty()) out += fmt::format(" at {}", info.peerAddress);
    out += "]";
  } else if (!info.peerAddress.empty()) {
    out += fmt::format(" [peer {}]", info.peerAddress);
  }
  if (!info.hint.empty()) out += fmt::format(" — hint: {}", info.hint);
  return out;
}

Error::Error(ErrorInfo info) : std::runtime_error(format(info)), info_(std::move(info)) {}

Error::Error(ErrorKind kind, std::string message, std::string hint)
    : Error(ErrorInfo{.kind = kind, .message = std::move(message), .hint = std::move(hint)}) {}

Error errnoError(ErrorKind kind, std::string call, int errnum, std::string message,
                 std::string hint) {
  return Error(ErrorInfo{.kind = kind,
                         .message = std::move(message),
                         .call = std::move(call),
                         .errnum = errnum,
                         .status = errnum != 0 ? std::strerror(errnum) : "",
                         .hint = std::move(hint)});
}

}  // namespace rdmacc
