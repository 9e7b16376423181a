#include "src/reduce.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#define RDMACC_HALF_AVX2 1
#endif

#include "rdmacc/error.hpp"

namespace rdmacc {
namespace {

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

// 16-bit floats: widen blocks to float, combine, narrow once. The block
// conversions are parameters: the portable ones below, and F16C's on CPUs
// that have it (both exact, so every rank gets the same bits whichever it
// runs: tests/host/reduce_test.cpp compares them).
using WidenBlock = void (*)(float*, const uint16_t*, size_t);
using NarrowBlock = void (*)(uint16_t*, const float*, size_t);

template <float (*Widen)(uint16_t) noexcept>
void widenEach(float* out, const uint16_t* in, size_t m) {
  for (size_t i = 0; i < m; ++i) out[i] = Widen(in[i]);
}

template <uint16_t (*Narrow)(float) noexcept>
void narrowEach(uint16_t* out, const float* in, size_t m) {
  for (size_t i = 0; i < m; ++i) out[i] = Narrow(in[i]);
}

template <WidenBlock Widen, NarrowBlock Narrow>
[[gnu::always_inline]] inline void reduceHalf(void* dst, const void* a, const void* b, size_t n,
                                              ReduceOp op) {
  auto* d = static_cast<uint16_t*>(dst);
  const auto* x = static_cast<const uint16_t*>(a);
  const auto* y = static_cast<const uint16_t*>(b);
  constexpr size_t kBlock = 256;
  alignas(32) float wx[kBlock];
  alignas(32) float wy[kBlock];
  for (size_t base = 0; base < n; base += kBlock) {
    size_t m = std::min(kBlock, n - base);
    Widen(wx, x + base, m);
    Widen(wy, y + base, m);
    reduceTyped<float>(wx, wx, wy, m, op);
    Narrow(d + base, wx, m);
  }
}

void reduceFloat16Baseline(void* dst, const void* a, const void* b, size_t n, ReduceOp op) {
  reduceHalf<widenEach<halfToFloat>, narrowEach<floatToHalf>>(dst, a, b, n, op);
}

void reduceBFloat16Baseline(void* dst, const void* a, const void* b, size_t n, ReduceOp op) {
  reduceHalf<widenEach<bfloat16ToFloat>, narrowEach<floatToBfloat16>>(dst, a, b, n, op);
}

#ifdef RDMACC_HALF_AVX2
// x86-64 CPUs with AVX2 and F16C (Haswell, Zen and later; not the baseline
// ISA the library is built for): F16C converts eight halves per instruction,
// exactly (round to nearest even, as floatToHalf), and AVX2 doubles the
// lanes of the bfloat16 conversions (the float combine between them stays
// the SSE2 one). Natively the portable float16 kernel ran at ~1 GB/s, below
// a 100 Gb/s link.
__attribute__((target("avx2,f16c"))) void widenF16c(float* out, const uint16_t* in, size_t m) {
  size_t i = 0;
  for (; i + 8 <= m; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
  }
  for (; i < m; ++i) out[i] = halfToFloat(in[i]);
}

__attribute__((target("avx2,f16c"))) void narrowF16c(uint16_t* out, const float* in, size_t m) {
  size_t i = 0;
  for (; i + 8 <= m; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
  for (; i < m; ++i) out[i] = floatToHalf(in[i]);
}

__attribute__((target("avx2,f16c"))) void reduceFloat16Avx2(void* dst, const void* a, const void* b,
                                                            size_t n, ReduceOp op) {
  reduceHalf<widenF16c, narrowF16c>(dst, a, b, n, op);
}

// bfloat16 is float's upper half: the portable conversions, vectorised with
// AVX2's lanes (explicit intrinsics measured no faster: 3.85 vs 3.57 GB/s).
__attribute__((target("avx2,f16c"))) void widenBFloat16Avx2(float* out, const uint16_t* in,
                                                            size_t m) {
  widenEach<bfloat16ToFloat>(out, in, m);
}

__attribute__((target("avx2,f16c"))) void narrowBFloat16Avx2(uint16_t* out, const float* in,
                                                             size_t m) {
  narrowEach<floatToBfloat16>(out, in, m);
}

__attribute__((target("avx2,f16c"))) void reduceBFloat16Avx2(void* dst, const void* a,
                                                             const void* b, size_t n, ReduceOp op) {
  reduceHalf<widenBFloat16Avx2, narrowBFloat16Avx2>(dst, a, b, n, op);
}

// AVX2 (which the compiler's check also requires the OS to save the YMM
// state for) and F16C (cpuid leaf 1: not every compiler's
// __builtin_cpu_supports knows it).
bool haveAvx2F16c() {
  static const bool have = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __builtin_cpu_supports("avx2") && __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 &&
           (ecx & bit_F16C) != 0;
  }();
  return have;
}
#endif

using HalfKernelFn = void (*)(void*, const void*, const void*, size_t, ReduceOp);

HalfKernelFn halfKernel(DataType dtype, HalfKernel kernel) {
  const bool fp16 = dtype == DataType::Float16;
#ifdef RDMACC_HALF_AVX2
  if (kernel == HalfKernel::Accelerated && haveAvx2F16c()) {
    return fp16 ? reduceFloat16Avx2 : reduceBFloat16Avx2;
  }
#endif
  (void)kernel;
  return fp16 ? reduceFloat16Baseline : reduceBFloat16Baseline;
}

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
    case DataType::Float16:
      mapTyped<uint16_t>(
          data, n, [&](uint16_t v) { return floatToHalf(static_cast<float>(f(halfToFloat(v)))); });
      return;
    case DataType::BFloat16:
      mapTyped<uint16_t>(data, n, [&](uint16_t v) {
        return floatToBfloat16(static_cast<float>(f(bfloat16ToFloat(v))));
      });
      return;
    default:
      throw Error(ErrorKind::Internal, "floating-point map on an integer type");
  }
}

}  // namespace

// Branch-free IEEE half conversions (the float-arithmetic formulation of
// Maratyszcza's FP16 library): straight-line code that the auto-vectoriser
// turns into SSE2 in the reduction loops. Exactness against the bit-by-bit
// definition is checked for every half and for rounding of floats by
// tests/host/reduce_test.cpp.
float halfToFloat(uint16_t h) noexcept {
  const uint32_t w = static_cast<uint32_t>(h) << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t twoW = w + w;
  // Normal numbers, infinities and NaNs: rebias the exponent by a multiply.
  const float normalized = std::bit_cast<float>((twoW >> 4) + (0xe0u << 23)) * 0x1.0p-112f;
  // Subnormals: the mantissa as a float in [0.5, 1), minus 0.5.
  const float denormalized = std::bit_cast<float>((twoW >> 17) | (126u << 23)) - 0.5f;
  const uint32_t bits = twoW < (1u << 27) ? std::bit_cast<uint32_t>(denormalized)
                                          : std::bit_cast<uint32_t>(normalized);
  return std::bit_cast<float>(sign | bits);
}

uint16_t floatToHalf(float f) noexcept {
  // Scaling up then down rounds to half's precision (to nearest even) in the
  // FPU and turns too-large values into infinity.
  float base = (std::fabs(f) * 0x1.0p+112f) * 0x1.0p-110f;
  const uint32_t w = std::bit_cast<uint32_t>(f);
  const uint32_t shl1W = w + w;
  const uint32_t sign = w & 0x80000000u;
  uint32_t bias = shl1W & 0xff000000u;
  bias = bias < 0x71000000u ? 0x71000000u : bias;
  base = std::bit_cast<float>((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = std::bit_cast<uint32_t>(base);
  const uint32_t expBits = (bits >> 13) & 0x00007c00u;
  const uint32_t mantissaBits = bits & 0x00000fffu;
  const uint32_t nonsign = expBits + mantissaBits;
  return static_cast<uint16_t>((sign >> 16) | (shl1W > 0xff000000u ? 0x7e00u : nonsign));
}

bool halfKernelAvailable(HalfKernel kernel) {
#ifdef RDMACC_HALF_AVX2
  return kernel == HalfKernel::Baseline || haveAvx2F16c();
#else
  return kernel == HalfKernel::Baseline;
#endif
}

void reduceHalfWith(HalfKernel kernel, void* dst, const void* a, const void* b, size_t n,
                    DataType dtype, ReduceOp op) {
  if (dtype != DataType::Float16 && dtype != DataType::BFloat16) {
    throw Error(ErrorKind::Internal, "reduceHalfWith on a type that is not a 16-bit float");
  }
  halfKernel(dtype, kernel)(dst, a, b, n, op);
}

float bfloat16ToFloat(uint16_t b) noexcept {
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}

uint16_t floatToBfloat16(float f) noexcept {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;  // to nearest even
  const uint32_t quietNan = (x >> 16) | 0x40u;
  return static_cast<uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? quietNan : rounded);
}

void reduceTo(void* dst, const void* a, const void* b, size_t n, DataType dtype, ReduceOp op) {
  switch (dtype) {
    case DataType::Float32:
      reduceTyped<float>(dst, a, b, n, op);
      return;
    case DataType::Float64:
      reduceTyped<double>(dst, a, b, n, op);
      return;
    case DataType::Float16:
    case DataType::BFloat16: {
      static const HalfKernelFn fp16 = halfKernel(DataType::Float16, HalfKernel::Accelerated);
      static const HalfKernelFn bf16 = halfKernel(DataType::BFloat16, HalfKernel::Accelerated);
      (dtype == DataType::Float16 ? fp16 : bf16)(dst, a, b, n, op);
      return;
    }
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
      mapNumeric(data, n, dtype, [&](double v) { return v * factor; });
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
      mapNumeric(data, n, dtype, [&](double v) { return v / static_cast<double>(divisor); });
      return;
  }
}

}  // namespace rdmacc
