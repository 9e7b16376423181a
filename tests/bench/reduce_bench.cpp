// Reduction kernels against memcpy, sizes beyond the last-level cache.
// Run: build/tests/rdmacc_reduce_bench --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>

#include <cstring>
#include <vector>

#include "rdmacc/types.hpp"
#include "src/reduce.hpp"

namespace {

void BM_Memcpy(benchmark::State& state) {
  size_t bytes = static_cast<size_t>(state.range(0));
  std::vector<uint8_t> a(bytes, 1), b(bytes, 2);
  for (auto _ : state) {
    std::memcpy(a.data(), b.data(), bytes);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
}

template <rdmacc::DataType T, rdmacc::ReduceOp Op>
void BM_Reduce(benchmark::State& state) {
  size_t bytes = static_cast<size_t>(state.range(0));
  size_t n = bytes / rdmacc::elementSize(T);
  std::vector<uint8_t> a(bytes, 0), b(bytes, 0);
  for (auto _ : state) {
    rdmacc::reduceInto(a.data(), b.data(), n, T, Op);
    benchmark::ClobberMemory();
  }
  // Bytes of the destination written, as for memcpy.
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
}

constexpr int64_t kBig = 256 << 20;  // beyond any last-level cache here

BENCHMARK(BM_Memcpy)->Arg(kBig)->Arg(1 << 20)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Reduce<rdmacc::DataType::Float32, rdmacc::ReduceOp::Sum>)
    ->Arg(kBig)
    ->Arg(1 << 20)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Reduce<rdmacc::DataType::Float64, rdmacc::ReduceOp::Sum>)
    ->Arg(kBig)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Reduce<rdmacc::DataType::Float16, rdmacc::ReduceOp::Sum>)
    ->Arg(kBig)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Reduce<rdmacc::DataType::BFloat16, rdmacc::ReduceOp::Sum>)
    ->Arg(kBig)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Reduce<rdmacc::DataType::Int32, rdmacc::ReduceOp::Sum>)
    ->Arg(kBig)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Reduce<rdmacc::DataType::Float32, rdmacc::ReduceOp::Max>)
    ->Arg(kBig)
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
