// RAII owners for every ibv_/rdma_ object, defined once. Deleters are noexcept
// and log failures; owners of children are declared after their parents so
// that destruction order is right by construction.
#pragma once

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "rdmacc/log.hpp"

namespace rdmacc::verbs {

// For release functions that return 0 on success and an errno value (ibv_*)
// or -1 with errno set (rdma_*) on failure.
template <typename T, int (*Release)(T*), const char* Name>
struct Deleter {
  void operator()(T* p) const noexcept {
    if (p == nullptr) return;
    int rc = Release(p);
    if (rc != 0) {
      int err = rc > 0 ? rc : errno;
      log(LogLevel::Warn, "{} failed: {} (a resource leaks until the process exits)", Name,
          std::strerror(err));
    }
  }
};

template <typename T, void (*Release)(T*)>
struct VoidDeleter {
  void operator()(T* p) const noexcept {
    if (p != nullptr) Release(p);
  }
};

inline constexpr char kCloseDevice[] = "ibv_close_device";
inline constexpr char kDeallocPd[] = "ibv_dealloc_pd";
inline constexpr char kDeregMr[] = "ibv_dereg_mr";
inline constexpr char kDestroyCq[] = "ibv_destroy_cq";
inline constexpr char kDestroyCompChannel[] = "ibv_destroy_comp_channel";
inline constexpr char kDestroyQp[] = "ibv_destroy_qp";
inline constexpr char kDestroySrq[] = "ibv_destroy_srq";
inline constexpr char kDestroyId[] = "rdma_destroy_id";
inline constexpr char kDeallocMw[] = "ibv_dealloc_mw";
// ibv_dealloc_mw is an inline function of verbs.h: wrapped to have an address.
inline int deallocMw(ibv_mw* mw) {
  return ibv_dealloc_mw(mw);
}

using ContextPtr =
    std::unique_ptr<ibv_context, Deleter<ibv_context, ibv_close_device, kCloseDevice>>;
using PdPtr = std::unique_ptr<ibv_pd, Deleter<ibv_pd, ibv_dealloc_pd, kDeallocPd>>;
using MrPtr = std::unique_ptr<ibv_mr, Deleter<ibv_mr, ibv_dereg_mr, kDeregMr>>;
// A memory window: deallocated before the registration it was bound to
// (rxe refuses to deregister memory a window still covers).
using MwPtr = std::unique_ptr<ibv_mw, Deleter<ibv_mw, deallocMw, kDeallocMw>>;
using CqPtr = std::unique_ptr<ibv_cq, Deleter<ibv_cq, ibv_destroy_cq, kDestroyCq>>;
using CompChannelPtr =
    std::unique_ptr<ibv_comp_channel,
                    Deleter<ibv_comp_channel, ibv_destroy_comp_channel, kDestroyCompChannel>>;
using QpPtr = std::unique_ptr<ibv_qp, Deleter<ibv_qp, ibv_destroy_qp, kDestroyQp>>;
// Destroyed after every queue pair attached to it (ibv_destroy_srq refuses
// while one is).
using SrqPtr = std::unique_ptr<ibv_srq, Deleter<ibv_srq, ibv_destroy_srq, kDestroySrq>>;
using EventChannelPtr =
    std::unique_ptr<rdma_event_channel,
                    VoidDeleter<rdma_event_channel, rdma_destroy_event_channel>>;
using CmIdPtr = std::unique_ptr<rdma_cm_id, Deleter<rdma_cm_id, rdma_destroy_id, kDestroyId>>;
using DeviceListPtr = std::unique_ptr<ibv_device*, VoidDeleter<ibv_device*, ibv_free_device_list>>;

// An acknowledged-on-destruction rdma_cm event (rdma_destroy_id blocks until
// every event of the id has been acked, so events must not outlive a scope).
struct CmEventDeleter {
  void operator()(rdma_cm_event* e) const noexcept {
    if (e != nullptr) rdma_ack_cm_event(e);
  }
};
using CmEventPtr = std::unique_ptr<rdma_cm_event, CmEventDeleter>;

}  // namespace rdmacc::verbs
