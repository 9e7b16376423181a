// rdmacc-perf's collective measurement (tools/src/collective_bench.hpp).
#include "tools/src/collective_bench.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <utility>
#include <vector>

namespace rdmacc::perf {
namespace {

using Clock = std::chrono::steady_clock;

// Typed storage with small integer values, exact in every dtype.
struct Buffer {
  DataType dtype;
  std::vector<uint8_t> bytes;
  Buffer(DataType t, size_t n) : dtype(t), bytes(n * elementSize(t)) {}
  size_t numel() const { return bytes.size() / elementSize(dtype); }
  Tensor tensor() { return Tensor{bytes.data(), numel(), dtype}; }
  void set(size_t i, double v) { setElement(tensor(), i, v); }
  double get(size_t i) const {
    return getElement(Tensor{const_cast<uint8_t*>(bytes.data()), numel(), dtype}, i);
  }
};

// Rank r's value at element i: 1..4, so sums, products (for n <= 8) and averages of n ranks are
// exact.
double value(int r, size_t i) {
  return static_cast<double>((static_cast<size_t>(r) * 3 + i) % 4 + 1);
}

double reduced(ReduceOp op, int n, size_t i, DataType t) {
  double acc = value(0, i);
  for (int r = 1; r < n; ++r) {
    double v = value(r, i);
    switch (op) {
      case ReduceOp::Product:
        acc *= v;
        break;
      case ReduceOp::Min:
        acc = std::min(acc, v);
        break;
      case ReduceOp::Max:
        acc = std::max(acc, v);
        break;
      default:
        acc += v;
        break;
    }
  }
  if (op == ReduceOp::Avg) acc = isFloatingPoint(t) ? acc / n : std::trunc(acc / n);
  return acc;
}

}  // namespace

class CollectiveBench::Impl {
 public:
  Impl(const Args& a, std::shared_ptr<VerbsBackend> b) : args_(a), backend_(std::move(b)) {
    n_ = backend_->getSize();
    rank_ = backend_->getRank();
    es_ = elementSize(args_.dtype);
  }

  Case describe() const {
    const std::string& c = args_.collective;
    double n = n_;
    if (c == "allreduce") return {c, 2 * (n - 1) / n, false, true};
    if (c == "broadcast" || c == "reduce") return {c, 1, false, true};
    if (c == "allgather") return {c, (n - 1) / n, true, true};
    if (c == "reduce_scatter" || c == "alltoall" || c == "gather" || c == "scatter")
      return {c, (n - 1) / n, true, false};
    if (c == "sendrecv") return {c, 1, true, false};
    return {c, 0, false, true};  // barrier
  }

  // Elements per rank-sized unit for this size.
  size_t countFor(size_t bytes) const {
    const std::string& c = args_.collective;
    size_t elems = bytes / es_;
    if (c == "allgather" || c == "reduce_scatter" || c == "alltoall" || c == "gather" ||
        c == "scatter") {
      return elems / static_cast<size_t>(n_);
    }
    return elems;
  }

  // Runs one iteration; returns the work. Sets up buffers on first use per size.
  // The tensor list of allreduce, broadcast and reduce is reused (assign
  // keeps its capacity): the harness allocates nothing per iteration, as an
  // OSU-style MPI loop does not, so what is timed is the backend's.
  std::shared_ptr<Work> once(bool inPlace) {
    const std::string& c = args_.collective;
    if (c == "allreduce") {
      std::vector<Tensor>& t = single(buf().tensor());
      return backend_->allreduce(
          t, AllreduceOptions{.reduceOp = args_.op, .algorithm = args_.algorithm});
    }
    if (c == "broadcast") {
      std::vector<Tensor>& t = single(buf().tensor());
      return backend_->broadcast(
          t, BroadcastOptions{.rootRank = args_.root, .algorithm = args_.algorithm});
    }
    if (c == "reduce") {
      std::vector<Tensor>& t = single(buf().tensor());
      return backend_->reduce(
          t, ReduceOptions{
                 .reduceOp = args_.op, .rootRank = args_.root, .algorithm = args_.algorithm});
    }
    if (c == "allgather") {
      Tensor out = outBuf().tensor();
      Tensor in = inPlace
                      ? Tensor{outBuf().bytes.data() + static_cast<size_t>(rank_) * count_ * es_,
                               count_, args_.dtype}
                      : buf().tensor();
      return backend_->_allgather_base(out, in, AllgatherOptions{.algorithm = args_.algorithm});
    }
    if (c == "reduce_scatter") {
      Tensor out = buf().tensor(), in = outBuf().tensor();
      return backend_->_reduce_scatter_base(
          out, in, ReduceScatterOptions{.reduceOp = args_.op, .algorithm = args_.algorithm});
    }
    if (c == "alltoall") {
      Tensor out = outBuf().tensor(), in = buf().tensor();
      std::vector<int64_t> none;
      return backend_->alltoall_base(out, in, none, none,
                                     AllToAllOptions{.algorithm = args_.algorithm});
    }
    if (c == "gather") {
      std::vector<Tensor> in{buf().tensor()};
      std::vector<std::vector<Tensor>> outs;
      if (rank_ == args_.root) outs.push_back(parts_);
      return backend_->gather(outs, in, GatherOptions{.rootRank = args_.root});
    }
    if (c == "scatter") {
      std::vector<Tensor> out{buf().tensor()};
      std::vector<std::vector<Tensor>> ins;
      if (rank_ == args_.root) ins.push_back(parts_);
      return backend_->scatter(out, ins, ScatterOptions{.rootRank = args_.root});
    }
    if (c == "sendrecv") {
      std::vector<Tensor> s{buf().tensor()}, r{outBuf().tensor()};
      int right = (rank_ + 1) % n_, left = (rank_ + n_ - 1) % n_;
      auto recv = backend_->recv(r, left, 0);
      backend_->send(s, right, 0);
      return recv;
    }
    return backend_->barrier(BarrierOptions{.algorithm = args_.algorithm});
  }

  void prepare(size_t count) {
    registered_.clear();  // deregistered before the buffers go
    count_ = count;
    const std::string& c = args_.collective;
    size_t total = count * static_cast<size_t>(n_);
    // buf(): the per-rank tensor (alltoall: the whole input); outBuf(): the gathered
    // or exchanged buffer (reduce_scatter: its input; sendrecv: the receive).
    bufs_.clear();
    outs_.clear();
    // Only the collectives that read or write outBuf() get one: N times the
    // size for every allreduce would make a rank's memory grow with N.
    const bool gathered = c == "allgather" || c == "reduce_scatter" || c == "alltoall";
    const size_t outCount = c == "sendrecv" ? count : gathered ? total : 0;
    for (int k = 0; k < std::max(1, args_.buffers); ++k) {
      bufs_.push_back(std::make_unique<Buffer>(args_.dtype, c == "alltoall" ? total : count));
      outs_.push_back(std::make_unique<Buffer>(args_.dtype, outCount));
    }
    current_ = 0;
    parts_.clear();
    partBufs_.clear();
    if ((c == "gather" || c == "scatter") && rank_ == args_.root) {
      for (int r = 0; r < n_; ++r)
        partBufs_.push_back(std::make_unique<Buffer>(args_.dtype, count));
      for (auto& p : partBufs_) parts_.push_back(p->tensor());
    }
    if (args_.registerBuffers) {
      for (auto& b : bufs_) registered_.emplace_back(*backend_, *b);
      for (auto& b : outs_) registered_.emplace_back(*backend_, *b);
      for (auto& p : partBufs_) registered_.emplace_back(*backend_, *p);
    }
  }

  // Fills inputs, runs once, counts wrong elements on this rank.
  long check(bool inPlace) {
    const std::string& c = args_.collective;
    size_t n = count_;
    auto fill = [&](Buffer& b, int r, size_t offset) {
      for (size_t i = 0; i < b.numel(); ++i) b.set(i, value(r, offset + i));
    };
    if (c == "allreduce" || c == "reduce") fill(buf(), rank_, 0);
    if (c == "broadcast") fill(buf(), rank_ == args_.root ? args_.root : (rank_ + 1) % 5 + 7, 0);
    if (c == "allgather") {
      std::fill(outBuf().bytes.begin(), outBuf().bytes.end(), 0);
      if (inPlace) {
        for (size_t i = 0; i < n; ++i)
          outBuf().set(static_cast<size_t>(rank_) * n + i, value(rank_, i));
      } else {
        fill(buf(), rank_, 0);
      }
    }
    if (c == "reduce_scatter") fill(outBuf(), rank_, 0);
    if (c == "alltoall") fill(buf(), rank_, 0);
    if (c == "gather" || c == "sendrecv") fill(buf(), rank_, 0);
    if (c == "scatter" && rank_ == args_.root) {
      for (int r = 0; r < n_; ++r) fill(*partBufs_[static_cast<size_t>(r)], r, 0);
    }
    once(inPlace)->wait();
    long wrong = 0;
    auto expect = [&](const Buffer& b, size_t i, double want) {
      Buffer w(args_.dtype, 1);
      w.set(0, want);
      if (b.get(i) != w.get(0)) ++wrong;
    };
    if (c == "allreduce" || (c == "reduce" && rank_ == args_.root)) {
      for (size_t i = 0; i < n; ++i) expect(buf(), i, reduced(args_.op, n_, i, args_.dtype));
    }
    if (c == "broadcast") {
      for (size_t i = 0; i < n; ++i) expect(buf(), i, value(args_.root, i));
    }
    if (c == "allgather") {
      for (int r = 0; r < n_; ++r) {
        for (size_t i = 0; i < n; ++i)
          expect(outBuf(), static_cast<size_t>(r) * n + i, value(r, i));
      }
    }
    if (c == "reduce_scatter") {
      for (size_t i = 0; i < n; ++i) {
        expect(buf(), i, reduced(args_.op, n_, static_cast<size_t>(rank_) * n + i, args_.dtype));
      }
    }
    if (c == "alltoall") {  // block p of rank r's input went to rank p's block r
      for (int r = 0; r < n_; ++r) {
        for (size_t i = 0; i < n; ++i)
          expect(outBuf(), static_cast<size_t>(r) * n + i,
                 value(r, static_cast<size_t>(rank_) * n + i));
      }
    }
    if (c == "gather" && rank_ == args_.root) {
      for (int r = 0; r < n_; ++r) {
        for (size_t i = 0; i < n; ++i) expect(*partBufs_[static_cast<size_t>(r)], i, value(r, i));
      }
    }
    if (c == "scatter") {
      for (size_t i = 0; i < n; ++i) expect(buf(), i, value(rank_, i));
    }
    if (c == "sendrecv") {
      int left = (rank_ + n_ - 1) % n_;
      for (size_t i = 0; i < n; ++i) expect(outBuf(), i, value(left, i));
    }
    return wrong;
  }

  double acrossRanks(double v, ReduceOp op = ReduceOp::Sum) {
    Buffer b(DataType::Float64, 1);
    b.set(0, v);
    std::vector<Tensor> t{b.tensor()};
    backend_->allreduce(t, AllreduceOptions{.reduceOp = op})->wait();
    return b.get(0);
  }

  Row measure(size_t bytes, bool inPlace) {
    Row row;
    size_t count = countFor(bytes);
    prepare(count);
    row.count = count;
    const std::string& c = args_.collective;
    row.bytes = c == "barrier" ? 0
                : (c == "allgather" || c == "reduce_scatter" || c == "alltoall" || c == "gather" ||
                   c == "scatter")
                    ? count * static_cast<size_t>(n_) * es_
                    : count * es_;
    row.inPlace = inPlace;
    if (args_.check)
      row.wrong = static_cast<long>(acrossRanks(static_cast<double>(check(inPlace))));
    for (int i = 0; i < args_.warmup; ++i) once(inPlace)->wait();
    backend_->barrier()->wait();
    auto start = Clock::now();
    std::deque<std::shared_ptr<Work>> works;
    for (int i = 0; i < args_.iterations; ++i) {
      // Ops complete in order: keep a bounded number in flight.
      current_ = static_cast<size_t>(i) % bufs_.size();
      works.push_back(once(inPlace));
      if (works.size() >= (args_.blocking ? 1u : 16u)) {
        works.front()->wait();
        works.pop_front();
      }
    }
    for (auto& w : works) w->wait();
    current_ = 0;
    double mine =
        std::chrono::duration<double, std::micro>(Clock::now() - start).count() / args_.iterations;
    row.time = acrossRanks(mine) / n_;
    row.minTime = acrossRanks(mine, ReduceOp::Min);
    row.maxTime = acrossRanks(mine, ReduceOp::Max);
    row.algbw = row.time > 0 ? static_cast<double>(row.bytes) / row.time / 1e3 : 0;  // GB/s
    row.busbw = row.algbw * describe().busFactor;
    return row;
  }

 private:
  const Args& args_;
  std::shared_ptr<VerbsBackend> backend_;
  int n_ = 1, rank_ = 0;
  size_t es_ = 4, count_ = 0;
  // Buffer sets (--buffers); the current one is what the next iteration uses.
  std::vector<std::unique_ptr<Buffer>> bufs_, outs_;
  size_t current_ = 0;
  Buffer& buf() { return *bufs_[current_]; }
  std::vector<Tensor>& single(const Tensor& t) {
    single_.assign(1, t);
    return single_;
  }
  std::vector<Tensor> single_;
  Buffer& outBuf() { return *outs_[current_]; }
  std::vector<std::unique_ptr<Buffer>> partBufs_;
  std::vector<Tensor> parts_;
  // -R: registrations of the buffers above, released before they are freed.
  struct Registered {
    VerbsBackend* backend = nullptr;
    void* ptr = nullptr;
    Registered(VerbsBackend& b, Buffer& buffer) {
      if (buffer.bytes.empty()) return;
      b.registerMemory(buffer.bytes.data(), buffer.bytes.size());
      backend = &b;
      ptr = buffer.bytes.data();
    }
    Registered(Registered&& o) noexcept : backend(std::exchange(o.backend, nullptr)), ptr(o.ptr) {}
    Registered(const Registered&) = delete;
    Registered& operator=(const Registered&) = delete;
    Registered& operator=(Registered&&) = delete;
    ~Registered() {
      if (backend != nullptr) backend->deregisterMemory(ptr);
    }
  };
  std::vector<Registered> registered_;
};

CollectiveBench::CollectiveBench(const Args& args, std::shared_ptr<VerbsBackend> backend)
    : impl_(std::make_unique<Impl>(args, std::move(backend))) {}
CollectiveBench::~CollectiveBench() = default;
Case CollectiveBench::describe() const {
  return impl_->describe();
}
Row CollectiveBench::measure(size_t bytes, bool inPlace) {
  return impl_->measure(bytes, inPlace);
}

}  // namespace rdmacc::perf
