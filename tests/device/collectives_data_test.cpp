// The collectives that move data without reducing it (allgather, gather,
// scatter, alltoall) on a real device, compared with the reference.
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

// ------------------------------------------------------ allgather & friends --

TEST(Collectives, AllgatherBaseInAndOutOfPlace) {
  int c = 2000;
  for (DataType t : kTypes) {
    for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{4099}}) {
      ++c;
      // Out of place around the ring, in place with every rank at once.
      const AllgatherOptions ring{.algorithm = Algorithm::Ring};
      const AllgatherOptions linear{.algorithm = Algorithm::Linear};
      Buffer in = contribution(t, ReduceOp::Sum, n, R, c);
      Buffer out(t, n * static_cast<size_t>(N));
      Tensor input = in.tensor(), output = out.tensor();
      gBackend->_allgather_base(output, input, ring)->wait();
      for (int r = 0; r < N; ++r) {
        Buffer part(t, n);
        std::memcpy(part.bytes.data(),
                    out.bytes.data() + static_cast<size_t>(r) * n * elementSize(t),
                    n * elementSize(t));
        expectValues(part, t, r, 0, n, c,
                     fmt::format("_allgather_base out of place {} block {}", toString(t), r));
      }
      // In place: the input is this rank's block of the output.
      Buffer inplace(t, n * static_cast<size_t>(N));
      for (size_t i = 0; i < n; ++i)
        inplace.set(static_cast<size_t>(R) * n + i, value(t, ReduceOp::Sum, R, i, c));
      Tensor whole = inplace.tensor(), mine = inplace.slice(static_cast<size_t>(R) * n, n);
      gBackend->_allgather_base(whole, mine, linear)->wait();
      EXPECT_EQ(inplace.bytes, out.bytes)
          << "in-place linear _allgather_base " << toString(t) << " n=" << n;
    }
  }
}

TEST(Collectives, AllgatherListsAndCoalesced) {
  for (size_t n : {size_t{0}, size_t{3}, size_t{4099}}) {
    Buffer in = contribution(DataType::Float64, ReduceOp::Sum, n, R, 3000);
    std::vector<Buffer> outs(static_cast<size_t>(N), Buffer(DataType::Float64, n));
    std::vector<std::vector<Tensor>> outputs(1);
    for (auto& o : outs) outputs[0].push_back(o.tensor());
    std::vector<Tensor> inputs{in.tensor()};
    gBackend->allgather(outputs, inputs)->wait();
    for (int r = 0; r < N; ++r)
      expectValues(outs[static_cast<size_t>(r)], DataType::Float64, r, 0, n, 3000, "allgather");
  }
  // Two tensors of different dtypes per rank.
  Buffer a = contribution(DataType::Int8, ReduceOp::Sum, 5, R, 3001),
         b = contribution(DataType::Float32, ReduceOp::Sum, 1234, R, 3002);
  std::vector<Tensor> inputs{a.tensor(), b.tensor()};
  std::vector<std::vector<Buffer>> outs;
  std::vector<std::vector<Tensor>> lists;
  for (int r = 0; r < N; ++r) {
    outs.push_back({Buffer(DataType::Int8, 5), Buffer(DataType::Float32, 1234)});
  }
  for (auto& o : outs) lists.push_back({o[0].tensor(), o[1].tensor()});
  gBackend->allgather_coalesced(lists, inputs)->wait();
  for (int r = 0; r < N; ++r) {
    expectValues(outs[static_cast<size_t>(r)][0], DataType::Int8, r, 0, 5, 3001,
                 "allgather_coalesced int8");
    expectValues(outs[static_cast<size_t>(r)][1], DataType::Float32, r, 0, 1234, 3002,
                 "allgather_coalesced float32");
  }
}

TEST(Collectives, GatherAndScatterEveryTypeAndRoot) {
  int c = 4000;
  for (DataType t : kTypes) {
    // Every root with one dtype, the first and last root with the others.
    for (int root = 0; root < N; ++root) {
      if (t != DataType::Int64 && root != 0 && root != N - 1) continue;
      for (size_t n : {size_t{0}, size_t{7}, size_t{4099}}) {
        c += 2;
        Buffer in = contribution(t, ReduceOp::Sum, n, R, c);
        std::vector<Tensor> inputs{in.tensor()};
        std::vector<Buffer> outs;
        std::vector<std::vector<Tensor>> outputs;
        if (R == root) {
          outs.assign(static_cast<size_t>(N), Buffer(t, n));
          outputs.emplace_back();
          for (auto& o : outs) outputs[0].push_back(o.tensor());
        }
        gBackend->gather(outputs, inputs, GatherOptions{.rootRank = root})->wait();
        if (R == root) {
          for (int r = 0; r < N; ++r)
            expectValues(outs[static_cast<size_t>(r)], t, r, 0, n, c, "gather");
        }
        // Scatter: the root sends block r to rank r (values as if from rank r).
        std::vector<Buffer> ins;
        std::vector<std::vector<Tensor>> scatterInputs;
        if (R == root) {
          scatterInputs.emplace_back();
          for (int r = 0; r < N; ++r) ins.push_back(contribution(t, ReduceOp::Sum, n, r, c + 1));
          for (auto& i : ins) scatterInputs[0].push_back(i.tensor());
        }
        Buffer out(t, n);
        std::vector<Tensor> scatterOutputs{out.tensor()};
        gBackend->scatter(scatterOutputs, scatterInputs, ScatterOptions{.rootRank = root})->wait();
        expectValues(out, t, R, 0, n, c + 1, "scatter");
      }
    }
  }
}

// ---------------------------------------------------------------- alltoall --

TEST(Collectives, AlltoallEvenAndUnevenSplits) {
  // Element j of the block rank r sends to rank p is value(r, p*1000 + j).
  auto run = [&](std::function<size_t(int from, int to)> count, const std::string& what,
                 Algorithm algorithm = Algorithm::Auto) {
    std::vector<int64_t> inSplits, outSplits;
    size_t inTotal = 0, outTotal = 0;
    for (int p = 0; p < N; ++p) {
      inSplits.push_back(static_cast<int64_t>(count(R, p)));
      outSplits.push_back(static_cast<int64_t>(count(p, R)));
      inTotal += count(R, p);
      outTotal += count(p, R);
    }
    Buffer in(DataType::Int32, inTotal), out(DataType::Int32, outTotal);
    size_t at = 0;
    for (int p = 0; p < N; ++p) {
      for (size_t j = 0; j < count(R, p); ++j)
        in.set(at++,
               value(DataType::Int32, ReduceOp::Sum, R, static_cast<size_t>(p) * 1000 + j, 6000));
    }
    Tensor input = in.tensor(), output = out.tensor();
    gBackend->alltoall_base(output, input, outSplits, inSplits, {.algorithm = algorithm})->wait();
    at = 0;
    for (int p = 0; p < N; ++p) {
      for (size_t j = 0; j < count(p, R); ++j) {
        double want =
            value(DataType::Int32, ReduceOp::Sum, p, static_cast<size_t>(R) * 1000 + j, 6000);
        if (out.get(at) != want) {
          ADD_FAILURE() << what << ": from rank " << p << " element " << j << " is " << out.get(at)
                        << ", want " << want;
          return;
        }
        ++at;
      }
    }
  };
  run([](int, int) { return size_t{5}; }, "alltoall_base even");
  for (Algorithm a : {Algorithm::Auto, Algorithm::Pairwise, Algorithm::Linear}) {
    run([](int from, int to) { return static_cast<size_t>((from * 3 + to * 7) % 5) * 300; },
        fmt::format("alltoall_base uneven {}", toString(a)), a);
  }
  run([](int, int) { return size_t{0}; }, "alltoall_base empty");
  // The list form, every dtype: rank r sends p + 1 elements to rank p.
  for (DataType t : kTypes) {
    std::vector<Buffer> ins, outs;
    for (int p = 0; p < N; ++p) {
      ins.push_back(contribution(t, ReduceOp::Sum, static_cast<size_t>(p + 1), R, 6100 + p));
      outs.emplace_back(t, static_cast<size_t>(R + 1));
    }
    std::vector<Tensor> inputs, outputs;
    for (auto& b : ins) inputs.push_back(b.tensor());
    for (auto& b : outs) outputs.push_back(b.tensor());
    gBackend->alltoall(outputs, inputs)->wait();
    for (int p = 0; p < N; ++p) {
      expectValues(outs[static_cast<size_t>(p)], t, p, 0, static_cast<size_t>(R + 1), 6100 + R,
                   fmt::format("alltoall {}", toString(t)));
    }
  }
}

}  // namespace
}  // namespace rdmacc::suite
