#include "src/reduce/reduce.hpp"

#include <cstdint>
#include <cstring>

#include "rdmacc/error.hpp"
#include "src/reduce/typed.hpp"

namespace rdmacc {
namespace {

using detail::reduceTyped;

void reduceBool(void* dst, const void* a, const void* b, size_t n, ReduceOp op) {
  auto* d = static_cast<uint8_t*>(dst);
  const auto* x = static_cast<const uint8_t*>(a);
  const auto* y = static_cast<const uint8_t*>(b);
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Max:
    case ReduceOp::BOr:
      for (size_t i = 0; i < n; ++i) d[i] = (x[i] | y[i]) != 0;
      return;
    case ReduceOp::Product:
    case ReduceOp::Min:
    case ReduceOp::BAnd:
      for (size_t i = 0; i < n; ++i) d[i] = (x[i] != 0) & (y[i] != 0);
      return;
    case ReduceOp::BXor:
      for (size_t i = 0; i < n; ++i) d[i] = (x[i] != 0) ^ (y[i] != 0);
      return;
    default:
      throw Error(ErrorKind::Internal, "Bool reduction with an unsupported op");
  }
}

template <typename T, typename F>
void mapTyped(void* data, size_t n, F f) {
  auto* d = static_cast<T*>(data);
  for (size_t i = 0; i < n; ++i) d[i] = f(d[i]);
}

template <typename F>
void mapNumeric(void* data, size_t n, DataType dtype, F f) {
  switch (dtype) {
    case DataType::Float32:
      mapTyped<float>(data, n, [&](float v) { return static_cast<float>(f(v)); });
      return;
    case DataType::Float64:
      mapTyped<double>(data, n, [&](double v) { return f(v); });
      return;
    default:
      throw Error(ErrorKind::Internal, "floating-point map on an integer type");
  }
}

}  // namespace

void reduceTo(void* dst, const void* a, const void* b, size_t n, DataType dtype, ReduceOp op) {
  switch (dtype) {
    case DataType::Float32:
      reduceTyped<float>(dst, a, b, n, op);
      return;
    case DataType::Float64:
      reduceTyped<double>(dst, a, b, n, op);
      return;
    case DataType::Float16:
    case DataType::BFloat16:
      reduceHalfWith(HalfKernel::Accelerated, dst, a, b, n, dtype, op);
      return;
    case DataType::Int8:
      reduceTyped<int8_t>(dst, a, b, n, op);
      return;
    case DataType::UInt8:
      reduceTyped<uint8_t>(dst, a, b, n, op);
      return;
    case DataType::Int32:
      reduceTyped<int32_t>(dst, a, b, n, op);
      return;
    case DataType::Int64:
      reduceTyped<int64_t>(dst, a, b, n, op);
      return;
    case DataType::Bool:
      reduceBool(dst, a, b, n, op);
      return;
  }
}

void reduceInto(void* dst, const void* src, size_t n, DataType dtype, ReduceOp op) {
  reduceTo(dst, dst, src, n, dtype, op);
}

void scaleBy(void* data, size_t n, DataType dtype, double factor) {
  switch (dtype) {
    case DataType::Int8:
      mapTyped<int8_t>(data, n, [&](int8_t v) { return static_cast<int8_t>(v * factor); });
      return;
    case DataType::UInt8:
      mapTyped<uint8_t>(data, n, [&](uint8_t v) { return static_cast<uint8_t>(v * factor); });
      return;
    case DataType::Int32:
      mapTyped<int32_t>(data, n, [&](int32_t v) { return static_cast<int32_t>(v * factor); });
      return;
    case DataType::Int64:
      mapTyped<int64_t>(data, n, [&](int64_t v) {
        return static_cast<int64_t>(static_cast<double>(v) * factor);
      });
      return;
    case DataType::Bool:
      throw Error(ErrorKind::Internal, "scaleBy on Bool");
    default:
      if (dtype == DataType::Float16 || dtype == DataType::BFloat16) {
        scaleHalfWith(HalfKernel::Accelerated, data, n, dtype, factor, /*divide=*/false);
      } else {
        mapNumeric(data, n, dtype, [&](double v) { return v * factor; });
      }
      return;
  }
}

void divideBy(void* data, size_t n, DataType dtype, int64_t divisor) {
  switch (dtype) {
    case DataType::Int8:
      mapTyped<int8_t>(data, n, [&](int8_t v) { return static_cast<int8_t>(v / divisor); });
      return;
    case DataType::UInt8:
      mapTyped<uint8_t>(data, n, [&](uint8_t v) { return static_cast<uint8_t>(v / divisor); });
      return;
    case DataType::Int32:
      mapTyped<int32_t>(data, n, [&](int32_t v) { return static_cast<int32_t>(v / divisor); });
      return;
    case DataType::Int64:
      mapTyped<int64_t>(data, n, [&](int64_t v) { return v / divisor; });
      return;
    case DataType::Bool:
      throw Error(ErrorKind::Internal, "divideBy on Bool");
    case DataType::Float32:  // divide in the type itself, as a framework's `sum / n` would
      mapTyped<float>(data, n, [&](float v) { return v / static_cast<float>(divisor); });
      return;
    default:
      if (dtype == DataType::Float16 || dtype == DataType::BFloat16) {
        scaleHalfWith(HalfKernel::Accelerated, data, n, dtype, static_cast<double>(divisor),
                      /*divide=*/true);
      } else {
        mapNumeric(data, n, dtype, [&](double v) { return v / static_cast<double>(divisor); });
      }
      return;
  }
}

}  // namespace rdmacc
