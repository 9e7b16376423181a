// The 16-bit floats (float16, bfloat16): their conversions, and the
// reduction and scaling kernels, which widen blocks to float, compute and
// narrow once. On x86-64 CPUs with AVX2 and F16C a second set of block
// conversions is chosen at run time (the library itself is built for the
// baseline ISA: the soft-RoCE VM's CPU has no AVX); both give the same bits
// for every input, so ranks on different CPUs agree (tests/unit/reduce/reduce_test.cpp).
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#define RDMACC_HALF_AVX2 1
#endif

#include "rdmacc/error.hpp"
#include "src/reduce/reduce.hpp"
#include "src/reduce/typed.hpp"

namespace rdmacc {
namespace {

constexpr size_t kBlock = 256;  // floats per block: two blocks stay in L1

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

// dst = a (op) b, pairwise in float, rounded once.
template <WidenBlock Widen, NarrowBlock Narrow>
void reduceHalf(void* dst, const void* a, const void* b, size_t n, ReduceOp op) {
  auto* d = static_cast<uint16_t*>(dst);
  const auto* x = static_cast<const uint16_t*>(a);
  const auto* y = static_cast<const uint16_t*>(b);
  alignas(32) float wx[kBlock];
  alignas(32) float wy[kBlock];
  for (size_t base = 0; base < n; base += kBlock) {
    const size_t m = std::min(kBlock, n - base);
    Widen(wx, x + base, m);
    Widen(wy, y + base, m);
    detail::reduceTyped<float>(wx, wx, wy, m, op);
    Narrow(d + base, wx, m);
  }
}

// data = data * x or data / x, computed in double (as the other floating
// types' scaling), rounded to float and then to the type.
template <WidenBlock Widen, NarrowBlock Narrow>
void scaleHalf(void* data, size_t n, double x, bool divide) {
  auto* d = static_cast<uint16_t*>(data);
  const auto xf = static_cast<float>(x);
  const bool exactInFloat = static_cast<double>(xf) == x;  // Avg's rank count
  alignas(32) float w[kBlock];
  for (size_t base = 0; base < n; base += kBlock) {
    const size_t m = std::min(kBlock, n - base);
    Widen(w, d + base, m);
    if (divide && exactInFloat) {
      // The same bits as in double: a quotient of two floats computed in
      // double and rounded to float is the correctly rounded float quotient
      // (53 >= 2 x 24 + 2 bits), and float division is twice as wide.
      for (size_t i = 0; i < m; ++i) w[i] = w[i] / xf;
    } else if (divide) {
      for (size_t i = 0; i < m; ++i) w[i] = static_cast<float>(static_cast<double>(w[i]) / x);
    } else {
      for (size_t i = 0; i < m; ++i) w[i] = static_cast<float>(static_cast<double>(w[i]) * x);
    }
    Narrow(d + base, w, m);
  }
}

struct HalfKernels {
  void (*reduce)(void*, const void*, const void*, size_t, ReduceOp);
  void (*scale)(void*, size_t, double, bool);
};

template <WidenBlock Widen, NarrowBlock Narrow>
constexpr HalfKernels kernelsOf() {
  return {reduceHalf<Widen, Narrow>, scaleHalf<Widen, Narrow>};
}

#ifdef RDMACC_HALF_AVX2
// F16C converts eight halves per instruction, exactly (round to nearest
// even, as floatToHalf); the portable float16 kernel is slower than a
// 100 Gb/s link (docs/performance.md, "Reduction kernels"). bfloat16 is
// float's upper half: its portable conversions compiled for AVX2's lanes
// (explicit intrinsics were no faster). The float arithmetic between the
// conversions stays the baseline's.
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
    const __m256 v = _mm256_loadu_ps(in + i);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
    // F16C keeps a NaN's payload; floatToHalf gives the canonical quiet NaN.
    if (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)) != 0) {
      for (size_t j = i; j < i + 8; ++j) {
        if (std::isnan(in[j])) out[j] = floatToHalf(in[j]);
      }
    }
  }
  for (; i < m; ++i) out[i] = floatToHalf(in[i]);
}

__attribute__((target("avx2,f16c"))) void widenBFloat16Avx2(float* out, const uint16_t* in,
                                                            size_t m) {
  widenEach<bfloat16ToFloat>(out, in, m);
}

__attribute__((target("avx2,f16c"))) void narrowBFloat16Avx2(uint16_t* out, const float* in,
                                                             size_t m) {
  narrowEach<floatToBfloat16>(out, in, m);
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

const HalfKernels& kernelsFor(DataType dtype, HalfKernel kernel) {
  if (dtype != DataType::Float16 && dtype != DataType::BFloat16) {
    throw Error(ErrorKind::Internal, "a 16-bit float kernel called for another type");
  }
  const bool fp16 = dtype == DataType::Float16;
  static constexpr HalfKernels float16 =
      kernelsOf<widenEach<halfToFloat>, narrowEach<floatToHalf>>();
  static constexpr HalfKernels bfloat16 =
      kernelsOf<widenEach<bfloat16ToFloat>, narrowEach<floatToBfloat16>>();
#ifdef RDMACC_HALF_AVX2
  static constexpr HalfKernels float16F16c = kernelsOf<widenF16c, narrowF16c>();
  static constexpr HalfKernels bfloat16Avx2 = kernelsOf<widenBFloat16Avx2, narrowBFloat16Avx2>();
  if (kernel == HalfKernel::Accelerated && haveAvx2F16c()) return fp16 ? float16F16c : bfloat16Avx2;
#endif
  (void)kernel;
  return fp16 ? float16 : bfloat16;
}

}  // namespace

bool halfKernelAvailable(HalfKernel kernel) {
#ifdef RDMACC_HALF_AVX2
  return kernel == HalfKernel::Baseline || haveAvx2F16c();
#else
  return kernel == HalfKernel::Baseline;
#endif
}

void reduceHalfWith(HalfKernel kernel, void* dst, const void* a, const void* b, size_t n,
                    DataType dtype, ReduceOp op) {
  kernelsFor(dtype, kernel).reduce(dst, a, b, n, op);
}

void scaleHalfWith(HalfKernel kernel, void* data, size_t n, DataType dtype, double x, bool divide) {
  kernelsFor(dtype, kernel).scale(data, n, x, divide);
}

// Branch-free IEEE half conversions (the float-arithmetic formulation of
// Maratyszcza's FP16 library): straight-line code that the auto-vectoriser
// turns into SSE2 in the reduction loops. Exactness against the bit-by-bit
// definition is checked for every half and for rounding of floats by
// tests/unit/reduce/reduce_test.cpp.
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

float bfloat16ToFloat(uint16_t b) noexcept {
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}

uint16_t floatToBfloat16(float f) noexcept {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;  // to nearest even
  const uint32_t quietNan = (x >> 16) | 0x40u;
  return static_cast<uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? quietNan : rounded);
}

}  // namespace rdmacc
