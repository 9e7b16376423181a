// Data types, reduction operators and the non-owning tensor view.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace rdmacc {

enum class DataType { Float32, Float64, Float16, BFloat16, Int8, UInt8, Int32, Int64, Bool };
enum class ReduceOp { Sum, Avg, Product, Min, Max, BAnd, BOr, BXor, PreMulSum };

size_t elementSize(DataType dtype) noexcept;
const char* toString(DataType dtype) noexcept;
const char* toString(ReduceOp op) noexcept;
bool isFloatingPoint(DataType dtype) noexcept;

// Whether op is defined on dtype: Sum, Avg, Product, Min, Max and PreMulSum on
// every numeric type (Bool included: Sum is logical or, Product logical and);
// BAnd, BOr, BXor on integer and Bool types only.
bool supports(ReduceOp op, DataType dtype) noexcept;

// IEEE half and bfloat16 from/to float (round to nearest even; NaN stays NaN).
float halfToFloat(uint16_t h) noexcept;
uint16_t floatToHalf(float f) noexcept;
float bfloat16ToFloat(uint16_t b) noexcept;
uint16_t floatToBfloat16(float f) noexcept;

// A non-owning view of numel contiguous elements of CPU memory.
struct Tensor {
  void* data = nullptr;
  size_t numel = 0;
  DataType dtype = DataType::Float32;

  size_t bytes() const noexcept { return numel * elementSize(dtype); }
};

// Element i of t read as / written from a double (rounded to the dtype as a
// cast would; Bool is 0 or 1). For tests, tools and checks, not for bulk data.
double getElement(const Tensor& t, size_t i);
void setElement(const Tensor& t, size_t i, double value);

}  // namespace rdmacc
