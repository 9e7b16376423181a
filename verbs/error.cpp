#include "verbs/error.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>

#include "rdmacc/topology.hpp"

namespace rdmacc::verbs {

Error verbsError(std::string call, int errnum, std::string message, std::string hint) {
  if (hint.empty() && (errnum == ENOMEM || errnum == EAGAIN)) {
    hint =
        "the device or the locked-memory limit ran out of resources; check `ulimit -l` "
        "and lower RDMACC_QPS_PER_PEER / RDMACC_QP_*_DEPTH";
  }
  return errnoError(ErrorKind::Verbs, std::move(call), errnum, std::move(message), std::move(hint));
}

Error cmError(std::string call, int errnum, std::string message, std::string hint) {
  if (hint.empty() && errnum == ENODEV) {
    hint =
        "the address is not on an RDMA-capable netdev (rdma_cm cannot use loopback 127.0.0.1 "
        "for RoCE); set RDMACC_SOCKET_IFNAME or RDMACC_IB_HCA";
  } else if (hint.empty() && errnum == EADDRNOTAVAIL) {
    hint = "the address is not configured on this host; check `ip addr`";
  }
  return errnoError(ErrorKind::ConnectionManager, std::move(call), errnum, std::move(message),
                    std::move(hint));
}

Error registrationError(int errnum, size_t bytes) {
  auto limit = lockedMemoryLimit();
  std::string hint =
      limit ? fmt::format(
                  "the locked-memory limit is {} KiB (ulimit -l); raise it to unlimited "
                  "(ulimit -l unlimited, or memlock in /etc/security/limits.conf, or "
                  "LimitMEMLOCK=infinity for systemd services, --ulimit memlock=-1 for docker)",
                  *limit / 1024)
            : std::string(
                  "the locked-memory limit is unlimited, so the device ran out of "
                  "translation resources; register fewer or smaller buffers");
  if (errnum == EFAULT || errnum == EINVAL)
    hint = "the buffer is not valid mapped memory of this process";
  return Error(
      ErrorInfo{.kind = ErrorKind::Registration,
                .message = fmt::format("cannot register {} bytes with the RDMA device", bytes),
                .call = "ibv_reg_mr",
                .errnum = errnum,
                .status = std::strerror(errnum),
                .hint = std::move(hint)});
}

std::string completionHint(ibv_wc_status status) {
  switch (status) {
    case IBV_WC_RETRY_EXC_ERR:
      return "the peer did not acknowledge: it died, or the path is broken (check the peer "
             "process, GID index and routing of RoCE v2; raise RDMACC_IB_TIMEOUT on slow fabrics)";
    case IBV_WC_RNR_RETRY_EXC_ERR:
      return "the peer had no receive posted for a message with immediate data";
    case IBV_WC_REM_ACCESS_ERR:
      return "the peer refused the write: remote key or address outside its registered region";
    case IBV_WC_LOC_PROT_ERR:
    case IBV_WC_LOC_ACCESS_ERR:
      return "a local buffer is not (or no longer) registered with this protection domain";
    case IBV_WC_WR_FLUSH_ERR:
      return "the queue pair had already failed; an earlier completion has the root cause";
    case IBV_WC_REM_OP_ERR:
    case IBV_WC_REM_INV_REQ_ERR:
      return "the peer could not execute the request (queue pair in error, or a protocol mismatch)";
    case IBV_WC_LOC_LEN_ERR:
      return "a message was longer than the receive buffer";
    default:
      return "";
  }
}

Error completionError(const ibv_wc& wc, int peerRank, const std::string& peerAddress,
                      const std::string& what) {
  return Error(ErrorInfo{
      .kind = wc.status == IBV_WC_RETRY_EXC_ERR ? ErrorKind::PeerFailure : ErrorKind::Completion,
      .message =
          fmt::format("{} completed with an error (vendor error {:#x})", what, wc.vendor_err),
      .call = "ibv_poll_cq",
      .errnum = static_cast<int>(wc.status),
      .status = ibv_wc_status_str(wc.status),
      .peerRank = peerRank,
      .peerAddress = peerAddress,
      .hint = completionHint(wc.status)});
}

}  // namespace rdmacc::verbs
