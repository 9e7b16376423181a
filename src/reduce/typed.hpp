// The element-wise reduction loop for one C++ type and op, shared by the
// kernels of src/reduce/reduce.cpp and the 16-bit float ones of src/reduce/half.cpp
// (which combine in float). Private to those files, both compiled with -O3
// for the auto-vectoriser (CMakeLists.txt).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "rdmacc/error.hpp"
#include "rdmacc/types.hpp"

namespace rdmacc::detail {

// Arithmetic that wraps for integers (no signed-overflow UB), plain for floats.
template <typename T>
T add(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  } else {
    // A NaN result is the canonical one: the hardware passes on the first
    // operand's payload and sign, which would differ between ranks that hold
    // the operands in opposite orders.
    const T r = a + b;
    return r != r ? std::numeric_limits<T>::quiet_NaN() : r;
  }
}

template <typename T>
T mul(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;
    return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
  } else {
    const T r = a * b;
    return r != r ? std::numeric_limits<T>::quiet_NaN() : r;
  }
}

// Min and Max whose result does not depend on the order of the operands, so
// that every rank reduces to the same bits whichever operand an algorithm
// holds first (recursive doubling combines the same pair on two ranks in
// opposite orders): -0 ranks below +0, and a NaN in either operand gives the
// type's canonical quiet NaN (NaNs propagate, as torch.minimum's do).
template <typename T>
T orderedMin(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    if (a != a || b != b) return std::numeric_limits<T>::quiet_NaN();
    if (a == b) return std::signbit(a) ? a : b;
  }
  return b < a ? b : a;
}

template <typename T>
T orderedMax(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    if (a != a || b != b) return std::numeric_limits<T>::quiet_NaN();
    if (a == b) return std::signbit(a) ? b : a;
  }
  return a < b ? b : a;
}

// d[i] = f(x[i], y[i]); d is x (in place) or overlaps neither.
template <typename T, typename F>
void apply(void* dst, const void* a, const void* b, size_t n, F f) {
  auto* d = static_cast<T*>(dst);
  const auto* x = static_cast<const T*>(a);
  const auto* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) d[i] = f(x[i], y[i]);
}

template <typename T>
void reduceTyped(void* dst, const void* a, const void* b, size_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg:
    case ReduceOp::PreMulSum:
      apply<T>(dst, a, b, n, [](T x, T y) { return add(x, y); });
      return;
    case ReduceOp::Product:
      apply<T>(dst, a, b, n, [](T x, T y) { return mul(x, y); });
      return;
    case ReduceOp::Min:
      apply<T>(dst, a, b, n, [](T x, T y) { return orderedMin(x, y); });
      return;
    case ReduceOp::Max:
      apply<T>(dst, a, b, n, [](T x, T y) { return orderedMax(x, y); });
      return;
    case ReduceOp::BAnd:
    case ReduceOp::BOr:
    case ReduceOp::BXor:
      if constexpr (std::is_integral_v<T>) {
        if (op == ReduceOp::BAnd)
          apply<T>(dst, a, b, n, [](T x, T y) { return static_cast<T>(x & y); });
        if (op == ReduceOp::BOr)
          apply<T>(dst, a, b, n, [](T x, T y) { return static_cast<T>(x | y); });
        if (op == ReduceOp::BXor)
          apply<T>(dst, a, b, n, [](T x, T y) { return static_cast<T>(x ^ y); });
        return;
      }
      break;
  }
  throw Error(ErrorKind::Internal, "reduction kernel called with an unsupported op");
}

}  // namespace rdmacc::detail
