// The reducing collectives on a real device, every dtype, op, size, root and
// algorithm, compared element by element with the reference (collectives.hpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include <fmt/format.h>

#include "rdmacc/error.hpp"
#include "src/reduce/reduce.hpp"

#include "tests/device/collectives.hpp"

namespace rdmacc::suite {
namespace {

using namespace std::chrono_literals;

// -------------------------------------------------------------- allreduce --

// Recursive doubling needs a power-of-two group. Hierarchical is one tree
// when every rank shares a host, the flat group's shape with one rank per
// host, and layered in mixed groups (device.collectives.*.mixed, the cluster).
std::vector<Algorithm> allreduceAlgorithms() {
  std::vector<Algorithm> out{Algorithm::Ring, Algorithm::Tree, Algorithm::Hierarchical};
  if ((N & (N - 1)) == 0) out.push_back(Algorithm::RecursiveDoubling);
  return out;
}

TEST(Collectives, AllreduceEveryTypeOpSizeAndAlgorithm) {
  int c = 0;
  for (DataType t : kTypes) {
    for (ReduceOp op : kOps) {
      if (!supports(op, t)) continue;
      for (size_t n : kSizes) {
        for (Algorithm a : allreduceAlgorithms()) {
          ++c;
          Buffer b = contribution(t, op, n, R, c);
          std::vector<Tensor> ts{b.tensor()};
          gBackend
              ->allreduce(ts,
                          AllreduceOptions{.reduceOp = op, .preMulFactor = kFactor, .algorithm = a})
              ->wait();
          expectReduced(b, op, 0, n, c, "allreduce " + name(t, op, n, a));
        }
      }
    }
  }
}

TEST(Collectives, AllreduceLargerThanEveryChunkAndAuto) {
  for (size_t n : {gBackend->chunkBytes() / 4 * 5 + 3, size_t{33333}}) {
    auto algorithms = allreduceAlgorithms();
    algorithms.push_back(Algorithm::Auto);
    for (Algorithm a : algorithms) {
      Buffer b = contribution(DataType::Float32, ReduceOp::Sum, n, R, 7);
      std::vector<Tensor> ts{b.tensor()};
      gBackend->allreduce(ts, AllreduceOptions{.algorithm = a})->wait();
      expectReduced(b, ReduceOp::Sum, 0, n, 7,
                    "large allreduce " + name(DataType::Float32, ReduceOp::Sum, n, a));
    }
  }
}

// Data full of +0/-0 and NaNs, every float type, op and algorithm: every rank
// ends with the same bytes (gathered and compared), which recursive doubling
// did not give for Min and Max before the kernels became order-free.
TEST(Collectives, AllreduceGivesIdenticalBytesOnEveryRankForSignedZerosAndNaNs) {
  auto algorithms = allreduceAlgorithms();
  algorithms.push_back(Algorithm::Auto);
  const size_t n = 64;
  for (DataType t : {DataType::Float32, DataType::Float64, DataType::Float16, DataType::BFloat16}) {
    for (ReduceOp op : {ReduceOp::Min, ReduceOp::Max, ReduceOp::Sum, ReduceOp::Product}) {
      for (Algorithm a : algorithms) {
        const size_t es = elementSize(t);
        std::vector<uint8_t> mine(n * es);
        Tensor tensor{mine.data(), n, t};
        const double nan = std::numeric_limits<double>::quiet_NaN();
        for (size_t i = 0; i < n; ++i) {
          // Per element a different mix across ranks: +0, -0, NaN, -NaN.
          const size_t k = (i + static_cast<size_t>(R) * (1 + i % 3)) % 4;
          setElement(tensor, i, k == 0 ? 0.0 : k == 1 ? -0.0 : k == 2 ? nan : -nan);
        }
        std::vector<Tensor> ts{tensor};
        gBackend->allreduce(ts, AllreduceOptions{.reduceOp = op, .algorithm = a})->wait();
        std::vector<uint8_t> all(mine.size() * static_cast<size_t>(N));
        Tensor whole{all.data(), n * static_cast<size_t>(N), t};
        gBackend->_allgather_base(whole, tensor, AllgatherOptions{})->wait();
        for (int r = 0; r < N; ++r) {
          EXPECT_EQ(std::memcmp(all.data() + static_cast<size_t>(r) * mine.size(), mine.data(),
                                mine.size()),
                    0)
              << "rank " << r << " differs from rank " << R << ": " << toString(t) << " "
              << toString(op) << " " << toString(a);
        }
      }
    }
  }
}

TEST(Collectives, AllreduceCoalesced) {
  std::vector<Buffer> bufs;
  for (size_t n : {size_t{5}, size_t{0}, size_t{3000}, size_t{1}})
    bufs.push_back(contribution(DataType::Int32, ReduceOp::Max, n, R, 11));
  std::vector<Tensor> ts;
  for (auto& b : bufs) ts.push_back(b.tensor());
  gBackend->allreduce_coalesced(ts, AllreduceCoalescedOptions{{.reduceOp = ReduceOp::Max}})->wait();
  // Each tensor is a slice of the concatenation: element indices continue.
  size_t first = 0;
  for (auto& b : bufs) {
    Buffer want = contribution(DataType::Int32, ReduceOp::Max, first + b.numel(), R, 11);
    for (size_t i = 0; i < b.numel(); ++i) {
      // Contributions were generated per tensor from index 0: compare against that.
      (void)want;
    }
    expectReduced(b, ReduceOp::Max, 0, b.numel(), 11, "allreduce_coalesced");
    first += b.numel();
  }
}

// -------------------------------------------------------- broadcast/reduce --

TEST(Collectives, BroadcastEveryTypeRootAndAlgorithm) {
  int c = 100;
  for (DataType t : kTypes) {
    for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{4099}}) {
      for (int root : {0, N - 1}) {
        for (Algorithm a : {Algorithm::Ring, Algorithm::Tree, Algorithm::Hierarchical}) {
          ++c;
          Buffer b = R == root ? contribution(t, ReduceOp::Sum, n, root, c) : Buffer(t, n);
          std::vector<Tensor> ts{b.tensor()};
          gBackend->broadcast(ts, BroadcastOptions{.rootRank = root, .algorithm = a})->wait();
          expectValues(b, t, root, 0, n, c, "broadcast " + name(t, ReduceOp::Sum, n, a));
        }
      }
    }
  }
}

TEST(Collectives, ReduceEveryTypeOpAndRoot) {
  int c = 1000;
  for (DataType t : kTypes) {
    for (ReduceOp op : kOps) {
      if (!supports(op, t)) continue;
      for (size_t n : {size_t{0}, size_t{7}, size_t{4099}}) {
        for (int root : {0, N - 1}) {
          for (Algorithm a : {Algorithm::Tree, Algorithm::Hierarchical}) {
            ++c;
            Buffer b = contribution(t, op, n, R, c);
            Buffer before = b;
            std::vector<Tensor> ts{b.tensor()};
            gBackend
                ->reduce(
                    ts,
                    ReduceOptions{
                        .reduceOp = op, .preMulFactor = kFactor, .rootRank = root, .algorithm = a})
                ->wait();
            if (R == root) {
              expectReduced(b, op, 0, n, c,
                            fmt::format("reduce root {} {}", root, name(t, op, n, a)));
            } else {
              EXPECT_EQ(b.bytes, before.bytes) << "reduce changed a non-root input";
            }
          }
        }
      }
    }
  }
}

// --------------------------------------------------------- reduce_scatter --

TEST(Collectives, ReduceScatterEveryTypeAndOp) {
  int c = 5000;
  for (DataType t : kTypes) {
    for (ReduceOp op : kOps) {
      if (!supports(op, t)) continue;
      for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{1031}}) {
        ++c;
        size_t total = n * static_cast<size_t>(N);
        Buffer in = contribution(t, op, total, R, c);
        Buffer out(t, n);
        Tensor input = in.tensor(), output = out.tensor();
        gBackend
            ->_reduce_scatter_base(
                output, input,
                ReduceScatterOptions{
                    .reduceOp = op, .preMulFactor = kFactor, .algorithm = Algorithm::Ring})
            ->wait();
        expectReduced(out, op, static_cast<size_t>(R) * n, n, c,
                      "_reduce_scatter_base " + name(t, op, n, Algorithm::Ring));
        // The list form, every rank's block straight to its owner.
        std::vector<Buffer> parts;
        for (int r = 0; r < N; ++r) {
          Buffer p(t, n);
          std::memcpy(p.bytes.data(), in.bytes.data() + static_cast<size_t>(r) * n * elementSize(t),
                      n * elementSize(t));
          parts.push_back(std::move(p));
        }
        std::vector<std::vector<Tensor>> inputs(1);
        for (auto& p : parts) inputs[0].push_back(p.tensor());
        for (Algorithm a : {Algorithm::Linear, Algorithm::Ring}) {
          Buffer out2(t, n);
          std::vector<Tensor> outputs{out2.tensor()};
          gBackend
              ->reduce_scatter(
                  outputs, inputs,
                  ReduceScatterOptions{.reduceOp = op, .preMulFactor = kFactor, .algorithm = a})
              ->wait();
          expectReduced(out2, op, static_cast<size_t>(R) * n, n, c,
                        "reduce_scatter list form " + name(t, op, n, a));
        }
      }
    }
  }
}

// The output inside the input: as this rank's own block (NCCL's in-place
// form: the ring reads the input where it is and writes the block last), and
// as the next rank's block (the ring then works on a copy of the input: with
// two ranks, the block it writes is the one it sends in the same step; a
// race this test does not provoke reliably, so it checks the results).
TEST(Collectives, ReduceScatterWithTheOutputInsideTheInput) {
  int c = 7000;
  for (DataType t : {DataType::Float32, DataType::Int64}) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max}) {
      for (size_t n : {size_t{1}, size_t{1031}}) {
        for (int shift : {0, 1}) {
          ++c;
          const size_t es = elementSize(t), total = n * static_cast<size_t>(N);
          Buffer in = contribution(t, op, total, R, c);
          const size_t block = static_cast<size_t>((R + shift) % N);
          Tensor input = in.tensor();
          Tensor output{in.bytes.data() + block * n * es, n, t};
          gBackend
              ->_reduce_scatter_base(
                  output, input, ReduceScatterOptions{.reduceOp = op, .algorithm = Algorithm::Ring})
              ->wait();
          Buffer got(t, n);
          std::memcpy(got.bytes.data(), output.data, n * es);
          expectReduced(got, op, static_cast<size_t>(R) * n, n, c,
                        "_reduce_scatter_base, output = block " + std::to_string(block) +
                            " of the input, " + name(t, op, n, Algorithm::Ring));
        }
      }
    }
  }
}

}  // namespace
}  // namespace rdmacc::suite
