// Reduction kernels: every dtype and op against independently computed values.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "src/reduce/reduce.hpp"

namespace rdmacc {
namespace {

// a (op) b, in place (reduceInto); the out-of-place reduceTo, into a buffer
// filled with garbage first, must give the same bits.
template <typename T>
std::vector<T> reduced(std::vector<T> a, const std::vector<T>& b, DataType t, ReduceOp op) {
  std::vector<T> out(a.size());
  std::memset(out.data(), 0xa5, out.size() * sizeof(T));
  reduceTo(out.data(), a.data(), b.data(), a.size(), t, op);
  reduceInto(a.data(), b.data(), a.size(), t, op);
  EXPECT_EQ(std::memcmp(out.data(), a.data(), a.size() * sizeof(T)), 0)
      << "reduceTo differs from reduceInto (" << toString(t) << ")";
  return a;
}

TEST(Reduce, Float32AndFloat64) {
  std::vector<float> a{1.5f, -2, 3, 0}, b{2, 4, -8, -0.0f};
  EXPECT_EQ(reduced(a, b, DataType::Float32, ReduceOp::Sum), (std::vector<float>{3.5f, 2, -5, 0}));
  EXPECT_EQ(reduced(a, b, DataType::Float32, ReduceOp::Product),
            (std::vector<float>{3, -8, -24, -0.0f}));
  EXPECT_EQ(reduced(a, b, DataType::Float32, ReduceOp::Min), (std::vector<float>{1.5f, -2, -8, 0}));
  EXPECT_EQ(reduced(a, b, DataType::Float32, ReduceOp::Max), (std::vector<float>{2, 4, 3, 0}));
  std::vector<double> c{1e300, 1}, d{1e300, 2};
  EXPECT_EQ(reduced(c, d, DataType::Float64, ReduceOp::Sum)[1], 3.0);
  EXPECT_TRUE(std::isinf(reduced(c, d, DataType::Float64, ReduceOp::Product)[0]));
  // Long arrays take the vectorised path; check a tail that is not a multiple of any vector width.
  std::vector<float> x(1037), y(1037);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i), y[i] = 0.5f;
  auto s = reduced(x, y, DataType::Float32, ReduceOp::Sum);
  for (size_t i = 0; i < s.size(); ++i) ASSERT_EQ(s[i], static_cast<float>(i) + 0.5f);
}

// Every rank must end with the same bits whichever operand an algorithm holds
// first: Min and Max of +0/-0, and any op's NaNs, do not depend on the order.
template <typename T>
void expectOrderFree(DataType dtype, ReduceOp op, T a, T b) {
  std::vector<T> ab = reduced(std::vector<T>{a}, std::vector<T>{b}, dtype, op);
  std::vector<T> ba = reduced(std::vector<T>{b}, std::vector<T>{a}, dtype, op);
  EXPECT_EQ(std::memcmp(ab.data(), ba.data(), sizeof(T)), 0)
      << "op " << static_cast<int>(op) << " dtype " << static_cast<int>(dtype);
}

TEST(Reduce, ResultsHaveTheSameBitsInEitherOrder) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float negNan = -std::numeric_limits<float>::quiet_NaN();
  for (ReduceOp op : {ReduceOp::Min, ReduceOp::Max, ReduceOp::Sum, ReduceOp::Product}) {
    for (auto [a, b] : {std::pair{0.0f, -0.0f}, {nan, 1.0f}, {nan, negNan}, {-0.0f, nan}}) {
      expectOrderFree<float>(DataType::Float32, op, a, b);
      expectOrderFree<double>(DataType::Float64, op, a, b);
      expectOrderFree<uint16_t>(DataType::Float16, op, floatToHalf(a), floatToHalf(b));
      expectOrderFree<uint16_t>(DataType::BFloat16, op, floatToBfloat16(a), floatToBfloat16(b));
    }
  }
  // -0 ranks below +0; a NaN propagates.
  EXPECT_TRUE(std::signbit(reduced<float>({0.0f}, {-0.0f}, DataType::Float32, ReduceOp::Min)[0]));
  EXPECT_FALSE(std::signbit(reduced<float>({-0.0f}, {0.0f}, DataType::Float32, ReduceOp::Max)[0]));
  EXPECT_TRUE(std::isnan(reduced<float>({1.0f}, {nan}, DataType::Float32, ReduceOp::Min)[0]));
  EXPECT_TRUE(std::isnan(reduced<double>({nan}, {1.0}, DataType::Float64, ReduceOp::Max)[0]));
}

TEST(Reduce, IntegersWrapLikeTwosComplement) {
  std::vector<int8_t> a{127, -128, 5, -1}, b{1, -1, -3, -1};
  EXPECT_EQ(reduced(a, b, DataType::Int8, ReduceOp::Sum), (std::vector<int8_t>{-128, 127, 2, -2}));
  EXPECT_EQ(reduced(a, b, DataType::Int8, ReduceOp::Product),
            (std::vector<int8_t>{127, -128, -15, 1}));
  std::vector<uint8_t> u{250, 3}, v{10, 4};
  EXPECT_EQ(reduced(u, v, DataType::UInt8, ReduceOp::Sum), (std::vector<uint8_t>{4, 7}));
  EXPECT_EQ(reduced(u, v, DataType::UInt8, ReduceOp::Min), (std::vector<uint8_t>{10, 3}));
  std::vector<int32_t> i{0x0f0f, -7}, j{0x00ff, 3};
  EXPECT_EQ(reduced(i, j, DataType::Int32, ReduceOp::BAnd), (std::vector<int32_t>{0x000f, -7 & 3}));
  EXPECT_EQ(reduced(i, j, DataType::Int32, ReduceOp::BOr), (std::vector<int32_t>{0x0fff, -7 | 3}));
  EXPECT_EQ(reduced(i, j, DataType::Int32, ReduceOp::BXor), (std::vector<int32_t>{0x0ff0, -7 ^ 3}));
  std::vector<int64_t> k{std::numeric_limits<int64_t>::max(), 6}, l{1, -2};
  EXPECT_EQ(reduced(k, l, DataType::Int64, ReduceOp::Sum)[0], std::numeric_limits<int64_t>::min());
  EXPECT_EQ(reduced(k, l, DataType::Int64, ReduceOp::Max),
            (std::vector<int64_t>{std::numeric_limits<int64_t>::max(), 6}));
}

TEST(Reduce, BoolIsLogical) {
  std::vector<uint8_t> a{0, 0, 1, 1}, b{0, 1, 0, 1};
  EXPECT_EQ(reduced(a, b, DataType::Bool, ReduceOp::Sum), (std::vector<uint8_t>{0, 1, 1, 1}));
  EXPECT_EQ(reduced(a, b, DataType::Bool, ReduceOp::Product), (std::vector<uint8_t>{0, 0, 0, 1}));
  EXPECT_EQ(reduced(a, b, DataType::Bool, ReduceOp::BXor), (std::vector<uint8_t>{0, 1, 1, 0}));
  EXPECT_EQ(reduced(a, b, DataType::Bool, ReduceOp::Min), (std::vector<uint8_t>{0, 0, 0, 1}));
}

TEST(Reduce, HalfAndBfloat16ComputeInFloat) {
  std::vector<uint16_t> a{floatToHalf(1.5f), floatToHalf(2048), floatToHalf(-3)};
  std::vector<uint16_t> b{floatToHalf(0.25f), floatToHalf(1), floatToHalf(-4)};
  auto s = reduced(a, b, DataType::Float16, ReduceOp::Sum);
  EXPECT_EQ(halfToFloat(s[0]), 1.75f);
  EXPECT_EQ(halfToFloat(s[1]), 2048.0f);  // 2049 rounds to even in half
  EXPECT_EQ(halfToFloat(s[2]), -7.0f);
  auto m = reduced(a, b, DataType::Float16, ReduceOp::Max);
  EXPECT_EQ(halfToFloat(m[2]), -3.0f);
  std::vector<uint16_t> c{floatToBfloat16(1.0f), floatToBfloat16(256)},
      d{floatToBfloat16(2.0f), floatToBfloat16(1)};
  auto p = reduced(c, d, DataType::BFloat16, ReduceOp::Product);
  EXPECT_EQ(bfloat16ToFloat(p[0]), 2.0f);
  EXPECT_EQ(bfloat16ToFloat(p[1]), 256.0f);
}

TEST(Reduce, HalfConversionsRoundTripEveryValue) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float f = halfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(halfToFloat(floatToHalf(f))));
      continue;
    }
    ASSERT_EQ(floatToHalf(f), h) << std::hex << h;
  }
  EXPECT_EQ(halfToFloat(floatToHalf(65504.0f)), 65504.0f);
  EXPECT_TRUE(std::isinf(halfToFloat(floatToHalf(65520.0f))));
  EXPECT_EQ(halfToFloat(floatToHalf(5.96e-8f)), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(bfloat16ToFloat(floatToBfloat16(1.00390625f)), 1.0f);        // ties to even
  EXPECT_EQ(bfloat16ToFloat(floatToBfloat16(1.01171875f)), 1.015625f);
  EXPECT_TRUE(std::isnan(bfloat16ToFloat(floatToBfloat16(std::nanf("")))));
}

// The bit-by-bit definition of float -> half (round to nearest even), to check
// the branch-free conversion the kernels use.
uint16_t referenceFloatToHalf(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  uint32_t sign = (x >> 16) & 0x8000;
  uint32_t absx = x & 0x7fffffffu;
  if (absx > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00);  // NaN
  if (absx == 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00);
  if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00);  // rounds to inf
  if (absx < 0x38800000u) {                                              // subnormal or zero
    if (absx < 0x33000000u) return static_cast<uint16_t>(sign);
    uint32_t mant = (absx & 0x7fffff) | 0x800000;
    int shift = 126 - static_cast<int>(absx >> 23);
    uint32_t half = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = ((absx >> 13) - ((127 - 15) << 10));
  uint32_t rem = absx & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) ++half;
  return static_cast<uint16_t>(sign | half);
}

TEST(Reduce, FloatToHalfRoundsLikeTheDefinition) {
  // Every float whose low 7 bits are 0 or 0x7f (2^26 values: every exponent,
  // ties, near-ties, subnormal boundaries), plus the bits around each
  // rounding boundary of every half.
  uint64_t checked = 0;
  auto expect = [&](uint32_t bits) {
    float f = std::bit_cast<float>(bits);
    ++checked;
    ASSERT_EQ(floatToHalf(f), referenceFloatToHalf(f)) << std::hex << bits;
  };
  for (uint64_t hi = 0; hi < (1u << 25); ++hi) {
    expect(static_cast<uint32_t>(hi << 7));
    expect(static_cast<uint32_t>(hi << 7 | 0x7f));
  }
  for (uint32_t h = 0; h < 0x10000; ++h) {
    uint32_t f = std::bit_cast<uint32_t>(halfToFloat(static_cast<uint16_t>(h)));
    for (uint32_t d = 0; d < 3; ++d) {
      expect(f + 0xfff + d);
      expect(f + 0x1000 + d);
      expect(f - d);
    }
  }
  EXPECT_GT(checked, 60'000'000u);
}

// The accelerated 16-bit kernels (AVX2 + F16C, picked at run time) must give
// the baseline's bits for every input, or ranks on different CPUs would
// disagree: every half against pseudo-random partners and against its
// neighbour (ties when rounding back), with a tail that fills neither a
// vector nor a block.
TEST(Reduce, HalfKernelsGiveTheSameBits) {
  if (!halfKernelAvailable(HalfKernel::Accelerated)) {
    GTEST_SKIP() << "this CPU has no AVX2/F16C: only the baseline kernel runs here";
  }
  const size_t n = 0x10000 + 11;
  std::vector<uint16_t> a(n), random(n), neighbour(n);
  for (size_t i = 0; i < n; ++i) {
    a[i] = static_cast<uint16_t>(i);
    random[i] = static_cast<uint16_t>(i * 0x9e37u + 0x1234u);
    neighbour[i] = static_cast<uint16_t>(i + 1);
  }
  for (DataType t : {DataType::Float16, DataType::BFloat16}) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Product, ReduceOp::Min, ReduceOp::Max}) {
      for (const auto* b : {&random, &neighbour}) {
        std::vector<uint16_t> base(n), fast(n), dispatched(n);
        reduceHalfWith(HalfKernel::Baseline, base.data(), a.data(), b->data(), n, t, op);
        reduceHalfWith(HalfKernel::Accelerated, fast.data(), a.data(), b->data(), n, t, op);
        reduceTo(dispatched.data(), a.data(), b->data(), n, t, op);
        for (size_t i = 0; i < n; ++i) {
          ASSERT_EQ(fast[i], base[i]) << toString(t) << " " << toString(op) << " of " << std::hex
                                      << a[i] << " and " << (*b)[i];
        }
        EXPECT_EQ(dispatched, fast) << toString(t) << " " << toString(op);
      }
    }
  }
}

// Avg's division and PreMulSum's factor on 16-bit floats: computed in
// double and rounded (to float, then to the type), as for the other floating
// types; both kernels, every value, divisors and factors that round.
TEST(Reduce, HalfScalingGivesTheDefinitionsBits) {
  const size_t n = 0x10000 + 11;
  std::vector<uint16_t> all(n);
  for (size_t i = 0; i < n; ++i) all[i] = static_cast<uint16_t>(i);
  for (DataType t : {DataType::Float16, DataType::BFloat16}) {
    const bool fp16 = t == DataType::Float16;
    auto widen = [&](uint16_t v) { return fp16 ? halfToFloat(v) : bfloat16ToFloat(v); };
    auto narrow = [&](float v) { return fp16 ? floatToHalf(v) : floatToBfloat16(v); };
    for (bool divide : {true, false}) {
      for (double x : {2.0, 3.0, 7.0, 1000.0, 1.0 / 3, 0.1, 3.7, 1e-5, 65504.0}) {
        if (divide && x != std::floor(x)) continue;  // Avg divides by a rank count
        for (HalfKernel k : {HalfKernel::Baseline, HalfKernel::Accelerated}) {
          if (!halfKernelAvailable(k)) continue;
          std::vector<uint16_t> got = all;
          scaleHalfWith(k, got.data(), n, t, x, divide);
          for (size_t i = 0; i < n; ++i) {
            const double v = widen(all[i]);
            const float want = static_cast<float>(divide ? v / x : v * x);
            ASSERT_EQ(got[i], narrow(want))
                << toString(t) << (divide ? " / " : " * ") << x << " of " << std::hex << all[i]
                << (k == HalfKernel::Baseline ? " (baseline)" : "");
          }
        }
      }
    }
  }
  // What Avg and PreMulSum call picks the same kernel.
  std::vector<uint16_t> viaDivide = all, viaKernel = all;
  divideBy(viaDivide.data(), n, DataType::Float16, 3);
  scaleHalfWith(HalfKernel::Accelerated, viaKernel.data(), n, DataType::Float16, 3.0, true);
  EXPECT_EQ(viaDivide, viaKernel);
}

TEST(Reduce, AvgDividesAndIntegersTruncate) {
  std::vector<int32_t> i{7, -7, 8};
  divideBy(i.data(), i.size(), DataType::Int32, 2);
  EXPECT_EQ(i, (std::vector<int32_t>{3, -3, 4}));
  std::vector<float> f{7, 1};
  divideBy(f.data(), f.size(), DataType::Float32, 4);
  EXPECT_EQ(f, (std::vector<float>{1.75f, 0.25f}));
  std::vector<uint16_t> h{floatToHalf(3)};
  divideBy(h.data(), 1, DataType::Float16, 2);
  EXPECT_EQ(halfToFloat(h[0]), 1.5f);
  std::vector<double> d{3, -1};
  scaleBy(d.data(), d.size(), DataType::Float64, 0.5);
  EXPECT_EQ(d, (std::vector<double>{1.5, -0.5}));
  std::vector<int64_t> l{5, -5};
  scaleBy(l.data(), l.size(), DataType::Int64, 0.5);
  EXPECT_EQ(l, (std::vector<int64_t>{2, -2}));
}

TEST(Reduce, SupportTable) {
  EXPECT_TRUE(supports(ReduceOp::BXor, DataType::Int8));
  EXPECT_TRUE(supports(ReduceOp::BAnd, DataType::Bool));
  EXPECT_FALSE(supports(ReduceOp::BOr, DataType::Float32));
  EXPECT_FALSE(supports(ReduceOp::BAnd, DataType::BFloat16));
  EXPECT_FALSE(supports(ReduceOp::Avg, DataType::Bool));
  EXPECT_TRUE(supports(ReduceOp::Avg, DataType::Int64));
  EXPECT_TRUE(supports(ReduceOp::PreMulSum, DataType::Float16));
}

}  // namespace
}  // namespace rdmacc
