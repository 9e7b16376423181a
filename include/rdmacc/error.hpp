// rdmacc::Error — the one error type of rdmacc.
#pragma once

#include <stdexcept>
#include <string>

namespace rdmacc {

// What failed, coarse enough for callers to branch on.
enum class ErrorKind {
  InvalidArgument,    // bad input from the caller or the environment
  NoDevice,           // no usable RDMA device / port / GID
  Verbs,              // an ibv_* call failed
  ConnectionManager,  // an rdma_* (librdmacm) call or event failed
  Completion,         // a work completion came back with an error status
  Registration,       // memory registration failed
  Timeout,            // a deadline passed
  Store,              // the rendezvous store failed or is unreachable
  Protocol,           // a peer spoke an unexpected protocol
  PeerFailure,        // a peer died or broke the connection
  Aborted,            // the operation was aborted by the user
  Internal,           // a bug in rdmacc
};

const char* toString(ErrorKind kind) noexcept;

// Everything an operator needs to act on a failure: the call that failed, the
// errno or work-completion status (number and text), the peer involved and a
// hint that says what to do. what() renders all of it in one line.
struct ErrorInfo {
  ErrorKind kind = ErrorKind::Internal;
  std::string message;      // what went wrong, in words
  std::string call;         // e.g. "ibv_reg_mr", "rdma_resolve_addr"; empty if none
  int errnum = 0;           // errno or ibv_wc_status value; 0 if none
  std::string status;       // strerror(errnum) or ibv_wc_status_str(); empty if none
  int peerRank = -1;        // -1 if no peer is involved
  std::string peerAddress;  // GID or ip:port of the peer, if known
  std::string hint;         // what to do about it; empty if nothing useful to say
};

class Error : public std::runtime_error {
 public:
  explicit Error(ErrorInfo info);
  Error(ErrorKind kind, std::string message, std::string hint = {});

  const ErrorInfo& info() const noexcept { return info_; }
  ErrorKind kind() const noexcept { return info_.kind; }
  int peerRank() const noexcept { return info_.peerRank; }

  // Renders the one-line message used by what().
  static std::string format(const ErrorInfo& info);

 private:
  ErrorInfo info_;
};

// An Error for a failed system/library call whose error number is errnum.
Error errnoError(ErrorKind kind, std::string call, int errnum, std::string message,
                 std::string hint = {});

}  // namespace rdmacc
