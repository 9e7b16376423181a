// Reduction kernels for every (dtype, op). Pure CPU code; the compiler
// vectorises the loops (no -march: the baseline x86-64 ISA).
#pragma once

#include <cstddef>
#include <cstdint>

#include "rdmacc/types.hpp"

namespace rdmacc {

// dst[i] = dst[i] (op) src[i]. Avg and PreMulSum reduce as Sum (their scaling
// is separate). Float16/BFloat16 compute each pair in float32 and round once.
// Integer Sum and Product wrap around (two's complement), as in NCCL.
void reduceInto(void* dst, const void* src, size_t count, DataType dtype, ReduceOp op);
// dst[i] = a[i] (op) b[i] in one pass (dst may be a; otherwise none of the
// three overlap): a reduction out of place without copying `a` first.
void reduceTo(void* dst, const void* a, const void* b, size_t count, DataType dtype, ReduceOp op);
// The 16-bit float kernels (src/reduce/half.cpp): the portable ones, and on
// x86-64 CPUs with AVX2 and F16C faster ones (Accelerated; the portable ones
// elsewhere) that the functions above use. Both give the same bits, so ranks
// on different CPUs agree; the tests compare them. dtype: Float16 or
// BFloat16.
enum class HalfKernel { Baseline, Accelerated };
bool halfKernelAvailable(HalfKernel kernel);
void reduceHalfWith(HalfKernel kernel, void* dst, const void* a, const void* b, size_t count,
                    DataType dtype, ReduceOp op);
// data[i] * x, or data[i] / x with divide, computed in double and rounded.
void scaleHalfWith(HalfKernel kernel, void* data, size_t count, DataType dtype, double x,
                   bool divide);
// data[i] *= factor (PreMulSum's pre-multiplication), rounded to dtype.
void scaleBy(void* data, size_t count, DataType dtype, double factor);
// data[i] /= divisor (Avg); integers truncate toward zero.
void divideBy(void* data, size_t count, DataType dtype, int64_t divisor);

}  // namespace rdmacc
