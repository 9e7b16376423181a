// Reduction kernels against memcpy, sizes beyond the last-level cache.
// Run: build/tests/rdmacc_reduce_bench --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>

#include <cstring>
#include <vector>

#include "rdmacc/types.hpp"
#include "src/reduce/reduce.hpp"

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

// The 16-bit kernels side by side: the portable one and the one reduceInto
// picks on CPUs with AVX2 and F16C (skipped where there is none).
template <rdmacc::DataType T, rdmacc::HalfKernel K>
void BM_HalfKernel(benchmark::State& state) {
  if (!rdmacc::halfKernelAvailable(K)) {
    state.SkipWithError("this CPU has no AVX2/F16C");
    return;
  }
  size_t bytes = static_cast<size_t>(state.range(0));
  size_t n = bytes / 2;
  std::vector<uint16_t> a(n, 0x3c00), b(n, 0x3c00);  // 1.0 in float16; a tiny value in bfloat16
  for (auto _ : state) {
    rdmacc::reduceHalfWith(K, a.data(), a.data(), b.data(), n, T, rdmacc::ReduceOp::Sum);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
}

// Avg's division on 16-bit floats (by 8 ranks), the two kernels.
template <rdmacc::DataType T, rdmacc::HalfKernel K>
void BM_HalfDivide(benchmark::State& state) {
  if (!rdmacc::halfKernelAvailable(K)) {
    state.SkipWithError("this CPU has no AVX2/F16C");
    return;
  }
  size_t bytes = static_cast<size_t>(state.range(0));
  size_t n = bytes / 2;
  std::vector<uint16_t> a(n, 0x3c00);
  for (auto _ : state) {
    rdmacc::scaleHalfWith(K, a.data(), n, T, 8.0, /*divide=*/true);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
}

using rdmacc::DataType;
using rdmacc::HalfKernel;
BENCHMARK(BM_HalfKernel<DataType::Float16, HalfKernel::Baseline>)
    ->Arg(kBig)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_HalfKernel<DataType::Float16, HalfKernel::Accelerated>)
    ->Arg(kBig)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_HalfKernel<DataType::BFloat16, HalfKernel::Baseline>)
    ->Arg(kBig)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_HalfKernel<DataType::BFloat16, HalfKernel::Accelerated>)
    ->Arg(kBig)
    ->Unit(benchmark::kMillisecond);

BENCHMARK(BM_HalfDivide<DataType::Float16, HalfKernel::Baseline>)
    ->Arg(kBig)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_HalfDivide<DataType::Float16, HalfKernel::Accelerated>)
    ->Arg(kBig)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_HalfDivide<DataType::BFloat16, HalfKernel::Baseline>)
    ->Arg(kBig)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_HalfDivide<DataType::BFloat16, HalfKernel::Accelerated>)
    ->Arg(kBig)
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
