// Mapping verbs and rdma_cm failures to rdmacc::Error with a hint that says what to do.
#pragma once

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <string>

#include "rdmacc/error.hpp"

namespace rdmacc::verbs {

// ibv_post_send, ibv_modify_qp, ... RETURN the errno: pass it as errnum.
// Calls that return NULL or -1 set errno: pass errno.
Error verbsError(std::string call, int errnum, std::string message, std::string hint = {});
Error cmError(std::string call, int errnum, std::string message, std::string hint = {});

// ibv_reg_mr failed with errnum: the hint names the locked-memory limit.
Error registrationError(int errnum, size_t bytes);

// A work completion with status != IBV_WC_SUCCESS.
Error completionError(const ibv_wc& wc, int peerRank, const std::string& peerAddress,
                      const std::string& what);
std::string completionHint(ibv_wc_status status);

}  // namespace rdmacc::verbs
