#include "verbs/qp.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <functional>
#include <vector>

#include <fmt/format.h>

#include "verbs/error.hpp"

namespace rdmacc::verbs {

CompletionQueue::CompletionQueue(ibv_context* context, int entries) {
  channel_.reset(ibv_create_comp_channel(context));
  if (!channel_) {
    throw verbsError("ibv_create_comp_channel", errno, "cannot create a completion channel");
  }
  int flags = ::fcntl(channel_->fd, F_GETFL);
  if (flags < 0 || ::fcntl(channel_->fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    throw verbsError("fcntl", errno, "cannot make the completion channel non-blocking");
  }
  ibv_device_attr attr{};
  maxEntries_ = ibv_query_device(context, &attr) == 0 ? attr.max_cqe : entries;
  cq_.reset(ibv_create_cq(context, entries, nullptr, channel_.get(), 0));
  if (!cq_) {
    throw verbsError("ibv_create_cq", errno,
                     fmt::format("cannot create a completion queue of {} entries", entries));
  }
}

void CompletionQueue::reserve(int entries) {
  entries = std::min(entries, maxEntries_);
  if (entries <= cq_->cqe) return;
  if (int rc = ibv_resize_cq(cq_.get(), entries); rc != 0) {
    throw verbsError(
        "ibv_resize_cq", rc,
        fmt::format("cannot grow the completion queue from {} to {} entries", cq_->cqe, entries));
  }
}

int CompletionQueue::poll(std::span<ibv_wc> wcs) {
  int n = ibv_poll_cq(cq_.get(), static_cast<int>(wcs.size()), wcs.data());
  if (n < 0) throw verbsError("ibv_poll_cq", EIO, "polling the completion queue failed");
  return n;
}

void CompletionQueue::arm() {
  if (int rc = ibv_req_notify_cq(cq_.get(), 0); rc != 0) {
    throw verbsError("ibv_req_notify_cq", rc, "cannot arm the completion queue");
  }
}

void CompletionQueue::drainEvents() {
  ibv_cq* cq = nullptr;
  void* ctx = nullptr;
  unsigned events = 0;
  while (ibv_get_cq_event(channel_.get(), &cq, &ctx) == 0) ++events;
  if (events > 0) ibv_ack_cq_events(cq_.get(), events);
}

PdPtr allocatePd(ibv_context* context) {
  PdPtr pd(ibv_alloc_pd(context));
  if (!pd) throw verbsError("ibv_alloc_pd", errno, "cannot allocate a protection domain");
  return pd;
}

MrPtr registerMemory(ibv_pd* pd, void* addr, size_t length, int access) {
  MrPtr mr(ibv_reg_mr(pd, addr, length, access));
  if (!mr) throw registrationError(errno, length);
  return mr;
}

bool supportsBoundWindows(ibv_context* context) {
  ibv_device_attr attr{};
  if (ibv_query_device(context, &attr) != 0) return false;
  return attr.max_mw > 0 && (attr.device_cap_flags &
                             (IBV_DEVICE_MEM_WINDOW_TYPE_2A | IBV_DEVICE_MEM_WINDOW_TYPE_2B)) != 0;
}

Window allocateWindow(ibv_pd* pd) {
  MwPtr mw(ibv_alloc_mw(pd, IBV_MW_TYPE_2));
  if (!mw) throw verbsError("ibv_alloc_mw", errno, "cannot allocate a memory window");
  const uint32_t rkey = ibv_inc_rkey(mw->rkey);
  return {std::move(mw), rkey};
}

void bindWindow(ibv_qp* qp, const Window& window, ibv_mr* mr, const void* addr, size_t length,
                uint64_t wrId, const std::string& forWhom) {
  ibv_send_wr wr{};
  wr.wr_id = wrId;
  wr.opcode = IBV_WR_BIND_MW;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.bind_mw.mw = window.mw.get();
  wr.bind_mw.rkey = window.rkey;
  wr.bind_mw.bind_info.mr = mr;
  wr.bind_mw.bind_info.addr = reinterpret_cast<uintptr_t>(addr);
  wr.bind_mw.bind_info.length = length;
  wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;
  ibv_send_wr* bad = nullptr;
  if (int rc = ibv_post_send(qp, &wr, &bad); rc != 0) {
    throw verbsError("ibv_post_send", rc, fmt::format("binding a memory window for {}", forWhom));
  }
}

QpPtr createRcQp(ibv_pd* pd, ibv_cq* cq, const QpParams& params, ibv_srq* srq) {
  ibv_qp_init_attr init{};
  init.send_cq = cq;
  init.recv_cq = cq;
  init.srq = srq;
  init.qp_type = IBV_QPT_RC;
  init.sq_sig_all = 0;
  init.cap.max_send_wr = params.sendDepth + kBindEntries;
  init.cap.max_recv_wr = srq != nullptr ? 0 : params.recvDepth;
  init.cap.max_send_sge = 2;  // header + zero-copy payload
  init.cap.max_recv_sge = srq != nullptr ? 0 : 1;
  init.cap.max_inline_data = params.maxInline;
  QpPtr qp(ibv_create_qp(pd, &init));
  // Devices differ in how much inline data they allow (some none at all).
  for (uint32_t fallback : {64u, 0u}) {
    if (qp || init.cap.max_inline_data <= fallback) continue;
    init.cap.max_inline_data = fallback;
    qp.reset(ibv_create_qp(pd, &init));
  }
  if (!qp) {
    throw verbsError("ibv_create_qp", errno,
                     fmt::format("cannot create an RC queue pair (send depth {}, receive depth {})",
                                 params.sendDepth, params.recvDepth));
  }
  return qp;
}

namespace {

void modify(ibv_qp* qp, rdma_cm_id* id, ibv_qp_state state,
            const std::function<void(ibv_qp_attr&, int&)>& adjust, const char* name) {
  ibv_qp_attr attr{};
  int mask = 0;
  attr.qp_state = state;
  if (rdma_init_qp_attr(id, &attr, &mask) != 0) {
    throw cmError("rdma_init_qp_attr", errno,
                  fmt::format("cannot compute the {} attributes of a queue pair", name));
  }
  adjust(attr, mask);
  if (int rc = ibv_modify_qp(qp, &attr, mask); rc != 0) {
    throw verbsError(
        "ibv_modify_qp", rc, fmt::format("cannot move a queue pair to {}", name),
        state == IBV_QPS_RTR ? "check RDMACC_IB_GID_INDEX (RoCE v2 GID) and RDMACC_IB_MTU" : "");
  }
}

}  // namespace

void moveToInit(ibv_qp* qp, rdma_cm_id* id) {
  modify(
      qp, id, IBV_QPS_INIT, [](ibv_qp_attr& a, int&) { a.qp_access_flags = kRemoteWriteAccess; },
      "INIT");
}

void moveToRtr(ibv_qp* qp, rdma_cm_id* id, const QpParams& p) {
  modify(
      qp, id, IBV_QPS_RTR,
      [&](ibv_qp_attr& a, int& mask) {
        a.path_mtu = p.pathMtu;
        a.min_rnr_timer = p.minRnrTimer;
        mask |= IBV_QP_PATH_MTU | IBV_QP_MIN_RNR_TIMER;
        if (a.ah_attr.is_global) {
          a.ah_attr.grh.sgid_index = static_cast<uint8_t>(p.gidIndex);
          a.ah_attr.grh.traffic_class = p.trafficClass;
        }
        a.ah_attr.sl = p.serviceLevel;
      },
      "RTR");
}

void moveToRts(ibv_qp* qp, rdma_cm_id* id, const QpParams& p) {
  modify(
      qp, id, IBV_QPS_RTS,
      [&](ibv_qp_attr& a, int& mask) {
        a.timeout = p.ackTimeout;
        a.retry_cnt = p.retryCount;
        a.rnr_retry = p.rnrRetry;
        mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY;
      },
      "RTS");
}

int postWrites(ibv_qp* qp, std::span<const WriteRequest> requests) {
  constexpr size_t kMax = 4;
  if (requests.empty()) return 0;
  if (requests.size() > kMax) return EINVAL;
  std::array<std::array<ibv_sge, 2>, kMax> sges{};
  std::array<ibv_send_wr, kMax> wrs{};
  for (size_t i = 0; i < requests.size(); ++i) {
    const WriteRequest& r = requests[i];
    int n = 0;
    if (r.length > 0) sges[i][n++] = {reinterpret_cast<uintptr_t>(r.local), r.length, r.lkey};
    if (r.length2 > 0) sges[i][n++] = {reinterpret_cast<uintptr_t>(r.local2), r.length2, r.lkey2};
    ibv_send_wr& wr = wrs[i];
    wr.wr_id = r.wrId;
    wr.sg_list = n > 0 ? sges[i].data() : nullptr;
    wr.num_sge = n;
    wr.opcode = r.imm ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
    if (r.imm) wr.imm_data = htonl(*r.imm);
    wr.send_flags = (r.signaled ? IBV_SEND_SIGNALED : 0) | (r.inlineData ? IBV_SEND_INLINE : 0);
    wr.wr.rdma.remote_addr = r.remoteAddr;
    wr.wr.rdma.rkey = r.rkey;
    wr.next = i + 1 < requests.size() ? &wrs[i + 1] : nullptr;
  }
  ibv_send_wr* bad = nullptr;
  return ibv_post_send(qp, wrs.data(), &bad);
}

int postWrite(ibv_qp* qp, const WriteRequest& request) {
  return postWrites(qp, std::span(&request, 1));
}

namespace {

// Posts count empty receives through post (ibv_post_recv or ibv_post_srq_recv).
template <typename Queue, typename Post>
int postEmpty(Queue* queue, uint64_t wrId, uint32_t count, Post post) {
  if (count == 1) {  // the data path's case (one repost per arrival): no allocation
    ibv_recv_wr wr{};
    wr.wr_id = wrId;
    ibv_recv_wr* bad = nullptr;
    return post(queue, &wr, &bad);
  }
  std::vector<ibv_recv_wr> wrs(count);
  for (uint32_t i = 0; i < count; ++i) {
    wrs[i].wr_id = wrId;
    wrs[i].next = i + 1 < count ? &wrs[i + 1] : nullptr;
  }
  ibv_recv_wr* bad = nullptr;
  return count == 0 ? 0 : post(queue, wrs.data(), &bad);
}

}  // namespace

int postEmptyRecvs(ibv_qp* qp, uint64_t wrId, uint32_t count) {
  return postEmpty(qp, wrId, count, [](ibv_qp* q, ibv_recv_wr* wr, ibv_recv_wr** bad) {
    return ibv_post_recv(q, wr, bad);
  });
}

int postEmptyRecvs(ibv_srq* srq, uint64_t wrId, uint32_t count) {
  return postEmpty(srq, wrId, count, [](ibv_srq* q, ibv_recv_wr* wr, ibv_recv_wr** bad) {
    return ibv_post_srq_recv(q, wr, bad);
  });
}

uint32_t srqCapacity(ibv_srq* srq) {
  ibv_srq_attr attr{};
  return ibv_query_srq(srq, &attr) == 0 ? attr.max_wr : 0;
}

SrqPtr createSrq(ibv_pd* pd, uint32_t entries) {
  ibv_device_attr attr{};
  if (ibv_query_device(pd->context, &attr) != 0 || attr.max_srq <= 0 || attr.max_srq_wr <= 0) {
    return nullptr;
  }
  ibv_srq_init_attr init{};
  init.attr.max_wr = std::min(entries, static_cast<uint32_t>(attr.max_srq_wr));
  init.attr.max_sge = 1;
  SrqPtr srq(ibv_create_srq(pd, &init));
  if (!srq) {
    log(LogLevel::Debug, "ibv_create_srq ({} entries) failed: {}; receive queues per queue pair",
        init.attr.max_wr, std::strerror(errno));
  }
  return srq;
}

}  // namespace rdmacc::verbs

namespace rdmacc::verbs {
uint32_t maxInlineData(ibv_qp* qp) {
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  if (ibv_query_qp(qp, &attr, IBV_QP_CAP, &init) != 0) return 0;
  return init.cap.max_inline_data;
}
}  // namespace rdmacc::verbs
