#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <thread>

#include <fmt/format.h>

#include "rdmacc/error.hpp"
#include "src/core/buffer.hpp"
#include "src/store/store_util.hpp"
#include "src/transport/rdma/mesh.hpp"
#include "src/transport/rdma/wr_id.hpp"
#include "tools/src/write_bench.hpp"
#include "verbs/error.hpp"

namespace rdmacc {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kPeerTimeout = std::chrono::seconds(60);
// Selective signaling: one signaled WR per kSignalEvery; the unsignaled run
// must stay well below the smallest send queue the config table allows.
constexpr int kSignalEvery = 8;
constexpr int kMinSendDepth = 16;
static_assert(kSignalEvery * 2 <= kMinSendDepth,
              "unsignaled run too long for the smallest send queue");

constexpr uint32_t kImmDone = 0x1;     // rank 0 -> 1: a bandwidth run finished
constexpr uint32_t kImmIntact = 0x2;   // rank 1 -> 0: data verified
constexpr uint32_t kImmCorrupt = 0x3;  // rank 1 -> 0: data differs
constexpr uint32_t kImmReady = 0x4;    // both ways: latency flag cleared

// perftest's statistics of the samples (microseconds) into r.
void summarize(std::vector<double>& samples, LatencyResult& r) {
  std::sort(samples.begin(), samples.end());
  auto at = [&](double q) {
    return samples[std::min(samples.size() - 1, static_cast<size_t>(q * samples.size()))];
  };
  double sum = 0, sq = 0;
  for (double v : samples) sum += v;
  r.averageUs = sum / static_cast<double>(samples.size());
  for (double v : samples) sq += (v - r.averageUs) * (v - r.averageUs);
  r.stdevUs = std::sqrt(sq / static_cast<double>(samples.size()));
  r.minUs = samples.front();
  r.maxUs = samples.back();
  r.typicalUs = at(0.5);
  r.p99Us = at(0.99);
  r.p999Us = at(0.999);
}

uint8_t patternByte(size_t i, size_t bytes) {
  return static_cast<uint8_t>((i * 131 + bytes * 7 + 1) & 0xff);
}

}  // namespace

struct WriteBench::Impl {
  std::shared_ptr<Store> store;
  int rank;
  int peer;
  WriteBenchOptions options;
  std::unique_ptr<Mesh> mesh;
  PageBuffer source;      // what this rank writes from
  PageBuffer target;      // what the peer writes into
  verbs::MrPtr sourceMr;  // after the mesh (its PD): deregistered first
  verbs::MrPtr targetMr;
  uint64_t peerAddr = 0;
  uint32_t peerRkey = 0;
  ibv_qp* qp = nullptr;
  uint32_t maxInline = 0;
  int txDepth = 0;
  int outstanding = 0;  // posted, not yet completed, send WRs
  std::vector<uint32_t> imms;
  int completed = 0;                                     // send WRs completed since the last reset
  std::vector<std::pair<int, Clock::time_point>> marks;  // (completed, when)

  void post(const void* local, uint32_t lkey, size_t bytes, uint64_t remote, bool signaled,
            int covered, std::optional<uint32_t> imm = std::nullopt) {
    verbs::WriteRequest w{.wrId = pack(WrId{.kind = imm ? WrKind::WriteImm : WrKind::Write,
                                            .peer = static_cast<uint16_t>(peer),
                                            .tag = static_cast<uint32_t>(covered)}),
                          .local = local,
                          .lkey = lkey,
                          .length = static_cast<uint32_t>(bytes),
                          .remoteAddr = remote,
                          .rkey = peerRkey,
                          .imm = imm,
                          .signaled = signaled,
                          .inlineData = bytes > 0 && bytes <= maxInline};
    if (int rc = verbs::postWrite(qp, w); rc != 0) {
      throw verbs::verbsError("ibv_post_send", rc,
                              fmt::format("posting an RDMA write of {} bytes", bytes));
    }
    ++outstanding;
  }

  // Polls once; returns the number of completions seen.
  int progress() {
    std::array<ibv_wc, 32> wcs;
    int n = mesh->cq().poll(wcs);
    bool sends = false;
    for (int i = 0; i < n; ++i) {
      const ibv_wc& wc = wcs[static_cast<size_t>(i)];
      WrId id = unpack(wc.wr_id);
      if (wc.status != IBV_WC_SUCCESS) {
        throw verbs::completionError(wc, peer, mesh->peerAddress(peer),
                                     id.kind == WrKind::Recv ? "a receive" : "an RDMA write");
      }
      if (id.kind == WrKind::Recv) {
        imms.push_back(ntohl(wc.imm_data));
        if (int rc = verbs::postEmptyRecvs(qp, wc.wr_id, 1); rc != 0) {
          throw verbs::verbsError("ibv_post_recv", rc, "reposting a receive");
        }
      } else {
        outstanding -= static_cast<int>(id.tag);
        completed += static_cast<int>(id.tag);
        sends = true;
      }
    }
    // One mark per poll: completions reaped together carry no timing between them.
    if (sends) marks.emplace_back(completed, Clock::now());
    return n;
  }

  uint32_t waitImm() {
    auto deadline = Clock::now() + kPeerTimeout;
    while (imms.empty()) {
      progress();
      if (Clock::now() > deadline) peerTimeout("a control message");
    }
    uint32_t v = imms.front();
    imms.erase(imms.begin());
    return v;
  }

  void sendImm(uint32_t imm) {
    post(nullptr, 0, 0, peerAddr, true, 1, imm);
    drain();
  }

  // After a latency run: completes the unsignaled tail (sinceSignal writes
  // since the last signaled one), so that the next run starts with an
  // empty queue.
  void settle(int sinceSignal) {
    if (sinceSignal > 0) post(source.data(), sourceMr->lkey, 0, peerAddr, true, sinceSignal + 1);
    drain();
    marks.clear();
  }

  void drain() {
    auto deadline = Clock::now() + kPeerTimeout;
    while (outstanding > 0) {
      progress();
      if (Clock::now() > deadline) peerTimeout("completions of our writes");
    }
  }

  [[noreturn]] void peerTimeout(const char* what) {
    throw Error(ErrorInfo{
        .kind = ErrorKind::Timeout,
        .message = fmt::format("waited {} s for {} from rank {}", kPeerTimeout.count(), what, peer),
        .peerRank = peer,
        .peerAddress = mesh->peerAddress(peer),
        .hint = "the peer process may have died or be stuck; see its output"});
  }
};

WriteBench::WriteBench(std::shared_ptr<Store> store, int rank, int size, const Config& config,
                       WriteBenchOptions options)
    : impl_(std::make_unique<Impl>()) {
  if (size != 2) {
    throw Error(ErrorKind::InvalidArgument,
                fmt::format("the write benchmark runs between exactly 2 ranks, not {}", size),
                "launch it with 2 ranks: rdmacc-run -n 2 -- rdmacc-perf -c write");
  }
  auto& s = *impl_;
  s.store = std::move(store);
  s.rank = rank;
  s.peer = 1 - rank;
  s.options = options;
  s.mesh =
      std::make_unique<Mesh>(*s.store, rank, size, config, MeshOptions{.group = options.group});
  size_t bytes = std::max<size_t>(options.maxBytes, 64);
  s.source = PageBuffer(bytes);
  s.target = PageBuffer(bytes);
  s.sourceMr =
      verbs::registerMemory(s.mesh->pd(), s.source.data(), bytes, verbs::kRemoteWriteAccess);
  s.targetMr =
      verbs::registerMemory(s.mesh->pd(), s.target.data(), bytes, verbs::kRemoteWriteAccess);
  s.qp = s.mesh->qp(s.peer);
  s.maxInline = verbs::maxInlineData(s.qp);
  s.txDepth =
      std::clamp(options.txDepth, 1, static_cast<int>(s.mesh->qpParams().sendDepth) - kSignalEvery);

  PrefixStore group("rdmacc/bench/" + options.group, s.store);
  group.set(fmt::format("mr/{}", rank),
            toBytes(fmt::format("{}:{}", reinterpret_cast<uintptr_t>(s.target.data()),
                                s.targetMr->rkey)));
  std::string peerMr = toString(group.get(fmt::format("mr/{}", s.peer)));
  auto colon = peerMr.find(':');
  const std::string key = fmt::format("mr/{}", s.peer);
  if (colon == std::string::npos) {
    throw Error(ErrorKind::Protocol,
                fmt::format("rank {} published '{}' as {}", s.peer, peerMr, key));
  }
  s.peerAddr = storeNumber(std::string_view(peerMr).substr(0, colon), UINT64_MAX, key);
  s.peerRkey = static_cast<uint32_t>(
      storeNumber(std::string_view(peerMr).substr(colon + 1), UINT32_MAX, key));
}

WriteBench::~WriteBench() = default;

std::string WriteBench::describe() const {
  const auto& ep = impl_->mesh->endpoint();
  return fmt::format("{}:{}, GID {} ({}, {}), path MTU {}, inline <= {} B, tx depth {}", ep.device,
                     ep.port, ep.gidIndex, ep.gid, ep.gidType, impl_->mesh->pathMtu(impl_->peer),
                     impl_->maxInline, impl_->txDepth);
}

BandwidthResult WriteBench::bandwidth(size_t bytes, int iterations, int warmup) {
  auto& s = *impl_;
  if (bytes > s.source.size() || iterations < 1 || warmup < 0) {
    throw Error(
        ErrorKind::InvalidArgument,
        fmt::format("bandwidth run of {} bytes x {} iterations does not fit (buffer {} bytes)",
                    bytes, iterations, s.source.size()));
  }
  BandwidthResult r{.bytes = bytes, .iterations = iterations};
  if (s.rank == 1) {
    if (s.waitImm() != kImmDone)
      throw Error(ErrorKind::Protocol, "write benchmark ranks are out of step");
    bool intact = true;
    for (size_t i = 0; i < bytes && intact; ++i)
      intact = s.target.data()[i] == patternByte(i, bytes);
    std::fill(s.target.data(), s.target.data() + bytes, 0);
    s.sendImm(intact ? kImmIntact : kImmCorrupt);
    r.dataIntact = intact;
    return r;
  }
  for (size_t i = 0; i < bytes; ++i) s.source.data()[i] = patternByte(i, bytes);
  const int total = warmup + iterations;
  Clock::time_point start{};
  int posted = 0, signaledUpTo = 0;
  auto deadline =
      Clock::now() + kPeerTimeout + std::chrono::seconds(static_cast<int64_t>(iterations) / 1000);
  while (posted < total || s.outstanding > 0) {
    while (posted < total && s.outstanding < s.txDepth) {
      if (posted == warmup) {
        s.drain();
        start = Clock::now();
        s.completed = 0;
        s.marks.assign(1, {0, start});
      }
      ++posted;
      bool signaled = posted % kSignalEvery == 0 || posted == total || posted == warmup;
      int covered = signaled ? posted - signaledUpTo : 0;
      if (signaled) signaledUpTo = posted;
      s.post(s.source.data(), s.sourceMr->lkey, bytes, s.peerAddr, signaled, covered);
    }
    s.progress();
    if (Clock::now() > deadline) s.peerTimeout("completions of our writes");
  }
  constexpr double kMB = 1024.0 * 1024.0;  // perftest's MB
  auto rate = [&](size_t from, size_t to) {
    double sec = std::chrono::duration<double>(s.marks[to].second - s.marks[from].second).count();
    return sec > 0
               ? static_cast<double>(bytes) * (s.marks[to].first - s.marks[from].first) / sec / kMB
               : 0.0;
  };
  double seconds = std::chrono::duration<double>(s.marks.back().second - start).count();
  r.averageMBps = rate(0, s.marks.size() - 1);
  r.messageRateMpps = seconds > 0 ? iterations / seconds / 1e6 : 0;
  // Peak: the best stretch of at least 1/16 of the run (perftest takes the best iteration).
  const int window = std::max(4 * kSignalEvery, iterations / 16);
  for (size_t i = 0, j = 0; i < s.marks.size(); ++i) {
    while (j < s.marks.size() && s.marks[j].first - s.marks[i].first < window) ++j;
    if (j == s.marks.size()) break;
    r.peakMBps = std::max(r.peakMBps, rate(i, j));
  }
  r.peakMBps = std::max(r.peakMBps, r.averageMBps);
  s.sendImm(kImmDone);
  r.dataIntact = s.waitImm() == kImmIntact;
  return r;
}

LatencyResult WriteBench::latency(size_t bytes, int iterations, int warmup) {
  auto& s = *impl_;
  if (bytes < 1 || bytes > s.source.size() || iterations < 1 || warmup < 0) {
    throw Error(
        ErrorKind::InvalidArgument,
        fmt::format(
            "latency run needs 1..{} bytes and >= 1 iteration (got {} bytes, {} iterations)",
            s.source.size(), bytes, iterations));
  }
  LatencyResult r{.bytes = bytes, .iterations = iterations};
  std::vector<double> samples;
  samples.reserve(static_cast<size_t>(iterations));
  uint8_t* flag = s.target.data() + bytes - 1;
  uint8_t* mine = s.source.data() + bytes - 1;
  // Clear our flag, then tell the peer: it pings only after our "ready", so a
  // fast peer's first ping can never be wiped by the clear.
  *flag = 0;
  s.sendImm(kImmReady);
  if (s.waitImm() != kImmReady)
    throw Error(ErrorKind::Protocol, "write benchmark ranks are out of step");
  int sinceSignal = 0;
  auto wait = [&](uint8_t value) {
    auto deadline = Clock::now() + kPeerTimeout;
    int spins = 0;
    while (std::atomic_ref<uint8_t>(*flag).load(std::memory_order_acquire) != value) {
      if (++spins % 1024 == 0) {
        s.progress();
        if (Clock::now() > deadline) s.peerTimeout("a latency ping");
      }
    }
  };
  auto send = [&](uint8_t value) {
    *mine = value;
    bool signaled = ++sinceSignal == kSignalEvery;
    if (signaled) sinceSignal = 0;
    s.post(s.source.data(), s.sourceMr->lkey, bytes, s.peerAddr, signaled,
           signaled ? kSignalEvery : 0);
    if (s.outstanding >= s.txDepth / 2) s.progress();
  };
  for (int i = 0; i < warmup + iterations; ++i) {
    auto value = static_cast<uint8_t>(i % 255 + 1);
    if (s.rank == 0) {
      auto t0 = Clock::now();
      send(value);
      wait(value);
      if (i >= warmup)
        samples.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / 2);
    } else {
      wait(value);
      send(value);
    }
  }
  s.settle(sinceSignal);
  if (s.rank == 1) return r;
  summarize(samples, r);
  return r;
}

LatencyResult WriteBench::exchange(size_t bytes, int iterations, int warmup, bool pingPong) {
  auto& s = *impl_;
  if (bytes > s.maxInline || iterations < 1 || warmup < 0) {
    throw Error(ErrorKind::InvalidArgument,
                fmt::format("an exchange run needs 0..{} bytes (inline) and >= 1 iteration (got {} "
                            "bytes, {} iterations)",
                            s.maxInline, bytes, iterations));
  }
  LatencyResult r{.bytes = bytes, .iterations = iterations};
  std::vector<double> samples;
  samples.reserve(static_cast<size_t>(iterations));
  // In step: the peer's receives are posted and its CQ empty of old arrivals.
  s.sendImm(kImmReady);
  if (s.waitImm() != kImmReady)
    throw Error(ErrorKind::Protocol, "write benchmark ranks are out of step");
  int sinceSignal = 0;
  auto send = [&](uint32_t imm) {
    bool signaled = ++sinceSignal == kSignalEvery;
    if (signaled) sinceSignal = 0;
    s.post(s.source.data(), s.sourceMr->lkey, bytes, s.peerAddr, signaled,
           signaled ? kSignalEvery : 0, imm);
  };
  // The payload's immediate carries the iteration (in the range of no
  // control message), so a stray arrival cannot pass for one.
  auto receive = [&](uint32_t expected) {
    auto deadline = Clock::now() + kPeerTimeout;
    while (s.imms.empty()) {
      s.progress();
      if (s.imms.empty() && Clock::now() > deadline) s.peerTimeout("an exchange message");
    }
    const uint32_t got = s.imms.front();
    s.imms.erase(s.imms.begin());
    if (got != expected) {
      throw Error(
          ErrorKind::Protocol,
          fmt::format("exchange benchmark: immediate {:#x} where {:#x} was due", got, expected));
    }
  };
  for (int i = 0; i < warmup + iterations; ++i) {
    const uint32_t imm = 0x100u + static_cast<uint32_t>(i);
    const auto t0 = Clock::now();
    if (!pingPong) {
      send(imm);
      receive(imm);
    } else if (s.rank == 0) {
      send(imm);
      receive(imm);
    } else {
      receive(imm);
      send(imm);
    }
    const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    if (i >= warmup) samples.push_back(pingPong ? us / 2 : us);
  }
  s.settle(sinceSignal);
  if (s.rank == 1) return r;
  summarize(samples, r);
  return r;
}

}  // namespace rdmacc
